"""The NodeMaintenance reconciler: reads state, decides, applies (A2-A5, B4-B9).

Level-based: every pass re-reads the CR, the node, its pods and the lease
from the caches, decides with the pure functions of :mod:`nmo.core.status`,
:mod:`nmo.core.nodeplan`, :mod:`nmo.core.lease` and
:mod:`nmo.core.podselect`, and applies the result. Writes carry the
object's resourceVersion, so a stale view answers 409 and the pass is simply
repeated on fresh state. A pass never waits on pods: evictions run in the
drainer and their completion (or a pod deletion seen by the watch) triggers
the next pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nmo.api import constants as c
from nmo.api.models import NodeMaintenance, NodeMaintenanceStatus, Phase, PodReference
from nmo.core import nodeplan, podselect, status
from nmo.core.drain import Drainer
from nmo.core.errors import Conflict, KubeError, NotFound
from nmo.core.events import EventRecorder
from nmo.core.kube import Kube, api_path
from nmo.core.lease import LeaseClient, LeaseHeldError
from nmo.core.metrics import Metrics
from nmo.core.renewer import LeaseRenewers
from nmo.core.watch import Informer

log = logging.getLogger("nmo.maintenance")

NM_PATH = api_path(c.API_VERSION, c.PLURAL)
Obj = dict[str, Any]


@dataclass(frozen=True)
class Result:
    """What the work queue does with the key after a pass."""

    requeue_after: float | None = None


DONE = Result()


@dataclass
class ReconcilerSettings:
    status_interval: float = 1.0  # at most one drain status write per CR per interval
    resync: float = 60.0  # safety requeue while a drain is in progress
    lease_retry: float = 5.0


class Reconciler:
    def __init__(
        self,
        *,
        kube: Kube,
        maintenances: Informer,
        nodes: Informer,
        pods: Informer,
        leases: LeaseClient,
        renewers: LeaseRenewers,
        drainer: Drainer,
        recorder: EventRecorder,
        metrics: Metrics,
        settings: ReconcilerSettings | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = kube
        self.maintenances = maintenances
        self.nodes = nodes
        self.pods = pods
        self.leases = leases
        self.renewers = renewers
        self.drainer = drainer
        self.recorder = recorder
        self.metrics = metrics
        self.settings = settings or ReconcilerSettings()
        self.clock = clock
        self._last_status_write: dict[str, float] = {}
        self._last_written: dict[str, tuple[dict[str, Any], float]] = {}
        self._lease_held: set[str] = set()

    # -- helpers ---------------------------------------------------------
    def _path(self, name: str, subresource: str | None = None) -> str:
        return api_path(c.API_VERSION, c.PLURAL, name=name, subresource=subresource)

    def _remember(self, obj: Obj) -> Obj:
        """Write-through: the cache sees our own writes before the watch does."""
        key = str(obj["metadata"]["name"])
        old = self.maintenances.store.get(key)
        if old is None or int(obj["metadata"].get("resourceVersion", "0") or 0) >= int(
            old["metadata"].get("resourceVersion", "0") or 0
        ):
            self.maintenances.store[key] = obj
        return obj

    async def _write_status(self, raw: Obj, new: NodeMaintenanceStatus) -> Obj:
        """Write the status unless nothing but lastUpdate would change.

        Also skips a status identical to the one this process wrote last
        (within a minute): a server that prunes fields it does not know (the
        Go NMO's CRD has no pendingPodsDetails) must not cause a write per pass.
        """
        name = str(raw["metadata"]["name"])
        current = NodeMaintenance.from_api(raw).status
        fingerprint = new.model_dump(mode="json", exclude={"last_update"})
        last = self._last_written.get(name)
        if not status.differs(current, new) or (
            last is not None and last[0] == fingerprint and time.monotonic() - last[1] < 60
        ):
            return raw
        body = {
            "metadata": {"resourceVersion": raw["metadata"]["resourceVersion"]},
            "status": status.status_patch(new),
        }
        out = await self.kube.merge_patch(self._path(name, "status"), body)
        self._last_status_write[name] = time.monotonic()
        self._last_written[name] = (fingerprint, time.monotonic())
        return self._remember(out)

    async def _node(self, name: str) -> Obj | None:
        node = self.nodes.get(name)
        if node is not None:
            return node
        try:
            return await self.kube.get(api_path("v1", "nodes", name=name))
        except NotFound:
            return None

    def _node_pods(self, node_name: str) -> list[Obj]:
        return self.pods.by_index(node_name)

    async def _daemonset_checker(self, pods: list[Obj]) -> Callable[[str], bool]:
        exists: dict[str, bool] = {}
        for pod in pods:
            owner = podselect.daemonset_owner(pod)
            if owner is None or owner in exists:
                continue
            ns, name = owner.split("/", 1)
            try:
                await self.kube.get(api_path("apps/v1", "daemonsets", namespace=ns, name=name))
                exists[owner] = True
            except NotFound:
                exists[owner] = False
        return lambda key: exists.get(key, False)

    # -- the pass --------------------------------------------------------
    async def reconcile(self, name: str) -> Result:
        raw = self.maintenances.get(name)
        if raw is None:
            return DONE
        nm = NodeMaintenance.from_api(raw)
        if nm.metadata.deletion_timestamp is not None:
            return await self._leave(raw, nm)
        return await self._enter(raw, nm)

    async def _enter(self, raw: Obj, nm: NodeMaintenance) -> Result:
        name, node_name = nm.metadata.name, nm.spec.node_name
        now = self.clock()
        st = nm.status
        if st.phase is Phase.FAILED:
            return DONE  # terminal: node missing, duplicate, or lease lost
        if c.FINALIZER not in nm.metadata.finalizers:
            raw = self._remember(
                await self.kube.merge_patch(
                    self._path(name),
                    {
                        "metadata": {
                            "resourceVersion": nm.metadata.resource_version,
                            "finalizers": [*nm.metadata.finalizers, c.FINALIZER],
                        }
                    },
                )
            )
            log.info("maintenance %s for node %s: begin", name, node_name, extra=_ctx(nm))
            await self.recorder.emit(raw, c.EVENT_BEGIN)
            nm = NodeMaintenance.from_api(raw)

        if self._older_duplicate(nm) is not None:
            log.warning("maintenance %s: node %s already has an older maintenance", name, node_name)
            await self._write_status(raw, status.duplicate(st, node_name, now))
            await self.recorder.emit(raw, c.EVENT_FAILED, warning=True)
            return DONE

        node = await self._node(node_name)
        if node is None:
            log.warning("maintenance %s: node %s not found", name, node_name, extra=_ctx(nm))
            await self._write_status(raw, status.node_not_found(st, node_name, now))
            await self.recorder.emit(raw, c.EVENT_FAILED, warning=True)
            return DONE

        raw, nm = await self._own(raw, nm, node)
        st = nm.status
        pods = self._node_pods(node_name)
        selection = podselect.select_pods(pods, await self._daemonset_checker(pods))
        if st.phase is None:
            refs = [
                PodReference(namespace=podselect.pod_namespace(p), name=podselect.pod_name(p))
                for p in selection.evict
            ]
            st = status.first_pass(st, pending=refs, total_pods=len(pods), now=now)
            raw = await self._write_status(raw, st)
            for warning in selection.warnings:
                log.info("drain of node %s: %s", node_name, warning, extra=_ctx(nm))

        result = await self._hold_lease(raw, nm, node, st, now)
        if result is not None:
            return result
        raw = self.maintenances.get(name) or raw
        st = NodeMaintenance.from_api(raw).status

        patch = nodeplan.enter_patch(node)
        if patch is not None:
            try:
                await self.kube.json_patch(api_path("v1", "nodes", name=node_name), patch)
            except KubeError as exc:
                if exc.status_code in (404, 409, 422):  # failed resourceVersion test
                    log.info("maintenance %s: node %s changed meanwhile, retrying", name, node_name)
                    return Result(requeue_after=0.2)
                raise
            log.info(
                "maintenance %s: node %s labelled, tainted and cordoned",
                name,
                node_name,
                extra=_ctx(nm),
            )
        return await self._drain(raw, nm, st, node_name, selection.evict, now)

    async def _own(self, raw: Obj, nm: NodeMaintenance, node: Obj) -> tuple[Obj, NodeMaintenance]:
        """Persist the ownerReference to the Node (B6) and the node's prior state (B7)."""
        meta: dict[str, Any] = {}
        uid = node["metadata"].get("uid")
        if not any(r.get("uid") == uid for r in nm.metadata.owner_references):
            ref = {
                "apiVersion": "v1",
                "kind": "Node",
                "name": node["metadata"]["name"],
                "uid": uid,
                "blockOwnerDeletion": False,
                "controller": False,
            }
            others = [r for r in nm.metadata.owner_references if r.get("kind") != "Node"]
            meta["ownerReferences"] = [*others, ref]
        if c.PRIOR_STATE_ANNOTATION not in nm.metadata.annotations:
            prior = nodeplan.prior_state(node)
            if nm.status.phase is not None and nm.status.phase is not Phase.FAILED:
                prior = nodeplan.PriorState()  # adopted from NMO: it did not record one
            meta["annotations"] = {c.PRIOR_STATE_ANNOTATION: prior.to_annotation()}
        if not meta:
            return raw, nm
        meta["resourceVersion"] = nm.metadata.resource_version
        raw = self._remember(
            await self.kube.merge_patch(self._path(nm.metadata.name), {"metadata": meta})
        )
        return raw, NodeMaintenance.from_api(raw)

    def _older_duplicate(self, nm: NodeMaintenance) -> str | None:
        """The name of a CR for the same node that owns it before this one (B8).

        A CR that has started (has a phase) outranks one that has not; then
        the older creationTimestamp wins (second resolution), then the name.
        """
        mine = _rank(nm)
        for other_raw in list(self.maintenances.store.values()):
            other = NodeMaintenance.from_api(other_raw)
            if other.metadata.name == nm.metadata.name or other.spec.node_name != nm.spec.node_name:
                continue
            if status.is_duplicate_failure(other.status, other.spec.node_name):
                continue
            if _rank(other) < mine:
                return other.metadata.name
        return None

    async def _hold_lease(
        self, raw: Obj, nm: NodeMaintenance, node: Obj, st: NodeMaintenanceStatus, now: datetime
    ) -> Result | None:
        node_name = nm.spec.node_name
        renewal_failed = self.renewers.failed.get(node_name)
        if (
            node_name in self._lease_held
            and renewal_failed is None
            and self.renewers.active(node_name)
        ):
            return None
        try:
            await self.leases.request(node, now, force=renewal_failed is not None)
        except (LeaseHeldError, KubeError) as exc:
            self._lease_held.discard(node_name)
            self.renewers.stop(node_name)
            foreign = isinstance(exc, LeaseHeldError)
            counted = not (foreign and not (st.drain_progress or 0))
            self.metrics.lease_errors.labels(kind="foreign" if foreign else "api").inc()
            if counted:
                log.warning(
                    "maintenance %s: failed to extend a lease that used to be owned by us: %s",
                    nm.metadata.name,
                    exc,
                    extra=_ctx(nm),
                )
            else:
                log.info(
                    "maintenance %s: failed to obtain a lease that is not owned by us: %s",
                    nm.metadata.name,
                    exc,
                    extra=_ctx(nm),
                )
            new = status.lease_error(st, error=str(exc), counted=counted, now=now)
            if new.phase is Phase.FAILED:
                await self._restore_node(node, nm)
                self.drainer.forget(node_name)
                raw = await self._write_status(raw, new)
                await self.recorder.emit(raw, c.EVENT_FAILED, warning=True)
                log.warning(
                    "maintenance %s failed: %s", nm.metadata.name, new.last_error, extra=_ctx(nm)
                )
                return DONE
            await self._write_status(raw, new)
            return Result(requeue_after=self.settings.lease_retry)
        self._lease_held.add(node_name)
        self.renewers.start(node, nm.metadata.name)
        if st.error_on_lease_count:
            await self._write_status(raw, status.lease_ok(st))
        log.debug("lease for node %s held", node_name, extra=_ctx(nm))
        return None

    async def _drain(
        self,
        raw: Obj,
        nm: NodeMaintenance,
        st: NodeMaintenanceStatus,
        node_name: str,
        evict: list[Obj],
        now: datetime,
    ) -> Result:
        report = self.drainer.sync(node_name, evict)
        if not report.pending:
            new = status.succeeded(st, now)
            if status.differs(st, new):
                raw = await self._write_status(raw, new)
            if st.phase is not Phase.SUCCEEDED:
                created = nm.metadata.creation_timestamp
                if created is not None:
                    self.metrics.drain_duration.observe((now - created).total_seconds())
                log.info(
                    "maintenance %s: drain of node %s complete",
                    nm.metadata.name,
                    node_name,
                    extra=_ctx(nm),
                )
                await self.recorder.emit(raw, c.EVENT_SUCCEEDED)
            self.drainer.forget(node_name)
            return DONE
        new = status.draining(
            st, pending=report.pending, details=report.details, error=report.last_error, now=now
        )
        wait = self.settings.resync if report.next_wake is None else report.next_wake
        if status.differs(st, new):
            since = time.monotonic() - self._last_status_write.get(nm.metadata.name, 0.0)
            if since < self.settings.status_interval:
                return Result(requeue_after=self.settings.status_interval - since)
            await self._write_status(raw, new)
            log.info(
                "drain of node %s: %d pods pending, progress %s%%",
                node_name,
                len(report.pending),
                new.drain_progress,
                extra=_ctx(nm),
            )
        return Result(requeue_after=max(0.05, min(wait, self.settings.resync)))

    async def _restore_node(self, node: Obj, nm: NodeMaintenance) -> None:
        prior = nodeplan.PriorState.from_annotation(
            nm.metadata.annotations.get(c.PRIOR_STATE_ANNOTATION)
        )
        for _ in range(5):
            patch = nodeplan.leave_patch(node, prior)
            if patch is None:
                return
            try:
                await self.kube.json_patch(api_path("v1", "nodes", name=nm.spec.node_name), patch)
                return
            except NotFound:
                return
            except KubeError as exc:
                if exc.status_code not in (409, 422):
                    raise
                node = await self.kube.get(api_path("v1", "nodes", name=nm.spec.node_name))
        raise Conflict("node kept changing while restoring it")

    async def _leave(self, raw: Obj, nm: NodeMaintenance) -> Result:
        """CR deleted: undo everything, then let it go (A3)."""
        name, node_name = nm.metadata.name, nm.spec.node_name
        if c.FINALIZER not in nm.metadata.finalizers:
            return DONE
        if not status.is_duplicate_failure(nm.status, node_name):
            self.renewers.stop(node_name)
            self.drainer.forget(node_name)
            self._lease_held.discard(node_name)
            node = await self._node(node_name)
            if node is not None:
                prior = nodeplan.PriorState.from_annotation(
                    nm.metadata.annotations.get(c.PRIOR_STATE_ANNOTATION)
                )
                uncordon = nodeplan.uncordons(node, prior)
                await self._restore_node(node, nm)
                if uncordon:
                    await self.recorder.emit(
                        node | {"kind": "Node", "apiVersion": "v1"}, c.EVENT_UNCORDON
                    )
                log.info("maintenance %s: node %s restored", name, node_name, extra=_ctx(nm))
            released = await self.leases.release(node_name)
            if released:
                log.info(
                    "maintenance %s: lease for node %s released", name, node_name, extra=_ctx(nm)
                )
        finalizers = [f for f in nm.metadata.finalizers if f != c.FINALIZER]
        try:
            out = await self.kube.merge_patch(
                self._path(name),
                {
                    "metadata": {
                        "resourceVersion": nm.metadata.resource_version,
                        "finalizers": finalizers,
                    }
                },
            )
            self._remember(out)
        except NotFound:
            pass
        await self.recorder.emit(raw, c.EVENT_REMOVED)
        self._last_status_write.pop(name, None)
        self._last_written.pop(name, None)
        log.info("maintenance %s for node %s removed", name, node_name, extra=_ctx(nm))
        return DONE


def _rank(nm: NodeMaintenance) -> tuple[int, datetime, str]:
    started = 0 if nm.status.phase is not None else 1
    created = nm.metadata.creation_timestamp or datetime.max.replace(tzinfo=UTC)
    return (started, created, nm.metadata.name)


def _ctx(nm: NodeMaintenance) -> dict[str, str]:
    return {"maintenance": nm.metadata.name, "node": nm.spec.node_name}
