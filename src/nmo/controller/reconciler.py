"""The NodeMaintenance pass: observe, plan, apply (behavior.md A2-A5, B4-B9).

Level-based: every pass reads the CR, the node, its pods and the memory
record (:meth:`Reconciler.observe`), hands them to the pure planner
(:mod:`nmo.core.maintenance.planner`) and applies the plan
(:meth:`Reconciler.apply`): at most one write of each kind (CR metadata,
lease, status, node), then the evictions and the events. Writes carry the
object's resourceVersion, so a stale view answers 409 and the pass is
repeated on fresh state. A pass never waits on pods: evictions run as tasks
and their answers (or a pod event seen by the node's pod watch) wake the
next pass.

Order matters and is fixed here: entering, the finalizer is written first,
then the lease, then the node (label, taints, cordon); only then do
evictions start (the status is written while they run); leaving, the node is
restored and the lease released before the finalizer goes, so a failure
half-way leaves the CR (and its finalizer) in place to retry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from nmo.api import constants as c
from nmo.api.models import NodeMaintenance, Phase
from nmo.controller.evictor import Evictor
from nmo.controller.leaseholder import LeaseClient, LeaseHeldError
from nmo.controller.ledger import Budget
from nmo.controller.memory import Memories, Memory
from nmo.controller.notifier import Notifier
from nmo.controller.quorumguard import QuorumGuard
from nmo.controller.recorder import EventRecorder
from nmo.controller.renewer import LeaseRenewers
from nmo.core.maintenance import admission, nodepatch, planner, podselect, transitions
from nmo.core.maintenance.admission import Admission
from nmo.core.maintenance.notifications import for_pass
from nmo.core.maintenance.observed import (
    DONE,
    Emit,
    LeaseStep,
    Observed,
    Plan,
    Recall,
    Result,
    Work,
)
from nmo.kube.client import Kube, api_path, nm_path, node_path
from nmo.kube.errors import Conflict, InvalidName, KubeError, NotFound
from nmo.kube.informer import Informer
from nmo.telemetry.metrics import Metrics

# How long a leave waits for a renewal PUT in flight before releasing the lease.
RENEWAL_SETTLE_SECONDS = 10.0

log = logging.getLogger("nmo.maintenance")

NM_PATH = nm_path()
Obj = dict[str, Any]

__all__ = ["NM_PATH", "Reconciler", "Result"]


class Reconciler:
    def __init__(
        self,
        *,
        kube: Kube,
        maintenances: Informer,
        nodes: Informer,
        memories: Memories,
        leases: LeaseClient,
        renewers: LeaseRenewers,
        evictor: Evictor,
        recorder: EventRecorder,
        metrics: Metrics,
        watch_pods: Callable[[Memory], None],
        pdbs: Informer | None = None,
        budget: Budget | None = None,
        wake_queued: Callable[[], None] = lambda: None,
        settings: planner.PlanSettings | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        notifier: Notifier | None = None,
        quorum: QuorumGuard | None = None,
    ) -> None:
        self.kube = kube
        self.maintenances = maintenances
        self.nodes = nodes
        self.memories = memories
        self.leases = leases
        self.renewers = renewers
        self.evictor = evictor
        self.recorder = recorder
        self.metrics = metrics
        self.watch_pods = watch_pods
        self.pdbs = pdbs
        self.budget = budget
        self.wake_queued = wake_queued  # a budget slot was freed: look at the queue again
        self.settings = settings or planner.PlanSettings()
        self.clock = clock
        self.notifier = notifier
        self.quorum = quorum  # re-checks etcd quorum when a queued maintenance starts

    # -- the pass ----------------------------------------------------------
    async def reconcile(self, name: str) -> Result:
        """One pass; an API failure is recorded in lastError, then retried with backoff."""
        try:
            return await self._pass(name)
        except Conflict:
            raise  # stale view: repeated on fresh state at once, not an error
        except KubeError as exc:
            await self._report(name, exc)
            raise

    async def _report(self, name: str, exc: KubeError) -> None:
        """Put a failed request's message in lastError, as the Go NMO's onReconcileError.

        Only lastError and lastUpdate are patched (no resourceVersion: nothing
        else of the status is touched). A repeat of the same error within a
        heartbeat is not written again, so the backoff's retries are no write
        storm. If this write fails too (no RBAC for the status), the log has it.
        """
        raw = self.maintenances.get(name)
        if raw is None:
            return
        nm = NodeMaintenance.from_api(raw)
        new = planner.api_error_status(nm, error=str(exc), now=self.clock(), settings=self.settings)
        if new is None:
            return
        body = new.to_api()
        patch = {"status": {"lastError": body["lastError"], "lastUpdate": body["lastUpdate"]}}
        try:
            self._remember(await self.kube.merge_patch(nm_path(name, "status"), patch))
        except KubeError as again:
            log.warning(
                "maintenance %s: could not record the error in its status: %s",
                name,
                again,
                extra={"maintenance": name, "node": nm.spec.node_name},
            )

    async def _pass(self, name: str) -> Result:
        raw = self.maintenances.get(name)
        if raw is None:
            self.memories.forget(name)
            return DONE
        nm = NodeMaintenance.from_api(raw)
        record = self.memories.recall(name, nm.spec.node_name)
        observed = await self.observe(nm, record)
        if self._wants_admission(observed):
            assert self.budget is not None
            held = await self._quorum_refusal(observed)
            if held is not None:  # stays queued, and takes no budget slot
                plan = planner.plan(replace(observed, admission=held), self.settings)
                return await self.apply(raw, observed, plan, record)
            observed = replace(observed, admission=await self.budget.admit(nm))
            if observed.admission is not None and observed.admission.admit:
                # Admissions are in creation order (the ledger admits the head of
                # the queue only); the next head is looked at once this pass is done.
                try:
                    return await self.apply(
                        raw, observed, planner.plan(observed, self.settings), record
                    )
                finally:
                    self.wake_queued()
        plan = planner.plan(observed, self.settings)
        return await self.apply(raw, observed, plan, record)

    # -- observe -----------------------------------------------------------
    async def observe(self, nm: NodeMaintenance, record: Memory) -> Observed:
        node_name = nm.spec.node_name
        others = tuple(
            NodeMaintenance.from_api(o)
            for o in self.maintenances.by_index(node_name)
            if o["metadata"]["name"] != nm.metadata.name
        )
        node: Obj | None = None
        if planner.needs_node(nm):
            node = await self._node(node_name)
        elif planner.resumable(nm):
            node = self.nodes.get(node_name)  # the node watch wakes it when one is added
        pods: tuple[Obj, ...] | None = None
        if node is not None and record.pods is not None and record.pods.synced.is_set():
            pods = tuple(record.pods.store.values())
            await self._daemonsets(record, pods)
        return Observed(
            nm=nm,
            others=others,
            node=node,
            pods=pods,
            daemonsets=record.daemonsets,
            drain=record.drain,
            recall=Recall(
                lease_held=record.lease_held and record.renewing,
                renewal_error=record.renewal_error,
                status_written_ago=record.written_ago(),
                last_written=record.last_written,
            ),
            now=self.clock(),
            tick=asyncio.get_running_loop().time(),
            pdbs=self._pdbs(record),
        )

    async def _quorum_refusal(self, obs: Observed) -> Admission | None:
        """The webhook checked etcd quorum at CREATE; a maintenance that waited
        in the queue (Pending) is checked again before it starts (issue 20)."""
        if self.quorum is None or obs.node is None or obs.nm.status.phase is not Phase.PENDING:
            return None
        return await self.quorum.refusal(obs.node)

    def _wants_admission(self, obs: Observed) -> bool:
        """A CR the budget decides on: not begun (or resuming: its missing node is
        back), not deleted, and not about to fail (a missing node or an older CR
        for its node fail it without a slot)."""
        nm = obs.nm
        return (
            self.budget is not None
            and admission.awaits_start(nm, node_exists=obs.node is not None)
            and obs.node is not None
            and planner.older_duplicate(nm, obs.others) is None
        )

    def _pdbs(self, record: Memory) -> dict[str, Obj]:
        """The PodDisruptionBudgets the node's drain states name (for the Blocked message)."""
        if self.pdbs is None:
            return {}
        out: dict[str, Obj] = {}
        for key, state in record.drain.items():
            if state.pdb:
                name = f"{key.split('/', 1)[0]}/{state.pdb}"
                if name not in out and (pdb := self.pdbs.get(name)) is not None:
                    out[name] = pdb
        return out

    async def _node(self, name: str) -> Obj | None:
        node = self.nodes.get(name)
        if node is not None:
            return node
        try:
            return await self.kube.get(node_path(name))
        except NotFound:
            return None

    async def _daemonsets(self, record: Memory, pods: tuple[Obj, ...]) -> None:
        """Learn, once per maintenance, whether each DaemonSet owner exists."""
        for pod in pods:
            owner = podselect.running_daemonset_owner(pod)
            if owner is None or owner in record.daemonsets:
                continue
            ns, name = owner.split("/", 1)
            try:
                await self.kube.get(api_path("apps/v1", "daemonsets", namespace=ns, name=name))
                record.daemonsets[owner] = True
            except InvalidName as exc:
                # No DaemonSet can have that name: the pod is evicted, as kubectl
                # would, and nothing is requested for it.
                log.warning(
                    "pod %s names DaemonSet owner %r, not a valid name: evicting it as unmanaged",
                    podselect.pod_key(pod),
                    name,
                    extra={"node": record.node, "error": str(exc)},
                )
                record.daemonsets[owner] = False
            except NotFound:
                record.daemonsets[owner] = False

    # -- apply -------------------------------------------------------------
    async def apply(self, raw: Obj, obs: Observed, plan: Plan, record: Memory) -> Result:
        if obs.nm.metadata.deletion_timestamp is not None:
            return await self._apply_leave(raw, obs, plan, record)
        return await self._apply_enter(raw, obs, plan, record)

    async def _apply_enter(self, raw: Obj, obs: Observed, plan: Plan, record: Memory) -> Result:
        name = obs.nm.metadata.name
        if plan.metadata:
            raw = await self._patch_metadata(raw, plan.metadata)
        if plan.restore:
            return await self._apply_abort(raw, obs, plan, record)
        if plan.work is Work.RUN:
            self.watch_pods(record)
        if plan.lease in (LeaseStep.REQUEST, LeaseStep.FORCE) and obs.node is not None:
            if not record.lease_held and not await self._confirmed(obs.nm):
                return DONE
            try:
                await self.leases.request(obs.node, force=plan.lease is LeaseStep.FORCE)
            except (LeaseHeldError, KubeError) as exc:
                foreign = isinstance(exc, LeaseHeldError)
                self.metrics.lease_errors.labels(kind="foreign" if foreign else "api").inc()
                record.stop_renewer()
                plan = planner.plan_lease_failure(
                    obs, error=str(exc), foreign=foreign, settings=self.settings
                )
                if plan.work is Work.STOP:
                    # Restored and released before Failed is written: Failed is
                    # terminal, so an undo that fails must leave the CR to be retried.
                    plan = await self._undo(obs, plan, record)
                raw = await self._write_status(raw, plan, record)
                await self._finish(raw, obs, plan, record)
                return plan.result
            if record.forgotten:
                return DONE  # the CR went away during the request
            self.renewers.start(record, obs.node)
        if plan.node_patch is not None and obs.node is not None:
            try:
                await self.kube.json_patch(node_path(obs.nm.spec.node_name), plan.node_patch)
            except KubeError as exc:
                if exc.status_code != 404 and not _changed_meanwhile(exc):
                    raise
                log.info(
                    "maintenance %s: node %s changed meanwhile, retrying",
                    name,
                    obs.nm.spec.node_name,
                )
                # Nothing more before the node is cordoned: the next pass re-plans
                # it all; only the event of the finalizer written above fires now.
                begun = tuple(e for e in plan.events if e.event == c.EVENT_BEGIN)
                await self._finish(raw, obs, replace(plan, events=begun, notes=()), record)
                return Result(requeue_after=0.2)
            log.info(
                "maintenance %s: node %s labelled, tainted and cordoned",
                name,
                obs.nm.spec.node_name,
                extra=_ctx(obs.nm),
            )
        for key in plan.drop:
            record.drain.pop(key, None)
        if plan.evict and not record.forgotten:
            # The node is cordoned: evictions run while the status is written.
            self.evictor.start(record, plan.evict)
        forced = await self._force(obs, plan, record)
        raw = await self._write_status(raw, plan, record)
        if plan.timed_out is not None:
            self.metrics.drain_timeouts.labels(action=plan.timed_out.value).inc()
        await self._finish(raw, obs, replace(plan, events=(*plan.events, *forced)), record)
        return plan.result

    async def _force(self, obs: Observed, plan: Plan, record: Memory) -> tuple[Emit, ...]:
        """onTimeout Delete: delete the pods the plan names (PDBs bypassed by opt-in)."""
        if not plan.force or record.forgotten:
            return ()
        done = await self.evictor.force(record, plan.force, generation=obs.nm.metadata.generation)
        events = []
        for (pod, grace), deleted in zip(plan.force, done, strict=True):
            if deleted:
                key = podselect.pod_key(pod)
                events.append(
                    Emit(
                        (
                            c.EVENT_POD_FORCE_DELETED,
                            f"drain deadline: deleted pod {key} with its grace period of "
                            f"{grace}s (onTimeout Delete bypasses PodDisruptionBudgets)",
                        ),
                        warning=True,
                    )
                )
        return tuple(events)

    async def _apply_abort(self, raw: Obj, obs: Observed, plan: Plan, record: Memory) -> Result:
        """onTimeout Abort: node restored, lease released, then Failed (terminal)."""
        plan = await self._undo(obs, plan, record)
        raw = await self._write_status(raw, plan, record)
        if plan.timed_out is not None:
            self.metrics.drain_timeouts.labels(action=plan.timed_out.value).inc()
        await self._finish(raw, obs, plan, record)
        return plan.result

    async def _undo(self, obs: Observed, plan: Plan, record: Memory) -> Plan:
        """Stop the record's work, restore the node, release the lease (leave, abort,
        lease exhaustion); the plan's events still to record are returned.

        The node's events (UncordonNode) are recorded as soon as the node is
        restored, as the Go NMO does: a later step that fails (the lease, the
        finalizer, the status) is retried on a node that needs no uncordon,
        and the event would otherwise never be recorded.
        """
        nm = obs.nm
        record.stop()  # no renewal, eviction or pod watch outlives the decision to leave
        await record.renewal_settled(RENEWAL_SETTLE_SECONDS)
        if plan.node_patch:
            await self._restore(obs, plan.node_patch)
            log.info(
                "maintenance %s: node %s restored",
                nm.metadata.name,
                nm.spec.node_name,
                extra=_ctx(nm),
            )
            if obs.node is not None:
                target = obs.node | {"kind": "Node", "apiVersion": "v1"}
                for emit in plan.events:
                    if emit.target == "node":
                        await self.recorder.emit(target, emit.event, warning=emit.warning)
            plan = replace(plan, events=tuple(e for e in plan.events if e.target != "node"))
        if plan.lease is LeaseStep.RELEASE and await self.leases.release(nm.spec.node_name):
            log.info(
                "maintenance %s: lease for node %s released",
                nm.metadata.name,
                nm.spec.node_name,
                extra=_ctx(nm),
            )
        return plan

    async def _apply_leave(self, raw: Obj, obs: Observed, plan: Plan, record: Memory) -> Result:
        plan = await self._undo(obs, plan, record)
        if plan.metadata:
            try:
                raw = await self._patch_metadata(raw, plan.metadata)
            except NotFound:
                pass
        await self._finish(raw, obs, plan, record)
        return plan.result

    async def _finish(self, raw: Obj, obs: Observed, plan: Plan, record: Memory) -> None:
        """Events, logs, metrics and the record's lifecycle: the end of every pass."""
        nm = obs.nm
        level = logging.WARNING if any(e.warning for e in plan.events) else logging.INFO
        for note in plan.notes:
            log.log(level, "%s", note, extra=_ctx(nm))
        if plan.drain_seconds is not None:
            self.metrics.drain_duration.observe(plan.drain_seconds)
        for emit in plan.events:
            if emit.target == "node":
                if obs.node is not None:
                    target = obs.node | {"kind": "Node", "apiVersion": "v1"}
                    await self.recorder.emit(target, emit.event, warning=emit.warning)
            else:
                await self.recorder.emit(raw, emit.event, warning=emit.warning)
        if plan.work is Work.STOP:
            record.stop()
        elif plan.work is Work.FORGET:
            self.memories.forget(nm.metadata.name)
        self._notify(raw, obs, plan)
        # Let go or failed (its node restored): the budget slot is free again.
        if (
            self.budget is not None
            and plan.work in (Work.STOP, Work.FORGET)
            and await self.budget.release(nm.metadata.name)
        ):
            self.wake_queued()

    def _notify(self, raw: Obj, obs: Observed, plan: Plan) -> None:
        """Queue the pass's notifications (``raw``: the CR as the pass left it)."""
        if self.notifier is None:
            return
        status = raw.get("status")
        for note in for_pass(
            obs.nm, status, plan.events, now=obs.now, operator=self.notifier.operator
        ):
            self.notifier.enqueue(note)

    # -- writes ------------------------------------------------------------
    async def _confirmed(self, nm: NodeMaintenance) -> bool:
        """Does the CR still exist, read from the apiserver rather than the cache?

        A lease this process does not hold is only taken for a CR confirmed
        by a live read. The cache may be behind a watch gap (the CR and its
        lease deleted while the watch was down, a renewal that found its
        lease gone, a new leader with a stale cache): taking the lease then
        would re-create a lease released with its CR, and nothing would
        ever release it again. One GET per acquisition.
        """
        name = nm.metadata.name
        try:
            live = await self.kube.get(nm_path(name))
        except NotFound:
            live = None
        if live is None or live["metadata"].get("uid") != nm.metadata.uid:
            log.info(
                "maintenance %s: gone from the apiserver, not in the cache yet; lease not taken",
                name,
                extra={"maintenance": name},
            )
            self.memories.forget(name)
            return False
        self._remember(live)
        return True

    def _remember(self, obj: Obj) -> Obj:
        """Write-through: the cache sees our own writes before the watch does."""
        key = str(obj["metadata"]["name"])
        old = self.maintenances.store.get(key)
        if old is None:
            return obj
        if int(obj["metadata"].get("resourceVersion", "0") or 0) >= int(
            old["metadata"].get("resourceVersion", "0") or 0
        ):
            self.maintenances.store[key] = obj
        return obj

    async def _patch_metadata(self, raw: Obj, metadata: Obj) -> Obj:
        body = {"metadata": {**metadata, "resourceVersion": raw["metadata"]["resourceVersion"]}}
        out = await self.kube.merge_patch(nm_path(raw["metadata"]["name"]), body)
        return self._remember(out)

    async def _write_status(self, raw: Obj, plan: Plan, record: Memory) -> Obj:
        if plan.status is None:
            return raw
        body = {
            "metadata": {"resourceVersion": raw["metadata"]["resourceVersion"]},
            "status": transitions.status_patch(plan.status),
        }
        out = await self.kube.merge_patch(nm_path(raw["metadata"]["name"], "status"), body)
        record.wrote(planner.fingerprint(plan.status))
        if plan.drain_pending:
            log.info(
                "drain of node %s: %d pods pending, progress %s%%",
                record.node,
                plan.drain_pending,
                plan.status.drain_progress,
                extra={"maintenance": record.name, "node": record.node},
            )
        return self._remember(out)

    async def _restore(self, obs: Observed, patch: list[Obj]) -> None:
        """Apply a restore patch; on a concurrent node change, re-plan it on fresh state."""
        node_name = obs.nm.spec.node_name
        ops: list[Obj] | None = patch
        for _ in range(5):
            if ops is None:
                return
            try:
                await self.kube.json_patch(node_path(node_name), ops)
                return
            except NotFound:
                return
            except KubeError as exc:
                if not _changed_meanwhile(exc):
                    raise
            fresh = await self.kube.get(node_path(node_name))
            prior = nodepatch.prior_for(fresh, obs.nm.metadata.uid)
            ended = obs.nm.metadata.deletion_timestamp is not None
            ops = nodepatch.leave_patch(fresh, prior, forget=ended)
        raise Conflict("node kept changing while restoring it")


PATCH_REJECTED = "the server rejected our request due to an error in our request"


def _changed_meanwhile(exc: KubeError) -> bool:
    """A node patch refused because the node changed since it was read: 409, or the
    bare 422 a failed JSON-patch ``test`` on its resourceVersion gets.

    Any other 422 (an admission policy or webhook refusing the change) is an
    error like a 403: reported in lastError and retried with backoff, not
    retried at once forever.
    """
    if exc.status_code == 409:
        return True
    return exc.status_code == 422 and exc.message == PATCH_REJECTED and not exc.body.get("details")


def _ctx(nm: NodeMaintenance) -> dict[str, str]:
    return {"maintenance": nm.metadata.name, "node": nm.spec.node_name}
