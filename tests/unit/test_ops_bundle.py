"""Must-gather bundle helpers: redaction, durations, PDB coverage, filters."""

from __future__ import annotations

from typing import Any

import pytest

from nmo.api import constants as c
from nmo.ops import bundle

JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJlLWJ5dGVz"


def test_redact_objects() -> None:
    pod = {
        "metadata": {
            "name": "p",
            "managedFields": [{"manager": "x"}],
            "annotations": {"note": f"Authorization: Bearer {JWT}"},
        },
        "spec": {
            "containers": [
                {
                    "env": [
                        {"name": "API_TOKEN", "value": "s3cr3t-value"},
                        {"name": "LEASE_NAMESPACE", "value": "medik8s-leases"},
                        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db"}}},
                    ]
                }
            ],
            "volumes": [{"name": "v", "secret": {"secretName": "tls"}}],
            "tolerations": [{"key": "node.kubernetes.io/unschedulable"}],
        },
        "data": {"token": "abcdef", "password": ""},
    }
    out = bundle.redact(pod)
    assert "managedFields" not in out["metadata"]
    env = out["spec"]["containers"][0]["env"]
    assert env[0]["value"] == bundle.REDACTED
    assert env[1]["value"] == "medik8s-leases"
    assert env[2]["valueFrom"] == {"secretKeyRef": {"name": "db"}}
    assert out["spec"]["volumes"][0]["secret"]["secretName"] == "tls"
    assert out["spec"]["tolerations"][0]["key"] == "node.kubernetes.io/unschedulable"
    assert out["data"] == {"token": bundle.REDACTED, "password": ""}
    assert JWT not in str(out)


@pytest.mark.parametrize(
    ("line", "leaked"),
    [
        (f"using token {JWT}", JWT),
        ("Authorization: Bearer abcdefghijkl123", "abcdefghijkl123"),
        ('{"token": "abcd1234efgh"}', "abcd1234efgh"),
        ("password=hunter22", "hunter22"),
    ],
)
def test_redact_text(line: str, leaked: str) -> None:
    assert leaked not in bundle.redact_text(line)


def test_redact_text_keeps_ordinary_logs() -> None:
    line = "maintenance nm-1: lease node-n1 renewed; drain 3 pending"
    assert bundle.redact_text(line) == line


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("30s", 30), ("10m", 600), ("1h30m", 5400), ("500ms", 0.5)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert bundle.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "ten", "1d", "5m-"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        bundle.parse_duration(text)


def pod(ns: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name, "labels": labels}}


def pdb(ns: str, name: str, selector: dict[str, Any] | None) -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name}, "spec": {"selector": selector}}


def test_pdbs_covering() -> None:
    pods = [pod("a", "db-0", {"app": "db"}), pod("b", "web-1", {"app": "web", "tier": "fe"})]
    pdbs = [
        pdb("a", "db", {"matchLabels": {"app": "db"}}),
        pdb("b", "db", {"matchLabels": {"app": "db"}}),  # other namespace's db
        pdb("b", "fe", {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["fe"]}]}),
        pdb("b", "all", {}),  # empty selector selects every pod in the namespace
        pdb("b", "none", None),
    ]
    covered = [(p["metadata"]["namespace"] + "/" + p["metadata"]["name"], pods_)
               for p, pods_ in bundle.pdbs_covering(pdbs, pods)]  # fmt: skip
    assert covered == [("a/db", ["a/db-0"]), ("b/fe", ["b/web-1"]), ("b/all", ["b/web-1"])]


def test_webhook_and_event_filters() -> None:
    ours = {"webhooks": [{"name": c.WEBHOOK_NAME}]}
    other = {"webhooks": [{"name": "other.example.com"}]}
    assert bundle.our_webhook_configs([ours, other, {}]) == [ours]
    assert bundle.maintenance_event({"reason": "UncordonNode"}, set())
    assert bundle.maintenance_event({"involvedObject": {"kind": c.KIND}}, set())
    assert bundle.maintenance_event({"involvedObject": {"kind": "Node", "name": "n1"}}, {"n1"})
    assert not bundle.maintenance_event({"involvedObject": {"kind": "Node", "name": "n2"}}, {"n1"})
    assert set(bundle.MAINTENANCE_REASONS) == {
        "BeginMaintenance", "SucceedMaintenance", "UncordonNode",
        "RemovedMaintenance", "FailedMaintenance",
    }  # fmt: skip


def test_summary_text_lists_problems() -> None:
    items = [
        bundle.Item("nodes", file="cluster/nodes.yaml", count=3),
        bundle.Item("operator pods", status="forbidden", detail="pods is forbidden"),
        bundle.Item("node metrics", status="not-served", detail="metrics API not served"),
    ]
    text = bundle.summary_text({"version": "0.1.0"}, items)
    assert "2 of 3 items collected, 1 problem(s):" in text
    assert "! operator pods: forbidden: pods is forbidden" in text
    assert "node metrics   not-served  metrics API not served" in text


def test_redact_json_inside_annotations() -> None:
    applied = '{"spec":{"env":[{"name":"DB_PASSWORD","value":"plain-text-pw"}]}}'
    out = bundle.redact({"metadata": {"annotations": {"last-applied": applied}}})
    text = out["metadata"]["annotations"]["last-applied"]
    assert "plain-text-pw" not in text and bundle.REDACTED in text
    assert bundle.redact({"note": "{not json"}) == {"note": "{not json"}
