"""The reads ``nmo plan`` makes, and nothing else (no write, no watch).

For one node: the Node (GET; missing: :class:`NodeMissing`), its pods (one
LIST with ``fieldSelector=spec.nodeName=NODE``), the PodDisruptionBudgets of
the namespaces those pods live in (one LIST per namespace), and whether the
DaemonSet owning a DaemonSet pod still exists (one GET per DaemonSet). The
decision is :func:`nmo.ops.preflight.preflight`'s.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from nmo.core.maintenance.podselect import daemonset_owner, pod_namespace
from nmo.kube.client import Kube, api_path, node_path
from nmo.kube.errors import NotFound
from nmo.ops import preflight

Obj = dict[str, Any]


class NodeMissing(Exception):
    """The node does not exist."""

    def __init__(self, node: str) -> None:
        super().__init__(f'node "{node}" not found')
        self.node = node


@dataclass(frozen=True)
class NodeState:
    node: Obj
    pods: list[Obj]
    pdbs: list[Obj]
    daemonsets: dict[str, bool]  # "namespace/name" -> exists


async def observe(kube: Kube, node: str) -> NodeState:
    """Read what the preflight of ``node`` needs; raises NodeMissing or KubeError."""
    try:
        obj = await kube.get(node_path(node))
    except NotFound as exc:
        raise NodeMissing(node) from exc
    listed = await kube.list_all(
        api_path("v1", "pods"), params={"fieldSelector": f"spec.nodeName={node}"}
    )
    pods = [p for p in listed.get("items") or [] if isinstance(p, dict)]
    pdbs: list[Obj] = []
    for ns in sorted({pod_namespace(p) for p in pods}):
        page = await kube.list_all(api_path("policy/v1", "poddisruptionbudgets", namespace=ns))
        pdbs += [b for b in page.get("items") or [] if isinstance(b, dict)]
    daemonsets: dict[str, bool] = {}
    for key in sorted({k for p in pods if (k := daemonset_owner(p)) is not None}):
        ns, _, name = key.partition("/")
        try:
            await kube.get(api_path("apps/v1", "daemonsets", namespace=ns, name=name))
            daemonsets[key] = True
        except NotFound:  # InvalidName too: no DaemonSet has that name, the pod is evicted
            daemonsets[key] = False
    return NodeState(node=obj, pods=pods, pdbs=pdbs, daemonsets=daemonsets)


async def plan_node(
    kube: Kube,
    node: str,
    pod_selector: Mapping[str, Any] | None = None,
    *,
    critical_last: bool = False,
    pod_rules_namespaces: Collection[str] = (),
) -> preflight.Preflight:
    """Observe ``node`` and compute its preflight."""
    state = await observe(kube, node)
    return preflight.preflight(
        node,
        state.pods,
        state.pdbs,
        lambda key: state.daemonsets.get(key, True),
        pod_selector,
        critical_last=critical_last,
        pod_rules_namespaces=pod_rules_namespaces,
    )
