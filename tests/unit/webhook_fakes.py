"""Fakes shared by the webhook unit tests: a cluster answered from dicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import builders
from nmo.webhooks.validators import LookupFailed

Obj = dict[str, Any]
GUARD = {"app": "guard"}


# The webhook tests' objects: nodes with their hostname label, the CR a review
# carries (``nm(node)``: named "nm"), the etcd quorum guard's PDB and pods.
node = partial(builders.node, hostname=True)
nm = partial(builders.nm, "nm", uid="uid-{name}")


def pdb(allowed: int, *, name: str = "etcd-guard-pdb") -> Obj:
    return builders.pdb(
        name, namespace="openshift-etcd", match_labels=GUARD, min_available=2, allowed=allowed
    )


def guard(
    node_name: str,
    ready: str | None,
    *,
    labels: Mapping[str, str] = GUARD,
    conditions: list[Obj] | None = None,
) -> Obj:
    if conditions is None:
        conditions = [] if ready is None else [{"type": "Ready", "status": ready}]
    return builders.pod(
        f"etcd-guard-{node_name}", labels=labels, node=node_name, conditions=conditions
    )


@dataclass
class FakeLookups:
    nodes: dict[str, Obj] = field(default_factory=dict)
    existing: set[str] = field(default_factory=set)
    openshift: bool = False
    pdbs: list[Obj] = field(default_factory=list)
    pods: list[Obj] = field(default_factory=list)
    failing: set[str] = field(default_factory=set)
    claims: dict[str, str] = field(default_factory=dict)
    pod_queries: int = 0
    node_pods: list[Obj] = field(default_factory=list)  # every pod, filtered by spec.nodeName
    node_pdbs: list[Obj] = field(default_factory=list)
    pod_deletion: bool | None = True  # may nmo delete pods (onTimeout Delete)
    deletion_checks: int = 0
    requesters: list[str] = field(default_factory=list)  # who each review came from

    def for_requester(self, requester: str) -> FakeLookups:
        self.requesters.append(requester)
        return self

    def _maybe_fail(self, what: str) -> None:
        if what in self.failing:
            raise LookupFailed(f"{what} exploded")

    async def get_node(self, name: str) -> Obj | None:
        self._maybe_fail("node")
        return self.nodes.get(name)

    async def claim_node(self, node_name: str, claimant: str, *, dry_run: bool = False) -> bool:
        self._maybe_fail("claim")
        if node_name in self.existing:
            return False
        if self.claims.get(node_name, claimant) != claimant:
            return False
        if not dry_run:
            self.claims[node_name] = claimant
        return True

    def release_node(self, node_name: str, claimant: str) -> None:
        if self.claims.get(node_name) == claimant:
            del self.claims[node_name]

    async def is_openshift(self) -> bool:
        self._maybe_fail("discovery")
        return self.openshift

    async def list_etcd_pdbs(self) -> Sequence[Obj]:
        self._maybe_fail("pdbs")
        return self.pdbs

    async def list_etcd_pods(self, selector: Mapping[str, Any] | None) -> Sequence[Obj]:
        self._maybe_fail("pods")
        self.pod_queries += 1
        return self.pods

    async def node_budgets(self, node_name: str) -> tuple[Sequence[Obj], Sequence[Obj]]:
        self._maybe_fail("budgets")
        pods = [p for p in self.node_pods if (p.get("spec") or {}).get("nodeName") == node_name]
        return pods, self.node_pdbs

    async def may_delete_pods(self) -> bool | None:
        self.deletion_checks += 1
        self._maybe_fail("access")
        return self.pod_deletion
