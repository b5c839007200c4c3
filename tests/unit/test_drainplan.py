"""The drain plan as tables: rules x order x deadline x onTimeout x pod state.

No cluster, no I/O: :func:`nmo.core.maintenance.drainplan.plan_drain` is a
function of the node's pods, their drain states, the PDBs, the deadline and
the clocks. The matrix checks, for every combination, the rules the drain
rests on (issue 12); focused tables follow for the deadline's sources, the
messages, the condition and the planner's use of them (events, Abort).
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from nmo.api import constants as c
from nmo.api.models import ConditionStatus, NodeMaintenance, OnTimeout, Phase
from nmo.core.maintenance import drainplan, planner, transitions
from nmo.core.maintenance.drainplan import Deadline, deadline_of, plan_drain
from nmo.core.maintenance.drainstate import REASON_PDB, PodDrainState
from nmo.core.maintenance.nodepatch import PriorState
from nmo.core.maintenance.observed import LeaseStep, Observed, Recall, Work
from nmo.core.maintenance.podselect import every_namespace, grace_seconds, order_key, select_pods

SINCE = datetime(2026, 1, 1, tzinfo=UTC)  # a drain state's "since" (any fixed time)

ALL = every_namespace  # these tables test the pod rules themselves
NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
START = NOW - timedelta(seconds=100)
Obj = dict[str, Any]


def pod(
    name: str,
    *,
    ns: str = "app",
    labels: dict[str, str] | None = None,
    order: str | None = None,
    critical: bool = False,
    grace: int | None = 30,
    phase: str = "Running",
    terminating: bool = False,
) -> Obj:
    annotations = {c.DRAIN_ORDER_ANNOTATION: order} if order is not None else {}
    meta: Obj = {
        "name": name,
        "namespace": ns,
        "uid": f"uid-{name}",
        "labels": labels or {},
        "annotations": annotations,
        "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "controller": True}],
    }
    if terminating:
        meta["deletionTimestamp"] = "2026-12-01T12:00:30Z"
        meta["deletionGracePeriodSeconds"] = 30
    spec: Obj = {"nodeName": "n1"}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    if critical:
        spec["priorityClassName"] = "system-node-critical"
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def no_ds(_key: str) -> bool:
    return False


def deadline(at: float | None, action: OnTimeout = OnTimeout.REPORT) -> Deadline:
    """A deadline ``at`` seconds from NOW (None: no deadline)."""
    return Deadline(
        start=START, at=None if at is None else NOW + timedelta(seconds=at), action=action
    )


def pdb(name: str = "db-pdb", *, desired: int = 3, current: int = 3, allowed: int = 0) -> Obj:
    return {
        "metadata": {"name": name, "namespace": "app"},
        "status": {
            "desiredHealthy": desired,
            "currentHealthy": current,
            "disruptionsAllowed": allowed,
        },
    }


def blocked_state(name: str, pdb_name: str = "db-pdb") -> PodDrainState:
    return PodDrainState(
        uid=f"uid-{name}",
        since=SINCE,
        reason=REASON_PDB,
        message="Cannot evict",
        pdb=pdb_name,
        next_attempt=1e9,
    )


# -- the matrix ----------------------------------------------------------------------

RULES = ("none", "skip", "wait", "wait-done", "invalid", "outside-selector")
ORDERS = ("same", "later")
DEADLINES = (None, 60.0, 10.0, -5.0)  # none, far, within the pod's grace (30 s), passed
ACTIONS = tuple(OnTimeout)
STATES = ("fresh", "blocked", "terminating", "forced", "in-flight")
SELECTOR = {"matchLabels": {"tier": "web"}}


def _subject(rule: str, order: str, state: str) -> tuple[Obj, dict[str, PodDrainState]]:
    labels = {"tier": "web"}
    phase = "Running"
    if rule == "skip":
        labels[c.DRAIN_RULE_LABEL] = "skip"
    elif rule in ("wait", "wait-done"):
        labels[c.DRAIN_RULE_LABEL] = "wait-completed"
        phase = "Succeeded" if rule == "wait-done" else "Running"
    elif rule == "invalid":
        labels[c.DRAIN_RULE_LABEL] = "later"
    elif rule == "outside-selector":
        labels = {"tier": "db"}
    p = pod(
        "subject",
        labels=labels,
        order="1" if order == "later" else None,
        phase=phase,
        terminating=state == "terminating",
    )
    states: dict[str, PodDrainState] = {}
    if state == "blocked":
        states["app/subject"] = blocked_state("subject")
    elif state == "forced":
        states["app/subject"] = PodDrainState(uid="uid-subject", since=SINCE, forced=True)
    elif state == "in-flight":
        states["app/subject"] = PodDrainState(uid="uid-subject", since=SINCE, in_flight=True)
    return p, states


MATRIX = list(itertools.product(RULES, ORDERS, DEADLINES, ACTIONS, STATES))


@pytest.mark.parametrize(("rule", "order", "at", "action", "state"), MATRIX)
def test_drain_matrix(
    rule: str, order: str, at: float | None, action: OnTimeout, state: str
) -> None:
    subject, states = _subject(rule, order, state)
    # An earlier pod (order 0) that stays on the node, blocked by its PDB.
    anchor = pod("anchor", labels={"tier": "web"})
    states["app/anchor"] = blocked_state("anchor")
    pods = [anchor, subject]
    selection = select_pods(pods, no_ds, SELECTOR, rules=ALL)
    dl = deadline(at, action)
    out = plan_drain(selection, states, {"app/db-pdb": pdb()}, dl, tick=0.0, now=NOW, rules=ALL)
    due = {p["metadata"]["name"] for p in out.survey.due}
    forced = {p["metadata"]["name"]: g for p, g in out.force}
    pending = {name for _, name in out.survey.report.pending}

    left_alone = rule in ("skip", "outside-selector", "wait-done")
    never_evicted = left_alone or rule in ("wait", "invalid")
    # Drain rules: a pod left alone is neither pending nor touched.
    if left_alone:
        assert "subject" not in pending and "subject" not in due and "subject" not in forced
    else:
        assert "subject" in pending
    # wait-completed and unknown rules are never evicted.
    if never_evicted:
        assert "subject" not in due
    # Order: a later pod is never due while the anchor (order 0) is on the node.
    if order == "later":
        assert "subject" not in due
    # Only a fresh pod of the current order, not held, is due.
    if "subject" in due:
        assert state == "fresh" and order == "same" and not never_evicted
    # The blocked anchor is not due (backed off) and keeps the drain Blocked or TimedOut.
    assert "anchor" not in due
    # Deadline.
    passed = at is not None and at <= 0
    assert out.timed_out == passed
    # Forced deletions: only with Delete, from deadline - grace, once, never terminating.
    for grace in forced.values():
        assert action is OnTimeout.DELETE
        assert grace >= 1
        assert at is not None and at - grace <= 0
    if "subject" in forced:
        assert state in ("fresh", "blocked") and not left_alone
    if action is OnTimeout.DELETE and at is not None and at <= 30 and not left_alone:
        assert ("subject" in forced) == (state in ("fresh", "blocked"))
        assert "anchor" in forced
    if action is not OnTimeout.DELETE or at is None or at > 30:
        assert not forced
    # The condition.
    reason = out.condition.reason
    assert out.condition.status is ConditionStatus.FALSE
    if passed:
        assert reason == drainplan.REASON_TIMED_OUT
        assert out.condition.message.startswith(f"drain did not finish within {100 + at:.0f}s")
    else:
        assert reason == drainplan.REASON_BLOCKED
        assert "PodDisruptionBudget app/db-pdb needs 3 healthy and has 3" in out.condition.message
    # A future deadline (or forced time) bounds the next wake.
    if at is not None and at > 0:
        assert out.next_wake is not None and out.next_wake <= at


# -- focused tables ------------------------------------------------------------------


def test_order_key_critical_last_within_an_order_when_asked() -> None:
    pods = {
        "a": pod("a"),
        "b": pod("b", critical=True),
        "c": pod("c", order="1"),
        "d": pod("d", order="-2", critical=True),
        "e": pod("e", order="oops"),
    }
    keys = {k: order_key(p, critical_last=True, rules=ALL) for k, p in pods.items()}
    assert sorted(keys, key=lambda k: keys[k]) == ["d", "a", "e", "b", "c"]
    # Off by default (the Go NMO): a critical pod is one of its order like any other.
    keys = {k: order_key(p, rules=ALL) for k, p in pods.items()}
    assert sorted(keys, key=lambda k: keys[k]) == ["d", "a", "b", "e", "c"]


def test_critical_pods_are_evicted_with_the_others_by_default() -> None:
    pods = [pod("a"), pod("b", critical=True)]
    out = plan_drain(
        select_pods(pods, no_ds, rules=ALL), {}, {}, deadline(None), tick=0.0, now=NOW, rules=ALL
    )
    assert [p["metadata"]["name"] for p in out.survey.due] == ["a", "b"]


def test_unreadable_order_is_a_warning_and_order_zero() -> None:
    sel = select_pods([pod("e", order="oops")], no_ds, rules=ALL)
    assert any("drain-order='oops' is not an integer, using 0" in w for w in sel.warnings)


@pytest.mark.parametrize(("grace", "used"), [(None, 30), (0, 1), (1, 1), (45, 45)])
def test_forced_grace_is_the_pods_own_never_zero(grace: int | None, used: int) -> None:
    assert grace_seconds(pod("p", grace=grace)) == used


def test_only_the_lowest_order_is_due_and_held_pods_say_why() -> None:
    pods = [pod("a"), pod("b", critical=True), pod("c", order="2")]
    sel = select_pods(pods, no_ds, rules=ALL)
    out = plan_drain(sel, {}, {}, deadline(None), tick=0.0, now=NOW, critical_last=True, rules=ALL)
    assert [p["metadata"]["name"] for p in out.survey.due] == ["a"]
    details = {d.name: d for d in out.survey.report.details}
    assert details["b"].reason == "Waiting"
    assert details["b"].message == "waiting for the pods of drain order 0 to leave the node"
    assert out.condition.reason == drainplan.REASON_DRAINING
    assert (
        out.condition.message == "3 pods pending: 1 being evicted, 2 waiting for their drain order"
    )


def test_a_wait_completed_pod_holds_later_orders() -> None:
    job = pod("job", labels={c.DRAIN_RULE_LABEL: "wait-completed"})
    later = pod("web", order="1")
    out = plan_drain(
        select_pods([job, later], no_ds, rules=ALL),
        {},
        {},
        deadline(None),
        tick=0.0,
        now=NOW,
        rules=ALL,
    )
    assert out.survey.due == []
    assert out.condition.reason == "WaitingForCompletion"
    assert out.condition.message == (
        "waiting for 1 pod labelled nodemaintenance.medik8s.io/drain=wait-completed "
        "to complete: app/job"
    )
    done = pod("job", labels={c.DRAIN_RULE_LABEL: "wait-completed"}, phase="Succeeded")
    out = plan_drain(
        select_pods([done, later], no_ds, rules=ALL),
        {},
        {},
        deadline(None),
        tick=0.0,
        now=NOW,
        rules=ALL,
    )
    assert [p["metadata"]["name"] for p in out.survey.due] == ["web"]


def test_blocked_message_groups_pods_by_pdb_with_numbers() -> None:
    pods = [pod(f"w{i}") for i in range(7)] + [pod("d0")]
    states = {f"app/w{i}": blocked_state(f"w{i}", "web") for i in range(7)}
    states["app/d0"] = blocked_state("d0", "gone-pdb")
    pdbs = {"app/web": pdb("web", desired=7, current=7)}
    out = plan_drain(
        select_pods(pods, no_ds, rules=ALL),
        states,
        pdbs,
        deadline(None),
        tick=0.0,
        now=NOW,
        rules=ALL,
    )
    assert out.condition.reason == "Blocked"
    assert out.condition.message == (
        "PodDisruptionBudget app/gone-pdb (not in the cache), holding 1 pod: app/d0; "
        "PodDisruptionBudget app/web needs 7 healthy and has 7 (0 disruptions allowed), "
        "holding 7 pods: app/w0, app/w1, app/w2, app/w3, app/w4 and 2 more"
    )


def test_unknown_rule_blocks_with_its_own_message() -> None:
    out = plan_drain(
        select_pods([pod("t", labels={c.DRAIN_RULE_LABEL: "skipp"})], no_ds, rules=ALL),
        {},
        {},
        deadline(None),
        tick=0.0,
        now=NOW,
        rules=ALL,
    )
    assert out.survey.due == []
    assert out.condition.reason == "Blocked"
    assert "unknown drain rule nodemaintenance.medik8s.io/drain='skipp'" in out.condition.message
    assert out.survey.report.details[0].reason == "InvalidDrainRule"


def test_nothing_pending_is_drained() -> None:
    skip = pod("s", labels={c.DRAIN_RULE_LABEL: "skip"})
    out = plan_drain(
        select_pods([skip], no_ds, rules=ALL), {}, {}, deadline(-10), tick=0.0, now=NOW, rules=ALL
    )
    assert out.condition.status is ConditionStatus.TRUE and out.condition.reason == "Drained"
    assert not out.timed_out and not out.force


# -- the deadline's sources ----------------------------------------------------------


def nm(drain: Obj | None = None, status_: Obj | None = None) -> NodeMaintenance:
    spec: Obj = {"nodeName": "n1"}
    if drain is not None:
        spec["drain"] = drain
    return NodeMaintenance.from_api(
        {"metadata": {"name": "nm"}, "spec": spec, "status": status_ or {}}
    )


STARTED = {"drainStartTime": "2026-12-01T11:58:20Z"}


@pytest.mark.parametrize(
    ("drain", "st", "default", "at", "action"),
    [
        (None, {}, 0, None, OnTimeout.REPORT),  # as the Go NMO: no deadline
        (None, {}, 60, NOW + timedelta(seconds=60), OnTimeout.REPORT),  # default, first pass
        ({"timeoutSeconds": 30}, {}, 0, NOW + timedelta(seconds=30), OnTimeout.REPORT),
        ({"timeoutSeconds": 30}, STARTED, 600, START + timedelta(seconds=30), OnTimeout.REPORT),
        ({"timeoutSeconds": 0}, STARTED, 600, None, OnTimeout.REPORT),  # 0 turns it off
        ({"onTimeout": "Abort"}, STARTED, 60, START + timedelta(seconds=60), OnTimeout.ABORT),
        # A deadline persisted from an earlier default outlives a changed flag.
        (
            None,
            {**STARTED, "drainDeadline": "2026-12-01T12:30:00Z"},
            0,
            datetime(2026, 12, 1, 12, 30, tzinfo=UTC),
            OnTimeout.REPORT,
        ),
    ],
)
def test_deadline_sources(
    drain: Obj | None, st: Obj, default: int, at: datetime | None, action: OnTimeout
) -> None:
    dl = deadline_of(nm(drain, st), NOW, default_timeout=default, default_action=OnTimeout.REPORT)
    assert dl.at == at and dl.action is action
    assert dl.start == (START if st else NOW)


def test_with_condition_moves_transition_time_only_on_status_change() -> None:
    s0 = nm().status
    t1, t2, t3 = NOW, NOW + timedelta(seconds=5), NOW + timedelta(seconds=9)
    s1 = transitions.with_condition(
        s0, type_="Drained", state=ConditionStatus.FALSE, reason="Draining", message="", now=t1
    )
    s2 = transitions.with_condition(
        s1, type_="Drained", state=ConditionStatus.FALSE, reason="Blocked", message="x", now=t2
    )
    s3 = transitions.with_condition(
        s2, type_="Drained", state=ConditionStatus.TRUE, reason="Drained", message="", now=t3
    )
    times = [x.conditions[0].last_transition_time for x in (s1, s2, s3) if x.conditions]
    assert times == [t1, t1, t3]
    assert [x.conditions[0].reason for x in (s1, s2, s3) if x.conditions] == [
        "Draining",
        "Blocked",
        "Drained",
    ]


# -- the planner's use of the drain plan -----------------------------------------------


def observed(nm_: NodeMaintenance, pods: list[Obj], states: dict[str, PodDrainState]) -> Observed:
    node = {
        "metadata": {"name": "n1", "uid": "node-uid", "resourceVersion": "7", "labels": {}},
        "spec": {},
    }
    return Observed(
        nm=nm_,
        others=(),
        node=node,
        pods=tuple(pods),
        daemonsets={},
        drain=states,
        recall=Recall(lease_held=True),
        now=NOW,
        tick=0.0,
        pdbs={"app/db-pdb": pdb()},
    )


def running_nm(drain: Obj, extra: Obj | None = None) -> NodeMaintenance:
    return NodeMaintenance.from_api(
        {
            "metadata": {
                "name": "nm",
                "uid": "u",
                "creationTimestamp": "2026-12-01T11:58:00Z",
                "finalizers": [c.FINALIZER],
                "annotations": {c.PRIOR_STATE_ANNOTATION: PriorState().to_annotation()},
                "ownerReferences": [{"kind": "Node", "uid": "node-uid", "name": "n1"}],
            },
            "spec": {"nodeName": "n1", "drain": drain},
            "status": {
                "phase": "Running",
                "evictionPods": 1,
                "totalpods": 1,
                **STARTED,
                **(extra or {}),
            },
        }
    )


def test_planner_reports_the_deadline_once() -> None:
    states = {"app/db": blocked_state("db")}
    first = planner.plan(observed(running_nm({"timeoutSeconds": 60}), [pod("db")], states))
    reasons = [e.event[0] for e in first.events]
    assert reasons == [c.EVENT_DRAIN_TIMED_OUT] and first.timed_out is OnTimeout.REPORT
    assert first.status is not None and first.status.phase is Phase.RUNNING
    conds = first.status.conditions or []
    assert conds[0].reason == "TimedOut"
    assert first.status.drain_deadline == START + timedelta(seconds=60)
    # The next pass sees TimedOut in the status: no second event, no second count.
    again = running_nm(
        {"timeoutSeconds": 60},
        {"conditions": [c_.model_dump(mode="json", by_alias=True) for c_ in conds]},
    )
    second = planner.plan(observed(again, [pod("db")], states))
    assert c.EVENT_DRAIN_TIMED_OUT not in [e.event[0] for e in second.events]
    assert second.timed_out is None


def test_planner_abort_restores_releases_and_fails() -> None:
    states = {"app/db": blocked_state("db")}
    plan = planner.plan(
        observed(running_nm({"timeoutSeconds": 60, "onTimeout": "Abort"}), [pod("db")], states)
    )
    assert plan.restore and plan.lease is LeaseStep.RELEASE and plan.work is Work.STOP
    assert plan.result.terminal and plan.timed_out is OnTimeout.ABORT
    assert plan.status is not None and plan.status.phase is Phase.FAILED
    assert (plan.status.last_error or "").startswith("drain did not finish within 60s")
    assert [e.event[0] for e in plan.events] == [c.EVENT_DRAIN_TIMED_OUT, c.EVENT_FAILED[0]]
    assert plan.evict == () and plan.force == ()


def test_planner_delete_forces_past_the_deadline() -> None:
    states = {"app/db": blocked_state("db")}
    plan = planner.plan(
        observed(running_nm({"timeoutSeconds": 60, "onTimeout": "Delete"}), [pod("db")], states)
    )
    assert [(f.pod["metadata"]["name"], f.grace) for f in plan.force] == [("db", 30)]
    assert plan.timed_out is OnTimeout.DELETE and not plan.result.terminal


def test_an_invalid_selector_blocks_instead_of_leaving_every_pod_alone() -> None:
    broken = {"matchExpressions": [{"key": "tier", "operator": "In"}]}
    sel = select_pods([pod("a"), pod("b")], no_ds, broken)
    out = plan_drain(sel, {}, {}, deadline(None), tick=0.0, now=NOW, rules=ALL)
    assert out.survey.due == [] and len(out.survey.report.pending) == 2
    assert out.condition.reason == "Blocked"
    assert (
        "spec.drain.podSelector.matchExpressions[0]: operator In needs at least one value: "
        "nothing is evicted until it is fixed" in out.condition.message
    )


def test_waiting_for_completion_only_once_the_evicted_pods_are_gone() -> None:
    job = pod("job", labels={c.DRAIN_RULE_LABEL: "wait-completed"})
    leaving = pod("web", terminating=True)
    out = plan_drain(
        select_pods([job, leaving], no_ds, rules=ALL),
        {},
        {},
        deadline(None),
        tick=0.0,
        now=NOW,
        rules=ALL,
    )
    assert out.condition.reason == "Draining"
    assert out.condition.message == "2 pods pending: 1 terminating, 1 waiting to complete"
    out = plan_drain(
        select_pods([job], no_ds, rules=ALL), {}, {}, deadline(None), tick=0.0, now=NOW, rules=ALL
    )
    assert out.condition.reason == "WaitingForCompletion"
