"""The maintenance planner: from what a pass observed to what it does (pure).

``plan(observed, settings)`` returns a :class:`Plan`: the reads the caches
could not answer, the fleet ledger's write, the CR metadata patch, the lease
step, the status, the node patch, the evictions to start, the events, the
notifications and the result. The executor applies it and decides nothing:
when a write fails the pass ends, the failure is recorded in the
maintenance's record, and the next round plans from it (a failed lease
request: :func:`plan_lease_failure`, the lease rules of behavior.md A5; an
API error: :func:`api_error_status`, written to lastError). The fleet
budget's queue is :mod:`nmo.core.maintenance.queueing`; the settings, the
status-write rule and the heartbeat are :mod:`nmo.core.maintenance.policy`.
No I/O, clock or event loop is imported here (enforced by import-linter), so
every decision is tested by tables.

The flow it encodes (behavior.md A2-A5, B4-B9):

* deleted CR: restore the node to its recorded prior state, release the
  lease, drop the finalizer (a duplicate that never owned the node only
  drops the finalizer);
* Failed is terminal, but for a missing node: that CR applies again when a
  Node of its name exists (the Go NMO keeps and re-applies it);
* the finalizer is added first (event BeginMaintenance);
* an older CR for the same node wins (duplicate ranking below), a missing
  node fails the CR;
* no ownerReference to the Node is kept on the CR (the one older nmo
  releases wrote is removed, B6 withdrawn), and the node's prior state is
  recorded with the first node patch, on the node, bound to the CR's uid;
* lease, then label + taints + cordon, then evictions; Running with the
  starting figures on the first pass, progress at most once per
  ``status_interval`` (a transition at once), Succeeded (event
  SucceedMaintenance) when no pod to evict remains.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from nmo.api import constants as c
from nmo.api.models import (
    ConditionStatus,
    NodeMaintenance,
    NodeMaintenanceStatus,
    OnTimeout,
    Phase,
    PodReference,
)
from nmo.core.maintenance import (
    admission,
    drainplan,
    nodeconditions,
    nodepatch,
    podselect,
    queueing,
    transitions,
    volumes,
)
from nmo.core.maintenance.notifications import for_pass
from nmo.core.maintenance.observed import (
    DONE,
    TERMINAL,
    Emit,
    Force,
    LeaseStep,
    LedgerWrite,
    Observed,
    Plan,
    Read,
    ReadKind,
    Result,
    Step,
    Work,
)
from nmo.core.maintenance.policy import (
    SETTINGS,
    PlanSettings,
    heartbeat,
    progress_wait,
    reading,
    status_write,
)

Obj = dict[str, Any]


def rank(nm: NodeMaintenance) -> tuple[int, datetime, str]:
    """Who owns a node among its CRs: started first, then oldest, then name (B8)."""
    started = 0 if nm.status.begun else 1
    created = nm.metadata.creation_timestamp or datetime.max.replace(tzinfo=UTC)
    return (started, created, nm.metadata.name)


def older_duplicate(nm: NodeMaintenance, others: tuple[NodeMaintenance, ...]) -> str | None:
    """The name of another CR for the node that outranks this one, if any."""
    mine = rank(nm)
    for other in others:
        if other.metadata.name == nm.metadata.name or other.spec.node_name != nm.spec.node_name:
            continue
        if transitions.is_duplicate_failure(other.status, other.spec.node_name):
            continue
        if rank(other) < mine:
            return other.metadata.name
    return None


def _prior(obs: Observed) -> nodepatch.PriorState | None:
    """The prior state this CR recorded on its node (none: restore as the Go NMO does)."""
    return nodepatch.prior_for(obs.node, obs.nm.metadata.uid)


def nmo_node_ref(ref: dict[str, Any], node: str) -> bool:
    """Whether an ownerReference is the Node reference older nmo releases wrote."""
    return (
        ref.get("apiVersion") == "v1"
        and ref.get("kind") == "Node"
        and ref.get("name") == node
        and ref.get("controller") is False
        and ref.get("blockOwnerDeletion") is False
    )


def _disowned(nm: NodeMaintenance) -> dict[str, Any]:
    """The metadata that drops the Node ownerReference older nmo releases wrote.

    With it, deleting or re-registering the Node garbage-collected the
    maintenance and the node came back schedulable mid-maintenance; the Go
    NMO never persists one (B6, withdrawn). References others wrote stay.
    """
    refs = nm.metadata.owner_references
    kept = [r for r in refs if not nmo_node_ref(r, nm.spec.node_name)]
    return {"ownerReferences": kept} if len(kept) != len(refs) else {}


def _selection(obs: Observed, pods: tuple[Obj, ...], settings: PlanSettings) -> podselect.Selection:
    drain = obs.nm.spec.drain
    selector = None
    if drain is not None and drain.pod_selector is not None:
        selector = drain.pod_selector.model_dump(by_alias=True, exclude_none=True)
    return podselect.select_pods(
        pods,
        lambda key: obs.daemonsets.get(key, False),
        selector,
        rules=podselect.rules_from(settings.pod_rules_namespaces),
    )


def _started(obs: Observed, settings: PlanSettings) -> NodeMaintenanceStatus:
    """The status with the drain's starting figures once the pods are known (A2.2)."""
    st = obs.nm.status
    if st.begun or obs.pods is None:
        return st
    selection = _selection(obs, obs.pods, settings)
    refs = [
        PodReference(namespace=podselect.pod_namespace(p), name=podselect.pod_name(p))
        for p in (*selection.evict, *selection.waited)
    ]
    return transitions.first_pass(st, pending=refs, total_pods=len(obs.pods), now=obs.now)


def _ignored_rules_event(selection: podselect.Selection) -> Emit:
    """Pods whose own drain rules were ignored: a Warning on the CR, names capped."""
    shown = selection.ignored[:MAX_EVENT_PODS]
    names = ", ".join(f"{podselect.pod_key(p)} ({podselect.ignored_rules(p)})" for p in shown)
    more = len(selection.ignored) - len(shown)
    message = f"{podselect.IGNORED_RULES}: {names}" + (f" and {more} more" if more else "")
    return Emit((c.EVENT_DRAIN_RULES_IGNORED, message), warning=True)


MAX_EVENT_PODS = 10


def needs_node(nm: NodeMaintenance) -> bool:
    """Whether a pass for the CR reads its node (a Failed CR left alone does not)."""
    return nm.metadata.deletion_timestamp is not None or nm.status.phase is not Phase.FAILED


def resumable(nm: NodeMaintenance) -> bool:
    """Failed for a missing node: a pass looks for its node in the cache only
    (no request), and applies the maintenance again once a Node of that name
    exists, as the Go NMO does on its next reconcile."""
    return nm.metadata.deletion_timestamp is None and transitions.is_node_missing_failure(
        nm.status, nm.spec.node_name
    )


def plan(obs: Observed, settings: PlanSettings = SETTINGS) -> Plan:
    """Everything one pass does for the CR."""
    if obs.recall.api_error is not None:
        # The last round ended on an API error: it goes into lastError first,
        # as the Go NMO's onReconcileError writes it (once per heartbeat).
        new = api_error_status(obs.nm, error=obs.recall.api_error, now=obs.now, settings=settings)
        if new is not None:
            body = new.to_api()
            patch = {"lastError": body["lastError"], "lastUpdate": body["lastUpdate"]}
            return Plan(work=Work.KEEP, report=patch)
    if obs.reads:  # the caches could not answer: read, then plan on the answers
        return reading(obs.reads)
    if obs.nm.metadata.deletion_timestamp is not None:
        out = plan_leave(obs)
    else:
        out = heartbeat(obs, _plan_enter(obs, settings), settings)
    out = nodeconditions.attach(obs, out, enabled=settings.node_conditions)
    return _notified(obs, queueing.released(obs, out, settings), settings)


def _notified(obs: Observed, out: Plan, settings: PlanSettings) -> Plan:
    """The notifications of the pass, each with the step after which it goes: the
    begin notification with the finalizer (as its event), the others at the end,
    from the status the pass leaves."""
    if settings.notify_operator is None or out.reads:
        return out
    operator = settings.notify_operator
    early = tuple(e for e in out.events if e.after is Step.METADATA)
    late = tuple(e for e in out.events if e.after is not Step.METADATA)
    before = obs.nm.status.to_api()
    after = (out.status or obs.nm.status).to_api()
    notes = [
        (Step.METADATA, n) for n in for_pass(obs.nm, before, early, now=obs.now, operator=operator)
    ]
    notes += [(Step.END, n) for n in for_pass(obs.nm, after, late, now=obs.now, operator=operator)]
    return replace(out, notifications=tuple(notes)) if notes else out


def _plan_enter(obs: Observed, settings: PlanSettings) -> Plan:
    nm, now = obs.nm, obs.now
    node_name = nm.spec.node_name
    st = nm.status
    resuming = transitions.is_node_missing_failure(st, node_name)
    if st.phase is Phase.FAILED and not (resuming and obs.node is not None):
        # A duplicate or a lost lease is final; a missing node is looked at
        # again when a Node of that name is added (the node watch wakes it).
        return Plan(work=Work.STOP, result=TERMINAL)
    if obs.recall.confirmed is False:
        return Plan(
            work=Work.FORGET,
            notes=(
                f"maintenance {nm.metadata.name}: gone from the apiserver, not in the cache "
                "yet; lease not taken",
            ),
        )
    decision: admission.Admission | None = None
    ledger_write: LedgerWrite | None = None
    if (
        settings.budget.enabled
        and obs.node is not None
        and admission.awaits_start(nm, node_exists=True)
        and older_duplicate(nm, obs.others) is None
    ):
        admitted = queueing.admit(obs, settings)
        if isinstance(admitted, Plan):
            return admitted  # a read first, or it stays queued
        decision, ledger_write = admitted
    meta: dict[str, Any] = {}
    events: list[Emit] = []
    notes: list[str] = []
    if c.FINALIZER not in nm.metadata.finalizers:
        meta["finalizers"] = [*nm.metadata.finalizers, c.FINALIZER]
        events.append(Emit(c.EVENT_BEGIN, after=Step.METADATA))
        notes.append(f"maintenance {nm.metadata.name} for node {node_name}: begin")

    def failed(new: NodeMaintenanceStatus, note: str) -> Plan:
        return Plan(
            ledger=ledger_write,
            metadata=meta or None,
            status=status_write(obs, new, settings),
            events=(*events, Emit(c.EVENT_FAILED, warning=True)),
            work=Work.STOP,
            result=TERMINAL,
            notes=(*notes, note),
        )

    if (older := older_duplicate(nm, obs.others)) is not None:
        return failed(
            transitions.duplicate(st, node_name, now),
            f"maintenance {nm.metadata.name}: node {node_name} already has an older "
            f"maintenance {older}",
        )
    if obs.node is None:
        return failed(
            transitions.node_not_found(st, node_name, now),
            f"maintenance {nm.metadata.name}: node {node_name} not found",
        )
    meta |= _disowned(nm)
    if obs.recall.lease_failure is not None:  # the last pass's lease request failed
        failure = obs.recall.lease_failure
        out = plan_lease_failure(
            obs, error=failure.error, foreign=failure.foreign, settings=settings
        )
        return replace(out, ledger=ledger_write, metadata=meta or None)
    lease = LeaseStep.NONE
    if obs.recall.renewal_error is not None or (
        not obs.recall.lease_held and (st.error_on_lease_count or 0) > 0
    ):
        # After a failure every attempt renews for real, as medik8s/common's
        # RequestLease always writes: a lease that cannot be written keeps
        # counting (and fails the maintenance) instead of passing on a read.
        lease = LeaseStep.FORCE
    elif not obs.recall.lease_held:
        lease = LeaseStep.REQUEST
    if lease is not LeaseStep.NONE and not obs.recall.lease_held and not obs.recall.confirmed:
        # A lease this process does not hold is only taken for a CR a live read
        # confirms: the cache may be behind a watch gap (the CR and its lease
        # deleted meanwhile), and a lease re-created then would never be released.
        return reading((Read(ReadKind.MAINTENANCE, nm.metadata.name),))
    st = _started(obs, settings)
    if resuming:
        st = transitions.resumed(st)
        notes.append(f"maintenance {nm.metadata.name}: node {node_name} exists again, resuming")
    if decision is not None:
        st = transitions.with_condition(
            st,
            type_=c.CONDITION_QUEUED,
            state=ConditionStatus.FALSE,
            reason=admission.REASON_ADMITTED,
            message="admitted by the fleet budget",
            now=now,
        )
    if lease is not LeaseStep.NONE:
        st = transitions.lease_ok(st)
    # The prior state is recorded only when nmo first takes the node (B7): a
    # CR that has begun without a record was started by the Go NMO (or before
    # nmo recorded on the node), and leaving it restores as the Go NMO does.
    first_take = "" if nm.status.begun else nm.metadata.uid
    node_patch = nodepatch.enter_patch(obs.node, record_for=first_take)
    base = Plan(
        ledger=ledger_write,
        metadata=meta or None,
        lease=lease,
        node_patch=node_patch,
        events=tuple(events),
        notes=tuple(notes),
    )
    if obs.pods is None:  # the node's pod watch is syncing; it wakes the CR when done
        return replace(
            base,
            status=status_write(obs, st, settings),
            result=Result(requeue_after=settings.pods_wait),
        )
    selection = _selection(obs, obs.pods, settings)
    if not nm.status.begun:
        notes.extend(f"drain of node {node_name}: {w}" for w in selection.warnings)
        if selection.ignored:  # said once per maintenance: with its first pass
            base = replace(base, events=(*base.events, _ignored_rules_event(selection)))
    deadline = drainplan.deadline_of(
        nm,
        now,
        default_timeout=settings.drain_timeout,
        default_action=settings.on_timeout,
        cap_seconds=settings.max_drain_seconds,
        cap_action=settings.max_drain_action,
    )
    st = transitions.drain_timing(st, start=deadline.start, deadline=deadline.at)
    plan_ = drainplan.plan_drain(
        selection,
        obs.drain,
        obs.pdbs,
        deadline,
        tick=obs.tick,
        now=now,
        critical_last=settings.critical_last,
        rules=podselect.rules_from(settings.pod_rules_namespaces),
        pdb_recheck=settings.pdb_recheck,
    )
    drain, report, cond = plan_.survey, plan_.survey.report, plan_.condition
    st = transitions.with_condition(
        st,
        type_=c.CONDITION_DRAINED,
        state=cond.status,
        reason=cond.reason,
        message=cond.message,
        now=now,
        generation=nm.metadata.generation or None,
    )
    before = transitions.condition(nm.status, c.CONDITION_DRAINED)
    reached = plan_.timed_out and (before is None or before.reason != drainplan.REASON_TIMED_OUT)
    if plan_.timed_out and deadline.action is OnTimeout.ABORT:
        return _abort(obs, base, st, cond.message, meta)
    if not report.pending:
        # Opt-in (issue 23): the drained pods' volumes detach first.
        gate = volumes.gate(obs, st, replace(base, notes=tuple(notes)), settings)
        if gate.wait is not None:
            return gate.wait
        st = gate.status
        new = transitions.succeeded(st, now)
        finished = st.phase is not Phase.SUCCEEDED
        created = nm.metadata.creation_timestamp
        return replace(
            base,
            status=status_write(obs, new, settings),
            drop=tuple(obs.drain),
            events=(
                (*base.events, *gate.events, Emit(c.EVENT_SUCCEEDED)) if finished else base.events
            ),
            notes=(
                (
                    *notes,
                    *gate.notes,
                    f"maintenance {nm.metadata.name}: drain of node {node_name} complete",
                )
                if finished
                else tuple(notes)
            ),
            drain_seconds=(now - created).total_seconds() if finished and created else None,
            drain_pending=0,
            volume_wait=gate.waited,
        )
    new = transitions.draining(
        volumes.reopened(st),
        pending=report.pending,
        details=report.details,
        error=report.last_error,
        now=now,
        started=deadline.start,
    )
    wait = settings.resync if plan_.next_wake is None else plan_.next_wake
    pass_ends = c.DRAIN_PASS_SECONDS - (now - deadline.start).total_seconds()
    if pass_ends > 0:  # lastError (and the Go NMO's log line) when its first pass would end
        wait = min(wait, pass_ends)
    result = Result(requeue_after=max(0.05, min(wait, settings.resync)))
    # Within the interval, a status that carries no transition is not even
    # compared (comparing dumps every pending pod): a pass comes back for it.
    later = progress_wait(obs, new, settings)
    write = status_write(obs, new, settings) if later is None else None
    if later is not None:
        # Progress is written at most once per interval; come back for it.
        result = Result(requeue_after=min(result.requeue_after or wait, later))
    fired = base.events
    if (
        write is not None
        and transitions.is_drain_pass_error(new.last_error)
        and new.last_error != nm.status.last_error
    ):
        # What the Go NMO logs when a drain pass ends with pods left; its e2e
        # suite and users' log searches look for it.
        notes.append(
            f"maintenance {nm.metadata.name}: drain of node {node_name} not complete after "
            f"{c.DRAIN_PASS_SECONDS}s, {len(report.pending)} pods pending; "
            f"{c.Messages.FIXED_DURATION_RECONCILE}"
        )
    if reached and write is not None:  # once, with the status that says TimedOut
        fired = (*fired, Emit((c.EVENT_DRAIN_TIMED_OUT, cond.message), warning=True))
        notes.append(f"maintenance {nm.metadata.name}: {cond.message}")
    return replace(
        base,
        status=write,
        evict=tuple(drain.due),
        force=tuple(_force(pod, grace) for pod, grace in plan_.force),
        drop=tuple(drain.stale),
        events=fired,
        notes=tuple(notes),
        result=result,
        drain_pending=len(report.pending),
        timed_out=deadline.action if reached and write is not None else None,
    )


def _force(pod: Obj, grace: int) -> Force:
    key = podselect.pod_key(pod)
    message = (
        f"drain deadline: deleted pod {key} with its grace period of {grace}s "
        "(onTimeout Delete bypasses PodDisruptionBudgets)"
    )
    return Force(pod, grace, Emit((c.EVENT_POD_FORCE_DELETED, message), warning=True))


def _abort(
    obs: Observed, base: Plan, st: NodeMaintenanceStatus, message: str, meta: dict[str, Any]
) -> Plan:
    """onTimeout Abort: restore the node as on deletion, release the lease, Failed."""
    nm = obs.nm
    assert obs.node is not None
    undo = nodepatch.restore(obs.node, _prior(obs))
    events = [*base.events, Emit((c.EVENT_DRAIN_TIMED_OUT, message), warning=True)]
    if undo.uncordon:
        events.append(Emit(c.EVENT_UNCORDON, target="node", after=Step.NODE))
    events.append(Emit(c.EVENT_FAILED, warning=True))
    return Plan(
        metadata=meta or None,
        lease=LeaseStep.RELEASE,
        status=transitions.drain_timed_out(st, error=message, now=obs.now),
        node_patch=undo.ops,
        restore=True,
        drop=tuple(obs.drain),
        events=tuple(events),
        work=Work.STOP,
        result=TERMINAL,
        notes=(*base.notes, f"maintenance {nm.metadata.name} failed: {message}"),
        timed_out=OnTimeout.ABORT,
    )


def lease_error_text(error: str, *, foreign: bool, counted: bool, count: int) -> str:
    """lastError for a failed lease request, as the Go NMO words it (A5).

    A foreign lease names whether it used to be ours (counted) or not, with
    the count after the failure; any other error is the API's own message.
    """
    if not foreign:
        return error
    text = c.Messages.LEASE_EXTEND_FAILED if counted else c.Messages.LEASE_NOT_OWNED
    return text.format(error=error, count=count)


def plan_lease_failure(
    obs: Observed, *, error: str, foreign: bool, settings: PlanSettings = SETTINGS
) -> Plan:
    """The pass when the lease step failed (A5).

    A foreign lease before the drain made progress is not counted (NMO waits
    for the other holder); every other failure increments errorOnLeaseCount,
    and past the limit the maintenance fails as the Go NMO's does: the node
    is restored (UncordonNode when that uncordons it), the lease released
    (one held by someone else is left alone) and the CR is Failed with the
    lease exhausted message.
    """
    st = _started(obs, settings)
    begun = (
        ()
        if c.FINALIZER in obs.nm.metadata.finalizers
        else (Emit(c.EVENT_BEGIN, after=Step.METADATA),)
    )
    if not st.begun:
        # The node's pods are not known yet: the error is recorded with the
        # starting figures (phase Running) once its pod watch has synced.
        return Plan(events=begun, result=Result(requeue_after=settings.pods_wait))
    counted = not (foreign and not (st.drain_progress or 0))
    count = (st.error_on_lease_count or 0) + (1 if counted else 0)
    text = lease_error_text(error, foreign=foreign, counted=counted, count=count)
    new = transitions.lease_error(st, error=text, counted=counted, now=obs.now)
    if new.phase is Phase.FAILED:
        restore = None
        events = list(begun)
        if obs.node is not None:
            undo = nodepatch.restore(obs.node, _prior(obs))
            restore = undo.ops
            if undo.uncordon:
                events.append(Emit(c.EVENT_UNCORDON, target="node", after=Step.NODE))
        events.append(Emit(c.EVENT_FAILED, warning=True))
        return Plan(
            lease=LeaseStep.RELEASE,
            status=new,
            node_patch=restore,
            restore=restore is not None,
            drop=tuple(obs.drain),
            events=tuple(events),
            work=Work.STOP,
            result=TERMINAL,
            notes=(f"maintenance {obs.nm.metadata.name} failed: {new.last_error}",),
        )
    # Retried every lease_retry seconds: the status is written when it changes
    # (and lastUpdate once per heartbeat), not on every refused attempt.
    waiting = Plan(
        status=status_write(obs, new, settings),
        events=begun,
        result=Result(requeue_after=settings.lease_retry),
        notes=(
            f"maintenance {obs.nm.metadata.name}: "
            + (
                "failed to extend a lease that used to be owned by us: "
                if counted
                else "failed to obtain a lease that is not owned by us: "
            )
            + error,
        ),
    )
    return heartbeat(obs, waiting, settings)


def api_error_status(
    nm: NodeMaintenance, *, error: str, now: datetime, settings: PlanSettings = SETTINGS
) -> NodeMaintenanceStatus | None:
    """The status after a pass whose API request failed (node patch, finalizer,
    status...), or None when it already says so and lastUpdate is recent.

    The Go NMO records every such error in lastError and retries; so does
    nmo, writing it once per error (and per heartbeat) however often the
    backoff retries.
    """
    st = nm.status
    last = st.last_update
    recent = last is not None and (now - last).total_seconds() < settings.heartbeat
    if st.last_error == error and recent:
        return None
    return st.model_copy(update={"last_error": error, "last_update": now})


def plan_leave(obs: Observed) -> Plan:
    """CR deleted: undo everything, then let it go (A3)."""
    nm = obs.nm
    if c.FINALIZER not in nm.metadata.finalizers:
        return Plan(work=Work.FORGET)
    metadata = {"finalizers": [f for f in nm.metadata.finalizers if f != c.FINALIZER]}
    removed = Emit(c.EVENT_REMOVED)
    gone = f"maintenance {nm.metadata.name} for node {nm.spec.node_name} removed"
    if transitions.is_duplicate_failure(nm.status, nm.spec.node_name):
        return Plan(metadata=metadata, events=(removed,), work=Work.FORGET, notes=(gone,))
    events: list[Emit] = []
    restore = None
    if obs.node is not None:
        undo = nodepatch.restore(obs.node, _prior(obs), forget=True)
        restore = undo.ops
        if undo.uncordon:
            events.append(Emit(c.EVENT_UNCORDON, target="node", after=Step.NODE))
        if undo.kept_cordoned:
            events.append(Emit(c.EVENT_KEPT_CORDONED, target="node", after=Step.NODE))
    return Plan(
        metadata=metadata,
        lease=LeaseStep.RELEASE,
        node_patch=restore,
        restore=restore is not None,
        drop=tuple(obs.drain),
        events=(*events, removed),
        work=Work.FORGET,
        result=DONE,
        notes=(gone,),
    )
