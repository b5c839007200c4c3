"""The emergency cleanup plan (B11): what is removed, what is kept and why."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pytest

import builders
from builders import apply_patch
from nmo.api import constants as c
from nmo.core.maintenance.nodepatch import PriorState
from nmo.kube.errors import NotFound
from nmo.ops.cleanup import (
    Plan,
    StepKind,
    leader_alive,
    plan_cleanup,
    same_or_smaller,
    watch_leader,
)

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
UNSCHED = {"key": c.UNSCHEDULABLE_TAINT_KEY, "effect": "NoSchedule"}
DRAIN = {"key": c.DRAIN_TAINT_KEY, "effect": "NoSchedule"}
FOREIGN = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
DRAIN_EXEC = {"key": c.DRAIN_TAINT_KEY, "effect": "NoExecute"}  # same key, not ours
BOTH_LABELS = {c.EXCLUDE_FROM_REMEDIATION_LABEL: "true", c.GUIDE_EXCLUDE_LABEL: "true"}


node = partial(builders.node, resource_version="7", labels={}, unschedulable=False, taints=[])
nm = partial(
    builders.nm,
    uid="uid-{name}",
    resource_version="3",
    created="2026-01-01T10:00:00Z",
    finalizers=(c.FINALIZER,),
)
lease = partial(builders.lease, uid="u1", resource_version="9")


def plan(n: dict[str, Any] | None, crs: list[dict[str, Any]] | None = None, ls: Any = None) -> Plan:
    return plan_cleanup(
        "n1", node=n, maintenances=crs or [], lease=ls, lease_namespace=c.LEASE_NAMESPACE_DEFAULT
    )


def kinds(p: Plan) -> list[StepKind]:
    return [s.kind for s in p.steps]


@pytest.mark.parametrize(
    ("before", "crs", "after_taints", "after_cordon", "after_labels"),
    [
        pytest.param(
            node(taints=[UNSCHED, DRAIN], unschedulable=True, labels=BOTH_LABELS),
            [nm()],
            [],
            False,
            {},
            id="full-mess-both-label-keys",
        ),
        pytest.param(
            node(taints=[FOREIGN, UNSCHED, DRAIN, DRAIN_EXEC], unschedulable=True),
            [],
            [FOREIGN, DRAIN_EXEC],
            False,
            {},
            id="foreign-taints-kept",
        ),
        pytest.param(
            node(
                taints=[UNSCHED, DRAIN],
                unschedulable=True,
                labels=BOTH_LABELS,
                prior=PriorState(
                    unschedulable=True, taints=(c.UNSCHEDULABLE_TAINT_KEY,), maintenance="uid-nm-1"
                ),
            ),
            [],
            [UNSCHED],
            True,
            {},
            id="prior-cordon-kept-even-with-the-cr-gone",
        ),
        pytest.param(
            node(
                taints=[DRAIN],
                unschedulable=True,
                labels={c.EXCLUDE_FROM_REMEDIATION_LABEL: "true"},
                prior=PriorState(label=True),
            ),
            [nm()],
            [],
            False,
            {c.EXCLUDE_FROM_REMEDIATION_LABEL: "true"},
            id="prior-label-kept",
        ),
        pytest.param(
            node(taints=[UNSCHED, DRAIN], unschedulable=True, labels=BOTH_LABELS),
            [nm(prior=PriorState(unschedulable=True, taints=(c.UNSCHEDULABLE_TAINT_KEY,)))],
            [],
            False,
            {},
            id="prior-state-on-a-cr-is-not-trusted",
        ),
        pytest.param(
            node(labels={c.EXCLUDE_FROM_REMEDIATION_LABEL: "true"}),
            [nm()],
            [],
            False,
            {c.EXCLUDE_FROM_REMEDIATION_LABEL: "true"},
            id="admin-exclude-label-without-sign-of-maintenance-kept",
        ),
        pytest.param(
            node(unschedulable=True, labels={c.EXCLUDE_FROM_REMEDIATION_LABEL: "true"}),
            [],
            [],
            True,
            {c.EXCLUDE_FROM_REMEDIATION_LABEL: "true"},
            id="admin-cordon-and-exclude-label-left-alone",
        ),
        pytest.param(
            node(taints=[UNSCHED], unschedulable=True),
            [],
            [UNSCHED],
            True,
            {},
            id="admin-cordon-without-maintenance-left-alone",
        ),
        pytest.param(
            node(taints=[DRAIN], labels={c.GUIDE_EXCLUDE_LABEL: "true", "team": "a"}),
            [],
            [],
            False,
            {"team": "a"},
            id="guide-label-with-the-drain-taint",
        ),
        pytest.param(
            node(labels={c.GUIDE_EXCLUDE_LABEL: "true", "team": "a"}),
            [],
            [],
            False,
            {c.GUIDE_EXCLUDE_LABEL: "true", "team": "a"},
            id="guide-label-alone-is-an-admins",
        ),
    ],
)
def test_node_after_cleanup(
    before: dict[str, Any],
    crs: list[dict[str, Any]],
    after_taints: list[dict[str, Any]],
    after_cordon: bool,
    after_labels: dict[str, str],
) -> None:
    p = plan(before, crs)
    after = apply_patch(before, p.node_patch)
    assert after["spec"]["taints"] == after_taints
    assert c.PRIOR_STATE_ANNOTATION not in (after["metadata"].get("annotations") or {})
    assert after["spec"]["unschedulable"] is after_cordon
    assert after["metadata"]["labels"] == after_labels


def test_both_label_keys_are_separate_steps() -> None:
    p = plan(node(taints=[DRAIN], labels=BOTH_LABELS))
    removed = {s.what for s in p.steps if s.kind is StepKind.REMOVE_LABEL}
    assert removed == {
        f"remove label {c.EXCLUDE_FROM_REMEDIATION_LABEL}",
        f"remove label {c.GUIDE_EXCLUDE_LABEL}",
    }


def test_node_patch_is_guarded_by_resource_version() -> None:
    p = plan(node(taints=[DRAIN]))
    assert p.node_patch is not None
    assert p.node_patch[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}


def test_prior_cordon_is_explained() -> None:
    prior = PriorState(unschedulable=True, taints=(c.UNSCHEDULABLE_TAINT_KEY,))
    p = plan(node(taints=[UNSCHED, DRAIN], unschedulable=True, prior=prior), [nm()])
    assert StepKind.UNCORDON not in kinds(p)
    assert any("cordoned before the maintenance (recorded on node/n1 by nmo)" in k for k in p.kept)
    assert StepKind.REMOVE_RECORD in kinds(p)


def test_an_admins_exclude_label_is_kept_and_explained() -> None:
    p = plan(node(labels={c.EXCLUDE_FROM_REMEDIATION_LABEL: "true"}), [nm()])
    assert StepKind.REMOVE_LABEL not in kinds(p)
    assert any("shows no sign that a maintenance set it" in k for k in p.kept)


@pytest.mark.parametrize(
    ("holder", "released", "kept"),
    [
        (c.LEASE_HOLDER, True, False),
        ("node-healthcheck", False, True),
        ("", False, True),
    ],
)
def test_lease_released_only_when_ours(holder: str, released: bool, kept: bool) -> None:
    p = plan(node(), [], lease(holder))
    assert (StepKind.RELEASE_LEASE in kinds(p)) is released
    assert (p.lease is not None) is released
    assert any("lease/" in k for k in p.kept) is kept
    if holder and kept:
        assert any(holder in k for k in p.kept)


def test_finalizer_removed_others_kept() -> None:
    p = plan(node(), [nm(finalizers=("example.com/keep", c.FINALIZER), deleting=True)])
    assert kinds(p) == [StepKind.REMOVE_FINALIZER]
    ((name, ops),) = p.finalizer_patches
    assert name == "nm-1"
    assert ops[-1] == {
        "op": "replace",
        "path": "/metadata/finalizers",
        "value": ["example.com/keep"],
    }
    assert not p.notes  # being deleted: it disappears once the finalizers are gone


def test_live_cr_gets_a_note_or_is_deleted_on_request() -> None:
    p = plan(node(), [nm()])
    assert any("kubectl delete nm nm-1" in n for n in p.notes)
    p2 = plan_cleanup(
        "n1",
        node=node(),
        maintenances=[nm()],
        lease=None,
        lease_namespace="x",
        delete_maintenances=True,
    )
    assert kinds(p2) == [StepKind.REMOVE_FINALIZER, StepKind.DELETE_MAINTENANCE]
    assert p2.deletions == (("nm-1", "uid-nm-1"),)
    again = copy.deepcopy(nm())
    again["metadata"]["uid"] = "uid-recreated"  # same name, another object
    p3 = plan_cleanup(
        "n1",
        node=node(),
        maintenances=[again],
        lease=None,
        lease_namespace="x",
        delete_maintenances=True,
    )
    assert not same_or_smaller(p3, p2)  # never deleted on the confirmation of the first
    ((_, ops),) = p3.finalizer_patches
    assert {"op": "test", "path": "/metadata/uid", "value": "uid-recreated"} in ops


def test_unknown_node_still_cleans_cr_and_lease() -> None:
    p = plan(None, [nm(deleting=True)], lease(c.LEASE_HOLDER))
    assert not p.node_found
    assert p.node_patch is None
    assert kinds(p) == [StepKind.RELEASE_LEASE, StepKind.REMOVE_FINALIZER]


def test_second_run_is_a_no_op() -> None:
    before = node(taints=[FOREIGN, UNSCHED, DRAIN], unschedulable=True, labels=BOTH_LABELS)
    first = plan(before, [nm(deleting=True)], lease(c.LEASE_HOLDER))
    after = apply_patch(before, first.node_patch)
    second = plan(after, [], None)
    assert second.empty
    assert second.node_patch is None


def test_replanned_subset_is_accepted() -> None:
    full = plan(node(taints=[UNSCHED, DRAIN], unschedulable=True, labels=BOTH_LABELS), [nm()])
    less = plan(node(taints=[DRAIN], unschedulable=True), [nm()])
    assert same_or_smaller(less, full)
    assert not same_or_smaller(full, less)


def leader(holder: str, rv: str, renew: str) -> dict[str, Any]:
    return {
        "metadata": {"name": c.LEADER_ELECTION_ID, "resourceVersion": rv},
        "spec": {"holderIdentity": holder, "renewTime": renew, "leaseDurationSeconds": 15},
    }


FUTURE = "2099-01-01T00:00:00.000000Z"  # a dead leader whose clock ran far ahead
PAST = "2000-01-01T00:00:00.000000Z"  # a live leader whose clock runs far behind


@pytest.mark.parametrize(
    ("first", "later", "alive"),
    [
        pytest.param(
            leader("nmo-1", "1", PAST),
            leader("nmo-1", "2", PAST),
            "nmo-1",
            id="renewed-clock-behind",
        ),
        pytest.param(
            leader("nmo-1", "1", FUTURE),
            leader("nmo-1", "1", FUTURE),
            None,
            id="static-clock-ahead",
        ),
        pytest.param(
            leader("nmo-1", "1", PAST), leader("nmo-2", "2", PAST), "nmo-2", id="taken-over"
        ),
        pytest.param(leader("", "1", PAST), leader("", "2", FUTURE), None, id="released"),
        pytest.param(leader("nmo-1", "1", PAST), None, None, id="deleted"),
        pytest.param(None, leader("nmo-1", "1", PAST), None, id="created-meanwhile-unseen"),
    ],
)
def test_leader_alive_when_the_lease_moves(
    first: dict[str, Any] | None, later: dict[str, Any] | None, alive: str | None
) -> None:
    assert leader_alive(first, later) == alive


class LeaseReads:
    """The leader lease as successive reads return it (None: not found)."""

    def __init__(self, *reads: dict[str, Any] | None) -> None:
        self.reads = list(reads)
        self.calls = 0

    async def get(self, path: str) -> dict[str, Any]:
        assert path.endswith(f"/leases/{c.LEADER_ELECTION_ID}")
        self.calls += 1
        read = self.reads.pop(0)
        if read is None:
            raise NotFound("leases not found")
        return read


async def no_sleep(_: float) -> None:
    return None


async def test_watch_leader_stops_at_the_first_renewal() -> None:
    first = leader("nmo-1", "1", PAST)
    reads = LeaseReads(first, first, leader("nmo-1", "2", PAST), first)
    got = await watch_leader(reads, "ns", first, window=5, poll=0.5, sleep=no_sleep)  # type: ignore[arg-type]
    assert got == "nmo-1" and reads.calls == 3


async def test_watch_leader_gives_up_after_the_window() -> None:
    first = leader("nmo-1", "1", FUTURE)
    reads = LeaseReads(*[first] * 20)
    got = await watch_leader(reads, "ns", first, window=5, poll=0.5, sleep=no_sleep)  # type: ignore[arg-type]
    assert got is None and reads.calls == 10


async def test_watch_leader_without_holder_reads_nothing_more() -> None:
    reads = LeaseReads()
    assert await watch_leader(reads, "ns", leader("", "1", PAST), sleep=no_sleep) is None  # type: ignore[arg-type]
    assert await watch_leader(reads, "ns", None, sleep=no_sleep) is None  # type: ignore[arg-type]
    assert reads.calls == 0


@pytest.mark.parametrize("holder", ["[/]", "[link=https://evil.example/]x[/link]"])
def test_plan_shown_as_plain_text(holder: str) -> None:
    """A foreign lease holder is a free string: the plan prints it, never as markup."""
    from rich.console import Console

    from nmo.cli.toolkit import _show_plan

    shown = plan(node(taints=[DRAIN], unschedulable=True), [nm()], lease(holder))
    terminal = Console(width=300, force_terminal=True, color_system="truecolor")
    with terminal.capture() as captured:
        _show_plan(terminal, shown)
    assert "\x1b]8;" not in captured.get()  # no OSC 8 terminal hyperlink
    recorder = Console(record=True, width=300, color_system=None)
    _show_plan(recorder, shown)
    assert f"held by {holder}, not nmo's" in recorder.export_text()


def test_nmos_node_conditions_go_and_others_stay() -> None:
    """--node-conditions: the lifecycle conditions nmo wrote (their message names a
    NodeMaintenance) are removed from the node's status; kubelet's and a
    same-named condition someone else wrote stay."""
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}
    mine = [
        {"type": t, "status": "True", "reason": "R", "message": "NodeMaintenance gone: x"}
        for t in c.NODE_CONDITION_TYPES[:3]
    ]
    foreign = {"type": c.NODE_CONDITION_DRAINED, "status": "True", "reason": "X", "message": "y"}
    before = node() | {"status": {"conditions": [ready, *mine, foreign]}}
    p = plan(before, [])
    assert kinds(p) == [StepKind.REMOVE_CONDITION] * 3
    assert str(p.steps[0]) == "node/n1: remove condition MaintenancePlanned"
    assert p.node_patch is None
    assert p.conditions_patch == {
        "status": {
            "conditions": [{"type": t, "$patch": "delete"} for t in c.NODE_CONDITION_TYPES[:3]]
        }
    }
    after = node() | {"status": {"conditions": [ready, foreign]}}
    assert plan(after, []).empty
