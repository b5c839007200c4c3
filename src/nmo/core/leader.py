"""Leader election through a coordination Lease (client-go's algorithm).

Only the leader reconciles; every replica serves the webhook and probes.
A replica becomes leader when the lease is free or its holder has not
renewed it within ``lease_duration`` (measured on this replica's clock
from when it last saw the lease change, as client-go does, so clock skew
between replicas does not matter). The leader renews every
``retry_period``; if it cannot renew for ``renew_deadline`` it steps down
and the process exits so that it restarts as a clean standby. On a clean
shutdown the leader releases the lease so the standby takes over at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nmo.core.errors import AlreadyExists, Conflict, KubeError, NotFound
from nmo.core.kube import Kube, api_path
from nmo.core.maintenance.lease import format_micro

log = logging.getLogger("nmo.leader")


@dataclass
class LeaderSettings:
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


class LeadershipLost(Exception):
    """The leader could not renew its lease in time."""


class LeaderElector:
    def __init__(self, kube: Kube, settings: LeaderSettings) -> None:
        self.kube = kube
        self.s = settings
        self.is_leader = False
        self._observed: tuple[str, str] | None = None  # (holder, renewTime)
        self._observed_at = 0.0
        self.transitions = 0

    @property
    def path(self) -> str:
        return api_path(
            "coordination.k8s.io/v1", "leases", namespace=self.s.namespace, name=self.s.name
        )

    def _body(self, lease: dict[str, Any] | None) -> dict[str, Any]:
        now = format_micro(datetime.now(UTC))
        spec = dict((lease or {}).get("spec") or {})
        if spec.get("holderIdentity") != self.s.identity:
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if lease else 0)
            spec["acquireTime"] = now
        spec.update(
            holderIdentity=self.s.identity,
            leaseDurationSeconds=int(self.s.lease_duration),
            renewTime=now,
        )
        meta: dict[str, Any] = {"name": self.s.name, "namespace": self.s.namespace}
        if lease:
            meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    async def try_acquire_or_renew(self) -> bool:
        try:
            lease: dict[str, Any] | None = await self.kube.get(self.path)
        except NotFound:
            lease = None
        if lease is None:
            try:
                await self.kube.create(
                    api_path("coordination.k8s.io/v1", "leases", namespace=self.s.namespace),
                    self._body(None),
                )
                return True
            except (AlreadyExists, Conflict):
                return False
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        observed = (holder, str(spec.get("renewTime") or ""))
        if observed != self._observed:
            self._observed, self._observed_at = observed, time.monotonic()
        expired = time.monotonic() - self._observed_at > self.s.lease_duration
        if holder and holder != self.s.identity and not expired:
            return False
        try:
            await self.kube.replace(self.path, self._body(lease))
        except Conflict:
            return False
        return True

    async def run(self, lead: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Wait for leadership, then run ``lead`` while renewing; raise on loss."""
        log.info("leader election: waiting for lease %s/%s", self.s.namespace, self.s.name)
        while True:
            try:
                if await self.try_acquire_or_renew():
                    break
            except KubeError as exc:
                log.warning("leader election: %s", exc)
            await asyncio.sleep(self.s.retry_period)
        self.is_leader = True
        self.transitions += 1
        log.info("leader election: became leader as %s", self.s.identity)
        leading = asyncio.create_task(lead(), name="leader-work")
        try:
            await self._renew_until_lost(leading)
        finally:
            self.is_leader = False
            leading.cancel()

    async def _renew_until_lost(self, leading: asyncio.Task[None]) -> None:
        last_ok = time.monotonic()
        while not leading.done():
            await asyncio.sleep(self.s.retry_period)
            try:
                if await self.try_acquire_or_renew():
                    last_ok = time.monotonic()
                    continue
            except KubeError as exc:
                log.warning("leader election: renew failed: %s", exc)
            if time.monotonic() - last_ok > self.s.renew_deadline:
                raise LeadershipLost(
                    f"could not renew leader lease within {self.s.renew_deadline}s"
                )
        leading.result()

    async def release(self) -> None:
        """Give the lease up (clean shutdown) so a standby takes over at once."""
        if not self.is_leader:
            return
        try:
            lease = await self.kube.get(self.path)
            if (lease.get("spec") or {}).get("holderIdentity") != self.s.identity:
                return
            lease["spec"]["holderIdentity"] = ""
            lease["spec"]["leaseDurationSeconds"] = 1
            await self.kube.replace(self.path, lease)
            log.info("leader election: released lease")
        except KubeError as exc:
            log.warning("leader election: release failed: %s", exc)
