"""The maintenance planner as tables (kopf-style matrices, no cluster, no I/O).

The main matrix crosses phase x deletion x finalizer x lease state x node
state x drain state x duplicate rank and checks, for every combination, the
invariants the operator's behaviour rests on (behavior.md A2-A5, B4-B9).
Focused tables follow for duplicate ranking, lease counting, adoption of a
CR the Go NMO started, the leave paths and the status write rules.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import builders
from nmo.api import constants as c
from nmo.api.models import NodeMaintenance, Phase
from nmo.core.maintenance import admission, planner, policy, transitions
from nmo.core.maintenance.admission import BudgetSettings
from nmo.core.maintenance.drainstate import REASON_PDB, PodDrainState
from nmo.core.maintenance.nodepatch import PriorState, in_maintenance
from nmo.core.maintenance.observed import (
    LeaseFailure,
    LeaseStep,
    Ledger,
    LedgerWrite,
    Observed,
    Plan,
    QuorumFacts,
    Read,
    ReadKind,
    Recall,
    Result,
    Step,
    Work,
)

SINCE = datetime(2026, 1, 1, tzinfo=UTC)  # a drain state's "since" (any fixed time)

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
CREATED = "2026-12-01T11:00:00Z"
NOT_CORDONED = PriorState()
Obj = dict[str, Any]


def nm_obj(
    name: str = "nm-1",
    node: str = "n1",
    *,
    phase: Phase | None = None,
    finalizer: bool = True,
    deleting: bool = False,
    created: str = CREATED,
    owned: bool = True,
    status: Obj | None = None,
) -> NodeMaintenance:
    meta: Obj = {
        "name": name,
        "uid": f"uid-{name}",
        "resourceVersion": "10",
        "creationTimestamp": created,
        "finalizers": [c.FINALIZER] if finalizer else [],
        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": "node-uid"}]
        if owned
        else [],
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T11:59:00Z"
    st: Obj = dict(status or {})
    if phase is not None:
        st.setdefault("phase", phase.value)
    return NodeMaintenance.from_api(
        {"metadata": meta, "spec": {"nodeName": node, "reason": "test"}, "status": st}
    )


def node_obj(
    *,
    cordoned: bool = False,
    maintenance: bool = False,
    label: bool = False,
    name: str = "n1",
    prior: PriorState | None = None,
) -> Obj:
    """A Node; ``prior`` is the record nmo wrote on it when it took the node."""
    taints: list[Obj] = [{"key": "other", "effect": "NoExecute"}]
    if maintenance:
        taints += [{"key": k, "effect": c.TAINT_EFFECT} for k in c.MAINTENANCE_TAINT_KEYS]
    labels = {"kubernetes.io/hostname": name}
    if label or maintenance:
        labels[c.EXCLUDE_FROM_REMEDIATION_LABEL] = "true"
    meta: Obj = {"name": name, "uid": "node-uid", "resourceVersion": "7", "labels": labels}
    if prior is not None:
        meta["annotations"] = {c.PRIOR_STATE_ANNOTATION: prior.to_annotation()}
    return {"metadata": meta, "spec": {"taints": taints, "unschedulable": cordoned or maintenance}}


# nm-1 took the node when it was not cordoned: its record on the node.
TAKEN = node_obj(maintenance=True, prior=replace(NOT_CORDONED, maintenance="uid-nm-1"))


def pod(name: str, *, ds: bool = False, terminating: bool = False, uid: str = "") -> Obj:
    meta: Obj = {"name": name, "namespace": "app", "uid": uid or f"u-{name}"}
    if ds:
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "controller": True}
        ]
    if terminating:
        meta["deletionTimestamp"] = "2026-12-01T12:00:30Z"
        meta["deletionGracePeriodSeconds"] = 30
    return {"metadata": meta, "spec": {"nodeName": "n1"}}


def observed(nm: NodeMaintenance, **kw: Any) -> Observed:
    defaults: dict[str, Any] = {
        "others": (),
        "node": TAKEN,
        "pods": (),
        "daemonsets": {"app/ds": True},
        "drain": {},
        "recall": Recall(lease_held=True),
        "now": NOW,
        "tick": 100.0,
    }
    defaults.update(kw)
    if defaults["recall"].confirmed is None:
        # A lease is taken only once a live read confirmed the CR (the executor's
        # read, asked for by an earlier pass): here it has. Tests of that read
        # pass confirmed=None or False themselves.
        defaults["recall"] = replace(defaults["recall"], confirmed=True)
    return Observed(nm=nm, **defaults)


# -- the main matrix ---------------------------------------------------------

PHASES = [None, Phase.RUNNING, Phase.SUCCEEDED, Phase.FAILED]
NODES = {
    "missing": None,
    "plain": node_obj(),
    "in-maintenance": TAKEN,
    "cordoned-before": node_obj(cordoned=True),
}
LEASES = {
    "held": Recall(lease_held=True),
    "not-held": Recall(lease_held=False),
    "renewal-failed": Recall(lease_held=False, renewal_error="renew failed"),
}
DRAINS: dict[str, tuple[Obj, ...] | None] = {
    "unsynced": None,
    "only-daemonset": (pod("ds-pod", ds=True),),
    "pending": (pod("a"), pod("b"), pod("ds-pod", ds=True)),
    "terminating": (pod("a", terminating=True),),
}
RANKS = ["alone", "older-other", "younger-other"]


def _others(rank: str) -> tuple[NodeMaintenance, ...]:
    if rank == "older-other":
        return (nm_obj("nm-0", created="2026-12-01T10:00:00Z", phase=Phase.RUNNING),)
    if rank == "younger-other":
        return (nm_obj("nm-2", created="2026-12-01T11:30:00Z"),)
    return ()


MATRIX = list(itertools.product(PHASES, [False, True], [True, False], LEASES, NODES, DRAINS, RANKS))


@pytest.mark.parametrize(
    ("phase", "deleting", "finalizer", "lease", "node_state", "drain", "rank"), MATRIX
)
def test_matrix(
    phase: Phase | None,
    deleting: bool,
    finalizer: bool,
    lease: str,
    node_state: str,
    drain: str,
    rank: str,
) -> None:
    nm = nm_obj(phase=phase, finalizer=finalizer, deleting=deleting)
    obs = observed(
        nm,
        others=_others(rank),
        node=NODES[node_state],
        pods=DRAINS[drain],
        recall=LEASES[lease],
    )
    plan = planner.plan(obs)
    reasons = [e.event[0] for e in plan.events]

    # Invariants that hold in every cell.
    assert plan.evict == () or plan.node_patch is not None or in_maintenance(obs.node or {}), (
        "evictions are only planned for a node that is (or is being) cordoned"
    )
    assert all(p["metadata"].get("deletionTimestamp") is None for p in plan.evict)
    assert all(p["metadata"]["name"] != "ds-pod" for p in plan.evict), "DaemonSet pods stay"
    assert len(reasons) == len(set(reasons)), "an event fires at most once per pass"

    if deleting:
        assert plan.work is Work.FORGET
        assert plan.evict == () and plan.status is None
        if not finalizer:
            assert plan == Plan(work=Work.FORGET), "nothing to undo without our finalizer"
            return
        assert plan.metadata == {"finalizers": []}
        assert reasons[-1] == "RemovedMaintenance"
        assert plan.lease is LeaseStep.RELEASE
        if node_state in ("in-maintenance", "plain"):
            # prior state: not cordoned, so leaving uncordons the in-maintenance node
            assert (plan.node_patch is not None) == (node_state == "in-maintenance")
        assert ("UncordonNode" in reasons) == (node_state in ("in-maintenance", "cordoned-before"))
        return

    if phase is Phase.FAILED:
        assert plan.work is Work.STOP and plan.result.terminal
        assert plan.metadata is None and plan.status is None and plan.events == ()
        return

    if not finalizer:
        assert plan.metadata is not None and c.FINALIZER in plan.metadata["finalizers"]
        assert reasons[0] == "BeginMaintenance"
    else:
        assert "BeginMaintenance" not in reasons

    if rank == "older-other":
        assert plan.status is not None and plan.status.phase is Phase.FAILED
        assert plan.status.last_error == c.Messages.WEBHOOK_DUPLICATE.format(node="n1")
        assert reasons[-1] == "FailedMaintenance" and plan.work is Work.STOP
        assert plan.lease is LeaseStep.NONE and plan.node_patch is None and plan.evict == ()
        return

    if node_state == "missing":
        assert plan.status is not None and plan.status.phase is Phase.FAILED
        assert plan.status.last_error == c.Messages.NODE_NOT_FOUND.format(node="n1")
        assert reasons[-1] == "FailedMaintenance" and plan.result.terminal
        assert plan.lease is LeaseStep.NONE and plan.node_patch is None
        return

    expected_lease = {
        "held": LeaseStep.NONE,
        "not-held": LeaseStep.REQUEST,
        "renewal-failed": LeaseStep.FORCE,
    }[lease]
    assert plan.lease is expected_lease
    assert (plan.node_patch is None) == (node_state == "in-maintenance")
    assert plan.work is Work.RUN and not plan.result.terminal

    if drain == "unsynced":
        assert plan.evict == ()
        assert plan.result.requeue_after == policy.SETTINGS.pods_wait
        return
    if drain == "only-daemonset":
        assert plan.status is not None and plan.status.phase is Phase.SUCCEEDED
        assert plan.status.drain_progress == 100
        assert ("SucceedMaintenance" in reasons) == (phase is not Phase.SUCCEEDED)
        assert plan.result.requeue_after is None
        return
    assert plan.status is not None and plan.status.phase is Phase.RUNNING
    if drain == "pending":
        assert sorted(p["metadata"]["name"] for p in plan.evict) == ["a", "b"]
        assert plan.status.pending_pods == ["a", "b"]
    else:  # a terminating pod is waited for, not evicted again
        assert plan.evict == ()
        assert plan.status.pending_pods_details[0].reason == "Terminating"
    assert "SucceedMaintenance" not in reasons
    assert plan.result.requeue_after is not None and plan.result.requeue_after > 0


def test_matrix_is_the_full_product() -> None:
    assert len(MATRIX) == 4 * 2 * 2 * 3 * 4 * 4 * 3


# -- duplicate ranking (B8) --------------------------------------------------


@pytest.mark.parametrize(
    ("mine", "other", "older"),
    [
        # (phase, created) of this CR and of the other one
        ((None, "2026-12-01T11:00:00Z"), (None, "2026-12-01T10:00:00Z"), True),
        ((None, "2026-12-01T11:00:00Z"), (None, "2026-12-01T12:00:00Z"), False),
        # a started CR outranks an older one that has not started
        ((Phase.RUNNING, "2026-12-01T11:00:00Z"), (None, "2026-12-01T10:00:00Z"), False),
        ((None, "2026-12-01T10:00:00Z"), (Phase.RUNNING, "2026-12-01T11:00:00Z"), True),
        # same second: the name decides (nm-0 < nm-1)
        ((None, "2026-12-01T11:00:00Z"), (None, "2026-12-01T11:00:00Z"), True),
        # a CR that already failed as a duplicate never outranks anyone
        ((None, "2026-12-01T11:00:00Z"), ("dup", "2026-12-01T10:00:00Z"), False),
    ],
)
def test_duplicate_ranking(
    mine: tuple[Phase | None, str], other: tuple[Phase | str | None, str], older: bool
) -> None:
    me = nm_obj("nm-1", phase=mine[0], created=mine[1])
    if other[0] == "dup":
        them = nm_obj(
            "nm-0",
            created=other[1],
            status={
                "phase": "Failed",
                "lastError": c.Messages.WEBHOOK_DUPLICATE.format(node="n1"),
            },
        )
    else:
        them = nm_obj("nm-0", phase=Phase(other[0]) if other[0] else None, created=other[1])
    assert (planner.older_duplicate(me, (them,)) == "nm-0") is older


def test_a_cr_for_another_node_is_not_a_duplicate() -> None:
    me = nm_obj("nm-1")
    them = nm_obj("nm-0", node="n2", created="2026-12-01T10:00:00Z")
    assert planner.older_duplicate(me, (them,)) is None


# -- lease counting (A5) -----------------------------------------------------


HELD = "can't update or invalidate the lease because it is held by different owner: nhc"
FORBIDDEN = 'leases.coordination.k8s.io "node-n1" is forbidden: User "nmo" cannot update'


@pytest.mark.parametrize(
    ("foreign", "progress", "count", "counted", "fails", "error"),
    [
        # someone else holds it before we began: wait, the Go NMO's words
        (True, 0, 0, False, False,
         f"failed to obtain a lease that is not owned by us : {HELD} errorOnLeaseCount 0"),
        # we had made progress: it used to be ours (the count after the failure)
        (True, 40, 0, True, False,
         "failed to extend a lease that used to be owned by us, incrementing error on lease "
         f"count: {HELD}, errorOnLeaseCount: 1"),
        (True, 40, 2, True, False,
         "failed to extend a lease that used to be owned by us, incrementing error on lease "
         f"count: {HELD}, errorOnLeaseCount: 3"),
        # API error: always counted, the API's own message
        (False, 0, 0, True, False, FORBIDDEN),
        (False, 0, c.MAX_LEASE_ERRORS - 1, True, False, FORBIDDEN),
        # past the limit: Failed
        (False, 0, c.MAX_LEASE_ERRORS, True, True, None),
        (True, 40, c.MAX_LEASE_ERRORS, True, True, None),
        # uncounted never fails
        (True, 0, c.MAX_LEASE_ERRORS,  False, False,
         f"failed to obtain a lease that is not owned by us : {HELD} errorOnLeaseCount 3"),
    ],
)  # fmt: skip
def test_lease_failure(
    foreign: bool, progress: int, count: int, counted: bool, fails: bool, error: str | None
) -> None:
    nm = nm_obj(
        phase=Phase.RUNNING,
        status={"drainProgress": progress, "errorOnLeaseCount": count},
    )
    obs = observed(nm, node=node_obj(maintenance=True))
    plan = planner.plan_lease_failure(obs, error=HELD if foreign else FORBIDDEN, foreign=foreign)
    assert plan.status is not None
    assert plan.status.error_on_lease_count == count + (1 if counted else 0)
    if fails:
        assert plan.status.phase is Phase.FAILED
        assert plan.status.last_error == c.Messages.LEASE_EXHAUSTED.format(count=count + 1)
        assert plan.node_patch is not None and plan.restore, "the node is restored"
        # as the Go NMO's stopNodeMaintenanceImp: UncordonNode, the lease released
        assert [(e.event, e.target) for e in plan.events] == [
            (c.EVENT_UNCORDON, "node"),
            (c.EVENT_FAILED, "maintenance"),
        ]
        assert plan.lease is LeaseStep.RELEASE
        assert plan.work is Work.STOP and plan.result.terminal
    else:
        assert plan.status.phase is Phase.RUNNING and plan.status.last_error == error
        assert "can't update or invalidate the lease" in error or not foreign
        assert plan.node_patch is None and plan.evict == ()
        assert plan.lease is LeaseStep.NONE
        assert plan.result.requeue_after == policy.SETTINGS.lease_retry


@pytest.mark.parametrize(
    ("node", "uncordoned"),
    [
        (node_obj(maintenance=True), True),
        (None, False),  # the node is gone: nothing to restore, the lease still released
    ],
)
def test_lease_exhaustion_restores_releases_and_fails(node: Obj | None, uncordoned: bool) -> None:
    nm = nm_obj(phase=Phase.RUNNING, status={"drainProgress": 50, "errorOnLeaseCount": 3})
    plan = planner.plan_lease_failure(observed(nm, node=node), error=HELD, foreign=True)
    assert plan.lease is LeaseStep.RELEASE and plan.work is Work.STOP
    assert (plan.node_patch is not None) is uncordoned
    assert ("UncordonNode" in [e.event[0] for e in plan.events]) is uncordoned


def test_lease_exhaustion_keeps_a_prior_cordon_and_records_no_uncordon() -> None:
    nm = nm_obj(phase=Phase.RUNNING, status={"drainProgress": 50, "errorOnLeaseCount": 3})
    node = node_obj(maintenance=True, prior=PriorState(unschedulable=True, maintenance="uid-nm-1"))
    plan = planner.plan_lease_failure(observed(nm, node=node), error=HELD, foreign=True)
    assert plan.status is not None and plan.status.phase is Phase.FAILED
    assert [e.event for e in plan.events] == [c.EVENT_FAILED]
    assert plan.lease is LeaseStep.RELEASE


def test_lease_failure_on_the_first_pass_still_starts_the_status() -> None:
    obs = observed(nm_obj(), node=node_obj(), pods=(pod("a"),), recall=Recall())
    plan = planner.plan_lease_failure(obs, error="held by nhc", foreign=True)
    assert plan.status is not None and plan.status.phase is Phase.RUNNING
    assert plan.status.eviction_pods == 1 and plan.status.error_on_lease_count == 0


def test_a_successful_request_clears_the_error_count() -> None:
    nm = nm_obj(phase=Phase.RUNNING, status={"errorOnLeaseCount": 2})
    plan = planner.plan(observed(nm, recall=Recall(lease_held=False)))
    # after counted errors the lease is written, not only read (a KEEP would
    # reset the count of a lease that cannot be renewed)
    assert plan.lease is LeaseStep.FORCE
    assert plan.status is not None and plan.status.error_on_lease_count == 0


# -- ownership, prior state and adoption (B6, B7) ----------------------------


def test_first_pass_records_prior_state_on_the_node_and_no_owner_on_the_cr() -> None:
    nm = nm_obj(finalizer=False, owned=False)
    plan = planner.plan(observed(nm, node=node_obj(cordoned=True), recall=Recall()))
    assert plan.metadata is not None
    # B6 withdrawn: with a Node owner the CR was garbage-collected with its Node.
    assert "ownerReferences" not in plan.metadata
    assert "annotations" not in plan.metadata  # the CR carries no prior state
    assert plan.node_patch is not None
    (record,) = [op for op in plan.node_patch if op["path"] == "/metadata/annotations"]
    prior = PriorState.from_annotation(record["value"][c.PRIOR_STATE_ANNOTATION])
    assert prior == PriorState(unschedulable=True, maintenance="uid-nm-1")


def test_the_record_is_written_once_and_never_after_the_take() -> None:
    """A started CR without a record on its node (the Go NMO's): nothing is recorded."""
    recorded = planner.plan(observed(nm_obj(), node=TAKEN, recall=Recall()))
    assert recorded.node_patch is None, "the node carries nm-1's record already"
    adopted = planner.plan(observed(nm_obj(phase=Phase.RUNNING), node=node_obj(maintenance=True)))
    assert adopted.node_patch is None, "the node is already in maintenance"


def test_adopting_a_cr_the_go_nmo_started_assumes_it_cordoned() -> None:
    """A Running CR whose node has no record: the Go NMO cordoned the node."""
    nm = nm_obj(phase=Phase.RUNNING)
    plan = planner.plan(observed(nm, node=node_obj(maintenance=True)))
    assert plan.node_patch is None, "the node is already in maintenance"
    assert "BeginMaintenance" not in [e.event[0] for e in plan.events]
    # ... so leaving it uncordons, as the Go NMO would
    gone = nm_obj(phase=Phase.RUNNING, deleting=True)
    leave = planner.plan(observed(gone, node=node_obj(maintenance=True)))
    assert [e.event[0] for e in leave.events] == ["UncordonNode", "RemovedMaintenance"]


@pytest.mark.parametrize(
    "forged",
    [
        pytest.param("annotation-on-the-cr", id="cr-annotation"),
        pytest.param("another-maintenance", id="record-of-another-cr"),
    ],
)
def test_a_prior_state_nmo_did_not_record_for_this_cr_is_ignored(forged: str) -> None:
    """A CR author cannot make the end of a maintenance leave the node cordoned."""
    claim = PriorState(
        unschedulable=True, taints=c.MAINTENANCE_TAINT_KEYS, label=True, maintenance="uid-nm-1"
    )
    raw: Obj = {
        "metadata": {
            "name": "nm-1",
            "uid": "uid-nm-1",
            "resourceVersion": "10",
            "creationTimestamp": CREATED,
            "finalizers": [c.FINALIZER],
            "deletionTimestamp": "2026-12-01T11:59:00Z",
        },
        "spec": {"nodeName": "n1"},
        "status": {"phase": "Succeeded"},
    }
    node = node_obj(maintenance=True)
    if forged == "annotation-on-the-cr":
        raw["metadata"]["annotations"] = {c.PRIOR_STATE_ANNOTATION: claim.to_annotation()}
    else:
        node = node_obj(maintenance=True, prior=replace(claim, maintenance="uid-old"))
    plan = planner.plan(observed(NodeMaintenance.from_api(raw), node=node))
    after = builders.apply_patch(node, plan.node_patch)
    assert not after["spec"]["unschedulable"]
    assert c.EXCLUDE_FROM_REMEDIATION_LABEL not in after["metadata"]["labels"]
    assert not in_maintenance(after)
    assert "UncordonNode" in [e.event[0] for e in plan.events]


def test_leaving_keeps_a_cordon_that_was_there_before() -> None:
    nm = nm_obj(deleting=True)
    before = PriorState(unschedulable=True, maintenance="uid-nm-1")
    node = node_obj(maintenance=True, prior=before)
    plan = planner.plan(observed(nm, node=node))
    assert plan.node_patch is not None
    assert not any(op.get("path") == "/spec/unschedulable" for op in plan.node_patch)
    assert "UncordonNode" not in [e.event[0] for e in plan.events]
    (kept,) = [e for e in plan.events if e.event == c.EVENT_KEPT_CORDONED]
    assert kept.target == "node" and not kept.warning
    after = builders.apply_patch(node, plan.node_patch)
    assert c.PRIOR_STATE_ANNOTATION not in after["metadata"]["annotations"], "record removed"


def test_a_duplicate_leaves_without_touching_node_or_lease() -> None:
    nm = nm_obj(
        deleting=True,
        status={"phase": "Failed", "lastError": c.Messages.WEBHOOK_DUPLICATE.format(node="n1")},
    )
    plan = planner.plan(observed(nm, node=node_obj(maintenance=True)))
    assert plan.lease is LeaseStep.NONE and plan.node_patch is None
    assert plan.metadata == {"finalizers": []}
    assert [e.event[0] for e in plan.events] == ["RemovedMaintenance"]


# -- status writes -----------------------------------------------------------


def _running_with(pending: list[str], drained: str | None = "Draining") -> NodeMaintenance:
    """Running, with the Drained condition at ``drained`` (None: none yet)."""
    status: Obj = {
        "evictionPods": 3,
        "totalpods": 3,
        "drainProgress": 0,
        "pendingPods": pending,
        "drainStartTime": "2026-12-01T11:59:50Z",
    }
    if drained is not None:
        status["conditions"] = [
            {
                "type": c.CONDITION_DRAINED,
                "status": "False",
                "reason": drained,
                "message": f"{len(pending)} pods pending",
                "lastTransitionTime": "2026-12-01T11:59:50Z",
            }
        ]
    return nm_obj(phase=Phase.RUNNING, status=status)


@pytest.mark.parametrize(("ago", "writes"), [(None, True), (0.3, False), (1.5, True)])
def test_progress_is_written_at_most_once_per_interval(ago: float | None, writes: bool) -> None:
    nm = _running_with(["a", "b", "c"])
    obs = observed(nm, pods=(pod("a"),), recall=Recall(lease_held=True, status_written_ago=ago))
    plan = planner.plan(obs)
    assert (plan.status is not None) is writes
    if not writes:
        assert ago is not None and plan.result.requeue_after is not None
        assert plan.result.requeue_after <= policy.SETTINGS.status_interval - ago + 1e-9
    else:
        assert plan.status is not None and plan.status.drain_progress == 66


REFUSED = PodDrainState(
    uid="u-a", since=SINCE, reason=REASON_PDB, message="needs 3", pdb="web", next_attempt=1e9
)


@pytest.mark.parametrize(
    ("before", "drain", "timeout", "after"),
    [
        ("Draining", {"app/a": REFUSED}, None, "Blocked"),  # a PDB refused the last pod
        ("Blocked", {}, None, "Draining"),  # the refused pod is being evicted again
        ("Blocked", {"app/a": REFUSED}, 5, "TimedOut"),  # the deadline passed
        (None, {}, None, "Draining"),  # the condition's first appearance
    ],
)
def test_a_transition_is_written_at_once_within_the_interval(
    before: str | None, drain: dict[str, PodDrainState], timeout: int | None, after: str
) -> None:
    nm = _running_with(["a"], drained=before)
    if timeout is not None:
        nm = nm.model_copy(update={"spec": nm.spec.model_copy(update={"drain": None})})
        settings = replace(policy.SETTINGS, drain_timeout=timeout)
    else:
        settings = policy.SETTINGS
    recall = Recall(lease_held=True, status_written_ago=0.05)
    plan = planner.plan(observed(nm, pods=(pod("a"),), drain=drain, recall=recall), settings)
    assert plan.status is not None, f"{before} -> {after} held back by the interval"
    cond = transitions.condition(plan.status, c.CONDITION_DRAINED)
    assert cond is not None and cond.reason == after
    # The same state once more, still within the interval: progress only, held.
    raw = nm.model_dump(mode="json", by_alias=True)
    raw["status"] = plan.status.to_api()
    again = planner.plan(
        observed(NodeMaintenance.from_api(raw), pods=(pod("a"), pod("b")), drain=drain,
                 recall=recall),
        settings,
    )  # fmt: skip
    assert again.status is None, "a pod more pending is progress, not a transition"
    assert again.result.requeue_after is not None and again.result.requeue_after <= 1.0


@pytest.mark.parametrize(
    ("a", "b", "moves"),
    [
        ({"phase": "Running"}, {"phase": "Succeeded"}, True),
        ({"phase": "Running", "drainProgress": 1}, {"phase": "Running", "drainProgress": 5}, False),
        ({"phase": "Running", "lastError": "x"}, {"phase": "Running", "lastError": "y"}, False),
    ],
)  # fmt: skip
def test_what_counts_as_a_transition(a: Obj, b: Obj, moves: bool) -> None:
    before, after = nm_obj(status=a).status, nm_obj(status=b).status
    assert transitions.transition(before, after) is moves


def test_completion_is_never_held_back_by_the_interval() -> None:
    obs = observed(
        _running_with(["a"]), pods=(), recall=Recall(lease_held=True, status_written_ago=0.01)
    )
    plan = planner.plan(obs)
    assert plan.status is not None and plan.status.phase is Phase.SUCCEEDED


def test_a_status_the_server_pruned_is_not_rewritten_every_pass() -> None:
    nm = _running_with(["a", "b", "c"])
    first = planner.plan(observed(nm, pods=(pod("a"),)))
    assert first.status is not None
    recall = Recall(
        lease_held=True, status_written_ago=5.0, last_written=policy.fingerprint(first.status)
    )
    again = planner.plan(observed(nm, pods=(pod("a"),), recall=recall))
    assert again.status is None
    later = planner.plan(
        observed(nm, pods=(pod("a"),), recall=replace(recall, status_written_ago=120.0))
    )
    assert later.status is not None


def test_blocked_pods_are_listed_first_with_their_budget() -> None:
    states = {
        "app/b": PodDrainState(
            uid="u-b",
            since=SINCE,
            reason=REASON_PDB,
            message="needs 2",
            pdb="web",
            next_attempt=500.0,
        )
    }
    obs = observed(_running_with(["a", "b"]), pods=(pod("a"), pod("b")), drain=states)
    plan = planner.plan(obs)
    assert [p["metadata"]["name"] for p in plan.evict] == ["a"], "b waits for its backoff"
    assert plan.status is not None
    first = plan.status.pending_pods_details[0]
    assert (first.name, first.reason, first.disruption_budget) == ("b", REASON_PDB, "web")
    assert first.message == "needs 2"
    assert plan.status.last_error is None, "the Go NMO writes none before a 30 s pass ends"
    assert plan.result.requeue_after is not None
    assert plan.result.requeue_after <= 400.0 or plan.result.requeue_after == 60.0


def test_drain_duration_is_reported_once() -> None:
    created = (NOW - timedelta(seconds=42)).strftime("%Y-%m-%dT%H:%M:%SZ")
    nm = nm_obj(phase=Phase.RUNNING, created=created)
    assert planner.plan(observed(nm, pods=())).drain_seconds == 42.0
    done = nm_obj(phase=Phase.SUCCEEDED, created=created)
    assert planner.plan(observed(done, pods=())).drain_seconds is None


@pytest.mark.parametrize("foreign", [True, False])
def test_lease_failure_on_a_new_cr_still_records_begin(foreign: bool) -> None:
    obs = observed(nm_obj(finalizer=False), node=node_obj(), recall=Recall())
    plan = planner.plan_lease_failure(obs, error="x", foreign=foreign)
    assert [e.event for e in plan.events] == [c.EVENT_BEGIN]


def test_lease_failure_before_the_pods_are_known_waits_for_them() -> None:
    obs = observed(nm_obj(), node=node_obj(), pods=None, recall=Recall())
    plan = planner.plan_lease_failure(obs, error="x", foreign=False)
    assert plan.status is None, "no status without the starting figures"
    assert plan.result.requeue_after == policy.SETTINGS.pods_wait


@pytest.mark.parametrize(
    ("phase", "deleting", "reads"),
    [(None, False, True), (Phase.RUNNING, False, True), (Phase.FAILED, False, False),
     (Phase.FAILED, True, True), (Phase.SUCCEEDED, True, True)],
)  # fmt: skip
def test_a_failed_cr_left_alone_does_not_read_its_node(
    phase: Phase | None, deleting: bool, reads: bool
) -> None:
    assert planner.needs_node(nm_obj(phase=phase, deleting=deleting)) is reads


# -- lastUpdate heartbeat (A2: "is the operator alive" checks) ----------------


def _settled(obs: Observed, *, age: float, written_ago: float | None = None) -> Observed:
    """``obs`` with the status its own plan writes already persisted ``age`` s ago
    (a drain that started an hour ago: past its first 30 s pass)."""
    started = obs.nm.status.model_copy(update={"drain_start_time": NOW - timedelta(hours=1)})
    obs = replace(obs, nm=obs.nm.model_copy(update={"status": started}))
    first = planner.plan(obs)
    assert first.status is not None
    persisted = first.status.model_copy(update={"last_update": NOW - timedelta(seconds=age)})
    raw = obs.nm.model_dump(mode="json", by_alias=True)
    raw["status"] = persisted.to_api()
    return replace(
        obs,
        nm=NodeMaintenance.from_api(raw),
        recall=replace(obs.recall, status_written_ago=written_ago),
    )


BLOCKED = {
    "app/a": PodDrainState(
        uid="u-a", since=SINCE, reason=REASON_PDB, message="needs 1", next_attempt=1e9
    )
}


@pytest.mark.parametrize(
    ("age", "written_ago", "writes", "wait"),
    [
        (10.0, None, False, 50.0),  # back when lastUpdate turns 60 s old
        (59.0, 59.0, False, 1.0),
        (60.0, None, True, 60.0),  # a minute: lastUpdate moves, nothing else
        (600.0, None, True, 60.0),  # e.g. after a restart
        # lastUpdate is stored at second precision: this process's own last
        # write is the sharper clock, so writes stay a minute apart
        (60.4, 59.6, False, 0.4),
    ],
)
def test_a_running_maintenance_moves_last_update_once_a_minute(
    age: float, written_ago: float | None, writes: bool, wait: float
) -> None:
    obs = _settled(
        observed(_running_with(["a"]), pods=(pod("a"),), drain=BLOCKED),
        age=age,
        written_ago=written_ago,
    )
    plan = planner.plan(obs)
    assert (plan.status is not None) is writes
    if plan.status is not None:
        assert plan.status.last_update == NOW
        assert not transitions.differs(obs.nm.status, plan.status), "only lastUpdate moves"
    assert plan.result.requeue_after == pytest.approx(wait)


def test_finished_maintenances_keep_their_last_update() -> None:
    done = _settled(observed(_running_with(["a"]), pods=()), age=3600.0)
    assert done.nm.status.phase is Phase.SUCCEEDED
    plan = planner.plan(done)
    assert plan.status is None and plan.result.requeue_after is None
    failed = nm_obj(phase=Phase.FAILED, status={"lastUpdate": "2026-12-01T10:00:00Z"})
    plan = planner.plan(observed(failed))
    assert plan.status is None and plan.result.requeue_after is None


def test_every_write_of_a_running_maintenance_carries_now() -> None:
    obs = observed(_running_with(["a", "b", "c"]), pods=(pod("a"),))
    plan = planner.plan(obs)
    assert plan.status is not None and plan.status.last_update == NOW


def test_a_queued_maintenance_moves_last_update_too() -> None:
    nm = nm_obj()
    first = planner.plan(queued(nm, running={"other": "n9"}), BUDGET)
    assert first.status is not None and first.status.phase is Phase.PENDING

    def after(age: float) -> Observed:
        st = first.status.model_copy(update={"last_update": NOW - timedelta(seconds=age)})
        return queued(nm.model_copy(update={"status": st}), running={"other": "n9"})

    plan = planner.plan(after(61.0), BUDGET)
    assert plan.status is not None and plan.status.phase is Phase.PENDING
    assert plan.status.last_update == NOW
    quiet = planner.plan(after(5.0), BUDGET)
    assert quiet.status is None
    assert quiet.result.requeue_after is not None and quiet.result.requeue_after <= 55.0


@pytest.mark.parametrize(("age", "writes"), [(5.0, False), (61.0, True)])
def test_waiting_for_a_foreign_lease_writes_only_when_something_changes(
    age: float, writes: bool
) -> None:
    nm = nm_obj(phase=Phase.RUNNING, status={"evictionPods": 1, "totalpods": 1})
    obs = observed(nm, recall=Recall())
    first = planner.plan_lease_failure(obs, error=HELD, foreign=True)
    assert first.status is not None
    raw = nm.model_dump(mode="json", by_alias=True)
    raw["status"] = first.status.model_copy(
        update={"last_update": NOW - timedelta(seconds=age)}
    ).to_api()
    again = planner.plan_lease_failure(
        replace(obs, nm=NodeMaintenance.from_api(raw)), error=HELD, foreign=True
    )
    assert (again.status is not None) is writes
    assert again.result.requeue_after == policy.SETTINGS.lease_retry


# -- API failures reach lastError (A2, as the Go NMO's onReconcileError) -------

DENIED = 'nodes "n1" is forbidden: ValidatingAdmissionPolicy denied request: no node patches'


@pytest.mark.parametrize(
    ("phase", "last_error", "age", "writes"),
    [
        (None, None, None, True),  # e.g. the finalizer could not be added
        (
            Phase.RUNNING,
            'error when evicting pods/"a" -n "app": global timeout reached: 30s',
            5.0,
            True,
        ),
        (Phase.RUNNING, DENIED, 5.0, False),  # the backoff's retry: already said
        (Phase.RUNNING, DENIED, 61.0, True),  # ... but lastUpdate still moves
        (Phase.SUCCEEDED, None, 3600.0, True),
    ],
)
def test_an_api_failure_is_recorded_in_last_error(
    phase: Phase | None, last_error: str | None, age: float | None, writes: bool
) -> None:
    st: Obj = {}
    if last_error is not None:
        st["lastError"] = last_error
    if age is not None:
        st["lastUpdate"] = (NOW - timedelta(seconds=age)).strftime("%Y-%m-%dT%H:%M:%SZ")
    nm = nm_obj(phase=phase, status=st)
    new = planner.api_error_status(nm, error=DENIED, now=NOW)
    assert (new is not None) is writes
    if new is not None:
        assert new.last_error == DENIED and new.last_update == NOW
        assert new.phase == nm.status.phase, "the phase is left as it is"


# -- the CR survives its Node (B6 withdrawn) ---------------------------------

OLD_NMO_REF: Obj = {
    "apiVersion": "v1",
    "kind": "Node",
    "name": "n1",
    "uid": "node-uid",
    "blockOwnerDeletion": False,
    "controller": False,
}


def with_refs(nm: NodeMaintenance, refs: list[Obj]) -> NodeMaintenance:
    meta = nm.metadata.model_copy(update={"owner_references": refs})
    return nm.model_copy(update={"metadata": meta})


def test_the_node_owner_older_releases_wrote_is_removed_and_others_kept() -> None:
    theirs: Obj = {"apiVersion": "example.com/v1", "kind": "Plan", "name": "p", "uid": "p-uid"}
    nm = with_refs(nm_obj(phase=Phase.RUNNING), [OLD_NMO_REF, theirs])
    plan = planner.plan(observed(nm))
    assert plan.metadata is not None
    assert plan.metadata["ownerReferences"] == [theirs]
    clean = planner.plan(observed(with_refs(nm_obj(phase=Phase.RUNNING), [theirs])))
    assert clean.metadata is None, "nothing to remove: no metadata write"


def missing_node_failure(**status: Any) -> NodeMaintenance:
    body = {"phase": "Failed", "lastError": 'nodes "n1" not found', **status}
    return nm_obj(status=body)


def test_a_missing_node_failure_waits_for_the_node_without_a_write() -> None:
    nm = missing_node_failure()
    assert not planner.needs_node(nm), "no request for the node: the cache is looked at"
    assert planner.resumable(nm)
    plan = planner.plan(observed(nm, node=None))
    assert plan.work is Work.STOP and plan.result.terminal
    assert plan.status is None and plan.events == () and plan.metadata is None


def test_a_missing_node_failure_applies_again_when_the_node_returns() -> None:
    nm = missing_node_failure(errorOnLeaseCount=2)
    plan = planner.plan(
        observed(nm, node=node_obj(), pods=(pod("a"),), recall=Recall(lease_held=False))
    )
    assert plan.work is Work.RUN and not plan.result.terminal
    assert plan.lease is LeaseStep.FORCE, "errorOnLeaseCount > 0: a real renewal, as Go"
    assert plan.node_patch is not None, "label, taints and cordon again"
    assert [p["metadata"]["name"] for p in plan.evict] == ["a"]
    assert plan.status is not None and plan.status.phase is Phase.RUNNING
    assert not plan.status.error_on_lease_count
    assert "FailedMaintenance" not in [e.event[0] for e in plan.events]
    assert any("exists again" in n for n in plan.notes)


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(c.Messages.WEBHOOK_DUPLICATE.format(node="n1"), id="duplicate"),
        pytest.param(c.Messages.LEASE_EXHAUSTED.format(count=4), id="lease-lost"),
        pytest.param('nodes "other" not found', id="another-node-missing"),
    ],
)
def test_other_failures_stay_final_when_the_node_exists(error: str) -> None:
    nm = nm_obj(status={"phase": "Failed", "lastError": error})
    assert not planner.resumable(nm)
    plan = planner.plan(observed(nm, node=node_obj()))
    assert plan.work is Work.STOP and plan.status is None and plan.node_patch is None


def test_a_deleted_missing_node_failure_leaves_not_resumes() -> None:
    nm = nm_obj(status={"phase": "Failed", "lastError": 'nodes "n1" not found'}, deleting=True)
    assert not planner.resumable(nm)
    assert planner.plan(observed(nm, node=None)).work is Work.FORGET


# -- lastError and the log while draining, as the Go NMO ----------------------


def _draining_since(seconds: float, last_error: str | None = None) -> NodeMaintenance:
    start = (NOW - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    st: Obj = {"evictionPods": 2, "totalpods": 2, "pendingPods": ["a", "b"]}
    st["drainStartTime"] = start
    if last_error is not None:
        st["lastError"] = last_error
    return nm_obj(phase=Phase.RUNNING, status=st)


def test_a_drain_pass_that_times_out_writes_kubectls_error_and_logs_go_nmos_line() -> None:
    evicted = {
        "app/a": PodDrainState(uid="u-a", since=SINCE, reason="Terminating", in_flight=False)
    }
    quiet = planner.plan(observed(_draining_since(10), pods=(pod("a"),), drain=evicted))
    assert quiet.status is not None and quiet.status.last_error is None
    assert not any(c.Messages.FIXED_DURATION_RECONCILE in n for n in quiet.notes)

    late = planner.plan(observed(_draining_since(31), pods=(pod("a"),), drain=evicted))
    assert late.status is not None
    assert late.status.last_error == (
        'error when waiting for pod "a" in namespace "app" to terminate: context deadline exceeded'
    )
    (note,) = [n for n in late.notes if c.Messages.FIXED_DURATION_RECONCILE in n]
    assert "1 pods pending" in note

    said = _draining_since(45, late.status.last_error)
    again = planner.plan(observed(said, pods=(pod("a"),), drain=evicted))
    assert not any(c.Messages.FIXED_DURATION_RECONCILE in n for n in again.notes), "once"


def test_the_pass_comes_back_when_a_go_drain_pass_would_end() -> None:
    evicted = {
        "app/a": PodDrainState(uid="u-a", since=SINCE, reason="Terminating", in_flight=False)
    }
    plan = planner.plan(observed(_draining_since(10), pods=(pod("a"),), drain=evicted))
    assert plan.result.requeue_after is not None
    assert plan.result.requeue_after <= 20.0, "lastError is due 30 s into the drain"


# -- the fleet budget: the ledger read in observe, its write a plan action --------

BUDGET = replace(policy.SETTINGS, budget=BudgetSettings(max_parallel=1))
NODES_BY_NAME = {"n1": node_obj(), "n9": node_obj(name="n9")}


def queued(
    nm: NodeMaintenance,
    *,
    entries: dict[str, dict[str, str]] | None = None,
    running: dict[str, str] | None = None,
    gone: frozenset[str] = frozenset(),
    fresh: bool = True,
    node: Obj | None = None,
    quorum: QuorumFacts | None = None,
) -> Observed:
    """A CR waiting for its start, the ledger and the fleet as observe sees them."""
    return observed(
        nm,
        node=node or node_obj(),
        ledger=Ledger(entries=entries or {}, gone=gone, fresh=fresh),
        fleet=admission.fleet(running or {}, [nm], NODES_BY_NAME),
        quorum=quorum,
    )


def test_without_a_ledger_view_the_pass_reads_it_and_does_nothing_else() -> None:
    obs = replace(queued(nm_obj()), ledger=None)
    plan = planner.plan(obs, BUDGET)
    assert plan.reads == (Read(ReadKind.LEDGER),)
    assert plan.work is Work.KEEP and plan.result == Result(requeue_after=0)
    assert (plan.metadata, plan.status, plan.node_patch, plan.ledger) == (None, None, None, None)
    stale = planner.plan(queued(nm_obj(), fresh=False), BUDGET)
    assert stale.reads == (Read(ReadKind.LEDGER),), "an entry's CR missing from the cache"


def test_a_cr_over_the_budget_stays_queued_and_writes_no_ledger() -> None:
    plan = planner.plan(queued(nm_obj(), running={"other": "n9"}), BUDGET)
    assert plan.work is Work.QUEUED and plan.ledger is None
    assert plan.metadata is None and plan.node_patch is None and plan.lease is LeaseStep.NONE
    assert plan.status is not None and plan.status.phase is Phase.PENDING
    (cond,) = plan.status.conditions or []
    assert (cond.type, cond.status.value, cond.reason) == ("Queued", "True", "BudgetExhausted")
    assert plan.result.requeue_after == BUDGET.queue_recheck


def test_an_admitted_cr_writes_the_ledger_then_starts_and_says_so() -> None:
    plan = planner.plan(queued(nm_obj()), BUDGET)
    assert plan.ledger == LedgerWrite({"nm-1": {"uid": "uid-nm-1", "node": "n1"}}, admitted="nm-1")
    assert plan.work is Work.RUN and plan.metadata is None  # the finalizer is there already
    assert plan.status is not None and plan.status.phase is Phase.SUCCEEDED  # no pods
    marks = [x for x in plan.status.conditions or [] if x.type == "Queued"]
    assert [(x.status.value, x.reason) for x in marks] == [("False", "Admitted")]


def test_an_entry_already_in_the_ledger_starts_without_a_write() -> None:
    entries = {"nm-1": {"uid": "uid-nm-1", "node": "n1"}}
    plan = planner.plan(queued(nm_obj(), entries=entries, running={"other": "n9"}), BUDGET)
    assert plan.ledger is None and plan.work is Work.RUN


def test_slots_of_gone_or_failed_crs_are_pruned_with_the_write() -> None:
    entries = {"old": {"uid": "u-old", "node": "n9"}}
    refused = planner.plan(queued(nm_obj(), entries=entries, running={"x": "n8"}), BUDGET)
    assert refused.ledger is None and refused.work is Work.QUEUED
    pruned = planner.plan(queued(nm_obj(), entries=entries, gone=frozenset({"old"})), BUDGET)
    assert pruned.ledger == LedgerWrite(
        {"nm-1": {"uid": "uid-nm-1", "node": "n1"}}, admitted="nm-1"
    )
    still_full = planner.plan(
        queued(nm_obj(), entries=entries, gone=frozenset({"old"}), running={"x": "n8"}), BUDGET
    )
    assert still_full.work is Work.QUEUED
    assert still_full.ledger == LedgerWrite({}), "the gone slot is freed even when it waits"


def test_a_maintenance_let_go_frees_its_ledger_slot() -> None:
    entries = {"nm-1": {"uid": "uid-nm-1", "node": "n1"}, "b": {"uid": "u-b", "node": "n9"}}
    leave = planner.plan(
        replace(observed(nm_obj(deleting=True)), ledger=Ledger(entries=entries)), BUDGET
    )
    assert leave.work is Work.FORGET
    assert leave.ledger == LedgerWrite({"b": {"uid": "u-b", "node": "n9"}}, released="nm-1")
    failed = nm_obj(phase=Phase.FAILED)
    stop = planner.plan(replace(observed(failed), ledger=Ledger(entries=entries)), BUDGET)
    assert stop.work is Work.STOP and stop.ledger is not None
    assert stop.ledger.released == "nm-1"
    unread = planner.plan(observed(nm_obj(deleting=True)), BUDGET)
    assert unread.ledger is None, "an unread ledger is pruned at the next admission"


CONTROL_PLANE = node_obj() | {
    "metadata": {**node_obj()["metadata"], "labels": {"node-role.kubernetes.io/master": ""}}
}


def test_a_queued_control_plane_node_reads_the_quorum_facts_before_it_starts() -> None:
    pending = nm_obj(phase=Phase.PENDING)
    plan = planner.plan(replace(queued(pending, node=CONTROL_PLANE), ledger=None), BUDGET)
    assert plan.reads == (Read(ReadKind.QUORUM, "n1"), Read(ReadKind.LEDGER))
    guard = {
        "metadata": {"labels": {"app": "guard"}},
        "spec": {"nodeName": "n1"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    pdb = {
        "spec": {"selector": {"matchLabels": {"app": "guard"}}},
        "status": {"disruptionsAllowed": 0},
    }
    broken = QuorumFacts(openshift=True, pdbs=(pdb,), pods=(guard,))
    held = planner.plan(queued(pending, node=CONTROL_PLANE, quorum=broken), BUDGET)
    assert held.work is Work.QUEUED and held.ledger is None
    assert held.status is not None
    (cond,) = held.status.conditions or []
    assert cond.reason == "EtcdQuorum"
    failed_read = QuorumFacts(openshift=True, error="connection refused")
    waits = planner.plan(queued(pending, node=CONTROL_PLANE, quorum=failed_read), BUDGET)
    assert waits.status is not None
    (cond,) = waits.status.conditions or []
    assert cond.message.startswith("could not check the etcd quorum before starting")
    vanilla = planner.plan(
        queued(pending, node=CONTROL_PLANE, quorum=QuorumFacts(openshift=False)), BUDGET
    )
    assert vanilla.ledger is not None and vanilla.ledger.admitted == "nm-1"


# -- failures of the last pass: recorded by the executor, planned here --------------


def test_a_lease_the_last_pass_could_not_take_is_planned_by_the_lease_rules() -> None:
    nm = nm_obj(phase=Phase.RUNNING, status={"evictionPods": 1, "totalpods": 1})
    failure = LeaseFailure(HELD, foreign=True)
    obs = observed(nm, node=node_obj(), pods=(pod("a"),), recall=Recall(lease_failure=failure))
    plan = planner.plan(obs)
    assert plan == planner.plan_lease_failure(obs, error=HELD, foreign=True)
    assert plan.lease is LeaseStep.NONE, "no new request in the pass that reports the failure"


def test_the_last_passs_api_error_goes_to_last_error_first() -> None:
    nm = nm_obj(phase=Phase.RUNNING, status={"evictionPods": 1, "totalpods": 1})
    plan = planner.plan(observed(nm, recall=Recall(lease_held=True, api_error=DENIED)))
    assert plan.work is Work.KEEP and plan.report is not None
    assert plan.report == {"lastError": DENIED, "lastUpdate": "2026-12-01T12:00:00Z"}
    assert (plan.status, plan.metadata, plan.node_patch, plan.evict) == (None, None, None, ())
    reading = replace(
        observed(nm, recall=Recall(lease_held=True, api_error=DENIED)),
        reads=(Read(ReadKind.NODE, "n1"),),
    )
    assert planner.plan(reading).report is not None, "a failed read is reported too"
    said = nm_obj(
        phase=Phase.RUNNING,
        status={
            "evictionPods": 1,
            "totalpods": 1,
            "lastError": DENIED,
            "lastUpdate": "2026-12-01T11:59:50Z",
        },
    )
    again = planner.plan(observed(said, recall=Recall(lease_held=True, api_error=DENIED)))
    assert again.report is None, "said within the heartbeat: the pass goes on"


def test_a_lease_is_taken_only_for_a_cr_a_live_read_confirmed() -> None:
    fresh = nm_obj(finalizer=False)
    unread = planner.plan(replace(observed(fresh, node=node_obj()), recall=Recall()))
    assert unread.reads == (Read(ReadKind.MAINTENANCE, "nm-1"),)
    assert unread.metadata is None, "nothing is written before the read"
    gone = planner.plan(replace(observed(fresh, node=node_obj()), recall=Recall(confirmed=False)))
    assert gone.work is Work.FORGET and gone.lease is LeaseStep.NONE
    assert gone.notes and "lease not taken" in gone.notes[0]
    held = planner.plan(observed(fresh, node=node_obj(), recall=Recall(lease_held=True)))
    assert not held.reads, "a lease this process holds needs no read"


def test_what_the_caches_could_not_answer_is_read_first() -> None:
    reads = (Read(ReadKind.NODE, "n1"), Read(ReadKind.DAEMONSET, "app/ds"))
    plan = planner.plan(replace(observed(nm_obj()), reads=reads))
    assert plan == Plan(reads=reads, work=Work.KEEP, result=Result(requeue_after=0))


def test_every_event_says_after_which_step_it_is_recorded() -> None:
    begin = planner.plan(observed(nm_obj(finalizer=False), node=node_obj()))
    assert [(e.event[0], e.after) for e in begin.events][:1] == [
        ("BeginMaintenance", Step.METADATA)
    ]
    leave = planner.plan(observed(nm_obj(deleting=True), node=TAKEN))
    steps = {e.event[0]: e.after for e in leave.events}
    assert steps["UncordonNode"] is Step.NODE and steps["RemovedMaintenance"] is Step.END


def test_the_begin_notification_goes_with_the_finalizer_the_rest_at_the_end() -> None:
    settings = replace(policy.SETTINGS, notify_operator="nmo-0")
    plan = planner.plan(observed(nm_obj(finalizer=False), node=node_obj(), pods=()), settings)
    steps = [(step, n.kind.value) for step, n in plan.notifications]
    assert steps == [(Step.METADATA, "begin"), (Step.END, "succeeded")]
    quiet = planner.plan(observed(nm_obj(finalizer=False), node=node_obj()), policy.SETTINGS)
    assert quiet.notifications == (), "no --notify-url: none are made"
