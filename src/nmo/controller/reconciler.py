"""The NodeMaintenance pass: observe, plan, apply (behavior.md A2-A5, B4-B9).

Level-based, and every pass has the same three parts:

* :meth:`Reconciler.observe` builds a frozen :class:`Observed` from the
  caches and the maintenance's memory record only. It makes no request:
  what the caches cannot answer is listed in ``Observed.reads``.
* :func:`nmo.core.maintenance.planner.plan` (pure) decides everything,
  failure branches included, and returns a :class:`Plan`.
* :meth:`Reconciler.apply` carries the plan out in a fixed order and
  decides nothing. A plan with reads only reads: the answers go into the
  record, and the reconcile plans again on them (:meth:`Reconciler.reconcile`
  runs rounds). When a write fails the pass ends: a 409 (or a node that
  changed since it was read) is repeated on fresh state at once; a failed
  lease request, or any other API error, is recorded in the record and the
  next round plans from it (the lease rules, lastError).

The order is fixed here. Entering: the fleet ledger (the admission), the
CR's metadata (finalizer), the lease, the node (label, taints, cordon);
only then do evictions start (the status is written while they run).
Leaving: the node is restored and the lease released, the ledger slot
freed, and the finalizer goes last, so a failure half-way leaves the CR
(and its finalizer) in place to retry. A plan's events are recorded after
the step they belong to (:class:`Step`), so one that ends early has
recorded what it did and nothing else.

A pass never waits on pods: evictions run as tasks and their answers (or a
pod event seen by the node's pod watch) wake the next pass.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from nmo.api.models import NodeMaintenance
from nmo.controller.evictor import Evictor
from nmo.controller.leaseholder import LeaseClient, LeaseHeldError
from nmo.controller.ledger import FleetLedger
from nmo.controller.memory import Fetched, Memories, Memory
from nmo.controller.notifier import Notifier
from nmo.controller.quorumguard import QuorumGuard
from nmo.controller.recorder import EventRecorder
from nmo.controller.renewer import LeaseRenewers
from nmo.controller.volumereader import VolumeReader
from nmo.core.maintenance import (
    admission,
    nodeconditions,
    planner,
    podselect,
    policy,
    transitions,
)
from nmo.core.maintenance.gates import AlertsSeen
from nmo.core.maintenance.observed import (
    DONE,
    Emit,
    LeaseFailure,
    LeaseStep,
    LedgerWrite,
    Observed,
    Plan,
    Read,
    ReadKind,
    Recall,
    Result,
    Step,
    Work,
)
from nmo.kube.client import Kube, api_path, nm_path, node_path
from nmo.kube.errors import (
    Conflict,
    Forbidden,
    Invalid,
    InvalidName,
    KubeError,
    NotFound,
    changed_meanwhile,
)
from nmo.kube.informer import Informer
from nmo.telemetry.metrics import Metrics

# How long a leave waits for a renewal PUT in flight before releasing the lease.
RENEWAL_SETTLE_SECONDS = 10.0
# Rounds of one reconcile while plans read (node, owners, ledger, quorum, the CR, volumes).
MAX_ROUNDS = 8
# When the rounds ran out (a node that keeps changing): the queue's next look.
STILL_READING = 0.1

log = logging.getLogger("nmo.maintenance")

NM_PATH = nm_path()
Obj = dict[str, Any]

__all__ = ["NM_PATH", "Ports", "Reconciler", "Result"]


def _no_wake() -> None:
    return None


@dataclass(frozen=True)
class Ports:
    """Everything a pass reads from and writes through, wired by the engine."""

    kube: Kube
    maintenances: Informer
    nodes: Informer
    memories: Memories
    leases: LeaseClient
    renewers: LeaseRenewers
    evictor: Evictor
    recorder: EventRecorder
    metrics: Metrics
    watch_pods: Callable[[Memory], None]  # start the node's pod watch (the record owns it)
    pdbs: Informer | None = None
    ledger: FleetLedger | None = None  # the fleet budget's ledger (None: no budget)
    wake_queued: Callable[[], None] = field(default=_no_wake)  # a ledger write moved the queue
    notifier: Notifier | None = None
    quorum: QuorumGuard | None = None  # reads the etcd-quorum facts for queued nodes
    volumes: VolumeReader | None = None  # reads a drained node's VolumeAttachments
    alerts: Callable[[], AlertsSeen] | None = None  # the alert gate's last answer


class Reconciler:
    def __init__(
        self,
        ports: Ports,
        settings: policy.PlanSettings | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.ports = ports
        self.settings = settings or policy.PlanSettings()
        self.clock = clock

    # -- the pass ----------------------------------------------------------
    async def reconcile(self, name: str) -> Result:
        """One pass: observe, plan, apply, in rounds while a plan only reads.

        A round whose plan reads (or whose lease request failed, or whose node
        patch found the node changed) is followed at once by another on the
        answers, within this reconcile, as the Go NMO's reconcile reads what
        it needs; answers are read afresh by the next reconcile. A failed
        request ends the pass: a 409 is repeated on fresh state by the queue,
        any other error is written to lastError by one more round (the
        planner's report) and retried with backoff.
        """
        ports = self.ports
        raw = ports.maintenances.get(name)
        if raw is None:
            ports.memories.forget_name(name)
            if self.settings.node_conditions:
                await self._remove_orphaned_conditions(name)
            return DONE
        meta, spec = raw["metadata"], raw.get("spec") or {}
        record = ports.memories.recall(
            str(meta.get("uid") or ""), name, str(spec.get("nodeName") or "")
        )
        record.fetched = Fetched()
        for _ in range(MAX_ROUNDS):
            raw = ports.maintenances.get(name)
            if raw is None or record.forgotten:
                return DONE
            observed = self.observe(record.parse(raw), record)
            plan = planner.plan(observed, self.settings)
            if not plan.reads:
                record.planned_failures()
            try:
                result = await self.apply(raw, observed, plan, record)
            except NodeChanged:
                record.fetched.node_changed, record.fetched.node_read = True, False
                continue  # the next round reads the node live and plans on it
            except Conflict:
                raise  # stale view: repeated on fresh state at once, not an error
            except KubeError as exc:
                record.api_error = str(exc)
                await self._report(name, record)
                raise
            if not plan.reads and record.lease_failure is None:
                return result
        return Result(requeue_after=STILL_READING)  # the queue brings it back

    async def _report(self, name: str, record: Memory) -> None:
        """The round after a failed request: the planner's report (lastError), if
        it has one to write; it writes nothing else."""
        raw = self.ports.maintenances.get(name)
        if raw is None:
            return
        observed = self.observe(record.parse(raw), record)
        plan = planner.plan(observed, self.settings)
        if plan.report is None:
            return  # said already, within the heartbeat
        record.planned_failures()
        try:
            await self.apply(raw, observed, plan, record)
        except KubeError as again:
            log.warning(
                "maintenance %s: could not record the error in its status: %s",
                name,
                again,
                extra={"maintenance": name, "node": record.node},
            )

    # -- observe: caches and the record only ---------------------------------
    def observe(self, nm: NodeMaintenance, record: Memory) -> Observed:
        ports = self.ports
        fetched = record.fetched
        node_name = nm.spec.node_name
        others = tuple(
            NodeMaintenance.from_api(o)
            for o in ports.maintenances.by_index(node_name)
            if o["metadata"]["name"] != nm.metadata.name
        )
        reads: list[Read] = []
        node: Obj | None = None
        if planner.needs_node(nm):
            node = None if fetched.node_changed else ports.nodes.get(node_name)
            if node is None and fetched.node_read:
                node = fetched.node  # read live by an earlier round (None: it does not exist)
            elif node is None:
                reads.append(Read(ReadKind.NODE, node_name))
        elif planner.resumable(nm):
            node = ports.nodes.get(node_name)  # the node watch wakes it when one is added
        pods: tuple[Obj, ...] | None = None
        if node is not None and record.pods is not None and record.pods.synced.is_set():
            pods = tuple(record.pods.store.values())
            unknown = {podselect.running_daemonset_owner(p) for p in pods}
            reads.extend(
                Read(ReadKind.DAEMONSET, owner)
                for owner in sorted(o for o in unknown if o and o not in record.daemonsets)
            )
        ledger = fleet = None
        if ports.ledger is not None:
            ledger = ports.ledger.view()
            if node is not None and admission.awaits_start(nm, node_exists=True):
                fleet = ports.ledger.fleet()
        return Observed(
            nm=nm,
            others=others,
            node=node,
            pods=pods,
            daemonsets=MappingProxyType(dict(record.daemonsets)),
            drain=MappingProxyType({k: copy.copy(v) for k, v in record.drain.items()}),
            recall=Recall(
                lease_held=record.lease_held and record.renewing,
                renewal_error=record.renewal_error,
                status_written_ago=record.written_ago(),
                last_written=record.last_written,
                lease_failure=record.lease_failure,
                api_error=record.api_error,
                confirmed=fetched.confirmed,
            ),
            now=self.clock(),
            tick=asyncio.get_running_loop().time(),
            pdbs=MappingProxyType(self._pdbs(record)),
            reads=tuple(reads),
            ledger=ledger,
            fleet=fleet,
            quorum=fetched.quorum,
            volumes=fetched.volumes,
            alerts=None if ports.alerts is None else ports.alerts(),
        )

    def _pdbs(self, record: Memory) -> dict[str, Obj]:
        """The PodDisruptionBudgets the node's drain states name (for the Blocked message)."""
        if self.ports.pdbs is None:
            return {}
        out: dict[str, Obj] = {}
        for key, state in record.drain.items():
            if state.pdb:
                name = f"{key.split('/', 1)[0]}/{state.pdb}"
                if name not in out and (pdb := self.ports.pdbs.get(name)) is not None:
                    out[name] = pdb
        return out

    # -- apply: the plan, in a fixed order -----------------------------------
    async def apply(self, raw: Obj, obs: Observed, plan: Plan, record: Memory) -> Result:
        if plan.report is not None:
            await self._write_report(raw, plan.report)
            return plan.result
        if plan.reads:
            await self._read(plan.reads, record)
            return plan.result
        if obs.nm.metadata.deletion_timestamp is not None and plan.work is Work.FORGET:
            return await self._apply_leave(raw, obs, plan, record)
        if plan.lease is LeaseStep.RELEASE:
            return await self._apply_abort(raw, obs, plan, record)
        return await self._apply_enter(raw, obs, plan, record)

    async def _read(self, reads: tuple[Read, ...], record: Memory) -> None:
        """The reads a plan asked for; their answers wait in the record for the next pass."""
        ports = self.ports
        for read in reads:
            if read.kind is ReadKind.NODE:
                try:
                    record.fetched.node = await ports.kube.get(node_path(read.name))
                except NotFound:
                    record.fetched.node = None
                record.fetched.node_read = True
            elif read.kind is ReadKind.DAEMONSET:
                record.daemonsets[read.name] = await self._daemonset_exists(read.name, record)
            elif read.kind is ReadKind.MAINTENANCE:
                try:
                    live: Obj | None = await ports.kube.get(nm_path(read.name))
                except NotFound:
                    live = None
                exists = live is not None and live["metadata"].get("uid") == record.uid
                record.fetched.confirmed = exists
                if live is not None and exists:
                    ports.maintenances.remember(live)
            elif read.kind is ReadKind.LEDGER:
                if ports.ledger is None:
                    raise RuntimeError("a plan read the fleet ledger, and nmo runs none")
                await ports.ledger.read()
            elif read.kind is ReadKind.QUORUM:
                if ports.quorum is None:
                    raise RuntimeError("a plan read the etcd-quorum facts, and nmo reads none")
                record.fetched.quorum = await ports.quorum.read()
            elif read.kind is ReadKind.VOLUMES:
                if ports.volumes is None:
                    raise RuntimeError("a plan read the node's volumes, and nmo reads none")
                record.fetched.volumes = await ports.volumes.read(read.name)

    async def _daemonset_exists(self, owner: str, record: Memory) -> bool:
        ns, name = owner.split("/", 1)
        try:
            await self.ports.kube.get(api_path("apps/v1", "daemonsets", namespace=ns, name=name))
        except InvalidName as exc:
            # No DaemonSet can have that name: the pod is evicted, as kubectl
            # would, and nothing is requested for it.
            log.warning(
                "a pod names DaemonSet owner %r, not a valid name: evicting it as unmanaged",
                owner,
                extra={"node": record.node, "error": str(exc)},
            )
            return False
        except NotFound:
            return False
        return True

    async def _apply_enter(self, raw: Obj, obs: Observed, plan: Plan, record: Memory) -> Result:
        ports, nm = self.ports, obs.nm
        if plan.ledger is not None:
            await self._write_ledger(plan.ledger)
        if plan.metadata:
            raw = await self._patch_metadata(raw, plan.metadata)
        await self._emit(raw, obs, plan, Step.METADATA)
        if plan.work is Work.RUN:
            ports.watch_pods(record)
        if plan.lease in (LeaseStep.REQUEST, LeaseStep.FORCE) and obs.node is not None:
            try:
                await ports.leases.request(obs.node, force=plan.lease is LeaseStep.FORCE)
            except (LeaseHeldError, KubeError) as exc:
                foreign = isinstance(exc, LeaseHeldError)
                ports.metrics.lease_errors.labels(kind="foreign" if foreign else "api").inc()
                record.stop_renewer()
                record.lease_failure = LeaseFailure(str(exc), foreign=foreign)
                return Result(requeue_after=0)  # the next pass plans the lease rules (A5)
            if record.forgotten:
                return DONE  # the CR went away during the request
            ports.renewers.start(record, obs.node)
        if plan.node_patch is not None and obs.node is not None:
            await self._patch_node(nm, plan.node_patch)
            log.info(
                "maintenance %s: node %s labelled, tainted and cordoned",
                nm.metadata.name,
                nm.spec.node_name,
                extra=_ctx(nm),
            )
        await self._write_conditions(nm, plan)
        await self._emit(raw, obs, plan, Step.NODE)
        for key in plan.drop:
            record.drain.pop(key, None)
        if plan.evict and not record.forgotten:
            # The node is cordoned: evictions run while the status is written.
            ports.evictor.start(record, plan.evict)
        forced = await self._force(obs, plan, record)
        raw = await self._write_status(raw, plan, record)
        if plan.timed_out is not None:
            ports.metrics.drain_timeouts.labels(action=plan.timed_out.value).inc()
        await self._finish(raw, obs, plan, record, forced)
        return plan.result

    async def _apply_abort(self, raw: Obj, obs: Observed, plan: Plan, record: Memory) -> Result:
        """The maintenance fails with its node given back (onTimeout Abort, the
        lease lost): node restored, lease released, then Failed (terminal), then
        its ledger slot freed. A step that fails leaves the CR to be retried."""
        if plan.metadata:
            raw = await self._patch_metadata(raw, plan.metadata)
        await self._emit(raw, obs, plan, Step.METADATA)
        await self._undo(raw, obs, plan, record)
        raw = await self._write_status(raw, plan, record)
        if plan.ledger is not None:
            await self._write_ledger(plan.ledger)
        if plan.timed_out is not None:
            self.ports.metrics.drain_timeouts.labels(action=plan.timed_out.value).inc()
        await self._finish(raw, obs, plan, record)
        return plan.result

    async def _apply_leave(self, raw: Obj, obs: Observed, plan: Plan, record: Memory) -> Result:
        """CR deleted: node restored, lease released, ledger slot freed, finalizer last."""
        await self._undo(raw, obs, plan, record)
        if plan.ledger is not None:
            try:
                await self._write_ledger(plan.ledger)
            except Conflict:
                raise  # decided on a stale ledger: the next pass reads it again
            except KubeError as exc:
                # Deletion is never held up by the budget: the slot of a CR that
                # is gone is pruned at the next admission.
                log.warning(
                    "maintenance %s: could not free its slot in the fleet budget's ledger "
                    "(pruned at the next admission): %s",
                    obs.nm.metadata.name,
                    exc,
                    extra=_ctx(obs.nm),
                )
        if plan.metadata:
            try:
                raw = await self._patch_metadata(raw, plan.metadata)
            except NotFound:
                pass
        await self._finish(raw, obs, plan, record)
        return plan.result

    async def _undo(self, raw: Obj, obs: Observed, plan: Plan, record: Memory) -> None:
        """Stop the record's work, restore the node, release the lease.

        The node's events (UncordonNode) are recorded as soon as the node is
        restored, as the Go NMO does: a later step that fails (the lease, the
        finalizer, the status) is retried on a node that needs no uncordon,
        and the event would otherwise never be recorded.
        """
        nm = obs.nm
        record.stop()  # no renewal, eviction or pod watch outlives the decision to leave
        await record.renewal_settled(RENEWAL_SETTLE_SECONDS)
        if plan.node_patch:
            await self._patch_node(nm, plan.node_patch, restoring=True)
            log.info(
                "maintenance %s: node %s restored",
                nm.metadata.name,
                nm.spec.node_name,
                extra=_ctx(nm),
            )
        await self._write_conditions(nm, plan, letting_go=True)
        await self._emit(raw, obs, plan, Step.NODE)
        if plan.lease is LeaseStep.RELEASE and await self.ports.leases.release(nm.spec.node_name):
            log.info(
                "maintenance %s: lease for node %s released",
                nm.metadata.name,
                nm.spec.node_name,
                extra=_ctx(nm),
            )

    async def _force(self, obs: Observed, plan: Plan, record: Memory) -> tuple[Emit, ...]:
        """onTimeout Delete: delete the pods the plan names (PDBs bypassed by opt-in)."""
        if not plan.force or record.forgotten:
            return ()
        pods = tuple((f.pod, f.grace) for f in plan.force)
        done = await self.ports.evictor.force(record, pods, generation=obs.nm.metadata.generation)
        return tuple(f.event for f, deleted in zip(plan.force, done, strict=True) if deleted)

    async def _finish(
        self, raw: Obj, obs: Observed, plan: Plan, record: Memory, forced: tuple[Emit, ...] = ()
    ) -> None:
        """Logs, metrics, the pass's last events, the record's lifecycle, notifications."""
        nm, ports = obs.nm, self.ports
        level = logging.INFO
        if any(e.warning for e in (*plan.events, *forced)):
            level = logging.WARNING
        for note in plan.notes:
            log.log(level, "%s", note, extra=_ctx(nm))
        if plan.drain_seconds is not None:
            ports.metrics.drain_duration.observe(plan.drain_seconds)
        if plan.volume_wait is not None:
            outcome, seconds = plan.volume_wait
            ports.metrics.volume_detach_wait.labels(outcome=outcome).observe(seconds)
        await self._emit(raw, obs, plan, Step.END)
        for emit in forced:
            await ports.recorder.emit(raw, emit.event, warning=emit.warning)
        if plan.work is Work.STOP:
            record.stop()
        elif plan.work is Work.FORGET:
            ports.memories.forget(record.uid)

    async def _emit(self, raw: Obj, obs: Observed, plan: Plan, step: Step) -> None:
        """The plan's events and notifications that belong to ``step``, now that it
        is done."""
        if self.ports.notifier is not None:
            for after, notification in plan.notifications:
                if after is step:
                    self.ports.notifier.enqueue(notification)
        for emit in plan.events:
            if emit.after is not step:
                continue
            if emit.target == "node":
                if obs.node is not None:
                    target = obs.node | {"kind": "Node", "apiVersion": "v1"}
                    await self.ports.recorder.emit(target, emit.event, warning=emit.warning)
            else:
                await self.ports.recorder.emit(raw, emit.event, warning=emit.warning)

    # -- writes ------------------------------------------------------------
    async def _write_ledger(self, change: LedgerWrite) -> None:
        assert self.ports.ledger is not None
        await self.ports.ledger.write(change)
        # Admissions are in creation order (a pass admits the head of the queue
        # only): the next head looks again now that the ledger moved.
        self.ports.wake_queued()

    async def _patch_node(
        self, nm: NodeMaintenance, ops: list[Obj], *, restoring: bool = False
    ) -> None:
        """A guarded JSON patch of the node; if the node changed (or went) since it
        was read, the pass ends and the next one plans on its new state."""
        try:
            await self.ports.kube.json_patch(node_path(nm.spec.node_name), ops)
        except NotFound:
            if restoring:
                return  # nothing left to restore
            raise NodeChanged(f"node {nm.spec.node_name} is gone") from None
        except KubeError as exc:
            if not changed_meanwhile(exc):
                raise
            log.info(
                "maintenance %s: node %s changed meanwhile, retrying",
                nm.metadata.name,
                nm.spec.node_name,
                extra=_ctx(nm),
            )
            raise NodeChanged(f"node {nm.spec.node_name} changed meanwhile") from exc

    async def _write_conditions(
        self, nm: NodeMaintenance, plan: Plan, *, letting_go: bool = False
    ) -> None:
        """nmo's lifecycle conditions on the node's status (--node-conditions):
        a strategic-merge patch keyed by condition type, so every other
        writer's condition stays. A node gone meanwhile has none to keep.

        ``letting_go`` (the CR deleted, or Failed with its node given back):
        a removal refused for good (403: nodes/status not granted, a policy;
        422) is logged and the maintenance lets go all the same: the
        conditions are an add-on, and must not hold the finalizer, the lease
        or the Failed status forever. Other errors are retried as any step.
        """
        if plan.node_conditions is None:
            return
        path = node_path(nm.spec.node_name, "status")
        try:
            out = await self.ports.kube.strategic_patch(path, plan.node_conditions)
        except NotFound:
            return
        except (Forbidden, Invalid) as exc:
            if not letting_go:
                raise
            log.warning(
                "maintenance %s: could not remove its lifecycle conditions from node %s "
                "(letting go all the same; nmo cleanup removes them): %s",
                nm.metadata.name,
                nm.spec.node_name,
                exc,
                extra=_ctx(nm),
            )
            return
        self.ports.nodes.remember(out)
        types = ", ".join(
            f"{x['type']}={x['status']} ({x['reason']})"
            if "status" in x
            else f"{x['type']} removed"
            for x in plan.node_conditions["status"]["conditions"]
        )
        log.info(
            "maintenance %s: node %s conditions: %s",
            nm.metadata.name,
            nm.spec.node_name,
            types,
            extra=_ctx(nm),
        )

    async def _remove_orphaned_conditions(self, name: str) -> None:
        """The CR ``name`` is gone from the cache: remove the lifecycle conditions
        that name it from any node (a queued CR is deleted without a pass of
        its own: it has no finalizer yet). The node cache is scanned once per
        gone CR. A failed removal is logged, not retried by this name (a
        refusal for good would retry forever): the node's next event sweeps
        it again (Engine._sweep_conditions)."""
        ports = self.ports
        for node in list(ports.nodes.store.values()):
            if name not in nodeconditions.owners(node):
                continue
            body = nodeconditions.removal(node, owner=name)
            node_name = str(node["metadata"]["name"])
            if body is None:
                continue
            try:
                out = await ports.kube.strategic_patch(node_path(node_name, "status"), body)
            except NotFound:
                continue
            except KubeError as exc:
                log.warning(
                    "maintenance %s: gone; could not remove its lifecycle conditions from "
                    "node %s (nmo cleanup removes them): %s",
                    name,
                    node_name,
                    exc,
                    extra={"maintenance": name, "node": node_name},
                )
                continue
            ports.nodes.remember(out)
            log.info(
                "maintenance %s: gone; its lifecycle conditions removed from node %s",
                name,
                node_name,
                extra={"maintenance": name, "node": node_name},
            )

    async def _write_report(self, raw: Obj, report: Mapping[str, Any]) -> None:
        """lastError and lastUpdate only, without a resourceVersion: nothing else
        of the status is touched (Go's onReconcileError)."""
        out = await self.ports.kube.merge_patch(
            nm_path(raw["metadata"]["name"], "status"), {"status": dict(report)}
        )
        self.ports.maintenances.remember(out)

    async def _patch_metadata(self, raw: Obj, metadata: Obj) -> Obj:
        body = {"metadata": {**metadata, "resourceVersion": raw["metadata"]["resourceVersion"]}}
        out = await self.ports.kube.merge_patch(nm_path(raw["metadata"]["name"]), body)
        self.ports.maintenances.remember(out)
        return out

    async def _write_status(self, raw: Obj, plan: Plan, record: Memory) -> Obj:
        if plan.status is None:
            return raw
        body = {
            "metadata": {"resourceVersion": raw["metadata"]["resourceVersion"]},
            "status": transitions.status_patch(plan.status),
        }
        out = await self.ports.kube.merge_patch(nm_path(raw["metadata"]["name"], "status"), body)
        record.wrote(policy.fingerprint(plan.status))
        if plan.drain_pending:
            log.info(
                "drain of node %s: %d pods pending, progress %s%%",
                record.node,
                plan.drain_pending,
                plan.status.drain_progress,
                extra={"maintenance": record.name, "node": record.node},
            )
        self.ports.maintenances.remember(out)
        return out


class NodeChanged(Conflict):
    """A node patch found the node changed (or gone) since it was read."""


def _ctx(nm: NodeMaintenance) -> dict[str, str]:
    return {"maintenance": nm.metadata.name, "node": nm.spec.node_name}
