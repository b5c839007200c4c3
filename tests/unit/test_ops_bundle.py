"""Must-gather bundle helpers: redaction, durations, PDB coverage, filters."""

from __future__ import annotations

import pytest

from builders import pdb, pod
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


def test_pdbs_covering() -> None:
    pods = [
        pod("db-0", namespace="a", labels={"app": "db"}),
        pod("web-1", namespace="b", labels={"app": "web", "tier": "fe"}),
    ]
    pdbs = [
        pdb("db", namespace="a", match_labels={"app": "db"}),
        pdb("db", namespace="b", match_labels={"app": "db"}),  # other namespace's db
        pdb(
            "fe",
            namespace="b",
            selector={"matchExpressions": [{"key": "tier", "operator": "In", "values": ["fe"]}]},
        ),
        pdb("all", namespace="b", selector={}),  # empty selector selects every pod in the namespace
        pdb("none", namespace="b"),  # no selector: selects nothing
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


# -- secrets by shape (issue 14, item 5) ---------------------------------------

PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\n"
    "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n"
    "VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK\n"
    "-----END RSA PRIVATE KEY-----"
)
SECRETS = {
    "url": ("postgres://app:hunter2pass@db.internal:5432/app", "hunter2pass"),
    "flag-space": ("run --token abc123secret --verbose", "abc123secret"),
    "flag-equals": ("run --password=s3cr3tpw", "s3cr3tpw"),
    "flag-secret": ("--client-secret zzTopSecret9", "zzTopSecret9"),
    "pem": (f"key:\n{PEM}\n", "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun"),
    "env-pair": ("DB_PASS=correcthorse", "correcthorse"),
    "hex": ("digest deadbeefdeadbeefdeadbeefdeadbeef01234567", "deadbeefdeadbeefdeadbeefdeadbeef"),
    "base64": ("blob QWxhZGRpbjpvcGVuIHNlc2FtZQ9xYzRkNTY3ODkwYWJjZGVm", "QWxhZGRpbjpvcGVu"),
}


@pytest.mark.parametrize("case", sorted(SECRETS))
def test_redact_text_by_shape(case: str) -> None:
    text, secret = SECRETS[case]
    out = bundle.redact_text(text)
    assert secret not in out
    assert bundle.REDACTED in out


def test_redact_by_shape_keeps_what_diagnosis_needs() -> None:
    kept = [
        "https://db.internal:5432/app",
        "registry.k8s.io/pause@sha256:7031c1b283388d2c2e09b57badb803c05ebed362dc88d84b480cc47f72a21097",
        "/var/run/secrets/kubernetes.io/serviceaccount",
        "maintenance nm-1: evicting web-0 (--grace-period 30)",
        "cordoned node worker-1; key node.kubernetes.io/unschedulable",
        "uid 6f1d6a6e-8a3b-4b5e-9b0a-3c2d1e0f9a8b",
        "--tls-private-key-file /etc/tls/tls.key --secret-name db",
    ]
    for text in kept:
        assert bundle.redact_text(text) == text


def test_redact_objects_by_name_and_shape() -> None:
    pod = {
        "metadata": {
            "annotations": {"db": "postgres://u:pw-in-url@h/db", "cert": PEM},
        },
        "spec": {
            "containers": [
                {
                    "args": ["--token", "abc123secret", "--verbose", "--password=p4ss"],
                    "command": ["app", "--key-file", "/etc/k.pem"],
                    "env": [
                        {"name": "DB_PASS", "value": "correcthorse"},
                        {"name": "SIGNING_KEY", "value": "k3y"},
                        {"name": "AWS_CREDENTIALS", "value": "cr3d"},
                    ],
                }
            ],
            "tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}],
        },
        "data": {"apiKey": "x1", "dbPassword": "x2", "Secret": "x3"},
    }
    out = bundle.redact(pod)
    text = str(out)
    for secret in ("pw-in-url", "MIIEowIB", "abc123secret", "p4ss", "correcthorse", "k3y", "cr3d"):
        assert secret not in text
    assert out["spec"]["containers"][0]["args"][2] == "--verbose"
    assert out["spec"]["containers"][0]["command"][2] == "/etc/k.pem"
    assert out["spec"]["tolerations"][0]["key"] == "node.kubernetes.io/unschedulable"
    assert set(out["data"].values()) == {bundle.REDACTED}


def test_pod_for_diagnosis_keeps_only_the_allow_list() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0",
            "namespace": "shop",
            "uid": "u1",
            "labels": {"app": "web"},
            "ownerReferences": [{"kind": "StatefulSet", "name": "web", "controller": True}],
            "deletionTimestamp": "2026-12-01T00:00:00Z",
            "annotations": {
                c.DRAIN_ORDER_ANNOTATION: "2",
                c.MIRROR_POD_ANNOTATION: "abc",
                "example.com/db-url": "postgres://u:p@h",
            },
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {
            "nodeName": "n1",
            "priorityClassName": "high",
            "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "c", "args": ["--token", "t"], "env": [{"name": "A"}]}],
            "volumes": [
                {"name": "data", "emptyDir": {}},
                {"name": "creds", "secret": {"secretName": "db"}},
            ],
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready"}], "podIP": "10.0.0.1"},
    }
    out = bundle.pod_for_diagnosis(pod)
    assert out == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0",
            "namespace": "shop",
            "uid": "u1",
            "labels": {"app": "web"},
            "ownerReferences": [{"kind": "StatefulSet", "name": "web", "controller": True}],
            "deletionTimestamp": "2026-12-01T00:00:00Z",
            "annotations": {c.DRAIN_ORDER_ANNOTATION: "2", c.MIRROR_POD_ANNOTATION: "abc"},
        },
        "spec": {
            "nodeName": "n1",
            "priorityClassName": "high",
            "terminationGracePeriodSeconds": 30,
            "volumes": [{"name": "data", "type": "emptyDir"}, {"name": "creds", "type": "secret"}],
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready"}]},
    }
