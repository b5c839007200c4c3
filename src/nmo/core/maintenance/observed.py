"""What one reconcile pass observed, and what it plans to do (plain data).

:class:`Observed` is a frozen snapshot read from the caches and the
maintenance's memory record only: no request is made to build it. What the
caches cannot answer (a node missing from the node cache, an unknown
DaemonSet owner, the fleet ledger, the etcd-quorum facts) is named in
``Observed.reads``; the plan asks the executor for those reads, and the next
pass sees their answers in the record. :class:`Plan` is every read, write,
event and lifecycle change one pass makes; the executor applies it in a
fixed order and decides nothing. When a write fails the pass ends; what
failed is recorded, and the next pass plans from it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from nmo.api.models import NodeMaintenance, NodeMaintenanceStatus, OnTimeout
from nmo.core.maintenance.admission import Fleet
from nmo.core.maintenance.drainstate import PodDrainState
from nmo.core.maintenance.gates import AlertsSeen, Returned

if TYPE_CHECKING:
    from nmo.core.maintenance.notifications import Notification

Obj = dict[str, Any]


class ReadKind(enum.Enum):
    """A read the caches could not answer, made by the executor for the next pass."""

    NODE = "node"  # a node missing from the node cache: a live GET
    DAEMONSET = "daemonset"  # whether a pod's DaemonSet owner exists ("namespace/name")
    MAINTENANCE = "maintenance"  # the CR, live, before a lease it does not hold is taken
    LEDGER = "ledger"  # the fleet ledger (and whether its entries' CRs still exist)
    QUORUM = "quorum"  # the etcd-quorum facts, for a queued control-plane node
    VOLUMES = "volumes"  # the node's VolumeAttachments and their PVs (drain at its end)


@dataclass(frozen=True)
class Read:
    kind: ReadKind
    name: str = ""  # the node, the "namespace/name" of a DaemonSet, the CR


@dataclass(frozen=True)
class LeaseFailure:
    """A lease request of an earlier pass that failed (the pass ended there)."""

    error: str
    foreign: bool  # held by another holder (else: the API refused)


@dataclass(frozen=True)
class Recall:
    """What the maintenance's memory record knows, as the planner sees it."""

    lease_held: bool = False  # requested successfully and a renewer is running
    renewal_error: str | None = None  # the renewer's last failure, not yet handled
    status_written_ago: float | None = None  # seconds since our last status write
    last_written: Mapping[str, Any] | None = None  # that status, within the last minute
    lease_failure: LeaseFailure | None = None  # the last pass's lease request failed
    api_error: str | None = None  # the last pass ended on this API error (for lastError)
    confirmed: bool | None = None  # a live read of the CR: True it exists, False gone


@dataclass(frozen=True)
class QuorumFacts:
    """What the etcd-quorum rule reads, read live for a queued control-plane node."""

    openshift: bool
    pdbs: tuple[Obj, ...] = ()  # the PodDisruptionBudgets of openshift-etcd
    pods: tuple[Obj, ...] = ()  # its pods, when the one PDB allows no disruption
    error: str | None = None  # the read failed: the maintenance waits


@dataclass(frozen=True)
class VolumeFacts:
    """What volume-safe completion decides on (:mod:`nmo.core.maintenance.volumes`),
    read by the executor when a drain that waits for volumes reached its end."""

    attachments: tuple[Obj, ...] = ()  # the VolumeAttachments whose spec.nodeName is the node
    # PV name -> the PersistentVolume (None: not found)
    volumes: Mapping[str, Obj | None] = field(default_factory=dict)
    error: str | None = None  # the read failed: nothing above is known


@dataclass(frozen=True)
class Ledger:
    """The fleet ledger as last read or written by this process."""

    entries: Mapping[str, Mapping[str, str]]  # CR name -> {"uid", "node"}
    gone: frozenset[str] = frozenset()  # entries whose CR a live read found gone (or failed)
    fresh: bool = True  # every entry's CR is in the cache or was confirmed by that read
    version: str | None = None  # the Lease's resourceVersion (None: there is no Lease yet)
    returned: Returned | None = None  # the last node back from a maintenance (the soak's)


@dataclass(frozen=True)
class LedgerWrite:
    """The ledger's new entries, written with the resourceVersion it was read at
    (a compare-and-swap: a 409 ends the pass, and the next one reads it again)."""

    entries: Mapping[str, Mapping[str, str]]
    version: str | None = None  # the resourceVersion it was decided on (None: create it)
    admitted: str | None = None  # the CR this write admits (for the log)
    released: str | None = None  # the CR whose slot this write frees
    returned: Returned | None = None  # a node is back: the soak starts (None: unchanged)


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
    reads: tuple[Read, ...] = ()  # what the caches could not answer (see ReadKind)
    ledger: Ledger | None = None  # the fleet ledger (None: no budget, or not read yet)
    fleet: Fleet | None = None  # the fleet as the budget sees it (a CR awaiting its start)
    quorum: QuorumFacts | None = None  # read for a queued control-plane node about to start
    volumes: VolumeFacts | None = None  # read when a drain that waits for volumes ends
    alerts: AlertsSeen | None = None  # the alert gate's last answer (None: no gate)


class LeaseStep(enum.Enum):
    NONE = "none"
    REQUEST = "request"  # obtain or renew as needed
    FORCE = "force"  # renew now (a background renewal failed)
    RELEASE = "release"


class Work(enum.Enum):
    """What happens to the maintenance's background work after the pass."""

    RUN = "run"  # pod watch (and, once the lease is held, its renewer) running
    KEEP = "keep"  # a pass that only reads or reports: nothing starts or stops
    QUEUED = "queued"  # held back by the budget: nothing runs for it yet
    STOP = "stop"  # terminal: stop drain, renewer and pod watch, keep the record
    FORGET = "forget"  # the CR is gone or let go: forget the record


class Step(enum.Enum):
    """The step of the apply order after which an event is recorded."""

    METADATA = "metadata"  # the finalizer is written (BeginMaintenance)
    NODE = "node"  # the node is patched or restored (UncordonNode, NodeKeptCordoned)
    END = "end"  # the pass went through


@dataclass(frozen=True)
class Emit:
    """An Event to record, on the NodeMaintenance or on its Node."""

    event: tuple[str, str]  # (reason, message) from nmo.api.constants
    target: Literal["maintenance", "node"] = "maintenance"
    warning: bool = False
    after: Step = Step.END  # recorded once this step is done, even if a later one fails


@dataclass(frozen=True)
class Force:
    """A pod to delete at the drain deadline (onTimeout Delete), and the event
    recorded when the API server deleted it."""

    pod: Obj
    grace: int
    event: Emit


@dataclass(frozen=True)
class Result:
    """What the work queue does with the key after the pass."""

    requeue_after: float | None = None
    terminal: bool = False


DONE = Result()
TERMINAL = Result(terminal=True)


@dataclass(frozen=True)
class Plan:
    reads: tuple[Read, ...] = ()  # reads for the next pass (the pass writes nothing else)
    ledger: LedgerWrite | None = None  # the fleet ledger's compare-and-swap
    metadata: Obj | None = None  # merge patch of the CR's metadata (finalizers, owners...)
    lease: LeaseStep = LeaseStep.NONE
    status: NodeMaintenanceStatus | None = None  # the status to write, None: no write
    node_patch: list[Obj] | None = None  # guarded JSON patch of the node
    # Strategic-merge patch of the node's status: nmo's lifecycle conditions
    # (--node-conditions, nmo.core.maintenance.nodeconditions), after node_patch.
    node_conditions: Obj | None = None
    restore: bool = False  # node_patch restores the node (re-planned on conflict)
    evict: tuple[Obj, ...] = ()  # pods to start evicting (only once the node is cordoned)
    force: tuple[Force, ...] = ()  # pods to delete: the drain deadline is near
    timed_out: OnTimeout | None = None  # the drain just reached its deadline (metric)
    drop: tuple[str, ...] = ()  # drain states to forget
    events: tuple[Emit, ...] = ()
    work: Work = Work.RUN
    result: Result = DONE
    notes: tuple[str, ...] = ()  # log lines (the guide greps some: keep their wording)
    drain_seconds: float | None = None  # the drain just finished after this long
    drain_pending: int | None = None  # pods still pending (for the log)
    volume_wait: tuple[str, float] | None = None  # a volume wait ended: (outcome, seconds)
    # For the notifier, each once its step is done (a begin notification goes
    # with the finalizer, as its event does).
    notifications: tuple[tuple[Step, Notification], ...] = ()
    # The last round's API error for lastError: a merge patch of lastError and
    # lastUpdate only, without a resourceVersion (Go's onReconcileError).
    report: Mapping[str, Any] | None = None
