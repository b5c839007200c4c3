"""The admission rules (behavior.md A6) as tables over a fake cluster."""

from __future__ import annotations

from typing import Any

import pytest
from webhook_fakes import GUARD, FakeLookups, Obj, guard, nm, node, pdb

import builders
from nmo.api.constants import CONTROL_PLANE_ROLE_LABEL, MASTER_ROLE_LABEL, Messages
from nmo.core.maintenance.quorum import etcd_disruption_allowed, is_control_plane
from nmo.core.maintenance.selectors import selector_matches
from nmo.webhooks.validators import (
    Decision,
    LookupFailed,
    validate_create,
    validate_update,
)

DENIED_NO_NODE = Messages.WEBHOOK_NO_NODE.format(node="n1")
DENIED_DUPLICATE = Messages.WEBHOOK_DUPLICATE.format(node="n1")
DENIED_QUORUM = Messages.WEBHOOK_QUORUM.format(node="n1")


async def create(lookups: FakeLookups, node_name: str = "n1", **kw: Any) -> Decision:
    return await validate_create(nm(node_name), lookups, claimant="uid-a", **kw)


# -- CREATE: the three rules in NMO's order -------------------------------------


@pytest.mark.parametrize(
    ("lookups", "message"),
    [
        pytest.param(FakeLookups(), DENIED_NO_NODE, id="missing node"),
        pytest.param(
            FakeLookups(existing={"n1"}),
            DENIED_NO_NODE,
            id="missing node wins over duplicate",
        ),
        pytest.param(
            FakeLookups(nodes={"n1": node("n1")}, existing={"n1"}),
            DENIED_DUPLICATE,
            id="duplicate",
        ),
        pytest.param(
            FakeLookups(
                nodes={"n1": node("n1", role=CONTROL_PLANE_ROLE_LABEL)},
                existing={"n1"},
                openshift=True,
            ),
            DENIED_DUPLICATE,
            id="duplicate wins over quorum",
        ),
        pytest.param(FakeLookups(nodes={"n1": node("n1")}), "", id="allowed"),
    ],
)
async def test_create_rules_in_order(lookups: FakeLookups, message: str) -> None:
    decision = await create(lookups)
    assert decision.allowed is (message == "")
    assert decision.message == message
    if message:
        assert (decision.code, decision.reason, decision.result) == (403, "Forbidden", "denied")


CP = CONTROL_PLANE_ROLE_LABEL


@pytest.mark.parametrize(
    ("role", "openshift", "pdbs", "pods", "allowed"),
    [
        pytest.param(CP, True, [pdb(0)], [guard("n1", "True")], False, id="guard Ready, 0 allowed"),
        pytest.param(CP, True, [pdb(0)], [guard("n1", "False")], True, id="guard not Ready"),
        pytest.param(CP, True, [pdb(0)], [guard("n2", "True")], True, id="no guard on the node"),
        pytest.param(CP, True, [pdb(0)], [], True, id="no guard pods at all"),
        pytest.param(CP, True, [pdb(1)], [guard("n1", "True")], True, id="1 disruption allowed"),
        pytest.param(CP, True, [pdb(2)], [guard("n1", "True")], True, id="2 disruptions allowed"),
        pytest.param(CP, True, [], [guard("n1", "False")], False, id="no PDB"),
        pytest.param(
            CP,
            True,
            [pdb(1), pdb(1, name="etcd-quorum-guard")],
            [],
            False,
            id="two PDBs",
        ),
        pytest.param(None, True, [], [], True, id="worker node"),
        pytest.param(CP, False, [], [], True, id="not OpenShift"),
        pytest.param(
            MASTER_ROLE_LABEL, True, [pdb(0)], [guard("n1", "True")], False, id="master label"
        ),
        pytest.param(
            CP,
            True,
            [pdb(0)],
            [guard("n1", "True", labels={"app": "other"})],
            True,
            id="pod on the node not matched by the selector",
        ),
        # medik8s/common: a missing Ready condition is not Ready (the node is
        # disrupted already); Unknown counts as Ready (about to be Ready).
        pytest.param(
            CP, True, [pdb(0)], [guard("n1", None)], True, id="guard without Ready condition"
        ),
        pytest.param(CP, True, [pdb(0)], [guard("n1", "Unknown")], False, id="guard Ready Unknown"),
        pytest.param(
            CP,
            True,
            [pdb(0)],
            [guard("n1", None, conditions=[{"type": "PodScheduled", "status": "True"}])],
            True,
            id="guard with other conditions only",
        ),
        pytest.param(
            CP,
            True,
            [pdb(0)],
            [
                guard(
                    "n1",
                    None,
                    conditions=[
                        {"type": "Ready", "status": "False"},
                        {"type": "Ready", "status": "True"},
                    ],
                )
            ],
            False,
            id="any Ready condition True counts",
        ),
    ],
)
async def test_quorum_matrix(
    role: str | None, openshift: bool, pdbs: list[Obj], pods: list[Obj], allowed: bool
) -> None:
    lookups = FakeLookups(
        nodes={"n1": node("n1", role=role)}, openshift=openshift, pdbs=pdbs, pods=pods
    )
    decision = await create(lookups)
    assert decision.allowed is allowed
    assert decision.message == ("" if allowed else DENIED_QUORUM)
    # A refused create must not keep the node claimed.
    assert lookups.claims == ({"n1": "uid-a"} if allowed else {})


async def test_guard_pods_are_only_read_when_no_disruption_is_allowed() -> None:
    lookups = FakeLookups(nodes={"n1": node("n1", role=CP)}, openshift=True, pdbs=[pdb(1)], pods=[])
    assert (await create(lookups)).allowed
    assert lookups.pod_queries == 0


@pytest.mark.parametrize(
    ("failing", "role", "what"),
    [
        (
            "node",
            None,
            "could not get node for validating spec.NodeName, please try again: could not get node",
        ),
        ("claim", None, "could not list NodeMaintenances for validating spec.NodeName"),
        ("discovery", CP, "could not check for OpenShift for master/control-plane quorum"),
        ("pdbs", CP, "could not check the etcd quorum guard"),
        ("pods", CP, "could not check the etcd quorum guard"),
    ],
)
async def test_lookup_failures_deny_with_retry_message(
    failing: str, role: str | None, what: str
) -> None:
    lookups = FakeLookups(
        nodes={"n1": node("n1", role=role)},
        openshift=True,
        pdbs=[pdb(0)],
        failing={failing},
    )
    decision = await create(lookups)
    assert not decision.allowed
    assert decision.result == "error"
    assert decision.message.startswith(what)
    assert decision.message.endswith(f"{failing} exploded")
    assert ", please try again: " in decision.message
    assert lookups.claims == {}


async def test_node_lookup_failure_has_nmo_wording() -> None:
    decision = await create(FakeLookups(failing={"node"}))
    assert decision.message == (
        "could not get node for validating spec.NodeName, please try again: "
        "could not get node: node exploded"
    )


async def test_quorum_node_lookup_failure_has_nmo_wording() -> None:
    class SecondGetFails(FakeLookups):
        calls = 0

        async def get_node(self, name: str) -> Obj | None:
            self.calls += 1
            if self.calls > 1:
                raise LookupFailed("timeout")
            return await super().get_node(name)

    decision = await create(SecondGetFails(nodes={"n1": node("n1")}))
    assert decision.message == (
        "could not get node for master/control-plane quorum validation, please try again: "
        "could not get node: timeout"
    )


async def test_concurrent_claim_is_a_duplicate() -> None:
    lookups = FakeLookups(nodes={"n1": node("n1")})
    first = await validate_create(nm("n1"), lookups, claimant="a")
    second = await validate_create(
        builders.nm("other", "n1", uid="uid-{name}"), lookups, claimant="b"
    )
    assert first.allowed
    assert second.message == DENIED_DUPLICATE


async def test_dry_run_does_not_claim() -> None:
    lookups = FakeLookups(nodes={"n1": node("n1")})
    assert (await create(lookups, dry_run=True)).allowed
    assert lookups.claims == {}


async def test_missing_node_name_is_a_bad_request() -> None:
    decision = await validate_create({"spec": {}}, FakeLookups(), claimant="a")
    assert (decision.allowed, decision.code, decision.result) == (False, 400, "error")


# -- UPDATE ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "allowed"),
    [
        (nm("n1"), nm("n1"), True),
        (nm("n1"), {**nm("n1"), "spec": {"nodeName": "n1", "reason": "new"}}, True),
        (nm("n1"), nm("n2"), False),
        (None, nm("n2"), True),
    ],
)
def test_update(old: Obj | None, new: Obj, allowed: bool) -> None:
    decision = validate_update(old, new)
    assert decision.allowed is allowed
    assert decision.message == ("" if allowed else "updating spec.NodeName isn't allowed")


# -- pure helpers ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({CONTROL_PLANE_ROLE_LABEL: ""}, True),
        ({MASTER_ROLE_LABEL: "true"}, True),
        ({"node-role.kubernetes.io/worker": ""}, False),
        ({}, False),
    ],
)
def test_is_control_plane(labels: dict[str, str], expected: bool) -> None:
    assert is_control_plane({"metadata": {"labels": labels}}) is expected


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        (None, {"a": "1"}, True),
        ({}, {}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {"a": "1"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
    ],
)
def test_selector_matches(
    selector: dict[str, Any] | None, labels: dict[str, str], expected: bool
) -> None:
    assert selector_matches(selector, labels) is expected


def test_etcd_disruption_first_guard_pod_on_the_node_decides() -> None:
    pods = [
        guard("n1", "True"),
        {**guard("n1", "False"), "metadata": {"name": "z", "labels": GUARD}},
    ]
    assert etcd_disruption_allowed([pdb(0)], pods, "n1") is False


def with_selector(expressions: list[Obj]) -> Obj:
    obj = nm("n1")
    obj["spec"]["drain"] = {"podSelector": {"matchExpressions": expressions}}
    return obj


BAD_SELECTORS = [
    pytest.param(
        [{"key": "tier", "operator": "In"}],
        "spec.drain.podSelector.matchExpressions[0]: operator In needs at least one value",
        id="In without values",
    ),
    pytest.param(
        [
            {"key": "a", "operator": "Exists"},
            {"key": "tier", "operator": "DoesNotExist", "values": ["x"]},
        ],
        "spec.drain.podSelector.matchExpressions[1]: operator DoesNotExist takes no values",
        id="DoesNotExist with values",
    ),
]


@pytest.mark.parametrize(("expressions", "message"), BAD_SELECTORS)
async def test_bad_pod_selector_is_refused_on_create_and_update(
    expressions: list[Obj], message: str
) -> None:
    obj = with_selector(expressions)
    created = await validate_create(obj, FakeLookups(nodes={"n1": node("n1")}), claimant="u")
    assert (created.allowed, created.message) == (False, message)
    updated = validate_update(nm("n1"), obj)
    assert (updated.allowed, updated.message) == (False, message)


async def test_good_pod_selector_is_allowed() -> None:
    obj = with_selector(
        [{"key": "tier", "operator": "In", "values": ["web"]}, {"key": "x", "operator": "Exists"}]
    )
    decision = await validate_create(obj, FakeLookups(nodes={"n1": node("n1")}), claimant="u")
    assert decision.allowed


@pytest.mark.parametrize(
    "spec",
    [
        [None],
        "x",
        {"nodeName": "n1", "drain": [1]},
        {"nodeName": "n1", "drain": {"podSelector": 3}},
    ],
)
def test_malformed_specs_never_crash_the_drain_check(spec: object) -> None:
    obj = {"metadata": {"name": "nm"}, "spec": spec}
    assert validate_update(None, obj).allowed


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ({"matchExpressions": {"a": 1}}, "spec.drain.podSelector.matchExpressions must be a list"),
        ({"matchExpressions": [1]}, "spec.drain.podSelector.matchExpressions[0] must be an object"),
    ],
)
def test_malformed_selectors_are_refused_clearly(selector: Obj, message: str) -> None:
    obj = nm("n1")
    obj["spec"]["drain"] = {"podSelector": selector}
    decision = validate_update(nm("n1"), obj)
    assert (decision.allowed, decision.message) == (False, message)


@pytest.mark.parametrize(
    ("timeout", "allowed"), [(0, False), (86401, False), (-1, False), (60, True), (None, True)]
)
async def test_volume_detach_timeout_is_checked_on_create_and_update(
    timeout: int | None, allowed: bool
) -> None:
    obj = nm("n1")
    obj["spec"]["drain"] = {"waitForVolumeDetach": {"enabled": True, "timeoutSeconds": timeout}}
    created = await validate_create(obj, FakeLookups(nodes={"n1": node("n1")}), claimant="u")
    updated = validate_update(nm("n1"), obj)
    assert (created.allowed, updated.allowed) == (allowed, allowed)
    if not allowed:
        assert created.message == updated.message
        assert created.message.startswith(
            "spec.drain.waitForVolumeDetach.timeoutSeconds must be between 1 and 86400 "
            f"seconds (got {timeout}): nmo never waits for volumes without a deadline"
        ), created.message
