"""``kubectl nm``'s argument handling and the CR it creates; ``--pod-selector`` parsing."""

from __future__ import annotations

from typing import Any

import pytest

from nmo.cli.plugin import maintenance_body, parse_args, restored
from nmo.core.maintenance.selectors import format_selector, parse_selector, selector_matches


@pytest.mark.parametrize(
    "argv",
    [
        ["--kubeconfig", "/k", "--context", "c", "status", "nm-1"],
        ["status", "nm-1", "--kubeconfig", "/k", "--context", "c"],
        ["--kubeconfig=/k", "status", "--context=c", "nm-1"],
    ],
)
def test_kubectl_flags_before_or_after_the_subcommand(argv: list[str]) -> None:
    args = parse_args(argv)
    assert (args.command, args.name, args.kubeconfig, args.context) == ("status", "nm-1", "/k", "c")


def test_kubeconfig_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/from/env")
    monkeypatch.delenv("LEASE_NAMESPACE", raising=False)
    args = parse_args(["plan", "n1", "n2", "-o", "json"])
    assert (args.kubeconfig, args.context, args.nodes, args.output) == (
        "/from/env",
        None,
        ["n1", "n2"],
        "json",
    )
    assert args.lease_namespace == "medik8s-leases"


def test_start_creates_nm_node_with_only_the_given_drain_fields() -> None:
    args = parse_args(["start", "worker-1", "--reason", "kernel upgrade"])
    assert maintenance_body(args) == {
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": "nm-worker-1"},
        "spec": {"nodeName": "worker-1", "reason": "kernel upgrade"},
    }
    args = parse_args(
        [
            "start",
            "worker-1",
            "--name",
            "mine",
            "--timeout-seconds",
            "600",
            "--on-timeout",
            "Delete",
            "--pod-selector",
            "app=web",
        ]
    )
    body = maintenance_body(args)
    assert body["metadata"]["name"] == "mine"
    assert body["spec"]["drain"] == {
        "timeoutSeconds": 600,
        "onTimeout": "Delete",
        "podSelector": {"matchLabels": {"app": "web"}},
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["start", "n1", "--on-timeout", "Later"],
        ["start", "n1", "--timeout-seconds", "-1"],
        ["status", "--output", "yaml"],
        [],
    ],
)
def test_bad_usage_exits_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2


@pytest.mark.parametrize(
    ("node", "done"),
    [
        ({"spec": {}, "metadata": {"labels": {}}}, True),
        ({"spec": {"unschedulable": True}, "metadata": {}}, True),  # an admin's cordon stays
        ({"spec": {"taints": [{"key": "medik8s.io/drain", "effect": "NoSchedule"}]}}, False),
        (
            {"metadata": {"labels": {"remediation.medik8s.io/exclude-from-remediation": "true"}}},
            False,
        ),
    ],
)
def test_restored(node: dict[str, Any], done: bool) -> None:
    assert restored(node) is done


# -- kubectl's -l syntax -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "selector"),
    [
        ("app=web", {"matchLabels": {"app": "web"}}),
        ("app==web,tier=front", {"matchLabels": {"app": "web", "tier": "front"}}),
        (
            "tier!=db",
            {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]},
        ),
        (
            "env in (a, b)",
            {"matchExpressions": [{"key": "env", "operator": "In", "values": ["a", "b"]}]},
        ),
        (
            "env notin (a),example.com/x",
            {
                "matchExpressions": [
                    {"key": "env", "operator": "NotIn", "values": ["a"]},
                    {"key": "example.com/x", "operator": "Exists"},
                ]
            },
        ),
        ("!legacy", {"matchExpressions": [{"key": "legacy", "operator": "DoesNotExist"}]}),
        ("app=", {"matchLabels": {"app": ""}}),
    ],
)
def test_parse_selector(text: str, selector: dict[str, Any]) -> None:
    assert parse_selector(text) == selector
    assert parse_selector(format_selector(selector)) == selector


@pytest.mark.parametrize(
    "text", ["", "a=b,,c", "a=b,a=c", "a in ()", "=x", "Bad Key=x", "a=has space", "a>1"]
)
def test_parse_selector_refuses(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - every message is the subject elsewhere
        parse_selector(text)


@pytest.mark.parametrize(
    ("labels", "matches"),
    [({"app": "web"}, True), ({"app": "web", "tier": "db"}, False), ({}, False)],
)
def test_parsed_selector_matches_like_kubectl(labels: dict[str, str], matches: bool) -> None:
    assert selector_matches(parse_selector("app=web,tier!=db"), labels) is matches
