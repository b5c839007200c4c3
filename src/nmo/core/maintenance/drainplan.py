"""The drain of one node as a plan: order, deadline, forced removals and the
``Drained`` condition (pure).

:func:`plan_drain` takes the pods the selection made (:mod:`.pods`), the
per-pod drain states, the PodDisruptionBudgets they name, the deadline and
the clocks, and says:

* which pods are due for an eviction now: only those of the lowest drain
  order still on the node (a later order starts once every pod of the
  earlier ones has left, including the ``wait-completed`` pods), and none
  that a PodDisruptionBudget which refused it still holds (:mod:`.pdbgate`);
* which pods are deleted now because the deadline is near
  (``onTimeout: Delete``): from ``deadline - the pod's grace period`` on,
  each remaining pod is deleted once with its own grace period (at least
  1 s) and a UID precondition, whatever its order and PDB;
* whether the deadline has passed, and when the next pass is due;
* the ``Drained`` condition: ``Draining``, ``Blocked`` (each blocking PDB
  with its numbers and the pods it holds), ``WaitingForCompletion`` or
  ``TimedOut``; ``True`` once nothing is pending.

The deadline lives in the CR (:func:`deadline_of`): it is the drain's
persisted start time plus ``spec.drain.timeoutSeconds`` (0: none), else the
persisted deadline, else the start time plus the operator's default. A restart or a
new leader recomputes exactly the same instant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from nmo.api import constants as c
from nmo.api.models import ConditionStatus, NodeMaintenance, OnTimeout
from nmo.core.maintenance import pdbgate
from nmo.core.maintenance.drainstate import (
    ERROR_REASONS,
    REASON_INVALID_RULE,
    REASON_PDB,
    REASON_WAIT_COMPLETED,
    PodDrainState,
    Survey,
    survey,
    terminating_since,
)
from nmo.core.maintenance.podselect import (
    RulesFrom,
    Selection,
    describe_order,
    grace_seconds,
    ignored_rules,
    no_pod_rules,
    order_key,
    pod_key,
)

Pod = dict[str, Any]

REASON_DRAINING = "Draining"
REASON_BLOCKED = "Blocked"
REASON_TIMED_OUT = "TimedOut"
REASON_DRAINED = "Drained"

MAX_NAMED_PODS = 5  # pods named per PDB in the Blocked message
MAX_NAMED_ERRORS = 3
MAX_MESSAGE = 4096  # the condition message stays readable (the API allows 32 KiB)


@dataclass(frozen=True)
class Deadline:
    start: datetime  # when the drain started (status.drainStartTime)
    at: datetime | None  # None: no deadline
    action: OnTimeout
    capped: bool = False  # the operator's --max-drain-seconds set it

    @property
    def seconds(self) -> int | None:
        return None if self.at is None else round((self.at - self.start).total_seconds())


def deadline_of(
    nm: NodeMaintenance,
    now: datetime,
    *,
    default_timeout: int,
    default_action: OnTimeout,
    cap_seconds: int = 0,
    cap_action: OnTimeout = OnTimeout.REPORT,
) -> Deadline:
    """The drain's deadline, from the CR alone (plus the operator's defaults).

    ``cap_seconds`` (> 0) is the admin's cap on every drain: no CR lifts it.
    When it comes first (or together), it sets the deadline and its action is
    ``cap_action``.
    """
    st, spec = nm.status, nm.spec.drain
    start = st.drain_start_time or now
    action = spec.on_timeout if spec is not None and spec.on_timeout is not None else None
    at: datetime | None = None
    if spec is not None and spec.timeout_seconds is not None:
        if spec.timeout_seconds > 0:  # 0: no deadline, whatever the operator's default
            at = start + timedelta(seconds=spec.timeout_seconds)
    elif st.drain_deadline is not None:
        at = st.drain_deadline  # set from the operator's default when the drain started
    elif default_timeout > 0:
        at = start + timedelta(seconds=default_timeout)
    if cap_seconds > 0:
        cap = start + timedelta(seconds=cap_seconds)
        if at is None or cap <= at:
            return Deadline(start=start, at=cap, action=cap_action, capped=True)
    return Deadline(start=start, at=at, action=action or default_action)


@dataclass(frozen=True)
class Condition:
    """The ``Drained`` condition as planned (the status adds the times)."""

    status: ConditionStatus
    reason: str
    message: str


@dataclass(frozen=True)
class DrainPlan:
    survey: Survey  # pending pods, the evictions due now, stale states
    force: tuple[tuple[Pod, int], ...]  # (pod, grace seconds) to delete now
    timed_out: bool  # the deadline has passed with pods pending
    next_wake: float | None  # seconds until the next pass is due for the drain
    condition: Condition


def _hold(
    selection: Selection, *, critical_last: bool, rules: RulesFrom
) -> tuple[dict[str, str], tuple[int, int] | None]:
    """Evictable pods not due yet because an earlier order is still on the node."""
    keys = {
        pod_key(p): order_key(p, critical_last=critical_last, rules=rules)
        for p in (*selection.evict, *selection.waited)
    }
    if not keys:
        return {}, None
    current = min(keys.values())
    why = f"waiting for the pods of drain {describe_order(current)} to leave the node"
    return {pod_key(p): why for p in selection.evict if keys[pod_key(p)] > current}, current


def plan_drain(
    selection: Selection,
    states: Mapping[str, PodDrainState],
    pdbs: Mapping[str, Mapping[str, Any]],
    deadline: Deadline,
    *,
    tick: float,
    now: datetime,
    critical_last: bool = False,
    rules: RulesFrom = no_pod_rules,
    pdb_recheck: float = pdbgate.RECHECK,
) -> DrainPlan:
    """One pass of the node's drain (see the module docstring; ``rules``: the
    namespaces whose pods' drain rules the selection honoured; ``pdb_recheck``:
    how often a PDB that stands in the way is asked again, :mod:`.pdbgate`)."""
    hold, _ = _hold(selection, critical_last=critical_last, rules=rules)
    gate = pdbgate.gate(
        selection.evict, states, pdbs, tick=tick, recheck=pdb_recheck, skip=hold.keys()
    )
    shown = {**states, **gate.shown} if gate.shown else states
    waited = [
        (p, REASON_WAIT_COMPLETED, "labelled wait-completed: waiting for it to complete")
        for p in selection.wait
    ] + [(p, REASON_INVALID_RULE, why) for p, why in selection.invalid]
    remarks = {
        pod_key(p): f"drain rules ignored ({ignored_rules(p)}): its namespace is not allowed "
        "to set them (--pod-drain-rules-namespaces)"
        for p in selection.ignored
    }
    drain = survey(
        shown,
        selection.evict,
        tick=tick,
        now=now,
        hold=hold,
        waited=waited,
        remarks=remarks,
        gated=gate.held,
        released=gate.released,
    )
    pending = len(drain.report.pending)
    wake = drain.report.next_wake
    if gate.wake is not None:
        wake = gate.wake if wake is None else min(wake, gate.wake)
    force: list[tuple[Pod, int]] = []
    timed_out = False
    if deadline.at is not None and pending:
        left = (deadline.at - now).total_seconds()
        timed_out = left <= 0
        if not timed_out:
            wake = left if wake is None else min(wake, left)
        if deadline.action is OnTimeout.DELETE:
            for pod in (*selection.evict, *selection.waited):
                state = states.get(pod_key(pod))
                if terminating_since(pod) is not None or (
                    state is not None and (state.forced or state.in_flight)
                ):
                    continue
                grace = grace_seconds(pod)
                until = left - grace
                if until <= 0:
                    force.append((pod, grace))
                else:
                    wake = until if wake is None else min(wake, until)
    condition = drained_condition(
        selection, shown, pdbs, drain, deadline, timed_out=timed_out, hold=hold
    )
    return DrainPlan(
        survey=drain,
        force=tuple(force),
        timed_out=timed_out,
        next_wake=wake,
        condition=condition,
    )


def _names(keys: Sequence[str], limit: int) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _pdb_figures(pdb: Mapping[str, Any] | None) -> str:
    if pdb is None:
        return " (not in the cache)"
    st = pdb.get("status") or {}
    return (
        f" needs {st.get('desiredHealthy', 0)} healthy and has {st.get('currentHealthy', 0)}"
        f" ({st.get('disruptionsAllowed', 0)} disruptions allowed)"
    )


def blocked_message(
    pending: Sequence[tuple[str, str]],
    states: Mapping[str, PodDrainState],
    pdbs: Mapping[str, Mapping[str, Any]],
    invalid: Sequence[tuple[Pod, str]] = (),
) -> str | None:
    """Why the drain cannot progress: each blocking PDB with its numbers and the
    pods it holds, then the pods with other eviction errors; None if nothing blocks."""
    by_pdb: dict[str, list[str]] = {}
    errors: list[str] = []
    for ns, name in pending:
        key = f"{ns}/{name}"
        state = states.get(key)
        # A pod a PDB refused stays held by it while it is asked again (a probe,
        # pdbgate): the condition does not flap to Draining and back for it.
        if state is None or (state.in_flight and state.reason != REASON_PDB):
            continue
        if state.reason == REASON_PDB:
            by_pdb.setdefault(f"{ns}/{state.pdb}" if state.pdb else "", []).append(key)
        elif state.reason in ERROR_REASONS:
            errors.append(f"{key}: {state.message or state.reason}")
    errors.extend(f"{pod_key(p)}: {why}" for p, why in invalid)
    parts: list[str] = []
    for pdb_key, keys in sorted(by_pdb.items()):
        held = f"{len(keys)} pod{'s' if len(keys) != 1 else ''}: {_names(keys, MAX_NAMED_PODS)}"
        if not pdb_key:
            parts.append(f"a PodDisruptionBudget forbids evicting {held}")
        else:
            figures = _pdb_figures(pdbs.get(pdb_key))
            parts.append(f"PodDisruptionBudget {pdb_key}{figures}, holding {held}")
    if errors:
        parts.append(
            f"{len(errors)} pod{'s' if len(errors) != 1 else ''} cannot be evicted: "
            + "; ".join(errors[:MAX_NAMED_ERRORS])
            + (
                f"; and {len(errors) - MAX_NAMED_ERRORS} more"
                if len(errors) > MAX_NAMED_ERRORS
                else ""
            )
        )
    return "; ".join(parts) if parts else None


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def timed_out_message(deadline: Deadline, pending: int) -> str:
    assert deadline.at is not None
    what = {
        OnTimeout.REPORT: "still draining",
        OnTimeout.DELETE: "deleting the remaining pods with their own grace period, "
        "bypassing PodDisruptionBudgets",
        OnTimeout.ABORT: "maintenance aborted, node restored and lease released",
    }[deadline.action]
    cap = " (the operator's cap, --max-drain-seconds)" if deadline.capped else ""
    return (
        f"drain did not finish within {deadline.seconds}s{cap} (deadline "
        f"{_stamp(deadline.at)}): {pending} pod{'s' if pending != 1 else ''} pending; "
        f"onTimeout {deadline.action.value}: {what}"
    )


def drained_condition(
    selection: Selection,
    states: Mapping[str, PodDrainState],
    pdbs: Mapping[str, Mapping[str, Any]],
    drain: Survey,
    deadline: Deadline,
    *,
    timed_out: bool,
    hold: Mapping[str, str],
) -> Condition:
    pending = drain.report.pending
    if not pending:
        return Condition(ConditionStatus.TRUE, REASON_DRAINED, "no pod left to evict")
    blocked = blocked_message(pending, states, pdbs, selection.invalid)
    if timed_out:
        message = timed_out_message(deadline, len(pending))
        if blocked:
            message += f"; {blocked}"
        return Condition(ConditionStatus.FALSE, REASON_TIMED_OUT, message[:MAX_MESSAGE])
    if blocked:
        return Condition(ConditionStatus.FALSE, REASON_BLOCKED, blocked[:MAX_MESSAGE])
    waiting = [pod_key(p) for p in selection.wait]
    by_key = {pod_key(p): p for p in selection.evict}
    current = [key for ns, name in pending if (key := f"{ns}/{name}") in by_key and key not in hold]
    moving = [key for key in current if terminating_since(by_key[key]) is None]
    if waiting and not current:  # only the wait-completed pods (and what they hold) are left
        message = (
            f"waiting for {len(waiting)} pod{'s' if len(waiting) != 1 else ''} labelled "
            f"{c.DRAIN_RULE_LABEL}={c.DRAIN_RULE_WAIT_COMPLETED} to complete: "
            f"{_names(waiting, MAX_NAMED_PODS)}"
        )
        return Condition(ConditionStatus.FALSE, REASON_WAIT_COMPLETED, message[:MAX_MESSAGE])
    terminating = sum(
        1 for ns, name in pending if (p := by_key.get(f"{ns}/{name}")) and terminating_since(p)
    )
    figures = [
        f"{n} {what}"
        for n, what in (
            (len(moving), "being evicted"),
            (terminating, "terminating"),
            (len(hold), "waiting for their drain order"),
            (len(waiting), "waiting to complete"),
        )
        if n
    ]
    message = f"{len(pending)} pod{'s' if len(pending) != 1 else ''} pending"
    if figures:
        message += ": " + ", ".join(figures)
    return Condition(ConditionStatus.FALSE, REASON_DRAINING, message)


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def blocked_since(obj: Mapping[str, Any]) -> datetime | None:
    """Since when a NodeMaintenance (as stored) has been Blocked, None if it is not.

    Read from the raw object (the metrics gauge runs after every pass over
    every CR): the earliest ``since`` of its blocked pods, else the
    condition's transition time.
    """
    status = obj.get("status") or {}
    drained = next(
        (x for x in status.get("conditions") or [] if x.get("type") == c.CONDITION_DRAINED), None
    )
    if drained is None or drained.get("reason") != REASON_BLOCKED:
        return None
    blocking = (REASON_PDB, *ERROR_REASONS)
    times = [
        t
        for d in status.get("pendingPodsDetails") or []
        if d.get("reason") in blocking and (t := _parse_time(d.get("since"))) is not None
    ]
    return min(times) if times else _parse_time(drained.get("lastTransitionTime"))
