"""What a drain knows about each pod, and the survey of a node's drain (pure).

The eviction executor (:mod:`nmo.controller.evictor`) keeps one :class:`PodDrainState`
per pod it must remove, in the maintenance's memory record, and updates it
as eviction answers arrive. :func:`survey` reads those states together with
the pods currently on the node and says, without changing anything:

* which pods are still pending, and why (blocked pods first, capped at
  :data:`MAX_DETAILS` details; ``pendingPods`` always lists every pod);
* which pods are due for an eviction attempt now;
* which states are stale (the pod left, or was replaced under the same
  name: a new UID);
* when the earliest backed-off pod is due again.

Times: ``tick`` is the event loop's monotonic clock (backoff deadlines);
``since`` values are wall-clock datetimes shown in the status.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from nmo.api.models import PendingPodDetail
from nmo.core.maintenance.podselect import pod_key

Pod = dict[str, Any]

REASON_PDB = "DisruptionBudget"
REASON_NS_TERMINATING = "NamespaceTerminating"
REASON_MULTI_PDB = "MultiplePDBs"
REASON_ERROR = "EvictionError"
REASON_TERMINATING = "Terminating"
REASON_WAITING = "Waiting"
REASON_EVICTING = "Evicting"
REASON_WAIT_COMPLETED = "WaitingForCompletion"  # drain=wait-completed, still running
REASON_INVALID_RULE = "InvalidDrainRule"  # an unknown drain rule: not evicted, blocks

ERROR_REASONS = (REASON_MULTI_PDB, REASON_ERROR, REASON_NS_TERMINATING, REASON_INVALID_RULE)

MAX_DETAILS = 100  # pendingPodsDetails is capped; pendingPods always lists every pod
_DETAIL_ORDER = {
    REASON_PDB: 0,
    REASON_MULTI_PDB: 0,
    REASON_NS_TERMINATING: 0,
    REASON_ERROR: 0,
    REASON_INVALID_RULE: 0,
    REASON_WAIT_COMPLETED: 1,
    REASON_TERMINATING: 1,
    REASON_EVICTING: 2,
    REASON_WAITING: 2,
}


@dataclass
class PodDrainState:
    """One pod's drain, as the eviction executor last saw it."""

    uid: str
    since: datetime  # when the pod's drain state last changed (the executor's clock)
    reason: str = REASON_WAITING
    message: str = ""
    pdb: str | None = None  # the blocking PodDisruptionBudget's name (pod's namespace)
    next_attempt: float = 0.0
    attempts: int = 0
    in_flight: bool = False
    evicted: bool = False
    forced: bool = False  # deleted after the drain deadline (onTimeout: Delete)
    # The last 429 from a PodDisruptionBudget (the event loop's clock), and that
    # PDB's status as the cache showed it when the eviction was sent
    # (:func:`nmo.core.maintenance.disruption.status_key`; None: not in the
    # cache). :mod:`nmo.core.maintenance.pdbgate` holds the pod while it stands.
    refused_at: float | None = None
    budget_seen: tuple[tuple[str, str], ...] | None = None


@dataclass(frozen=True)
class DrainReport:
    """Where a node's drain stands (the ``drain report`` a plan reads)."""

    pending: list[tuple[str, str]]  # (namespace, name) of every pod still on the node
    details: list[PendingPodDetail]  # why, blocked pods first, at most MAX_DETAILS
    next_wake: float | None  # seconds until a backed-off pod is due again
    last_error: str | None


@dataclass(frozen=True)
class Survey:
    report: DrainReport
    due: list[Pod]  # pods to start an eviction for now
    stale: list[str]  # state keys to drop


def terminating_since(pod: Pod) -> datetime | None:
    """When the pod's deletion began (deletionTimestamp minus its grace period)."""
    meta = pod.get("metadata") or {}
    stamp = meta.get("deletionTimestamp")
    if not stamp:
        return None
    return _began(str(stamp), int(meta.get("deletionGracePeriodSeconds") or 0))


@lru_cache(maxsize=4096)
def _began(stamp: str, grace: int) -> datetime:
    """deletionTimestamp minus the grace period (parsed once per distinct pair:
    a pass reads every terminating pod of the node several times)."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")) - timedelta(seconds=grace)


def _view(pod: Pod, state: PodDrainState | None) -> tuple[str, str, str | None, datetime | None]:
    """(reason, message, pdb, since) as shown for a pod."""
    since = terminating_since(pod)
    if since is not None and (state is None or not state.in_flight):
        return REASON_TERMINATING, f"pod is terminating since {since.isoformat()}", None, since
    if state is None:
        return REASON_WAITING, "", None, None
    return state.reason, state.message, state.pdb, state.since


def survey(
    states: Mapping[str, PodDrainState],
    pods: Sequence[Pod],
    *,
    tick: float,
    now: datetime,
    hold: Mapping[str, str] | None = None,
    waited: Sequence[tuple[Pod, str, str]] = (),
    remarks: Mapping[str, str] | None = None,
    gated: Collection[str] = (),
    released: Collection[str] = (),
) -> Survey:
    """The drain of one node: pending pods, what is due, what is stale.

    ``pods`` are the pods to evict; those in ``hold`` (key -> why) are pending
    but not due yet (a later drain order). ``waited`` are pods the drain waits
    on without evicting them, as ``(pod, reason, message)``. ``remarks``
    (key -> text) is shown for a pod that has no message of its own.
    ``gated`` pods are not due (a PodDisruptionBudget that refused them
    stands, :mod:`.pdbgate`), ``released`` ones are due whatever their backoff
    says (that PDB changed since).
    """
    hold = hold or {}
    remarks = remarks or {}
    present = {pod_key(p): p for p in pods}
    extra = {pod_key(p): (p, reason, message) for p, reason, message in waited}
    stale = [
        key
        for key, state in states.items()
        if (key not in present and key not in extra)
        or (present.get(key) or extra[key][0])["metadata"].get("uid") != state.uid
    ]
    live = {k: s for k, s in states.items() if k not in stale}
    due: list[Pod] = []
    wake: float | None = None
    errors: list[str] = []
    rows: list[tuple[int, int, str, str, str, str, str | None, datetime | None]] = []
    pending: list[tuple[str, str]] = []
    for key, pod in [*present.items(), *((k, v[0]) for k, v in extra.items())]:
        state = live.get(key)
        terminating = terminating_since(pod) is not None
        held = key in hold or key in extra
        if state is not None and state.forced:
            pass  # its deletion was accepted: the pod watch reports it terminating
        elif held or key in gated:
            pass
        elif state is None:
            if not terminating:
                due.append(pod)
        elif not state.in_flight and not terminating:
            if key in released or tick >= state.next_attempt:
                due.append(pod)
            else:
                remaining = state.next_attempt - tick
                wake = remaining if wake is None else min(wake, remaining)
        reason, message, pdb, since = _view(pod, state)
        if key in extra and not terminating and (state is None or not state.in_flight):
            _, reason, message = extra[key]
        elif key in hold and state is None and not terminating:
            reason, message = REASON_WAITING, hold[key]
        elif state is None and not terminating:
            reason = REASON_EVICTING
        if not message and key in remarks:
            message = remarks[key]
        if reason in ERROR_REASONS:
            errors.append(message)
        meta = pod["metadata"]
        ns, name = str(meta.get("namespace", "")), str(meta["name"])
        pending.append((ns, name))
        rows.append(
            (_DETAIL_ORDER.get(reason, 3), len(rows), ns, name, reason, message, pdb, since)
        )
    # Stable: blocked pods first, then in the node's order; only the shown
    # details become models (a 1,000-pod drain shows 100).
    rows.sort(key=lambda row: (row[0], row[1]))
    details = [
        PendingPodDetail(
            namespace=ns,
            name=name,
            reason=reason,
            message=message,
            disruption_budget=pdb,
            since=since or now,
        )
        for _, _, ns, name, reason, message, pdb, since in rows[:MAX_DETAILS]
    ]
    return Survey(
        report=DrainReport(
            pending=pending,
            details=details,
            next_wake=wake,
            last_error=errors[0] if errors else None,
        ),
        due=due,
        stale=stale,
    )


def names_budget(states: Mapping[str, PodDrainState], namespace: str, pdb: str) -> bool:
    """Whether a pod of ``namespace`` is held by the PDB ``pdb`` (refused by it)."""
    return any(
        s.reason == REASON_PDB and s.pdb == pdb and key.split("/", 1)[0] == namespace
        for key, s in states.items()
    )
