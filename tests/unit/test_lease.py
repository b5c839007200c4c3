"""The medik8s lease rules (behavior.md A5)."""

from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest

import builders
from nmo.core.maintenance.lease import Action, apply, build_lease, decide, format_micro

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


lease = partial(builders.lease, resource_version="1", duration=3600, transitions=2)


def without(obj: dict[str, Any], key: str) -> dict[str, Any]:
    spec = {k: v for k, v in obj["spec"].items() if k != key}
    return {**obj, "spec": spec}


@pytest.mark.parametrize(
    ("current", "expected"),
    [
        (None, Action.CREATE),
        (lease("node-maintenance", NOW - timedelta(seconds=10)), Action.KEEP),
        (lease("node-maintenance", NOW - timedelta(minutes=10)), Action.RENEW),
        (lease("node-maintenance", NOW - timedelta(hours=2)), Action.RENEW),
        (lease("node-healthcheck", NOW - timedelta(minutes=10)), Action.FOREIGN),
        (lease("node-healthcheck", NOW), Action.FOREIGN),
        # expired only once renewTime + duration + 2 s skew has passed
        (lease("node-healthcheck", NOW - timedelta(seconds=3601)), Action.FOREIGN),
        (lease("node-healthcheck", NOW - timedelta(seconds=3602)), Action.FOREIGN),
        (
            lease("node-healthcheck", NOW - timedelta(seconds=3602, microseconds=1)),
            Action.TAKE_OVER,
        ),
        (lease("node-healthcheck", NOW - timedelta(seconds=3603)), Action.TAKE_OVER),
        # a renewal that landed while nmo read the lease, or a clock a little ahead
        (lease("node-healthcheck", NOW + timedelta(seconds=1)), Action.FOREIGN),
        (lease("node-healthcheck", NOW + timedelta(seconds=2)), Action.FOREIGN),
        (lease("node-healthcheck", NOW + timedelta(seconds=3)), Action.TAKE_OVER),
        (lease("node-healthcheck", NOW + timedelta(minutes=5)), Action.TAKE_OVER),
        (lease("node-healthcheck", None), Action.TAKE_OVER),
        # medik8s/common: any holder but ours holds a valid lease, an empty one too
        (lease("", NOW), Action.FOREIGN),
        (lease("", NOW - timedelta(hours=2)), Action.TAKE_OVER),
        (without(lease("node-maintenance", NOW), "holderIdentity"), Action.FOREIGN),
        # no renewTime or no duration: no expiry, so never valid (common's isValidLease)
        (without(lease("node-healthcheck", NOW), "renewTime"), Action.TAKE_OVER),
        (without(lease("node-healthcheck", NOW), "leaseDurationSeconds"), Action.TAKE_OVER),
        (without(lease("", NOW), "renewTime"), Action.TAKE_OVER),
        # ... and our own such lease is renewed (as newly acquired, see below)
        (without(lease("node-maintenance", NOW), "renewTime"), Action.RENEW),
        (without(lease("node-maintenance", NOW), "leaseDurationSeconds"), Action.RENEW),
    ],
)
def test_decide(current: dict[str, Any] | None, expected: Action) -> None:
    assert decide(current, NOW).action is expected


@pytest.mark.parametrize(
    ("holder", "named"), [("", ""), (None, "unknown"), ("node-healthcheck", "node-healthcheck")]
)
def test_a_valid_foreign_lease_names_its_holder_as_common_does(
    holder: str | None, named: str
) -> None:
    current = lease(holder or "", NOW)
    if holder is None:
        current = without(current, "holderIdentity")
    decision = decide(current, NOW)
    assert decision.action is Action.FOREIGN and decision.holder == named


NODE = {"metadata": {"name": "n1", "uid": "uid-now"}}
STALE_OWNER = [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-before"}]


@pytest.mark.parametrize(
    ("current", "reacquired"),
    [
        (lease("node-maintenance", NOW - timedelta(minutes=30)), False),  # renew
        (lease("node-healthcheck", NOW - timedelta(hours=3)), True),  # take over
        (without(lease("node-maintenance", NOW), "renewTime"), True),  # renewed as acquired
        # expired: acquireTime is set again only where it was missing
        (lease("node-maintenance", NOW - timedelta(hours=2)), False),
        (without(lease("node-maintenance", NOW - timedelta(hours=2)), "acquireTime"), True),
    ],
)
def test_renewal_and_takeover_point_the_owner_at_the_current_node(
    current: dict[str, Any], reacquired: bool
) -> None:
    current = {**current, "metadata": {**current["metadata"], "ownerReferences": STALE_OWNER}}
    decision = decide(current, NOW)
    assert decision.action in (Action.RENEW, Action.TAKE_OVER)
    new = apply(decision, current, NODE, NOW)
    assert new["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-now"}
    ]
    assert new["metadata"]["resourceVersion"] == "1", "the update carries the resourceVersion"
    assert new["spec"]["holderIdentity"] == "node-maintenance"
    assert new["spec"]["renewTime"] == format_micro(NOW)
    assert new["spec"]["leaseDurationSeconds"] == 3600
    if reacquired:
        assert new["spec"]["acquireTime"] == format_micro(NOW)
        assert new["spec"]["leaseTransitions"] == 3
    else:
        assert new["spec"].get("acquireTime") == current["spec"].get("acquireTime")
        assert new["spec"]["leaseTransitions"] == 2


def test_foreign_decision_names_the_holder() -> None:
    assert decide(lease("self-node-remediation", NOW), NOW).holder == "self-node-remediation"


def test_take_over_bumps_transitions_and_acquire_time() -> None:
    old = lease("node-healthcheck", NOW - timedelta(hours=3))
    new = apply(decide(old, NOW), old, NODE, NOW)
    assert new["spec"]["holderIdentity"] == "node-maintenance"
    assert new["spec"]["leaseTransitions"] == 3
    assert new["spec"]["acquireTime"] == "2026-11-30T12:00:00.000000Z"
    assert new["spec"]["renewTime"] == "2026-11-30T12:00:00.000000Z"
    assert new["spec"]["leaseDurationSeconds"] == 3600


def test_renew_keeps_acquire_time() -> None:
    old = lease("node-maintenance", NOW - timedelta(minutes=30))
    new = apply(decide(old, NOW), old, NODE, NOW)
    assert new["spec"]["acquireTime"] == old["spec"]["acquireTime"]
    assert new["spec"]["leaseTransitions"] == 2


def test_new_lease_shape() -> None:
    node = {"metadata": {"name": "Worker-1", "uid": "u1"}}
    body = build_lease(node, "medik8s-leases", NOW)
    assert body["metadata"]["name"] == "node-worker-1"
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "Worker-1", "uid": "u1"}
    ]
    assert body["spec"]["holderIdentity"] == "node-maintenance"
    assert body["spec"]["leaseDurationSeconds"] == 3600
