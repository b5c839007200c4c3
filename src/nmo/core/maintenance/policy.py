"""What every plan follows: the operator's settings, when a status is written,
and the heartbeat that says the operator is alive (pure).

:class:`PlanSettings` are nmo's flags as the planner reads them. A status is
written only when it changes something (:func:`status_write`); a live
maintenance's ``lastUpdate`` still moves once per ``heartbeat``
(:func:`heartbeat`). :func:`reading` is the plan of a round that only reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from nmo.api import constants as c
from nmo.api.models import NodeMaintenanceStatus, OnTimeout, Phase
from nmo.core.maintenance import admission, transitions
from nmo.core.maintenance.observed import Observed, Plan, Read, Result, Work


@dataclass(frozen=True)
class PlanSettings:
    status_interval: float = 1.0  # at most one progress write per CR per interval
    resync: float = 60.0  # safety requeue while a drain is in progress
    # --pdb-recheck-interval: a PDB that refused a pod and has not changed since
    # is asked again this often, one pod per PDB (any change retries at once).
    pdb_recheck: float = 60.0
    lease_retry: float = 5.0  # retry after a failed lease request
    pods_wait: float = 5.0  # safety requeue while the node's pod watch syncs
    rewrite_after: float = 60.0  # a pruned status is rewritten at most this often
    drain_timeout: int = 0  # operator default for spec.drain.timeoutSeconds (0: none)
    on_timeout: OnTimeout = OnTimeout.REPORT  # operator default for spec.drain.onTimeout
    queue_recheck: float = 30.0  # a queued CR is looked at again at least this often
    heartbeat: float = 60.0  # lastUpdate of a Pending or Running CR is never older than this
    critical_last: bool = False  # --critical-pods-last: critical pods after the others (opt-in)
    # --pod-drain-rules-namespaces: whose pods' drain label and drain-order are
    # honoured (none: the Go NMO's behaviour; "*": every namespace).
    pod_rules_namespaces: frozenset[str] = frozenset()
    # --max-drain-seconds / --max-drain-action: a cap on every drain that no CR lifts.
    max_drain_seconds: int = 0
    max_drain_action: OnTimeout = OnTimeout.REPORT
    # --max-parallel-maintenances, --max-unavailable, the window: the fleet budget
    # (disabled by default, as the Go NMO has none).
    budget: admission.BudgetSettings = field(default_factory=admission.BudgetSettings)
    # --wait-for-volume-detach / --volume-detach-timeout: after the drain, wait for
    # the drained pods' VolumeAttachments to go (off: as the Go NMO); looked at
    # again every volume_poll seconds while waiting.
    volume_detach: bool = False
    volume_detach_timeout: int = c.VOLUME_DETACH_TIMEOUT_DEFAULT
    volume_poll: float = 5.0
    # --notify-url: the operator's identity in the notifications (None: none are made).
    notify_operator: str | None = None


SETTINGS = PlanSettings()


def status_write(
    obs: Observed, new: NodeMaintenanceStatus, settings: PlanSettings
) -> NodeMaintenanceStatus | None:
    """``new`` if writing it changes something, else None.

    A status identical to the one this process wrote within ``rewrite_after``
    is not written again: a server that prunes fields it does not know (the
    Go NMO's CRD has no pendingPodsDetails) must not cause a write per pass.
    """
    compared = fingerprint(new)  # once: it dumps every pending pod
    if fingerprint(obs.nm.status) == compared:
        return None
    recall = obs.recall
    if (
        recall.last_written is not None
        and recall.status_written_ago is not None
        and recall.status_written_ago < settings.rewrite_after
        and recall.last_written == compared
    ):
        return None
    return new


def progress_wait(
    obs: Observed, new: NodeMaintenanceStatus, settings: PlanSettings
) -> float | None:
    """Seconds until a drain's progress may be written, None: now.

    At most one write per CR per ``status_interval`` while a drain runs; a
    write that carries a transition (the phase, a condition's status or
    reason: Draining -> Blocked, TimedOut) goes at once, as does the first
    (the starting figures) and the final one (Succeeded is planned apart).
    """
    ago = obs.recall.status_written_ago
    if not obs.nm.status.begun or ago is None or ago >= settings.status_interval:
        return None
    if transitions.transition(obs.nm.status, new):
        return None
    return settings.status_interval - ago


def fingerprint(st: NodeMaintenanceStatus) -> dict[str, Any]:
    """A status as compared for rewrites (everything but lastUpdate)."""
    return transitions.comparable(st)


LIVE = (Phase.PENDING, Phase.RUNNING)  # phases whose lastUpdate says the operator is alive


def heartbeat_in(obs: Observed, settings: PlanSettings) -> float:
    """Seconds until lastUpdate must move again (<= 0: now).

    Measured from the persisted lastUpdate, or from this process's own last
    write when that is later (the persisted value is truncated to the second,
    and a write is never repeated within ``heartbeat`` for it).
    """
    last = obs.nm.status.last_update
    age = float("inf") if last is None else (obs.now - last).total_seconds()
    if obs.recall.status_written_ago is not None:
        age = min(age, obs.recall.status_written_ago)
    return settings.heartbeat - age


def heartbeat(obs: Observed, out: Plan, settings: PlanSettings) -> Plan:
    """lastUpdate moves at least every ``heartbeat`` while Pending or Running (A2).

    Scripts check that the operator is alive by the age of lastUpdate, as
    the Go NMO rewrote it on every pass. nmo writes a status only when it
    changes, so: every write of a live CR carries ``now``, a pass with
    nothing to write rewrites the persisted status with ``now`` once
    ``heartbeat`` has passed, and the CR is looked at again by then. When
    nothing changes that is one write per ``heartbeat``.
    """
    if out.work not in (Work.RUN, Work.QUEUED) or out.result.terminal:
        return out
    if (out.status or obs.nm.status).phase not in LIVE:
        return out
    if out.status is not None:
        st, wait = out.status.model_copy(update={"last_update": obs.now}), settings.heartbeat
    else:
        due = heartbeat_in(obs, settings)
        st, wait = None, due
        if due <= 0:
            st = obs.nm.status.model_copy(update={"last_update": obs.now})
            wait = settings.heartbeat
    after = out.result.requeue_after
    return replace(
        out,
        status=st,
        result=Result(requeue_after=max(0.05, wait if after is None else min(after, wait))),
    )


def reading(reads: tuple[Read, ...]) -> Plan:
    """A round that only reads; the reconcile plans again on the answers."""
    return Plan(reads=reads, work=Work.KEEP, result=Result(requeue_after=0))
