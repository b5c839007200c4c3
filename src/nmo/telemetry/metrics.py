"""Prometheus metrics: nmo's own, and the ones the Go operator's libraries serve.

nmo's ``nmo_*`` metrics are what NMO never exported (behavior.md B10). Next
to them are the series controller-runtime and client-go serve for the Go
operator, under the same names, labels and buckets, so existing alerts and
dashboards keep working: ``controller_runtime_*`` (pkg/internal/controller/
metrics), ``workqueue_*`` (pkg/internal/metrics/workqueue.go),
``leader_election_master_status``, ``rest_client_requests_total`` and the
``process_*`` collector.

One :class:`Metrics` object per process, created in the entry point and
passed down (no global registry), so tests get a fresh registry each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

_DRAIN_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
_FAST_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# Volume detach waits: seconds (a CSI detach) to past the 6 min force-detach.
_VOLUME_BUCKETS = (1, 5, 10, 30, 60, 120, 240, 360, 600, 1200)
# controller-runtime's reconcile_time_seconds buckets.
_RECONCILE_BUCKETS = (
    *(0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5),
    *(0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5),
    *(5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50, 60),
)
# client-go's workqueue buckets: prometheus.ExponentialBuckets(10e-9, 10, 12).
_QUEUE_BUCKETS = tuple(float(f"1e{exp}") for exp in range(-8, 4))

CONTROLLER = "nodemaintenance"  # the Go controller's name: its kind, lower-cased
RECONCILE_RESULTS = ("error", "requeue_after", "requeue", "success")


@dataclass(frozen=True)
class QueueInstruments:
    """The ``workqueue_*`` series of one named queue (client-go's queue metrics)."""

    depth: Gauge
    adds: Counter
    latency: Histogram
    work_duration: Histogram
    unfinished: Gauge
    longest: Gauge
    retries: Counter


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._refreshers: list[Callable[[], None]] = []
        r = self.registry
        self.maintenances = Gauge(
            "nmo_maintenances",
            "NodeMaintenance objects by phase (Pending means no phase yet).",
            ["phase"],
            registry=r,
        )
        self.drain_duration = Histogram(
            "nmo_drain_duration_seconds",
            "Time from the start of a maintenance to Succeeded.",
            buckets=_DRAIN_BUCKETS,
            registry=r,
        )
        self.volume_detach_wait = Histogram(
            "nmo_volume_detach_wait_seconds",
            "Time a maintenance waited, after its last pod left, for the VolumeAttachments "
            "of the drained pods' volumes to go (--wait-for-volume-detach), by outcome "
            "(detached, timed_out, turned_off).",
            ["outcome"],
            buckets=_VOLUME_BUCKETS,
            registry=r,
        )
        self.evictions = Counter(
            "nmo_evictions_total",
            "Eviction API calls by outcome "
            "(evicted, gone, pdb_blocked, conflict, namespace_terminating, multiple_pdbs, error).",
            ["outcome"],
            registry=r,
        )
        self.drain_timeouts = Counter(
            "nmo_drain_timeouts_total",
            "Maintenances whose drain reached its deadline, by onTimeout action "
            "(Report, Delete, Abort).",
            ["action"],
            registry=r,
        )
        self.forced_deletions = Counter(
            "nmo_forced_deletions_total",
            "Pod deletions at the drain deadline (onTimeout Delete, PDBs bypassed), "
            "by outcome (deleted, gone, forbidden, error).",
            ["outcome"],
            registry=r,
        )
        self.drain_blocked = Gauge(
            "nmo_drain_blocked_seconds",
            "How long a maintenance's drain has been Blocked (condition Drained, "
            "reason Blocked); absent when it is not blocked.",
            ["maintenance", "node"],
            registry=r,
        )
        self.lease_errors = Counter(
            "nmo_lease_errors_total",
            "Failures to obtain or extend the medik8s node lease.",
            ["kind"],
            registry=r,
        )
        for action in ("Report", "Delete", "Abort"):
            self.drain_timeouts.labels(action=action)
        for outcome in ("deleted", "gone", "forbidden", "error"):
            self.forced_deletions.labels(outcome=outcome)
        for kind in ("foreign", "api", "renewal"):
            self.lease_errors.labels(kind=kind)
        self.notifications = Counter(
            "nmo_notifications_total",
            "Notifications to --notify-url by kind (begin, blocked, succeeded, failed, "
            "removed) and result (delivered, failed, dropped).",
            ["kind", "result"],
            registry=r,
        )
        self.notification_retries = Counter(
            "nmo_notification_retries_total",
            "Notification deliveries retried after a connection error, a 5xx or a 429.",
            ["kind"],
            registry=r,
        )
        self.lease_renewals = Counter(
            "nmo_lease_renewals_total",
            "Background renewals of medik8s node leases.",
            registry=r,
        )
        self.webhook_admissions = Counter(
            "nmo_webhook_admissions_total",
            "Admission reviews answered, by operation and result (allowed, denied, error).",
            ["operation", "result"],
            registry=r,
        )
        self.webhook_latency = Histogram(
            "nmo_webhook_admission_duration_seconds",
            "Time to answer an admission review.",
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        self.reconcile_total = Counter(
            "nmo_reconcile_total",
            "Reconciles by result (success, requeue, error).",
            ["result"],
            registry=r,
        )
        self.reconcile_errors = Counter(
            "nmo_reconcile_errors_total",
            "Reconciles that ended in an error.",
            registry=r,
        )
        self.reconcile_latency = Histogram(
            "nmo_reconcile_duration_seconds",
            "Time spent in one reconcile.",
            buckets=_FAST_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "nmo_workqueue_depth", "Keys waiting in the reconcile work queue.", registry=r
        )
        self.is_leader = Gauge(
            "nmo_leader", "1 when this replica holds the leader election lease.", registry=r
        )
        # The fleet's gates (issue 23): what holds new maintenances back.
        self.soak_remaining = Gauge(
            "nmo_fleet_soak_remaining_seconds",
            "Seconds left of the soak after the last node returned (0: no soak running).",
            registry=r,
        )
        self.blocking_alerts = Gauge(
            "nmo_fleet_blocking_alerts",
            "Alerts matching --blocking-alerts firing at the last answer from Prometheus.",
            registry=r,
        )
        self.prometheus_up = Gauge(
            "nmo_fleet_prometheus_up",
            "1 when the alert gate's last query to Prometheus was answered, 0 otherwise.",
            registry=r,
        )
        self.prometheus_queries = Counter(
            "nmo_fleet_prometheus_queries_total",
            "The alert gate's queries to Prometheus, by result (answered, failed).",
            ["result"],
            registry=r,
        )
        self._controller_runtime(r)
        ProcessCollector(registry=r)

    def on_scrape(self, refresh: Callable[[], None]) -> None:
        """Call ``refresh`` before every scrape: gauges of elapsed time (how
        long a drain has been blocked) are current when read, not as old as
        the last reconcile pass."""
        self._refreshers.append(refresh)

    def refresh(self) -> None:
        """What a ``/metrics`` request runs before rendering the registry."""
        for refresh in self._refreshers:
            refresh()

    def _controller_runtime(self, r: CollectorRegistry) -> None:
        """controller-runtime's and client-go's series, as the Go operator serves them."""
        self.cr_reconcile_total = Counter(
            "controller_runtime_reconcile_total",
            "Total number of reconciliations per controller",
            ["controller", "result"],
            registry=r,
        )
        self.cr_reconcile_errors = Counter(
            "controller_runtime_reconcile_errors_total",
            "Total number of reconciliation errors per controller",
            ["controller"],
            registry=r,
        )
        self.cr_terminal_errors = Counter(
            "controller_runtime_terminal_reconcile_errors_total",
            "Total number of terminal reconciliation errors per controller",
            ["controller"],
            registry=r,
        )
        self.cr_panics = Counter(
            "controller_runtime_reconcile_panics_total",
            "Total number of reconciliation panics per controller",
            ["controller"],
            registry=r,
        )
        self.cr_reconcile_time = Histogram(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            ["controller"],
            buckets=_RECONCILE_BUCKETS,
            registry=r,
        )
        self.cr_max_concurrent = Gauge(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            ["controller"],
            registry=r,
        )
        self.cr_active_workers = Gauge(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            ["controller"],
            registry=r,
        )
        q = ["name", "controller"]
        self.wq_depth = Gauge(
            "workqueue_depth",
            "Current depth of workqueue by workqueue and priority",
            [*q, "priority"],
            registry=r,
        )
        self.wq_adds = Counter(
            "workqueue_adds_total", "Total number of adds handled by workqueue", q, registry=r
        )
        self.wq_latency = Histogram(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            q,
            buckets=_QUEUE_BUCKETS,
            registry=r,
        )
        self.wq_work_duration = Histogram(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes.",
            q,
            buckets=_QUEUE_BUCKETS,
            registry=r,
        )
        self.wq_unfinished = Gauge(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been "
            "observed by work_duration. Large values indicate stuck threads. One can deduce "
            "the number of stuck threads by observing the rate at which this increases.",
            q,
            registry=r,
        )
        self.wq_longest = Gauge(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running.",
            q,
            registry=r,
        )
        self.wq_retries = Counter(
            "workqueue_retries_total", "Total number of retries handled by workqueue", q, registry=r
        )
        self.leader_status = Gauge(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates "
            "backup, 1 indicates master. 'name' is the string used to identify the lease. "
            "Please make sure to group by name.",
            ["name"],
            registry=r,
        )
        self.rest_requests = Counter(
            "rest_client_requests_total",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            ["code", "method", "host"],
            registry=r,
        )

    def controller_started(self, max_concurrent: int, controller: str = CONTROLLER) -> None:
        """The series controller-runtime creates when its controller starts (initMetrics)."""
        for result in RECONCILE_RESULTS:
            self.cr_reconcile_total.labels(controller=controller, result=result)
        for family in (self.cr_reconcile_errors, self.cr_terminal_errors, self.cr_panics):
            family.labels(controller=controller)
        self.cr_max_concurrent.labels(controller=controller).set(max_concurrent)
        self.cr_active_workers.labels(controller=controller).set(0)

    def reconciled(self, result: str, seconds: float, controller: str = CONTROLLER) -> None:
        """One pass, as controller-runtime's reconcileHandler counts it."""
        self.cr_reconcile_total.labels(controller=controller, result=result).inc()
        if result == "error":
            self.cr_reconcile_errors.labels(controller=controller).inc()
        self.cr_reconcile_time.labels(controller=controller).observe(seconds)

    def workqueue(
        self,
        name: str = CONTROLLER,
        *,
        depth: Callable[[], float],
        unfinished: Callable[[], float],
        longest: Callable[[], float],
    ) -> QueueInstruments:
        """The ``workqueue_*`` children of queue ``name``; gauges read the queue on scrape."""
        labels = {"name": name, "controller": name}
        instruments = QueueInstruments(
            depth=self.wq_depth.labels(priority="", **labels),
            adds=self.wq_adds.labels(**labels),
            latency=self.wq_latency.labels(**labels),
            work_duration=self.wq_work_duration.labels(**labels),
            unfinished=self.wq_unfinished.labels(**labels),
            longest=self.wq_longest.labels(**labels),
            retries=self.wq_retries.labels(**labels),
        )
        instruments.depth.set_function(depth)
        instruments.unfinished.set_function(unfinished)
        instruments.longest.set_function(longest)
        return instruments

    def leader(self, name: str, leading: bool) -> None:
        """client-go's leader-election metric (0 from the elector's creation on)."""
        self.leader_status.labels(name=name).set(1 if leading else 0)

    def rest_request(self, code: str, method: str, host: str) -> None:
        """One API request attempt, as client-go's rest client counts it."""
        self.rest_requests.labels(code=code, method=method, host=host).inc()
