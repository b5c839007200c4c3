"""UPDATEs the chart's matchConditions keep from the webhook, sent to it anyway.

Before Kubernetes 1.28 the chart renders no matchConditions, so every
NodeMaintenance UPDATE (finalizer removal by ``nmo cleanup`` or the guide's
section 6, labels, annotations) reaches the webhook. nmo must then answer as
if the condition had filtered them out: allow them, at once, without a
single lookup, whatever the object holds (an old ``spec.drain`` that would
no longer pass included). What the conditions do send (a changed nodeName,
a changed drain) keeps its rules.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from test_app import client, count, review

import builders
from nmo.api.constants import WEBHOOK_PATH, Messages
from nmo.server.app import create_webhook_app, decide
from nmo.telemetry.metrics import Metrics
from nmo.webhooks.review import parse_review
from nmo.webhooks.validators import Decision

Obj = dict[str, Any]
# An old CR whose selector today's rules refuse (In without values): created
# while the webhook was down or before the rule existed.
BAD_DRAIN = {"podSelector": {"matchExpressions": [{"key": "tier", "operator": "In"}]}}


class NoLookups:
    """Every lookup is a test failure: these UPDATEs must be decided without one."""

    calls: list[str]

    def __init__(self) -> None:
        self.calls = []

    def _refuse(self, what: str) -> Any:
        self.calls.append(what)
        raise AssertionError(f"UPDATE decided with a lookup: {what}")

    def for_requester(self, requester: str) -> NoLookups:
        return self  # not a lookup: who would pay for them

    async def get_node(self, name: str) -> Any:
        return self._refuse("get_node")

    async def claim_node(self, node_name: str, claimant: str, *, dry_run: bool = False) -> bool:
        return bool(self._refuse("claim_node"))

    def release_node(self, node_name: str, claimant: str) -> None:
        self._refuse("release_node")

    async def is_openshift(self) -> bool:
        return bool(self._refuse("is_openshift"))

    async def list_etcd_pdbs(self) -> Any:
        return self._refuse("list_etcd_pdbs")

    async def list_etcd_pods(self, selector: Any) -> Any:
        return self._refuse("list_etcd_pods")

    async def node_budgets(self, node_name: str) -> Any:
        return self._refuse("node_budgets")

    async def may_delete_pods(self) -> bool | None:
        return bool(self._refuse("may_delete_pods"))


def live(*, drain: Obj | None = None, pending: int = 3) -> Obj:
    """A NodeMaintenance as the apiserver holds it, with our finalizer and a status."""
    pods = [f"web-{i:04d}-7d9f8b6c5d-x2x7q" for i in range(pending)]
    return builders.nm(
        "nm",
        "n1",
        uid="uid-{name}",
        typed=True,
        finalizers=["foregroundDeleteNodeMaintenance"],
        resource_version="41",
        drain=drain,
        status={
            "phase": "Running",
            "pendingPods": pods,
            "pendingPodsRefs": [{"namespace": "shop", "name": p} for p in pods],
            "totalpods": pending,
            "evictionPods": pending,
        },
    )


def changed(old: Obj, change: str) -> Obj:
    new = copy.deepcopy(old)
    meta = new["metadata"]
    if change == "finalizer removed on deletion":
        meta["deletionTimestamp"] = "2026-05-01T12:00:00Z"
        meta["finalizers"] = []
    elif change == "finalizer added":
        meta["finalizers"] = ["foregroundDeleteNodeMaintenance", "example.com/hold"]
    elif change == "label":
        meta["labels"] = {"team": "infra"}
    elif change == "prior-state annotation":
        meta["annotations"] = {"nodemaintenance.medik8s.io/prior-node-state": "{}"}
    elif change == "owner reference":
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u"}]
    elif change == "reason":
        new["spec"]["reason"] = "new reason"
    elif change == "drain removed":
        new["spec"].pop("drain", None)
    else:
        raise AssertionError(change)
    return new


EXCLUDED = [
    "finalizer removed on deletion",
    "finalizer added",
    "label",
    "prior-state annotation",
    "owner reference",
    "reason",
    "drain removed",
]


def update_review(old: Obj, new: Obj) -> Obj:
    return review("UPDATE", obj=new, old=old)


def decide_without_suspending(body: Obj) -> Decision:
    """Run :func:`decide` one step: it must finish without awaiting anything (no I/O)."""
    request = parse_review(json.dumps(body).encode()).request
    coro = decide(request, NoLookups())
    with pytest.raises(StopIteration) as done:
        coro.send(None)
    decision = done.value.value
    assert isinstance(decision, Decision)
    return decision


@pytest.mark.parametrize("drain", [None, BAD_DRAIN], ids=["no drain", "old invalid drain"])
@pytest.mark.parametrize("change", EXCLUDED)
async def test_updates_the_conditions_exclude_are_allowed_without_lookups(
    change: str, drain: Obj | None
) -> None:
    old = live(drain=drain)
    body = update_review(old, changed(old, change))
    assert decide_without_suspending(body).allowed
    lookups = NoLookups()
    metrics = Metrics()
    async with client(create_webhook_app(lookups=lookups, metrics=metrics)) as http:
        resp = await http.post(WEBHOOK_PATH, json=body)
    assert resp.status_code == 200
    assert resp.json()["response"]["allowed"] is True, resp.json()
    assert lookups.calls == []
    assert count(metrics, "UPDATE", "allowed") == 1


@pytest.mark.parametrize(
    ("new_spec", "message"),
    [
        ({"nodeName": "n2"}, Messages.WEBHOOK_NODENAME_CHANGED),
        (
            {"nodeName": "n1", "drain": BAD_DRAIN},
            "spec.drain.podSelector.matchExpressions[0]: operator In needs at least one value",
        ),
    ],
    ids=["node name changed", "drain changed to an invalid one"],
)
def test_what_the_conditions_send_keeps_its_rules(new_spec: Obj, message: str) -> None:
    old = live()
    new = copy.deepcopy(old)
    new["spec"] = new_spec
    decision = decide_without_suspending(update_review(old, new))
    assert (decision.allowed, decision.message) == (False, message)


def test_an_invalid_drain_changed_again_is_still_refused() -> None:
    old = live(drain=BAD_DRAIN)
    new = copy.deepcopy(old)
    new["spec"]["drain"]["podSelector"]["matchExpressions"][0]["key"] = "app"
    decision = decide_without_suspending(update_review(old, new))
    assert decision.allowed is False
