"""The node lifecycle conditions (KEP-5683, --node-conditions) as tables.

nmo.core.maintenance.nodeconditions decides which of the four conditions a
Node carries, their status, reason and message, and the strategic-merge
patch that gets the node there from what it carries (only what differs;
lastTransitionTime moves only with the status; other writers' conditions
are never in the patch). The planner attaches it to the pass's plan.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from test_planner import (
    BUDGET,
    NOW,
    TAKEN,
    _running_with,
    nm_obj,
    node_obj,
    observed,
    pod,
    queued,
)

from nmo.api import constants as c
from nmo.api.models import Condition, ConditionStatus, Phase
from nmo.core.maintenance import nodeconditions as nc
from nmo.core.maintenance import planner, policy
from nmo.core.maintenance.drainstate import REASON_PDB, PodDrainState
from nmo.core.maintenance.nodeconditions import Stage
from nmo.core.maintenance.observed import Observed, Plan, Recall, Work

Obj = dict[str, Any]
ON = replace(policy.SETTINGS, node_conditions=True)
BUDGET_ON = replace(BUDGET, node_conditions=True)
STAMP = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
READY = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}

PL, IP, DIP, DR = c.NODE_CONDITION_TYPES
# Pod app/a refused by its PodDisruptionBudget: the drain is Blocked.
BLOCKED = PodDrainState(
    uid="u-a", since=NOW, reason=REASON_PDB, message="needs 2", pdb="web", next_attempt=500.0
)


def table(body: Obj | None) -> dict[str, tuple[str, str]]:
    """A patch's conditions as type -> (status, reason)."""
    assert body is not None
    return {x["type"]: (x["status"], x["reason"]) for x in body["status"]["conditions"]}


def with_conditions(node: Obj, conditions: list[Obj]) -> Obj:
    return {**node, "status": {"conditions": [READY, *conditions]}}


def applied(node: Obj, body: Obj | None) -> Obj:
    """What a strategic-merge patch keyed by type makes of the node's conditions."""
    have = {x["type"]: x for x in (node.get("status") or {}).get("conditions") or []}
    for x in (body or {"status": {"conditions": []}})["status"]["conditions"]:
        if x.get("$patch") == "delete":
            have.pop(x["type"], None)
        else:
            have[x["type"]] = x
    return {**node, "status": {"conditions": list(have.values())}}


# -- which conditions, at which stage ------------------------------------------


@pytest.mark.parametrize(
    ("stage", "reason", "expected"),
    [
        (
            Stage.QUEUED,
            "BudgetExhausted",
            {
                PL: ("True", "BudgetExhausted"),
                IP: ("False", "NotStarted"),
                DIP: ("False", "NotStarted"),
                DR: ("False", "NotStarted"),
            },
        ),
        (
            Stage.STARTING,
            "",
            {
                PL: ("True", "Admitted"),
                IP: ("False", "NotStarted"),
                DIP: ("False", "NotStarted"),
                DR: ("False", "NotStarted"),
            },
        ),
        (
            Stage.DRAINING,
            "",
            {
                PL: ("False", "Started"),
                IP: ("True", "NodeCordoned"),
                DIP: ("True", "Draining"),
                DR: ("False", "Draining"),
            },
        ),
        (
            Stage.DRAINING,
            "TimedOut",
            {
                PL: ("False", "Started"),
                IP: ("True", "NodeCordoned"),
                DIP: ("True", "TimedOut"),
                DR: ("False", "TimedOut"),
            },
        ),
        (
            Stage.DRAINED,
            "",
            {
                PL: ("False", "Started"),
                IP: ("True", "NodeCordoned"),
                DIP: ("False", "Drained"),
                DR: ("True", "Drained"),
            },
        ),
    ],
)
def test_the_four_conditions_per_stage(
    stage: Stage, reason: str, expected: dict[str, tuple[str, str]]
) -> None:
    wants = nc.wanted("nm-1", stage, reason=reason)
    assert {w.type: (w.status, w.reason) for w in wants} == expected
    assert all(w.message.startswith("NodeMaintenance nm-1: ") for w in wants)
    assert {nc.owner_of({"message": w.message}) for w in wants} == {"nm-1"}


def test_owner_of_ignores_messages_nmo_did_not_write() -> None:
    assert nc.owner_of({"message": "kubelet is posting ready status"}) is None
    assert nc.owner_of({}) is None
    assert nc.owner_of({"message": "NodeMaintenance a.b-c: queued"}) == "a.b-c"


# -- the patch: only what differs, times kept --------------------------------


def test_a_node_without_them_gets_all_four_and_others_are_left_out() -> None:
    node = with_conditions(node_obj(), [])
    body = nc.patch(node, nc.wanted("nm-1", Stage.DRAINING), now=NOW)
    assert body is not None
    assert [x["type"] for x in body["status"]["conditions"]] == list(c.NODE_CONDITION_TYPES)
    assert all(x["lastTransitionTime"] == STAMP for x in body["status"]["conditions"])
    assert "Ready" not in table(body), "kubelet's conditions are never part of the patch"


@pytest.mark.parametrize(
    ("before", "after", "written", "moved"),
    [
        # same stage: nothing to write (a restart, a leader change, a repeated pass)
        (Stage.DRAINING, Stage.DRAINING, set(), set()),
        (Stage.DRAINED, Stage.DRAINED, set(), set()),
        # queued -> taken: every condition changes status
        (Stage.QUEUED, Stage.DRAINING, {PL, IP, DIP, DR}, {PL, IP, DIP}),
        # starting -> draining: Drained stays False (reason changes, time kept)
        (Stage.STARTING, Stage.DRAINING, {PL, IP, DIP, DR}, {PL, IP, DIP}),
        # draining -> drained: Planned and InProgress untouched
        (Stage.DRAINING, Stage.DRAINED, {DIP, DR}, {DIP, DR}),
    ],
)
def test_only_what_changed_is_written_and_transition_times_move_with_the_status(
    before: Stage, after: Stage, written: set[str], moved: set[str]
) -> None:
    earlier = NOW - timedelta(minutes=5)
    first = nc.patch(with_conditions(node_obj(), []), nc.wanted("nm-1", before), now=earlier)
    node = applied(with_conditions(node_obj(), []), first)
    body = nc.patch(node, nc.wanted("nm-1", after), now=NOW)
    if not written:
        assert body is None
        return
    assert body is not None
    conds = {x["type"]: x for x in body["status"]["conditions"]}
    assert set(conds) == written
    assert {t for t, x in conds.items() if x["lastTransitionTime"] == STAMP} == moved


def test_conditions_a_status_rewrite_dropped_are_written_again() -> None:
    node = applied(
        with_conditions(node_obj(), []),
        nc.patch(with_conditions(node_obj(), []), nc.wanted("nm-1", Stage.DRAINED), now=NOW),
    )
    kept = [x for x in node["status"]["conditions"] if x["type"] != DR]
    body = nc.patch(
        {**node, "status": {"conditions": kept}}, nc.wanted("nm-1", Stage.DRAINED), now=NOW
    )
    assert table(body) == {DR: ("True", "Drained")}


@pytest.mark.parametrize(
    ("owner", "names", "removed"),
    [
        ("nm-1", ["nm-1"] * 4, {PL, IP, DIP, DR}),
        ("nm-1", ["nm-2"] * 4, set()),  # another CR's: left alone
        (None, ["nm-2", "nm-1", "nm-1", "nm-2"], {PL, IP, DIP, DR}),  # nmo cleanup: all
    ],
)
def test_removal_deletes_only_the_owners_conditions(
    owner: str | None, names: list[str], removed: set[str]
) -> None:
    conds = [
        {"type": t, "status": "True", "reason": "R", "message": f"NodeMaintenance {n}: x"}
        for t, n in zip(c.NODE_CONDITION_TYPES, names, strict=True)
    ]
    body = nc.removal(with_conditions(node_obj(), conds), owner=owner)
    if not removed:
        assert body is None
        return
    assert body is not None
    assert {x["type"] for x in body["status"]["conditions"]} == removed
    assert all(x["$patch"] == "delete" for x in body["status"]["conditions"])
    assert nc.removal(with_conditions(node_obj(), []), owner=owner) is None


# -- what the planner attaches, pass by pass -----------------------------------


def _plan(obs: Observed, settings: policy.PlanSettings = ON) -> Plan:
    return planner.plan(obs, settings)


def test_off_by_default_nothing_is_written() -> None:
    obs = observed(nm_obj(), node=node_obj(), recall=Recall())
    assert planner.plan(obs).node_conditions is None
    assert planner.plan(obs, BUDGET).node_conditions is None
    assert _plan(obs).node_conditions is not None


@pytest.mark.parametrize(
    ("name", "obs", "settings", "expected"),
    [
        (
            "queued by the budget",
            lambda: queued(nm_obj(), running={"other": "n9"}),
            BUDGET_ON,
            {PL: ("True", "BudgetExhausted")},
        ),
        (
            "first pass takes the node (pods running)",
            lambda: observed(nm_obj(), node=node_obj(), recall=Recall(), pods=(pod("a"),)),
            ON,
            {IP: ("True", "NodeCordoned"), DIP: ("True", "Draining")},
        ),
        (
            "first pass, pod watch not synced yet: the node is taken",
            lambda: observed(nm_obj(), node=node_obj(), recall=Recall(), pods=None),
            ON,
            {IP: ("True", "NodeCordoned"), DIP: ("True", "Draining")},
        ),
        (
            # Blocked is known from the evictions' answers only (memory): a new
            # leader would flip it, so the node says Draining (the CR says Blocked).
            "blocked drain",
            lambda: observed(
                _running_with(["a"], drained="Blocked"),
                pods=(pod("a"),),
                drain={"app/a": BLOCKED},
            ),
            ON,
            {DIP: ("True", "Draining"), DR: ("False", "Draining")},
        ),
        (
            "drain past its deadline (onTimeout Report)",
            lambda: observed(
                _running_with(["a"], drained="TimedOut"),
                pods=(pod("a"),),
                drain={"app/a": BLOCKED},
            ),
            replace(ON, drain_timeout=5),
            {DIP: ("True", "TimedOut"), DR: ("False", "TimedOut")},
        ),
        (
            "drained",
            lambda: observed(nm_obj(phase=Phase.RUNNING), pods=()),
            ON,
            {IP: ("True", "NodeCordoned"), DR: ("True", "Drained")},
        ),
    ],
)
def test_live_maintenances_set_their_stage(
    name: str, obs: Any, settings: policy.PlanSettings, expected: dict[str, tuple[str, str]]
) -> None:
    plan = _plan(obs(), settings)
    got = table(plan.node_conditions)
    assert {t: got[t] for t in expected} == expected, name


@pytest.mark.parametrize(
    ("volumes", "expected"),
    [
        (
            "False",
            {DIP: ("True", "WaitingForVolumeDetach"), DR: ("False", "WaitingForVolumeDetach")},
        ),
        ("True", {DIP: ("True", "Draining"), DR: ("False", "Draining")}),
    ],
)
def test_a_drain_waiting_for_its_volumes_is_not_drained_yet(
    volumes: str, expected: dict[str, tuple[str, str]]
) -> None:
    """--wait-for-volume-detach: every pod left, the CR stays Running with its
    VolumesDetached condition False; the node says the drain goes on."""
    st = nm_obj(phase=Phase.RUNNING).status.model_copy(
        update={
            "conditions": [
                Condition(
                    type=c.CONDITION_VOLUMES_DETACHED,
                    status=ConditionStatus(volumes),
                    reason="Waiting",
                    message="1 volume(s) still attached",
                )
            ]
        }
    )
    out = Plan(status=st)
    stage = nc.stage_of(observed(nm_obj(phase=Phase.RUNNING)), out, st)
    assert stage is Stage.DRAINING
    body = nc.attach(observed(nm_obj(phase=Phase.RUNNING)), out, enabled=True)
    got = table(body.node_conditions)
    assert {t: got[t] for t in expected} == expected


def test_a_pass_on_a_node_that_says_so_already_writes_nothing() -> None:
    obs = observed(nm_obj(phase=Phase.RUNNING), pods=())
    first = _plan(obs).node_conditions
    again = _plan(replace(obs, node=applied(TAKEN, first))).node_conditions
    assert first is not None and again is None


def _carrying(owner: str, stage: Stage = Stage.DRAINING) -> Obj:
    return applied(TAKEN, nc.patch(TAKEN, nc.wanted(owner, stage), now=NOW))


@pytest.mark.parametrize(
    ("name", "nm", "node_owner", "removes"),
    [
        ("deleted: its own go", nm_obj(deleting=True, phase=Phase.RUNNING), "nm-1", True),
        ("deleted: another CR's stay", nm_obj(deleting=True, phase=Phase.RUNNING), "nm-2", False),
        (
            "deleted duplicate: never held the node",
            nm_obj(
                deleting=True,
                phase=Phase.FAILED,
                status={"lastError": c.Messages.WEBHOOK_DUPLICATE.format(node="n1")},
            ),
            "nm-1",
            False,
        ),
        (
            "failed (lease lost, timed out): its own go",
            nm_obj(phase=Phase.FAILED, status={"lastError": "drain timed out"}),
            "nm-1",
            True,
        ),
    ],
)
def test_a_maintenance_that_ends_removes_the_conditions_it_wrote(
    name: str, nm: Any, node_owner: str, removes: bool
) -> None:
    plan = _plan(observed(nm, node=_carrying(node_owner), recall=Recall()))
    if removes:
        assert plan.node_conditions is not None, name
        gone = plan.node_conditions["status"]["conditions"]
        assert {x["type"] for x in gone} == set(c.NODE_CONDITION_TYPES), name
        assert plan.node_conditions is not None
        assert all(x["$patch"] == "delete" for x in plan.node_conditions["status"]["conditions"])
    else:
        assert plan.node_conditions is None, name


def test_reads_and_lets_go_write_nothing() -> None:
    obs = observed(nm_obj(), node=node_obj(), recall=Recall(confirmed=False))
    plan = _plan(obs)
    assert plan.work is Work.FORGET and plan.node_conditions is None
    unknown = observed(nm_obj(), node=None, recall=Recall())
    assert _plan(unknown).node_conditions is None
