"""The operator's runtime: caches, work queue, workers, leader election.

Wiring (see architecture.md): three informers (NodeMaintenances, Nodes,
bound Pods indexed by node) feed reconcile keys into one work queue; N
workers run :class:`Reconciler` passes concurrently, never the same key
twice at once; the drainer and the lease renewers run as their own tasks.
Informers run on every replica (the webhook answers from them); workers
run only on the leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from nmo.api import constants as c
from nmo.core.drain import Drainer
from nmo.core.errors import Conflict, KubeError
from nmo.core.events import EventRecorder
from nmo.core.kube import Kube, api_path
from nmo.core.leader import LeaderElector, LeaderSettings
from nmo.core.lease import LeaseClient
from nmo.core.metrics import Metrics
from nmo.core.queue import WorkQueue
from nmo.core.reconciler import NM_PATH, Reconciler, ReconcilerSettings
from nmo.core.renewer import LeaseRenewers
from nmo.core.watch import Informer

log = logging.getLogger("nmo.engine")


def default_identity() -> str:
    return f"{socket.gethostname()}_{os.getpid()}"


@dataclass
class EngineSettings:
    lease_namespace: str = c.LEASE_NAMESPACE_DEFAULT
    max_concurrent_reconciles: int = 10
    max_parallel_evictions: int = 50
    lease_renew_interval: float = 300.0
    leader_election: bool = True
    leader_election_namespace: str = c.OPERATOR_NAMESPACE
    leader_election_id: str = c.LEADER_ELECTION_ID
    leader_lease_duration: float = 15.0
    leader_renew_deadline: float = 10.0
    leader_retry_period: float = 2.0
    pod_event_debounce: float = 0.5
    resync_period: float = 600.0
    identity: str = field(default_factory=default_identity)
    reconciler: ReconcilerSettings = field(default_factory=ReconcilerSettings)


def _intent(obj: dict[str, Any]) -> tuple[Any, ...]:
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


def _pod_node(pod: dict[str, Any]) -> str | None:
    node = (pod.get("spec") or {}).get("nodeName")
    return str(node) if node else None


class Engine:
    def __init__(self, kube: Kube, settings: EngineSettings, metrics: Metrics) -> None:
        self.kube = kube
        self.settings = settings
        self.metrics = metrics
        self.maintenances = Informer(
            kube,
            NM_PATH,
            name="nodemaintenances",
            missing_hint=f"the CRD {c.CRD_NAME} is not installed; install the Helm chart "
            "or run `nmo crd | kubectl apply -f -`",
        )
        self.nodes = Informer(kube, api_path("v1", "nodes"), name="nodes")
        self.pods = Informer(
            kube,
            api_path("v1", "pods"),
            name="pods",
            params={"fieldSelector": "spec.nodeName!="},
            index=_pod_node,
        )
        self.queue = WorkQueue()
        self.leases = LeaseClient(kube, settings.lease_namespace)
        self.renewers = LeaseRenewers(
            self.leases,
            interval=settings.lease_renew_interval,
            on_failure=self.queue.add,
            metrics=metrics,
        )
        self.drainer = Drainer(
            kube,
            max_parallel=settings.max_parallel_evictions,
            on_change=self._enqueue_node,
            metrics=metrics,
        )
        self.recorder = EventRecorder(kube, instance=settings.identity)
        self.reconciler = Reconciler(
            kube=kube,
            maintenances=self.maintenances,
            nodes=self.nodes,
            pods=self.pods,
            leases=self.leases,
            renewers=self.renewers,
            drainer=self.drainer,
            recorder=self.recorder,
            metrics=metrics,
            settings=settings.reconciler,
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
        self._by_node: dict[str, set[str]] = {}
        self.leading = False
        self.maintenances.add_handler(self._on_maintenance)
        self.nodes.add_handler(lambda _e, obj, _o: self._enqueue_node(obj["metadata"]["name"]))
        self.pods.add_handler(self._on_pod)

    @property
    def informers(self) -> list[Informer]:
        return [self.maintenances, self.nodes, self.pods]

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    def _on_maintenance(self, event: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        name = str(obj["metadata"]["name"])
        if event == "MODIFIED" and old is not None and _intent(old) == _intent(obj):
            return  # a status-only change (most often our own write): nothing to do
        node = str((obj.get("spec") or {}).get("nodeName") or "")
        for prev in (old, obj):
            prev_node = str(((prev or {}).get("spec") or {}).get("nodeName") or "")
            if prev_node and prev_node != node:
                self._by_node.get(prev_node, set()).discard(name)
        if event == "DELETED":
            self._by_node.get(node, set()).discard(name)
        elif node:
            self._by_node.setdefault(node, set()).add(name)
        if self.leading:
            self.queue.add(name)

    def _enqueue_node(self, node: str) -> None:
        if not self.leading:
            return
        for name in self._by_node.get(node, ()):
            self.queue.add(name)

    def _on_pod(self, _event: str, obj: dict[str, Any], _old: dict[str, Any] | None) -> None:
        # Pod churn during a drain is coalesced: one pass per debounce window
        # sees all the deletions of that window (a 1,000-pod drain would
        # otherwise run a full pass per pod event).
        node = _pod_node(obj)
        if node and self.leading:
            for name in self._by_node.get(node, ()):
                self.queue.add_after(name, self.settings.pod_event_debounce)

    async def run(self) -> None:
        """Run until cancelled; an informer or worker crash ends the process."""
        async with asyncio.TaskGroup() as group:
            for informer in self.informers:
                group.create_task(informer.run(), name=f"informer:{informer.name}")
            for informer in self.informers:
                await informer.synced.wait()
            log.info("caches synced: maintenances, nodes, pods")
            if self.elector is not None:
                group.create_task(self.elector.run(self._lead), name="leader-election")
            else:
                group.create_task(self._lead(), name="leader-work")

    async def _lead(self) -> None:
        self.metrics.is_leader.set(1)
        try:
            await self.leases.ensure_namespace()
        except KubeError as exc:
            log.warning("could not ensure lease namespace %s: %s", self.leases.namespace, exc)
        self.leading = True
        for name in list(self.maintenances.store):
            self.queue.add(name)
        log.info(
            "maintenance workers starting: %d reconcilers, %d parallel evictions",
            self.settings.max_concurrent_reconciles,
            self.settings.max_parallel_evictions,
        )
        try:
            async with asyncio.TaskGroup() as group:
                for i in range(self.settings.max_concurrent_reconciles):
                    group.create_task(self._worker(), name=f"reconcile-worker:{i}")
                group.create_task(self._resync(), name="resync")
        finally:
            self.leading = False
            self.metrics.is_leader.set(0)
            self.renewers.stop_all()

    async def _resync(self) -> None:
        """Level-based safety net: every CR is reconciled at least this often."""
        while True:
            await asyncio.sleep(self.settings.resync_period)
            for name in list(self.maintenances.store):
                self.queue.add(name)

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            if key is None:
                return
            started = time.perf_counter()
            result = "success"
            try:
                outcome = await self.reconciler.reconcile(key)
                self.queue.forget(key)
                if outcome.requeue_after is not None:
                    result = "requeue"
                    self.queue.add_after(key, outcome.requeue_after)
            except Conflict as exc:
                result = "requeue"
                log.info("maintenance %s: conflict, retrying on fresh state: %s", key, exc)
                self.queue.add_after(key, 0.1)
            except KubeError as exc:
                result = "error"
                delay = self.queue.backoff(key)
                log.warning(
                    "maintenance %s: reconcile failed, retrying in %.1fs: %s", key, delay, exc
                )
            except Exception:
                result = "error"
                delay = self.queue.backoff(key)
                log.exception("maintenance %s: reconcile crashed, retrying in %.1fs", key, delay)
            finally:
                self.queue.done(key)
                self.metrics.reconcile_total.labels(result=result).inc()
                if result == "error":
                    self.metrics.reconcile_errors.inc()
                self.metrics.reconcile_latency.observe(time.perf_counter() - started)
                self.metrics.queue_depth.set(len(self.queue))
                self._phase_gauge()

    def _phase_gauge(self) -> None:
        counts = {"Pending": 0, "Running": 0, "Succeeded": 0, "Failed": 0}
        for obj in self.maintenances.store.values():
            phase = (obj.get("status") or {}).get("phase") or "Pending"
            counts[phase] = counts.get(phase, 0) + 1
        for phase, n in counts.items():
            self.metrics.maintenances.labels(phase=phase).set(n)

    async def shutdown(self) -> None:
        await self.queue.shutdown()
        self.renewers.stop_all()
        if self.elector is not None:
            with contextlib.suppress(Exception):
                await self.elector.release()
