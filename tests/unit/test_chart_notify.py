"""The chart's notify values, rendered offline (``helm template``, as test_chart_alerts),
and the documentation of the notification document and metrics."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest
from test_chart_alerts import METRICS_DOC, ROOT, helm_env, manager_args, of_kind, render, template

from nmo.core.maintenance.notifications import VERSION, Kind, Notification
from nmo.telemetry.metrics import Metrics

INSTALL_DOC = ROOT / "docs" / "install.md"

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


def test_the_network_policy_lets_the_receivers_port_out(helm_env: dict[str, str]) -> None:
    # docs/install.md says so: the chart's egress rules include notify.url's port.
    docs = render(helm_env, "--set", "networkPolicy.enabled=true", "--set", "notify.url=http://r/")
    (policy,) = of_kind(docs, "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    notify = [
        r for r in policy["spec"]["egress"] if r["ports"] == [{"port": 80, "protocol": "TCP"}]
    ]
    # ... at any address but the link-local metadata endpoints and loopback
    # (test_chart_policies.py has the blocks).
    assert len(notify) == 1 and "169.254.0.0/16" in str(notify[0]["to"])


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


def test_the_documented_document_is_the_one_sent() -> None:
    text = INSTALL_DOC.read_text()
    section = text[text.index("### Notifications") : text.index("## 3. ")]
    match = re.search(r"```json\n(.*?)```", section, re.S)
    assert match is not None, "no JSON example in the Notifications section"
    example = json.loads(match.group(1))
    sent = Notification(Kind.BLOCKED, "m", "n", "Running", "r", "x", datetime.now(UTC), "o")
    assert list(example) == list(sent.document())
    assert example["version"] == VERSION
    documented = set(re.findall(r"^\| `(\w+)` \|", section, re.M))
    assert set(sent.document()) <= documented, "a field of the document is not described"
    assert {k.value for k in Kind} <= documented, "a kind is not described"


def test_the_notification_metrics_are_documented_and_registered() -> None:
    documented = set(re.findall(r"^\| `(nmo_[a-z_]+)` \|", METRICS_DOC.read_text(), re.M))
    names = {f.name + "_total" for f in Metrics().registry.collect() if f.type == "counter"}
    for name in ("nmo_notifications_total", "nmo_notification_retries_total"):
        assert name in documented and name in names, name
