"""Cache transforms keep what nmo reads and nothing else."""

from __future__ import annotations

import gc
import json
import tracemalloc
from typing import Any

import pytest

import builders
from nmo.api import constants as c
from nmo.controller.recorder import involved
from nmo.core.maintenance import nodepatch
from nmo.core.maintenance.admission import unavailable
from nmo.core.maintenance.lease import owner_reference
from nmo.core.maintenance.nodepatch import PriorState
from nmo.core.maintenance.podselect import daemonset_owner, select_pods
from nmo.core.maintenance.quorum import is_control_plane
from nmo.kube import slim
from nmo.kube.informer import Informer


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
    assert [dict(x) for x in out["status"]["conditions"]] == [{"type": "Ready", "status": "True"}]
    assert out["kind"] == "Node"


def test_node_keeps_nmos_lifecycle_conditions_whole() -> None:
    """--node-conditions: a pass compares them with what it wants (status,
    reason, message, lastTransitionTime); every other condition but Ready goes."""
    ours = {
        "type": c.NODE_CONDITION_IN_PROGRESS,
        "status": "True",
        "reason": "NodeCordoned",
        "message": "NodeMaintenance nm-1: node cordoned",
        "lastTransitionTime": "2026-12-01T12:00:00Z",
        "lastHeartbeatTime": "2026-12-01T12:00:00Z",
    }
    status = {
        "conditions": [
            {"type": "MemoryPressure", "status": "False", "message": "x"},
            {"type": "Ready", "status": "True", "message": "kubelet is ready"},
            ours,
        ]
    }
    out = slim.node({"metadata": {"name": "n1"}, "status": status})
    kept = {k: v for k, v in ours.items() if k != "lastHeartbeatTime"}
    assert [dict(x) for x in out["status"]["conditions"]] == [
        {"type": "Ready", "status": "True"},
        kept,
    ]
    alone = slim.node({"metadata": {"name": "n1"}, "status": {"conditions": [ours]}})
    assert [dict(x) for x in alone["status"]["conditions"]] == [kept]


def kwok_node(name: str = "n1", **kw: Any) -> dict[str, Any]:
    """A Node as the API server serves a kwok node (labels, annotations, five
    conditions, addresses, node info, managedFields), decoded from JSON as the
    informer gets it: every string its own object."""
    out = builders.node(
        name,
        uid=f"{name}-0f2c9a4e-8d8b-4d6e-a9f3-5a1e2b3c4d5e"[-36:],
        resource_version="1234567",
        **{
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "type": "kwok",
            },
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            **kw,
        },
    )
    out |= {"apiVersion": "v1", "kind": "Node"}
    out["metadata"] |= {
        "creationTimestamp": "2026-12-05T15:48:15Z",
        "managedFields": [{"manager": "kwok", "fieldsV1": {"f:status": {"f:phase": {}}}}],
    }
    ready = (out.get("status") or {}).get("conditions") or []
    pressure = [
        {"type": t, "status": "False", "reason": f"KubeletHasNo{t}", "message": f"no {t}"}
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable")
    ]
    stamps = {
        "lastHeartbeatTime": "2026-12-05T15:49:29Z",
        "lastTransitionTime": "2026-12-05T15:48:15Z",
    }
    out["status"] = {
        "phase": "Running",
        "capacity": {"cpu": "32", "memory": "256Gi", "pods": "1k"},
        "conditions": [{**cond, **stamps} for cond in [*ready, *pressure]],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        "nodeInfo": {"kubeletVersion": "kwok-0.8.0", "architecture": "amd64"},
    }
    decoded: dict[str, Any] = json.loads(json.dumps(out))
    return decoded


TAINTS = [
    {
        "key": c.UNSCHEDULABLE_TAINT_KEY,
        "effect": c.TAINT_EFFECT,
        "timeAdded": "2026-12-05T15:50:00Z",
    },
    {"key": "gpu", "value": "a100", "effect": "NoExecute"},
]
RECORD = PriorState(unschedulable=True, taints=(c.UNSCHEDULABLE_TAINT_KEY,), maintenance="uid-nm")


@pytest.mark.parametrize(
    "node",
    [
        kwok_node(ready=True),
        kwok_node(ready=False),
        kwok_node(),  # no Ready condition yet
        kwok_node(role=c.CONTROL_PLANE_ROLE_LABEL, ready=True),
        kwok_node(role=c.MASTER_ROLE_LABEL, ready=True, taints=TAINTS, unschedulable=True),
        kwok_node(prior=RECORD, taints=TAINTS, unschedulable=True, ready=True),
        kwok_node(labels={c.EXCLUDE_FROM_REMEDIATION_LABEL: "true"}, annotations=None),
        builders.node("bare", uid="u"),  # no labels, annotations, taints or status at all
        builders.node("odd", uid="u") | {"status": {"conditions": [{"type": "Ready"}]}},
    ],
    ids=["ready", "not-ready", "no-ready", "control-plane", "master-cordoned", "recorded",
         "labelled-no-annotations", "bare", "ready-without-status"],
)  # fmt: skip
def test_node_readers_answer_alike_on_slim_nodes(node: dict[str, Any]) -> None:
    """Every reader of the node cache gives the same answer on the slim copy."""
    out = slim.node(node)

    def answers(n: dict[str, Any]) -> list[Any]:
        restored = [
            nodepatch.restore(n, prior, forget=forget)
            for prior in (None, RECORD, nodepatch.recorded_prior(n))
            for forget in (False, True)
        ]
        return [
            unavailable(n),
            is_control_plane(n),
            nodepatch.prior_state(n),
            nodepatch.recorded_prior(n),
            nodepatch.prior_for(n, "uid-nm"),
            nodepatch.in_maintenance(n),
            nodepatch.has_label(n),
            nodepatch.is_cordoned(n),
            nodepatch.enter_patch(n),
            nodepatch.enter_patch(n, record_for="uid-nm"),
            nodepatch.enter_patch(n, record_for="uid-other"),
            [(r.ops, r.uncordon, r.kept_cordoned, r.removed, r.kept) for r in restored],
            owner_reference(n) if n["metadata"].get("uid") else None,
            involved(n | {"kind": "Node", "apiVersion": "v1"}),
        ]

    assert answers(out) == answers(node)


def test_node_parts_shared_by_many_nodes_refuse_writes() -> None:
    a, b = slim.node(kwok_node("a", ready=True)), slim.node(kwok_node("b", ready=True))
    assert a["status"] is b["status"] and a["spec"] is b["spec"]
    assert a["metadata"]["labels"] is b["metadata"]["labels"]
    with pytest.raises(TypeError):
        a["status"]["conditions"][0]["status"] = "False"  # type: ignore[index]
    with pytest.raises(TypeError):
        a["metadata"]["labels"][c.EXCLUDE_FROM_REMEDIATION_LABEL] = "true"
    assert unavailable(b) is False


NODE_BUDGET = 1024  # bytes of Python objects per cached kwok node (measured: about 600)


def test_node_cache_stays_within_a_budget_per_node() -> None:
    """The node informer's store, built from N kwok nodes as served, holds
    less than NODE_BUDGET bytes per node once the served objects are gone (a
    kwok node as served is about 3.8 KB of JSON; its slim copy took 3.3 KB
    of Python objects while it kept every label and condition)."""
    count = 2000
    cache = Informer(None, "/api/v1/nodes", name="nodes", transform=slim.node)  # type: ignore[arg-type]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        nodes = [kwok_node(f"kwok-node-{i:05d}", ready=True) for i in range(count)]
        for i, obj in enumerate(nodes):
            cache._apply("ADDED", obj)
            nodes[i] = {}
        del nodes, obj
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(cache.store) == count
    per_node = (after - before) / count
    assert per_node < NODE_BUDGET, f"{per_node:.0f} bytes per cached node"


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
