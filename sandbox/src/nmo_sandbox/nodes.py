"""The fake nodes of the sandbox: what they look like and when they count as Ready.

kwok only manages Node objects carrying the ``kwok.x-k8s.io/node=fake``
annotation, so the sandbox creates nodes itself with that annotation and a
capacity large enough for 1000-pod benchmarks. A node is usable once kwok has
reported it Ready *and* the node-lifecycle controller has lifted the
``not-ready``/``unreachable`` taints, which would otherwise keep the scheduler
away from it for a few seconds after creation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nmo_sandbox.components import KWOK_NODE_ANNOTATION

__all__ = ["NODE_CAPACITY", "node_is_ready", "node_manifest"]

NODE_CAPACITY = {"cpu": "32", "memory": "256Gi", "pods": "1000"}
_UNSCHEDULABLE_TAINTS = frozenset(
    {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
)


def node_manifest(name: str, *, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A Node kwok will manage, with ``type=kwok`` and hostname labels."""
    key, value = KWOK_NODE_ANNOTATION
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {key: value, "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **(labels or {}),
            },
        },
        "spec": {},
        # The apiserver keeps a Node's status on create (kubelets register this
        # way) and kwok's node-initialize stage keeps allocatable/capacity.
        "status": {"allocatable": dict(NODE_CAPACITY), "capacity": dict(NODE_CAPACITY)},
    }


def node_is_ready(node: Mapping[str, Any]) -> bool:
    """Ready=True and free of the taints that keep the scheduler away."""
    status = node.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    taints = (node.get("spec") or {}).get("taints") or []
    return ready and not any(t.get("key") in _UNSCHEDULABLE_TAINTS for t in taints)
