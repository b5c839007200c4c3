"""Node changes on entering and leaving maintenance (A2 5-7, A3, B7)."""

from functools import partial
from typing import Any

import pytest

import builders
from builders import apply_patch
from nmo.api import constants as c
from nmo.core.maintenance import nodepatch

UNSCHED = {"key": c.UNSCHEDULABLE_TAINT_KEY, "effect": "NoSchedule"}
DRAIN = {"key": c.DRAIN_TAINT_KEY, "effect": "NoSchedule"}
OTHER = {"key": "dedicated", "value": "gpu", "effect": "NoExecute"}


node = partial(builders.node, resource_version="42")


@pytest.mark.parametrize(
    "before",
    [
        node(),
        node(labels={"a": "b"}, taints=[OTHER]),
        node(unschedulable=True, taints=[UNSCHED]),
        node(taints=[DRAIN, OTHER]),
    ],
)
def test_enter_then_leave_restores_prior_state(before: dict[str, Any]) -> None:
    prior = nodepatch.prior_state(before)
    ops = nodepatch.enter_patch(before)
    assert ops is not None
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "42"}
    during = apply_patch(before, ops)
    assert nodepatch.in_maintenance(during)
    assert nodepatch.enter_patch(during) is None
    for t in before["spec"].get("taints", []):
        assert t in during["spec"]["taints"], "a pre-existing taint was lost"
    back = nodepatch.leave_patch(
        during, nodepatch.PriorState.from_annotation(prior.to_annotation())
    )
    after = apply_patch(during, back) if back else during
    assert bool(after["spec"].get("unschedulable")) == bool(before["spec"].get("unschedulable"))
    assert sorted(map(str, after["spec"].get("taints", []))) == sorted(
        map(str, before["spec"].get("taints", []))
    )
    assert c.EXCLUDE_FROM_REMEDIATION_LABEL not in (after["metadata"].get("labels") or {})


def test_leave_without_prior_state_does_what_nmo_does() -> None:
    during = node(
        unschedulable=True,
        taints=[UNSCHED, DRAIN, OTHER],
        labels={c.EXCLUDE_FROM_REMEDIATION_LABEL: "true"},
    )
    after = apply_patch(during, nodepatch.leave_patch(during, None) or [])
    assert after["spec"]["taints"] == [OTHER]
    assert after["spec"]["unschedulable"] is False
    assert after["metadata"]["labels"] == {}
    assert nodepatch.restore(during, None).uncordon


def test_previously_cordoned_node_is_not_uncordoned() -> None:
    prior = nodepatch.PriorState(unschedulable=True)
    during = node(unschedulable=True, taints=[UNSCHED, DRAIN])
    after = apply_patch(during, nodepatch.leave_patch(during, prior) or [])
    assert after["spec"]["unschedulable"] is True
    assert not nodepatch.restore(during, prior).uncordon


def test_nothing_to_undo_gives_no_patch() -> None:
    assert nodepatch.leave_patch(node(taints=[OTHER]), nodepatch.PriorState()) is None


@pytest.mark.parametrize("value", [None, "", "not json", "[]"])
def test_bad_prior_annotation_is_ignored(value: str | None) -> None:
    assert nodepatch.PriorState.from_annotation(value) is None


@pytest.mark.parametrize(
    "before",
    [
        node(),
        node(labels={"a": "b"}, taints=[OTHER]),
        node(unschedulable=True, taints=[UNSCHED]),
        node(taints=[DRAIN, OTHER], labels={c.EXCLUDE_FROM_REMEDIATION_LABEL: "true"}),
    ],
)
def test_the_first_take_records_the_node_on_the_node(before: dict[str, Any]) -> None:
    """The record rides in the patch that first changes the node, bound to the CR."""
    during = apply_patch(before, nodepatch.enter_patch(before, record_for="uid-a") or [])
    assert nodepatch.in_maintenance(during)
    prior = nodepatch.prior_for(during, "uid-a")
    assert prior == nodepatch.PriorState(
        unschedulable=nodepatch.is_cordoned(before),
        taints=nodepatch.prior_state(before).taints,
        label=nodepatch.has_label(before),
        maintenance="uid-a",
    )
    assert nodepatch.prior_for(during, "uid-b") is None, "bound to the CR that took the node"
    assert nodepatch.enter_patch(during, record_for="uid-a") is None, "recorded once"
    kept = apply_patch(during, nodepatch.leave_patch(during, prior) or [])
    assert nodepatch.prior_for(kept, "uid-a") == prior, "a Failed CR keeps its record"
    after = apply_patch(during, nodepatch.leave_patch(during, prior, forget=True) or [])
    assert nodepatch.recorded_prior(after) is None
    assert after["spec"].get("taints", []) == before["spec"].get("taints", [])
    assert bool(after["spec"].get("unschedulable")) == nodepatch.is_cordoned(before)
