"""The operator's runtime: caches, work queue, workers, leader election.

Wiring (see architecture.md): two cluster-wide informers (NodeMaintenances,
Nodes), slimmed to the fields nmo reads, feed reconcile keys into one work
queue; N workers run :class:`Reconciler` passes concurrently, never the same
key twice at once. The pods of a node are watched only while it is under
maintenance (field selector ``spec.nodeName=<node>``), by a watch its memory
record owns; PodDisruptionBudgets are watched while leading, so a pod held
by a PDB is retried the moment the PDB's status changes, and not before.

What runs where is declared in :meth:`Engine.runnables`: the caches the
webhook answers from run on every replica; the workers, the resync and the
PDB watch run only on the leader. The manager
(:class:`nmo.controller.manager.Manager`) starts them in phases and stops
them in reverse; :meth:`Engine.leadership` is what leading means, entered
once elected. Every background task is named; a crash of one ends the
process, except the per-node pod watches, which are restarted by the next
pass of their CR.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from nmo.api import constants as c
from nmo.controller.alertgate import AlertGateSettings, AlertPoller
from nmo.controller.evictor import Evictor
from nmo.controller.leader import LeaderElector, LeaderSettings
from nmo.controller.leaseholder import LeaseClient
from nmo.controller.ledger import FleetLedger
from nmo.controller.manager import Group, Runnable
from nmo.controller.memory import Memories, Memory
from nmo.controller.notifier import Notifier, NotifySettings
from nmo.controller.quorumguard import QuorumGuard
from nmo.controller.reconciler import NM_PATH, Ports, Reconciler
from nmo.controller.recorder import EventRecorder
from nmo.controller.renewer import LeaseRenewers
from nmo.controller.volumereader import VolumeReader
from nmo.core.maintenance import nodeconditions
from nmo.core.maintenance.admission import BudgetSettings, unavailable
from nmo.core.maintenance.disruption import status_key
from nmo.core.maintenance.drainplan import blocked_since
from nmo.core.maintenance.drainstate import names_budget
from nmo.core.maintenance.gates import soak_left
from nmo.core.maintenance.policy import PlanSettings
from nmo.kube import slim
from nmo.kube.access import Access
from nmo.kube.client import Kube, api_path, node_path
from nmo.kube.errors import Conflict, Forbidden, KubeError
from nmo.kube.informer import Informer
from nmo.kube.workqueue import WorkQueue
from nmo.telemetry.metrics import CONTROLLER, Metrics

log = logging.getLogger("nmo.engine")

Obj = dict[str, Any]


def default_identity() -> str:
    return f"{socket.gethostname()}_{os.getpid()}"


@dataclass
class EngineSettings:
    lease_namespace: str = c.LEASE_NAMESPACE_DEFAULT
    max_concurrent_reconciles: int = 10
    max_parallel_evictions: int = 100
    lease_renew_interval: float = 300.0
    leader_election: bool = True
    leader_election_namespace: str = c.OPERATOR_NAMESPACE
    leader_election_id: str = c.LEADER_ELECTION_ID
    leader_lease_duration: float = 15.0
    leader_renew_deadline: float = 10.0
    leader_retry_period: float = 2.0
    # Pod events and eviction answers during a drain wake one pass per window:
    # a pass plans the whole node (O(pods)), and progress is written at most
    # once per status interval (1 s) anyway. The last pod leaving, a PDB
    # change and a CR change wake a pass at once.
    pod_event_debounce: float = 1.0
    resync_period: float = 600.0
    identity: str = field(default_factory=default_identity)
    plan: PlanSettings = field(default_factory=PlanSettings)
    budget: BudgetSettings = field(default_factory=BudgetSettings)
    budget_namespace: str | None = None  # the ledger's namespace; None: leader election's
    notify: NotifySettings | None = None  # --notify-url; None: no notifications
    alert_gate: AlertGateSettings | None = None  # --blocking-prometheus-url; None: no gate


def _intent(obj: Obj) -> tuple[Any, ...]:
    """What a reconcile reacts to on a NodeMaintenance: all but the status."""
    meta = obj.get("metadata") or {}
    return (
        obj.get("spec"),
        meta.get("generation"),
        meta.get("deletionTimestamp"),
        meta.get("finalizers"),
        meta.get("annotations"),
        meta.get("ownerReferences"),
    )


def _node_of(obj: Obj) -> str | None:
    node = (obj.get("spec") or {}).get("nodeName")
    return str(node) if node else None


QUEUE_REFRESH = 10.0  # seconds: the other queued CRs rewrite their position this late at most


class Engine:
    def __init__(self, kube: Kube, settings: EngineSettings, metrics: Metrics) -> None:
        self.kube = kube
        self.settings = settings
        self.metrics = metrics
        # Every request of the process's client is counted, as client-go's
        # rest client counts the Go operator's (rest_client_requests_total).
        kube.on_response = metrics.rest_request
        metrics.on_scrape(self._scrape)
        self.maintenances = Informer(
            kube,
            NM_PATH,
            name="nodemaintenances",
            missing_hint=f"the CRD {c.CRD_NAME} is not installed; install the Helm chart "
            "or run `nmo crd | kubectl apply -f -`",
            transform=slim.maintenance,
            index=_node_of,
        )
        self.nodes = Informer(kube, node_path(), name="nodes", transform=slim.node)
        self.pdbs = Informer(
            kube,
            api_path("policy/v1", "poddisruptionbudgets"),
            name="poddisruptionbudgets",
            transform=slim.pdb,
        )
        self.queue = WorkQueue()
        self.memories = Memories()
        self.leases = LeaseClient(kube, settings.lease_namespace)
        self.renewers = LeaseRenewers(
            self.leases,
            interval=settings.lease_renew_interval,
            on_failure=self.queue.add,
            metrics=metrics,
        )
        self.evictor = Evictor(
            kube,
            max_parallel=settings.max_parallel_evictions,
            on_change=self._drain_changed,
            metrics=metrics,
            access=Access(kube),
            budgets=self.pdbs.get,
        )
        self.budget: FleetLedger | None = None
        if settings.budget.enabled:
            self.budget = FleetLedger(
                kube,
                namespace=settings.budget_namespace or settings.leader_election_namespace,
                maintenances=self.maintenances,
                nodes=self.nodes,
            )
        self.alerts: AlertPoller | None = None
        if settings.alert_gate is not None:
            self.alerts = AlertPoller(
                settings.alert_gate, metrics=metrics, on_change=self._wake_queued
            )
        if self.budget is not None and settings.budget.soak_seconds > 0:
            metrics.soak_remaining.set_function(self._soak_remaining)
        self.recorder = EventRecorder(kube, instance=settings.identity)
        self.notifier: Notifier | None = None
        if settings.notify is not None:
            self.notifier = Notifier(settings.notify, metrics=metrics, operator=settings.identity)
        self.reconciler = Reconciler(
            Ports(
                kube=kube,
                maintenances=self.maintenances,
                nodes=self.nodes,
                memories=self.memories,
                leases=self.leases,
                renewers=self.renewers,
                evictor=self.evictor,
                recorder=self.recorder,
                metrics=metrics,
                watch_pods=self._watch_pods,
                pdbs=self.pdbs,
                ledger=self.budget,
                wake_queued=self._wake_queued,
                notifier=self.notifier,
                quorum=QuorumGuard(kube),
                volumes=VolumeReader(kube),
                alerts=None if self.alerts is None else self.alerts.seen,
            ),
            settings=replace(
                settings.plan,
                budget=settings.budget,
                notify_operator=None if self.notifier is None else self.notifier.operator,
            ),
        )
        self.elector: LeaderElector | None = None
        if settings.leader_election:
            self.elector = LeaderElector(
                kube,
                LeaderSettings(
                    namespace=settings.leader_election_namespace,
                    name=settings.leader_election_id,
                    identity=settings.identity,
                    lease_duration=settings.leader_lease_duration,
                    renew_deadline=settings.leader_renew_deadline,
                    retry_period=settings.leader_retry_period,
                ),
            )
            metrics.leader(settings.leader_election_id, leading=False)
        self.leading = False
        self.pod_watches_started = 0
        self.maintenances.add_handler(self._on_maintenance)
        self.nodes.add_handler(self._on_node)
        self.pdbs.add_handler(self._on_pdb)

    # -- what runs where ---------------------------------------------------
    def runnables(self) -> list[Runnable]:
        leader = Group.LEADER
        return [
            *(
                Runnable(f"informer:{i.name}", i.run, Group.CACHES, synced=i.synced)
                for i in self.informers
            ),
            Runnable("informer:poddisruptionbudgets", self.pdbs.run, leader),
            Runnable("resync", self._resync, leader),
            *(
                Runnable(f"reconcile-worker:{i}", self._worker, leader)
                for i in range(self.settings.max_concurrent_reconciles)
            ),
            *(
                [Runnable("notifier", self.notifier.run, leader)]
                if self.notifier is not None
                else []
            ),
            *([Runnable("alert-gate", self.alerts.run, leader)] if self.alerts else []),
        ]

    @property
    def informers(self) -> list[Informer]:
        """The caches every replica keeps (the webhook answers from them)."""
        return [self.maintenances, self.nodes]

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    # -- triggers ----------------------------------------------------------
    def _wake(self, name: str) -> None:
        if self.leading:
            self.queue.add(name)

    def _on_maintenance(self, event: str, obj: Obj, old: Obj | None) -> None:
        name = str(obj["metadata"]["name"])
        if event == "DELETED":
            # However the CR went (a DELETE event, or missing from a re-list
            # after a watch gap), nothing of it may keep running.
            uid = obj["metadata"].get("uid")
            if uid:
                self.memories.forget(str(uid))
            else:
                self.memories.forget_name(name)
            self._wake_queued()  # its slot may be free (pruned at the next admission)
            if self.leading:
                self._phase_gauge()  # no pass follows a deletion: count it now
            if self.settings.plan.node_conditions:
                # A queued CR goes without a pass (no finalizer yet): the pass
                # on its absence removes the node conditions that name it.
                self._wake(name)
            return
        if event == "MODIFIED" and old is not None and _intent(old) == _intent(obj):
            return  # a status-only change (most often our own write): nothing to do
        self._wake(name)

    def _wake_queued(self) -> None:
        """The queue moved: its head looks again now (it may start), the others
        soon, coalesced (their position in the queue changed)."""
        if self.budget is None or not self.leading:
            return
        names = self.budget.queued_names()
        if names:
            self.queue.add(names[0])
        for name in names[1:]:
            self.queue.add_after(name, QUEUE_REFRESH)

    def _soak_remaining(self) -> float:
        """nmo_fleet_soak_remaining_seconds, from the ledger as last read or written."""
        if self.budget is None or not self.leading:
            return 0.0
        left = soak_left(
            self.budget.returned(), self.settings.budget.soak_seconds, datetime.now(UTC)
        )
        return round(left, 3)

    def _on_node(self, _event: str, obj: Obj, old: Obj | None) -> None:
        if not self.leading:
            return
        if (
            self.budget is not None
            and self.settings.budget.max_unavailable
            and (old is None or unavailable(old) != unavailable(obj))
        ):
            self._wake_queued()  # the count of unavailable nodes changed
        for nm in self.maintenances.by_index(str(obj["metadata"]["name"])):
            self.queue.add(str(nm["metadata"]["name"]))
        self._sweep_conditions(obj)

    def _sweep_conditions(self, node: Obj) -> None:
        """Lifecycle conditions naming a CR the cache does not hold (deleted while
        nmo was down or another replica led): that name's pass removes them."""
        if not self.settings.plan.node_conditions:
            return
        for owner in nodeconditions.owners(node):
            if owner not in self.maintenances.store:
                self.queue.add(owner)

    def _drain_changed(self, name: str) -> None:
        """An eviction was answered (refused, failed, gone): one pass per debounce
        window sees every answer of that window, as for pod events; a pass per
        answer would plan the whole node once per refused pod."""
        if self.leading:
            self.queue.add_after(name, self.settings.pod_event_debounce)

    def _on_pod(self, record: Memory, event: str, obj: Obj) -> None:
        if not self.leading or record.forgotten:
            return
        pods = record.pods.store if record.pods is not None else {}
        # Newest states first: pods leave in about the order their evictions
        # started, so a pod still there is found at once (not O(pods) per event).
        if event == "DELETED" and not any(key in pods for key in reversed(record.drain)):
            self.queue.add(record.name)  # the last pod to evict left: finish at once
            return
        # Pod churn during a drain is coalesced: one pass per debounce window
        # sees all the changes of that window.
        self.queue.add_after(record.name, self.settings.pod_event_debounce)

    def _on_pdb(self, event: str, obj: Obj, old: Obj | None) -> None:
        """A PDB's status changed: the maintenances it held plan again at once (the
        planner decides which pods go, :mod:`nmo.core.maintenance.pdbgate`)."""
        if not self.leading:
            return
        if event == "MODIFIED" and old is not None and status_key(old) == status_key(obj):
            return  # the eviction API would answer as before
        meta = obj["metadata"]
        namespace, name = str(meta.get("namespace")), str(meta["name"])
        for record in self.memories:
            if names_budget(record.drain, namespace, name):
                self.queue.add(record.name)

    def _watch_pods(self, record: Memory) -> None:
        """Watch the node's pods while its maintenance runs (the record owns it)."""
        if record.forgotten or (record.pods_task is not None and not record.pods_task.done()):
            return
        informer = Informer(
            self.kube,
            api_path("v1", "pods"),
            name=f"pods:{record.node}",
            params={"fieldSelector": f"spec.nodeName={record.node}"},
            transform=slim.pod,
            page_size=100,
            on_synced=lambda: self._wake(record.name),
        )
        informer.add_handler(lambda event, obj, _old: self._on_pod(record, event, obj))
        record.pods = informer
        record.pods_task = asyncio.get_running_loop().create_task(
            informer.run(), name=f"pod-watch:{record.node}"
        )
        record.pods_task.add_done_callback(lambda task: self._pod_watch_ended(record, task))
        self.pod_watches_started += 1
        log.info("pod watch started for node %s", record.node, extra={"node": record.node})

    def _pod_watch_ended(self, record: Memory, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        log.error(
            "pod watch for node %s crashed; the next pass restarts it",
            record.node,
            exc_info=task.exception(),
            extra={"node": record.node},
        )
        self._wake(record.name)

    # -- running (the manager's hooks, see nmo.controller.manager) ----------
    def caches_synced(self) -> None:
        log.info("caches synced: maintenances, nodes")

    @contextlib.asynccontextmanager
    async def leadership(self) -> AsyncIterator[None]:
        """Leading, around the leader group: the workers take every CR in
        the cache; on the way out every record's tasks stop."""
        self.metrics.is_leader.set(1)
        if self.elector is not None:
            self.metrics.leader(self.settings.leader_election_id, leading=True)
        # What controller-runtime's controller does when it starts on the leader.
        self.metrics.controller_started(self.settings.max_concurrent_reconciles)
        self.queue.instrument(self.metrics)
        try:
            await self.leases.ensure_namespace()
        except Forbidden:
            # The chart grants no namespace create when it creates the lease
            # namespace itself (leases.createNamespace): it exists already.
            log.info(
                "lease namespace %s is not nmo's to create (no RBAC for namespaces): "
                "leases go into it as it is",
                self.leases.namespace,
            )
        except KubeError as exc:
            log.warning("could not ensure lease namespace %s: %s", self.leases.namespace, exc)
        self.leading = True
        for name in list(self.maintenances.store):
            self.queue.add(name)
        for node in list(self.nodes.store.values()):
            self._sweep_conditions(node)
        log.info(
            "maintenance workers starting: %d reconcilers, %d parallel evictions",
            self.settings.max_concurrent_reconciles,
            self.settings.max_parallel_evictions,
        )
        try:
            yield
        finally:
            self.leading = False
            self.metrics.is_leader.set(0)
            if self.elector is not None:
                self.metrics.leader(self.settings.leader_election_id, leading=False)
            self.memories.forget_all()

    async def _resync(self) -> None:
        """Level-based safety net: every CR is reconciled at least this often."""
        while True:
            await asyncio.sleep(self.settings.resync_period)
            for name in list(self.maintenances.store):
                self.queue.add(name)

    async def _worker(self) -> None:
        active = self.metrics.cr_active_workers.labels(controller=CONTROLLER)
        while True:
            key = await self.queue.get()
            if key is None:
                return
            active.inc()
            started = time.perf_counter()
            result = "success"  # nmo_reconcile_total's result
            compat = "success"  # controller_runtime_reconcile_total's result
            try:
                outcome = await self.reconciler.reconcile(key)
                self.queue.forget(key)
                if outcome.requeue_after is not None:
                    result = "requeue"
                    compat = "requeue_after" if outcome.requeue_after > 0 else "requeue"
                    self.queue.add_after(key, outcome.requeue_after, retry=True)
            except Conflict as exc:
                result = compat = "requeue"
                log.info("maintenance %s: conflict, retrying on fresh state: %s", key, exc)
                self.queue.add_after(key, 0.1, retry=True)
            except KubeError as exc:
                result = compat = "error"
                delay = self.queue.backoff(key)
                log.warning(
                    "maintenance %s: reconcile failed, retrying in %.1fs: %s", key, delay, exc
                )
            except Exception:
                result = compat = "error"
                # A crash is what a recovered panic is to controller-runtime.
                self.metrics.cr_panics.labels(controller=CONTROLLER).inc()
                delay = self.queue.backoff(key)
                log.exception("maintenance %s: reconcile crashed, retrying in %.1fs", key, delay)
            finally:
                elapsed = time.perf_counter() - started
                self.queue.done(key)
                active.dec()
                self.metrics.reconcile_total.labels(result=result).inc()
                if result == "error":
                    self.metrics.reconcile_errors.inc()
                self.metrics.reconcile_latency.observe(elapsed)
                self.metrics.reconciled(compat, elapsed)
                self.metrics.queue_depth.set(len(self.queue))
                self._phase_gauge()

    def _scrape(self) -> None:
        """Before a scrape: nmo_drain_blocked_seconds as of now on the leader (a
        pass of a drain with pods pending lasts up to 30 s)."""
        if self.leading:
            self._phase_gauge()

    def _phase_gauge(self) -> None:
        counts = {"Pending": 0, "Running": 0, "Succeeded": 0, "Failed": 0}
        for obj in self.maintenances.store.values():
            phase = (obj.get("status") or {}).get("phase") or "Pending"
            counts[phase] = counts.get(phase, 0) + 1
        for phase, n in counts.items():
            self.metrics.maintenances.labels(phase=phase).set(n)
        self.metrics.drain_blocked.clear()
        now = datetime.now(UTC)
        for obj in self.maintenances.store.values():
            since = blocked_since(obj)
            if since is not None:
                self.metrics.drain_blocked.labels(
                    maintenance=obj["metadata"]["name"],
                    node=(obj.get("spec") or {}).get("nodeName", ""),
                ).set(max(0.0, (now - since).total_seconds()))

    async def quiesce(self) -> None:
        """At shutdown: the queue hands out no more keys (its timers dropped)."""
        await self.queue.shutdown()

    def forget(self) -> None:
        """At shutdown, once the leader group ended: every record's tasks stop.
        The informers run on until the manager stops them, so the webhook
        keeps answering from them while the process drains."""
        self.memories.forget_all()
