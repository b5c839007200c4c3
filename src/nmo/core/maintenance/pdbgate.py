"""No blind retries behind a PodDisruptionBudget (pure).

A 429 from a PDB says its status allows no disruption now. Retrying the pod
on a timer asks the same question again and gets the same answer until the
PDB's status changes, and the PDB informer sees that change. So, for each
PDB in the cache that refused a pod of the node (the pod's drain state names
it, :attr:`PodDrainState.refused_at` is set), :func:`gate` decides which of
the pods it holds go this pass:

* **standing**: a pod was refused against the PDB's current status
  (:attr:`PodDrainState.budget_seen` equals
  :func:`~nmo.core.maintenance.disruption.status_key` of the cached PDB) and
  that status allows no disruption: no pod of the PDB is due. Once
  ``recheck`` seconds have passed since its last refusal, and none of its
  pods is in flight, one pod is (the one refused longest ago): a single
  probe per PDB per interval, in case the cache is wrong.
* **changed**: no refusal was made against the current status (the PDB
  changed since, which wakes the maintenance): up to
  ``max(1, disruptionsAllowed)`` pods, counting those in flight, are due at
  once, the refused ones first (longest ago first), whatever their backoff
  says. A pod refused against a status that still shows disruptions allowed
  (the cache is behind, or another drain took them) keeps its backoff.

The pods of the node the PDB selects that were never refused (a later drain
order, a 409 retried) are held with it, shown as its refused pods are (reason,
message, budget, since), so ``pendingPodsDetails`` and the ``Drained``
condition read as if each had been refused. A Pending, terminating, completed
or unready pod is never held: the eviction API may let it go without
consuming a disruption (:mod:`.disruption`, rules 1 and 4).

A PDB that is not in the cache (no RBAC to watch PDBs, not leading, deleted)
gates nothing: its pods follow their backoff, as a 429 without a named PDB
does. Times are the event loop's ``tick``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from nmo.core.maintenance.disruption import Figures, ignores_budgets, is_ready, selects, status_key
from nmo.core.maintenance.drainstate import (
    REASON_EVICTING,
    REASON_PDB,
    REASON_WAITING,
    PodDrainState,
    terminating_since,
)
from nmo.core.maintenance.podselect import pod_key, pod_namespace

Pod = dict[str, Any]

RECHECK = 60.0  # seconds: a standing PDB is probed this often (PlanSettings.pdb_recheck)


@dataclass(frozen=True)
class Gate:
    """What the PDBs that refused pods of a node let through this pass."""

    held: frozenset[str] = frozenset()  # not due, whatever their backoff says
    released: frozenset[str] = frozenset()  # due now, whatever their backoff says
    shown: Mapping[str, PodDrainState] = field(default_factory=dict)  # held, never refused
    wake: float | None = None  # seconds until a held pod is due (a probe, a backoff)


@dataclass
class _Budget:
    key: str  # namespace/name of the PDB
    pdb: Mapping[str, Any]
    refused: list[str] = field(default_factory=list)  # its pods it refused, not in flight
    others: list[str] = field(default_factory=list)  # its pods never refused, not in flight
    in_flight: int = 0


def _refused_by(state: PodDrainState | None) -> bool:
    return state is not None and state.reason == REASON_PDB and bool(state.pdb)


def _fresh(pod: Pod, state: PodDrainState | None) -> bool:
    """A pod no answer has placed yet, which the PDB's figures decide."""
    if state is not None and (
        state.forced or state.evicted or state.reason not in (REASON_WAITING, REASON_EVICTING)
    ):
        return False
    return is_ready(pod) and not ignores_budgets(pod)


def _budgets(
    pods: Sequence[Pod],
    states: Mapping[str, PodDrainState],
    pdbs: Mapping[str, Mapping[str, Any]],
    skip: Collection[str],
) -> list[_Budget]:
    candidates = [p for p in pods if pod_key(p) not in skip and terminating_since(p) is None]
    budgets: dict[str, _Budget] = {}
    placed: set[str] = set()
    for pod in candidates:
        key, state = pod_key(pod), states.get(pod_key(pod))
        if state is None or not _refused_by(state) or state.forced:
            continue
        name = f"{pod_namespace(pod)}/{state.pdb}"
        pdb = pdbs.get(name)
        if pdb is None:
            continue  # not in the cache: its backoff decides
        budget = budgets.setdefault(name, _Budget(name, pdb))
        placed.add(key)
        if state.in_flight:
            budget.in_flight += 1
        elif state.refused_at is not None:
            budget.refused.append(key)
        else:
            budget.others.append(key)  # a 409 since its refusal: retried as the others
    if not budgets:
        return []
    ordered = sorted(budgets)
    for pod in candidates:
        key, state = pod_key(pod), states.get(pod_key(pod))
        if key in placed or not _fresh(pod, state):
            continue
        held_by = next((budgets[n] for n in ordered if selects(budgets[n].pdb, pod)), None)
        if held_by is None:
            continue
        if state is not None and state.in_flight:
            held_by.in_flight += 1
        else:
            held_by.others.append(key)
    return [budgets[n] for n in ordered]


def _soonest(a: float | None, b: float) -> float:
    return b if a is None else min(a, b)


def gate(
    pods: Sequence[Pod],
    states: Mapping[str, PodDrainState],
    pdbs: Mapping[str, Mapping[str, Any]],
    *,
    tick: float,
    recheck: float = RECHECK,
    skip: Collection[str] = (),
) -> Gate:
    """Which pods the PDBs that refused pods of the node let go now (module docstring).

    ``pods`` are the pods to evict, ``skip`` those not due for another reason
    (a later drain order); ``pdbs`` the cached PDBs the drain states name.
    """
    held: set[str] = set()
    released: set[str] = set()
    shown: dict[str, PodDrainState] = {}
    wake: float | None = None
    uids = {pod_key(p): str(p["metadata"].get("uid", "")) for p in pods}
    for budget in _budgets(pods, states, pdbs, skip):
        refused = sorted(budget.refused, key=lambda k: (states[k].refused_at or 0.0, k))
        seen = [states[k] for k in refused]
        if not seen and not budget.in_flight:
            continue  # only 409s since: their backoff decides
        figures = Figures.of(budget.pdb)
        allowed = figures.disruptions_allowed if figures.observed else 0
        current = status_key(budget.pdb)
        against = [s.refused_at or 0.0 for s in seen if s.budget_seen == current]
        ready: list[str] = []
        if against and allowed < 1:  # standing: one probe per interval
            probe_at = max(against) + recheck
            if budget.in_flight:
                pass  # its answer wakes the maintenance
            elif tick >= probe_at and refused:
                ready = refused[:1]
            else:
                wake = _soonest(wake, probe_at - tick)
        else:  # changed since (or the cache shows room): as many as it allows
            slots = max(1, allowed) - budget.in_flight
            for key in (*refused, *budget.others):
                state = states.get(key)
                changed = (
                    key in budget.refused and state is not None and (state.budget_seen != current)
                )
                if state is None or changed or tick >= state.next_attempt:
                    ready.append(key)
                else:
                    wake = _soonest(wake, state.next_attempt - tick)
            ready = ready[: max(0, slots)]
        released.update(ready)
        held.update(k for k in (*refused, *budget.others) if k not in ready)
        if seen:
            latest = seen[-1]  # the message of the latest refusal, since of the earliest
            since = min(s.since for s in seen)
            for key in budget.others:
                state = states.get(key)
                if key not in ready and (state is None or not _refused_by(state)):
                    shown[key] = replace(
                        latest,
                        uid=uids.get(key, ""),
                        since=since,
                        in_flight=False,
                        attempts=0 if state is None else state.attempts,
                        refused_at=None,
                    )
    return Gate(held=frozenset(held), released=frozenset(released), shown=shown, wake=wake)
