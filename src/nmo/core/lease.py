"""The medik8s node lease, shared with NHC and SNR (behavior.md A5, B3).

Whoever holds ``<ns>/node-<node>`` owns the node: a remediation operator will
not fence a node nmo holds, and nmo will not drain a node someone else
holds. :func:`decide` is the pure rule (create, renew, take over an expired
foreign lease, or refuse); :class:`LeaseClient` applies it with optimistic
concurrency (PUT carries the resourceVersion, a conflict re-reads once).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from nmo.api import constants as c
from nmo.core.errors import AlreadyExists, Conflict, NotFound
from nmo.core.kube import Kube, api_path

Lease = dict[str, Any]

MICRO_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def format_micro(t: datetime) -> str:
    return t.astimezone(UTC).strftime(MICRO_FORMAT)


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


class Action(enum.Enum):
    CREATE = "create"
    RENEW = "renew"
    TAKE_OVER = "take-over"
    KEEP = "keep"
    FOREIGN = "foreign"


@dataclass(frozen=True)
class Decision:
    action: Action
    holder: str = ""
    expires: datetime | None = None


class LeaseHeldError(Exception):
    """The lease is validly held by another holder."""

    def __init__(self, holder: str) -> None:
        super().__init__(c.Messages.LEASE_FOREIGN.format(holder=holder))
        self.holder = holder


def decide(
    lease: Lease | None,
    now: datetime,
    *,
    holder: str = c.LEASE_HOLDER,
    renew_after: timedelta = timedelta(minutes=5),
) -> Decision:
    """What to do with the lease to hold it (pure)."""
    if lease is None:
        return Decision(Action.CREATE)
    spec = lease.get("spec") or {}
    current = str(spec.get("holderIdentity") or "")
    duration = timedelta(seconds=int(spec.get("leaseDurationSeconds") or 0))
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    expires = renewed + duration if renewed else None
    if current == holder:
        if renewed is None or now - renewed >= renew_after or expires is None or now > expires:
            return Decision(Action.RENEW, current, expires)
        return Decision(Action.KEEP, current, expires)
    valid = renewed is not None and expires is not None and renewed <= now <= expires
    if current and valid:
        return Decision(Action.FOREIGN, current, expires)
    return Decision(Action.TAKE_OVER, current, expires)


def build_lease(
    node: dict[str, Any], namespace: str, now: datetime, *, holder: str = c.LEASE_HOLDER
) -> Lease:
    name = str(node["metadata"]["name"])
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": c.lease_name(name),
            "namespace": namespace,
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}
            ],
        },
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": c.LEASE_DURATION_SECONDS,
            "acquireTime": format_micro(now),
            "renewTime": format_micro(now),
            "leaseTransitions": 0,
        },
    }


def apply(
    decision: Decision, lease: Lease, now: datetime, *, holder: str = c.LEASE_HOLDER
) -> Lease:
    """The lease object after a RENEW or TAKE_OVER (pure)."""
    out = {**lease, "spec": dict(lease.get("spec") or {})}
    spec = out["spec"]
    if decision.action is Action.TAKE_OVER:
        spec["holderIdentity"] = holder
        spec["acquireTime"] = format_micro(now)
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
    spec["leaseDurationSeconds"] = c.LEASE_DURATION_SECONDS
    spec["renewTime"] = format_micro(now)
    if not spec.get("acquireTime"):
        spec["acquireTime"] = format_micro(now)
    return out


class LeaseClient:
    """Obtains, renews and releases node leases."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        *,
        holder: str = c.LEASE_HOLDER,
        renew_after: timedelta = timedelta(minutes=5),
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.holder = holder
        self.renew_after = renew_after

    def path(self, node_name: str | None = None) -> str:
        return api_path(
            "coordination.k8s.io/v1",
            "leases",
            namespace=self.namespace,
            name=c.lease_name(node_name) if node_name else None,
        )

    async def ensure_namespace(self) -> None:
        try:
            await self.kube.create(
                api_path("v1", "namespaces"),
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {
                        "name": self.namespace,
                        # Shared with NHC and SNR: a Helm release that once
                        # created this namespace must never delete it.
                        "annotations": {"helm.sh/resource-policy": "keep"},
                    },
                },
            )
        except (AlreadyExists, Conflict):
            pass

    async def get(self, node_name: str) -> Lease | None:
        try:
            return await self.kube.get(self.path(node_name))
        except NotFound:
            return None

    async def request(
        self, node: dict[str, Any], now: datetime, *, force: bool = False
    ) -> Decision:
        """Hold the lease for the node or raise LeaseHeldError / KubeError."""
        name = str(node["metadata"]["name"])
        for attempt in range(2):
            lease = await self.get(name)
            decision = decide(lease, now, holder=self.holder, renew_after=self.renew_after)
            if force and decision.action is Action.KEEP:
                decision = Decision(Action.RENEW, decision.holder, decision.expires)
            try:
                if decision.action is Action.FOREIGN:
                    raise LeaseHeldError(decision.holder)
                if decision.action is Action.CREATE:
                    try:
                        await self.kube.create(self.path(), build_lease(node, self.namespace, now))
                    except NotFound:
                        # The lease namespace was deleted under us: recreate it once.
                        await self.ensure_namespace()
                        await self.kube.create(self.path(), build_lease(node, self.namespace, now))
                elif decision.action in (Action.RENEW, Action.TAKE_OVER):
                    assert lease is not None
                    await self.kube.replace(
                        self.path(name), apply(decision, lease, now, holder=self.holder)
                    )
                return decision
            except (Conflict, AlreadyExists):
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    async def release(self, node_name: str) -> bool:
        """Delete the lease if we hold it; a foreign lease is left alone."""
        lease = await self.get(node_name)
        if lease is None:
            return False
        if (lease.get("spec") or {}).get("holderIdentity") != self.holder:
            return False
        try:
            await self.kube.delete(
                self.path(node_name),
                body={
                    "preconditions": {
                        "uid": lease["metadata"]["uid"],
                        "resourceVersion": lease["metadata"]["resourceVersion"],
                    }
                },
            )
        except NotFound:
            return False
        return True
