"""Cache transforms keep what nmo reads and nothing else."""

from __future__ import annotations

import json
from typing import Any

from nmo.api import constants as c
from nmo.core.maintenance.podselect import daemonset_owner, select_pods
from nmo.kube import slim


def full_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-1",
            "namespace": "app",
            "uid": "u1",
            "resourceVersion": "42",
            "labels": {"app": "web"},
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "x" * 5000,
                c.MIRROR_POD_ANNOTATION: "abc",
                "nodemaintenance.medik8s.io/drain-order": "2",
            },
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "controller": True},
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm"},
            ],
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:x": {}}}] * 20,
            "deletionTimestamp": "2026-12-01T12:00:00Z",
            "deletionGracePeriodSeconds": 30,
        },
        "spec": {
            "nodeName": "n1",
            "priorityClassName": "system-node-critical",
            "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "c", "image": "x", "env": [{"name": "A", "value": "1"}]}],
            "volumes": [{"name": "cache", "emptyDir": {}}, {"name": "cfg", "configMap": {}}],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "Scheduled"}],
            "containerStatuses": [{"name": "c", "ready": True}],
        },
    }


def test_pod_keeps_what_the_drain_reads() -> None:
    pod = slim.pod(full_pod())
    meta = pod["metadata"]
    assert meta["name"] == "web-1" and meta["namespace"] == "app" and meta["uid"] == "u1"
    assert meta["deletionGracePeriodSeconds"] == 30 and meta["labels"] == {"app": "web"}
    assert set(meta["annotations"]) == {
        c.MIRROR_POD_ANNOTATION,
        "nodemaintenance.medik8s.io/drain-order",
    }
    assert [r["kind"] for r in meta["ownerReferences"]] == ["DaemonSet"]
    assert "managedFields" not in meta
    assert pod["spec"] == {
        "nodeName": "n1",
        "priorityClassName": "system-node-critical",
        "terminationGracePeriodSeconds": 30,
        "volumes": [{"name": "cache", "emptyDir": {}}],
    }
    assert pod["status"] == {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    assert len(json.dumps(pod)) < len(json.dumps(full_pod())) / 10


def test_drain_rules_give_the_same_answer_on_slim_pods() -> None:
    full = full_pod()
    del full["metadata"]["annotations"][c.MIRROR_POD_ANNOTATION]
    for exists in (True, False):
        a = select_pods([full], lambda _k, e=exists: e)
        b = select_pods([slim.pod(full)], lambda _k, e=exists: e)
        assert (len(a.evict), len(a.daemonset), a.warnings) == (
            len(b.evict),
            len(b.daemonset),
            b.warnings,
        )
    assert daemonset_owner(slim.pod(full)) == "app/ds"


def test_node_keeps_labels_taints_cordon_and_conditions() -> None:
    node = {
        "metadata": {
            "name": "n1",
            "uid": "u",
            "resourceVersion": "3",
            "labels": {"node-role.kubernetes.io/control-plane": ""},
            "annotations": {"big": "x" * 1000, c.PRIOR_STATE_ANNOTATION: "{}"},
            "managedFields": [{}],
        },
        "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}], "unschedulable": True},
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "message": "kubelet is ready"}],
            "images": [{"names": ["x"] * 50}],
        },
    }
    out = slim.node(node)
    assert out["metadata"] == {
        "name": "n1",
        "uid": "u",
        "resourceVersion": "3",
        "labels": {"node-role.kubernetes.io/control-plane": ""},
        "annotations": {c.PRIOR_STATE_ANNOTATION: "{}"},  # nmo's record only
    }
    assert out["spec"] == node["spec"]
    node["metadata"]["annotations"] = {"big": "x"}
    assert slim.node(node)["metadata"]["annotations"] == {}, "the map stays: add, not replace"
    del node["metadata"]["annotations"]
    assert "annotations" not in slim.node(node)["metadata"]
    assert out["status"] == {"conditions": [{"type": "Ready", "status": "True"}]}
    assert out["kind"] == "Node"


def test_pdb_keeps_the_disruption_figures() -> None:
    pdb = {
        "metadata": {"name": "web", "namespace": "app", "uid": "u", "managedFields": [{}]},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "maxUnavailable": "10%"},
        "status": {"disruptionsAllowed": 2, "currentHealthy": 20, "desiredHealthy": 18,
                   "expectedPods": 20, "observedGeneration": 1},
    }  # fmt: skip
    out = slim.pdb(pdb)
    assert out["status"] == {
        "disruptionsAllowed": 2,
        "currentHealthy": 20,
        "desiredHealthy": 18,
        "expectedPods": 20,
    }
    assert "managedFields" not in out["metadata"]
