"""Prometheus metrics NMO never exported (behavior.md B10).

One :class:`Metrics` object per process, created in the entry point and
passed down (no global registry), so tests get a fresh registry each.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_DRAIN_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
_FAST_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
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
            "by outcome (deleted, gone, error).",
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
        for outcome in ("deleted", "gone", "error"):
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
