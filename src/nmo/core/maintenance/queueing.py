"""The fleet budget's queue, planned: who may start now, who waits, whose slot
is freed (pure; behavior.md's fleet limits, issue 16).

:func:`admit` decides for a CR waiting to start on the ledger snapshot and
plans its compare-and-swap write; :func:`queued` is the plan of a CR that
waits (Pending, a Queued condition, nothing else); :func:`released` frees the
slot of a maintenance let go or failed (and, with a soak, records when its
node returned). The rules themselves are :mod:`nmo.core.maintenance.admission`'s,
:mod:`nmo.core.maintenance.gates`' and :mod:`nmo.core.maintenance.quorum`'s.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from nmo.api import constants as c
from nmo.api.models import ConditionStatus, Phase
from nmo.core.maintenance import admission, gates, quorum, transitions
from nmo.core.maintenance.observed import (
    LedgerWrite,
    Observed,
    Plan,
    Read,
    ReadKind,
    Result,
    Work,
)
from nmo.core.maintenance.policy import PlanSettings, reading, status_write

# A return stamped this far ahead of this clock at most is left as it is (no write).
SKEW_TOLERATED = 1.0


def admit(
    obs: Observed, settings: PlanSettings
) -> Plan | tuple[admission.Admission, LedgerWrite | None]:
    """The fleet budget's decision for a CR waiting to start (behavior.md fleet limits).

    A queued (Pending) control-plane node is checked against the etcd quorum
    again first (the webhook checked it at CREATE). The decision is made on
    the ledger as last read; admitting writes it back with the
    resourceVersion it was read at, so a decision on a stale ledger ends in
    a 409 and is made again on a fresh read. Entries whose CR failed or is
    gone are pruned with the write.
    """
    nm, node = obs.nm, obs.node
    assert node is not None
    ledger, fleet = obs.ledger, obs.fleet
    checks_quorum = nm.status.phase is Phase.PENDING and quorum.is_control_plane(node)
    reads: list[Read] = []
    if checks_quorum and obs.quorum is None:
        reads.append(Read(ReadKind.QUORUM, nm.spec.node_name))
    if ledger is None or not ledger.fresh or fleet is None:
        reads.append(Read(ReadKind.LEDGER))
    if reads:  # both in one round
        return reading(tuple(reads))
    assert ledger is not None
    assert fleet is not None
    if checks_quorum:
        assert obs.quorum is not None
        held = quorum.refusal_of(obs.quorum, nm.spec.node_name)
        if held is not None:  # stays queued, and takes no slot
            return queued(obs, held, settings)
    name = nm.metadata.name
    entries = {k: dict(v) for k, v in ledger.entries.items() if k not in ledger.gone}
    pruned = len(entries) != len(ledger.entries)
    version = ledger.version
    if name in entries:  # admitted before: never held, but a pruned slot starts the soak
        noticed = _noticed(obs, entries, settings)
        return admission.Admission(True, admission.REASON_ADMITTED, "admitted"), (
            LedgerWrite(entries, version=version, returned=noticed) if pruned else None
        )
    running = {**fleet.admitted, **{k: v["node"] for k, v in entries.items()}}
    running.pop(name, None)
    decision = admission.decide(nm, replace(fleet, admitted=running), settings.budget, obs.now)
    # The gates (soak, alerts) hold back what the budget would start now.
    noticed = _noticed(obs, entries, settings) or _restamped(ledger.returned, settings, obs.now)
    if decision.admit:
        waiting = {q.metadata.name for q in fleet.queue if q.metadata.name not in running}
        decision = replace(decision, position=1, queued=len(waiting | {name}))
    decision = gates.hold(
        decision,
        returned=noticed or ledger.returned,
        alerts=obs.alerts,
        settings=settings.budget,
        now=obs.now,
    )
    if decision.admit:
        entries[name] = {"uid": nm.metadata.uid, "node": nm.spec.node_name}
        return admission.Admission(True, admission.REASON_ADMITTED, "admitted"), LedgerWrite(
            entries, version=version, admitted=name, returned=noticed
        )
    waits = queued(obs, decision, settings)
    if not pruned and noticed is None:
        return waits
    return replace(waits, ledger=LedgerWrite(entries, version=version, returned=noticed))


def _noticed(
    obs: Observed, kept: dict[str, dict[str, str]], settings: PlanSettings
) -> gates.Returned | None:
    """Slots pruned now (their CR vanished or failed without freeing them): their
    nodes' return time is unknown, so the soak starts now (never shorter)."""
    ledger = obs.ledger
    assert ledger is not None
    pruned = sorted(k for k in ledger.entries if k not in kept)
    if not pruned or settings.budget.soak_seconds <= 0:
        return None
    nodes = sorted({str(ledger.entries[k].get("node", "")) for k in pruned})
    return gates.Returned(", ".join(pruned), ", ".join(nodes), obs.now)


def _restamped(
    returned: gates.Returned | None, settings: PlanSettings, now: datetime
) -> gates.Returned | None:
    """A return stamped ahead of this clock (by a replica whose clock is ahead)
    would hold for the skew plus the soak: it is recorded again at this clock's
    now, so the soak ends one soak from now (never shorter than from the return)."""
    if returned is None or settings.budget.soak_seconds <= 0:
        return None
    if returned.at <= now + timedelta(seconds=SKEW_TOLERATED):
        return None
    return replace(returned, at=now)


def queued(obs: Observed, decision: admission.Admission, settings: PlanSettings) -> Plan:
    """Held back by the budget or the window: Pending, a Queued condition, nothing else."""
    nm = obs.nm
    st = transitions.with_condition(
        nm.status.model_copy(update={"phase": Phase.PENDING}),
        type_=c.CONDITION_QUEUED,
        state=ConditionStatus.TRUE,
        reason=decision.reason,
        message=decision.message,
        now=obs.now,
    )
    if transitions.differs(nm.status, st):
        st = st.model_copy(update={"last_update": obs.now})
    wait = settings.queue_recheck
    if decision.retry_after is not None:
        wait = min(wait, decision.retry_after)
    changed = nm.status.phase is not Phase.PENDING
    return Plan(
        status=status_write(obs, st, settings),
        work=Work.QUEUED,
        result=Result(requeue_after=wait),
        notes=(f"maintenance {nm.metadata.name} queued: {decision.message}",) if changed else (),
    )


def released(obs: Observed, out: Plan, settings: PlanSettings) -> Plan:
    """A maintenance let go or failed frees its slot in the fleet ledger (read
    first when this process has not read it yet), and the queue moves."""
    name = obs.nm.metadata.name
    ledger = obs.ledger
    if out.work not in (Work.STOP, Work.FORGET) or out.ledger is not None or out.reads:
        return out
    if not settings.budget.enabled:
        return out
    if ledger is None:
        return reading((Read(ReadKind.LEDGER),))
    if name not in ledger.entries:
        return out  # never admitted
    kept = {k: v for k, v in ledger.entries.items() if k != name}
    returned = None
    if settings.budget.soak_seconds > 0:  # its node is back: the soak starts
        node = str(ledger.entries[name].get("node") or obs.nm.spec.node_name)
        returned = gates.Returned(name, node, obs.now)
    change = LedgerWrite(kept, version=ledger.version, released=name, returned=returned)
    return replace(out, ledger=change)
