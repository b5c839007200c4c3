"""The chart's notify values, rendered offline (``helm template``, as test_chart_alerts)."""

from __future__ import annotations

import pytest
from test_chart_alerts import helm_env, manager_args, of_kind, render, template

__all__ = ["helm_env"]  # the fixture, shared


def notify_args(args: list[str]) -> list[str]:
    return [a for a in args if a.startswith("--notify")]


def test_off_by_default(helm_env: dict[str, str]) -> None:
    assert notify_args(manager_args(render(helm_env))) == []


def test_url_and_timeout_render_into_the_manager_args(helm_env: dict[str, str]) -> None:
    url = "https://hooks.example.com/nmo?team=infra&token=a:b#x"
    docs = render(
        helm_env, "--set-string", f"notify.url={url}", "--set", "notify.timeoutSeconds=20"
    )
    assert notify_args(manager_args(docs)) == [f"--notify-url={url}", "--notify-timeout=20"]
    docs = render(helm_env, "--set", "notify.url=http://receiver.tools:8080/hook")
    assert notify_args(manager_args(docs)) == [
        "--notify-url=http://receiver.tools:8080/hook",
        "--notify-timeout=5",
    ]


def test_the_network_policy_leaves_egress_open(helm_env: dict[str, str]) -> None:
    # docs/install.md says so: the receiver needs no NetworkPolicy rule of the chart.
    docs = render(helm_env, "--set", "networkPolicy.enabled=true", "--set", "notify.url=http://r/")
    (policy,) = of_kind(docs, "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert "egress" not in policy["spec"]


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ("notify.url=ftp://receiver/", "/notify/url"),
        ("notify.url=receiver:8080", "/notify/url"),
        ("notify.url=http://", "/notify/url"),
        ("notify.timeoutSeconds=0", "/notify/timeoutSeconds"),
        ("notify.timeoutSeconds=61", "/notify/timeoutSeconds"),
        ("notify.timeoutSeconds=soon", "/notify/timeoutSeconds"),
        ("notify.retries=3", "/notify"),
    ],
)
def test_schema_refuses(helm_env: dict[str, str], value: str, where: str) -> None:
    result = template(helm_env, "--set", value)
    assert result.returncode != 0, f"{value} was accepted"
    assert where in result.stderr, result.stderr
