"""The node lease client: obtains, renews and releases medik8s node leases.

The rules are pure (:mod:`nmo.core.maintenance.lease`); this module applies
them with optimistic concurrency (PUT carries the resourceVersion, a
conflict re-reads once). A renewal never creates a lease: a lease that
disappeared while held (released, or deleted by someone) is reported as a
failed renewal, so a renewer that outlives its maintenance cannot re-create
a released lease.

Every write names nmo's field manager (:data:`FIELD_MANAGER`): the chart's
lease policy (templates/lease-policy.yaml) lets nmo take over another
holder's lease only once it has expired, and a policy has no clock but the
time the API server writes into that manager's managedFields entry.

Time is read from the injected clock *after* the lease is: a ``now`` taken
before the GET would make a foreign renewal that landed in between look like
an invalid (future) renewal and the lease look free to take.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from nmo.api import constants as c
from nmo.core.maintenance.lease import (
    Action,
    Decision,
    Lease,
    apply,
    build_lease,
    decide,
)
from nmo.kube.client import Kube, api_path
from nmo.kube.errors import AlreadyExists, Conflict, NotFound

FIELD_MANAGER = "nmo"  # the manager the User-Agent nmo/<version> would give anyway
_WRITE = {"fieldManager": FIELD_MANAGER}


class LeaseHeldError(Exception):
    """The lease is validly held by another holder."""

    def __init__(self, holder: str) -> None:
        super().__init__(c.Messages.LEASE_FOREIGN.format(holder=holder))
        self.holder = holder


class LeaseLost(Exception):
    """A lease we renew has disappeared (released or deleted by someone)."""

    def __init__(self, node_name: str) -> None:
        super().__init__(f"the lease {c.lease_name(node_name)} no longer exists")
        self.node_name = node_name


class LeaseClient:
    """Obtains, renews and releases node leases."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        *,
        holder: str = c.LEASE_HOLDER,
        renew_after: timedelta = timedelta(minutes=5),
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = kube
        self.clock = clock
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
        self, node: dict[str, Any], *, force: bool = False, renew_only: bool = False
    ) -> Decision:
        """Hold the lease for the node or raise LeaseHeldError / LeaseLost / KubeError.

        ``renew_only`` (background renewals) refuses to create a missing lease.
        """
        name = str(node["metadata"]["name"])
        for attempt in range(2):
            lease = await self.get(name)
            now = self.clock()  # after the read: see the module docstring
            decision = decide(lease, now, holder=self.holder, renew_after=self.renew_after)
            if force and decision.action is Action.KEEP:
                decision = Decision(Action.RENEW, decision.holder, decision.expires)
            try:
                if decision.action is Action.FOREIGN:
                    raise LeaseHeldError(decision.holder)
                if decision.action is Action.CREATE and renew_only:
                    raise LeaseLost(name)
                if decision.action is Action.CREATE:
                    body = build_lease(node, self.namespace, now)
                    try:
                        await self.kube.create(self.path(), body, params=_WRITE)
                    except NotFound:
                        # The lease namespace was deleted under us: recreate it once.
                        await self.ensure_namespace()
                        await self.kube.create(self.path(), body, params=_WRITE)
                elif decision.action in (Action.RENEW, Action.TAKE_OVER):
                    assert lease is not None
                    await self.kube.replace(
                        self.path(name),
                        apply(decision, lease, node, now, holder=self.holder),
                        params=_WRITE,
                    )
                return decision
            except (Conflict, AlreadyExists):
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    async def release(self, node_name: str) -> bool:
        """Delete the lease if we hold it; a foreign lease is left alone.

        A lease without ``holderIdentity`` is nobody's and is deleted too, as
        medik8s/common's InvalidateLease does (an empty holder is someone's).
        """
        lease = await self.get(node_name)
        if lease is None:
            return False
        current = (lease.get("spec") or {}).get("holderIdentity")
        if current is not None and current != self.holder:
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
