"""What one reconcile pass observed, and what it plans to do (plain data).

:class:`Observed` is read from the caches and the maintenance's memory
record only (no request is made to build it beyond a GET for a node missing
from the cache and a GET per unknown DaemonSet owner). :class:`Plan` is every
write, event and lifecycle change one pass makes; the executor applies at
most one write of each kind.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from nmo.api.models import NodeMaintenance, NodeMaintenanceStatus, OnTimeout
from nmo.core.maintenance.admission import Admission
from nmo.core.maintenance.drainstate import PodDrainState

Obj = dict[str, Any]


@dataclass(frozen=True)
class Recall:
    """What the maintenance's memory record knows, as the planner sees it."""

    lease_held: bool = False  # requested successfully and a renewer is running
    renewal_error: str | None = None  # the renewer's last failure, not yet handled
    status_written_ago: float | None = None  # seconds since our last status write
    last_written: Mapping[str, Any] | None = None  # that status, within the last minute


@dataclass(frozen=True)
class Observed:
    nm: NodeMaintenance
    others: tuple[NodeMaintenance, ...]  # other CRs naming the same node
    node: Obj | None  # None: the node does not exist (or was not read: planner.needs_node)
    pods: tuple[Obj, ...] | None  # the node's pods; None while its pod watch has not synced
    daemonsets: Mapping[str, bool]  # "namespace/name" of DaemonSet owners -> exists
    drain: Mapping[str, PodDrainState]  # per-pod drain states ("namespace/name")
    recall: Recall
    now: datetime  # wall clock (status times)
    tick: float  # event loop clock (backoff deadlines)
    pdbs: Mapping[str, Obj] = field(default_factory=dict)  # "ns/name" -> PDBs drain states name
    admission: Admission | None = None  # the fleet budget's answer (None: no budget applies)


class LeaseStep(enum.Enum):
    NONE = "none"
    REQUEST = "request"  # obtain or renew as needed
    FORCE = "force"  # renew now (a background renewal failed)
    RELEASE = "release"


class Work(enum.Enum):
    """What happens to the maintenance's background work after the pass."""

    RUN = "run"  # pod watch (and, once the lease is held, its renewer) running
    QUEUED = "queued"  # held back by the budget: nothing runs for it yet
    STOP = "stop"  # terminal: stop drain, renewer and pod watch, keep the record
    FORGET = "forget"  # the CR is gone or let go: forget the record


@dataclass(frozen=True)
class Emit:
    """An Event to record, on the NodeMaintenance or on its Node."""

    event: tuple[str, str]  # (reason, message) from nmo.api.constants
    target: Literal["maintenance", "node"] = "maintenance"
    warning: bool = False


@dataclass(frozen=True)
class Result:
    """What the work queue does with the key after the pass."""

    requeue_after: float | None = None
    terminal: bool = False


DONE = Result()
TERMINAL = Result(terminal=True)


@dataclass(frozen=True)
class Plan:
    metadata: Obj | None = None  # merge patch of the CR's metadata (finalizers, owners...)
    lease: LeaseStep = LeaseStep.NONE
    status: NodeMaintenanceStatus | None = None  # the status to write, None: no write
    node_patch: list[Obj] | None = None  # guarded JSON patch of the node
    restore: bool = False  # node_patch restores the node (re-planned on conflict)
    evict: tuple[Obj, ...] = ()  # pods to start evicting (only once the node is cordoned)
    force: tuple[tuple[Obj, int], ...] = ()  # (pod, grace s) to delete: the deadline is near
    timed_out: OnTimeout | None = None  # the drain just reached its deadline (metric)
    drop: tuple[str, ...] = ()  # drain states to forget
    events: tuple[Emit, ...] = ()
    work: Work = Work.RUN
    result: Result = DONE
    notes: tuple[str, ...] = ()  # log lines (the guide greps some: keep their wording)
    drain_seconds: float | None = None  # the drain just finished after this long
    drain_pending: int | None = None  # pods still pending (for the log)
    fields: dict[str, Any] = field(default_factory=dict)  # log context
