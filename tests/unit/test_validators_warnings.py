"""Admission warnings: a PDB allowing no disruption warns on CREATE, never refuses it."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import httpx
import pytest
import respx
from test_lookups import Clock, FakeCache, FakeKube
from webhook_fakes import FakeLookups, node

import builders
from nmo.api.constants import WEBHOOK_PATH
from nmo.kube.client import Kube, parse_warning
from nmo.kube.errors import Forbidden
from nmo.server.app import create_webhook_app
from nmo.telemetry.metrics import Metrics
from nmo.webhooks.lookups import MAX_PDB_NAMESPACES, ClusterLookups, LookupSettings
from nmo.webhooks.review import review_response
from nmo.webhooks.validators import (
    POD_DELETION_WARNING,
    Decision,
    LookupFailed,
    validate_create,
)

Obj = dict[str, Any]
WEB = {"app": "web"}
WARNING = (
    "PodDisruptionBudget shop/web-pdb allows no disruption now (needs 2 healthy, has 2): "
    "the drain of n1 will wait for it"
)


pod = partial(builders.pod, namespace="shop", labels=WEB, node="n1", phase="Running", ready=True)
pdb = partial(builders.pdb, "web-pdb", namespace="shop", match_labels=WEB, desired=2, current=2)
cr = partial(builders.nm, "nm", "n1", uid="u1")


def cluster(pods: list[Obj], pdbs: list[Obj], **kw: Any) -> FakeLookups:
    return FakeLookups(nodes={"n1": node("n1")}, node_pods=pods, node_pdbs=pdbs, **kw)


@pytest.mark.parametrize("dry_run", [False, True])
async def test_blocking_budget_warns_and_allows(dry_run: bool) -> None:
    lookups = cluster([pod("web-1"), pod("web-2")], [pdb(allowed=0)])
    decision = await validate_create(cr(), lookups, claimant="u1", dry_run=dry_run)
    assert decision.allowed
    assert decision.warnings == (WARNING,)


async def test_a_pods_own_skip_rule_is_not_honoured_by_default() -> None:
    """As the operator with default flags (the Go NMO's behaviour), the webhook
    counts a pod labelled drain=skip among those the drain evicts."""
    labelled = pod("web-1", labels={**WEB, "nodemaintenance.medik8s.io/drain": "skip"})
    decision = await validate_create(cr(), cluster([labelled], [pdb(allowed=0)]), claimant="u1")
    assert decision.allowed and len(decision.warnings) == 1
    assert "shop/web-pdb allows no disruption" in decision.warnings[0]


@pytest.mark.parametrize(
    ("pods", "pdbs", "drain"),
    [
        pytest.param([pod("web-1")], [pdb(allowed=1)], None, id="a disruption is allowed"),
        pytest.param([], [pdb(allowed=0)], None, id="no pods"),
        pytest.param([pod("web-1")], [], None, id="no budget"),
        pytest.param(
            [pod("web-1")],
            [pdb(allowed=0)],
            {"podSelector": {"matchLabels": {"app": "db"}}},
            id="pod outside the CR's podSelector",
        ),
        pytest.param(
            [pod("agent", owner="DaemonSet/a")],
            [pdb(allowed=0)],
            None,
            id="DaemonSet pod",
        ),
    ],
)
async def test_no_warning(pods: list[Obj], pdbs: list[Obj], drain: Obj | None) -> None:
    decision = await validate_create(cr(drain=drain), cluster(pods, pdbs), claimant="u1")
    assert decision == Decision.allow()


async def test_lookup_failure_allows_without_warning_and_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("WARNING", logger="nmo.webhooks")
    lookups = cluster([pod("web-1")], [pdb(allowed=0)], failing={"budgets"})
    decision = await validate_create(cr(), lookups, claimant="u1")
    assert decision == Decision.allow()
    assert lookups.claims == {"n1": "u1"}  # the claim stands: the CREATE goes ahead
    assert any("budgets exploded" in r.getMessage() for r in caplog.records)


async def test_denied_create_does_not_look_at_budgets() -> None:
    class Counting(FakeLookups):
        budget_calls = 0

        async def node_budgets(self, node_name: str) -> Any:
            self.budget_calls += 1
            return await super().node_budgets(node_name)

    lookups = Counting(existing={"n1"}, nodes={"n1": node("n1")})
    decision = await validate_create(cr(), lookups, claimant="u1")
    assert not decision.allowed
    assert lookups.budget_calls == 0


def test_review_carries_warnings_only_when_there_are_some() -> None:
    answer = review_response("uid-1", Decision.allow([WARNING]))
    assert answer["response"] == {
        "uid": "uid-1",
        "allowed": True,
        "status": {"code": 200},
        "warnings": [WARNING],
    }
    assert "warnings" not in review_response("uid-1", Decision.allow())["response"]


async def test_webhook_app_answers_with_warnings() -> None:
    lookups = cluster([pod("web-1")], [pdb(allowed=0)])
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "r1", "operation": "CREATE", "object": cr()},
    }
    app = create_webhook_app(lookups=lookups, metrics=Metrics())
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as http:
        resp = await http.post(WEBHOOK_PATH, json=review)
    assert resp.json()["response"]["allowed"] is True
    assert resp.json()["response"]["warnings"] == [WARNING]


# -- ClusterLookups.node_budgets: targeted, recent, bounded ---------------------------------


class ListingKube(FakeKube):
    """FakeKube whose pod LIST filters by the fieldSelector it is given."""

    def __init__(self, answers: dict[str, Any], *, hang: bool = False) -> None:
        super().__init__(answers)
        self.hang = hang

    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        if self.hang:
            await asyncio.Event().wait()
        return await super().request(method, path, **kw)


def lookups_with(kube: FakeKube, **settings: Any) -> ClusterLookups:
    return ClusterLookups(
        kube,
        nodes=FakeCache([node("n1")]),
        maintenances=FakeCache(),
        settings=LookupSettings(**settings),
    )


async def test_node_budgets_lists_the_node_pods_then_their_namespaces_pdbs() -> None:
    kube = ListingKube(
        {
            "/api/v1/pods": {"items": [pod("web-1"), pod("x", namespace="other")]},
            "/apis/policy/v1/namespaces/shop/poddisruptionbudgets": {"items": [pdb(allowed=0)]},
            "/apis/policy/v1/namespaces/other/poddisruptionbudgets": {"items": []},
        }
    )
    pods, pdbs = await lookups_with(kube).node_budgets("n1")
    assert [p["metadata"]["name"] for p in pods] == ["web-1", "x"]
    assert pdbs == [pdb(allowed=0)]
    assert kube.calls[0] == ("GET", "/api/v1/pods", {"fieldSelector": "spec.nodeName=n1"})
    assert sorted(c[1] for c in kube.calls[1:]) == [
        "/apis/policy/v1/namespaces/other/poddisruptionbudgets",
        "/apis/policy/v1/namespaces/shop/poddisruptionbudgets",
    ]


async def test_node_budgets_uses_one_cluster_list_for_many_namespaces() -> None:
    namespaces = [f"ns{i}" for i in range(MAX_PDB_NAMESPACES + 1)]
    kube = ListingKube(
        {
            "/api/v1/pods": {"items": [pod("p", namespace=ns) for ns in namespaces]},
            "/apis/policy/v1/poddisruptionbudgets": {
                "items": [pdb(allowed=0, namespace="ns0"), pdb(allowed=0, namespace="unrelated")]
            },
        }
    )
    _, pdbs = await lookups_with(kube).node_budgets("n1")
    assert [b["metadata"]["namespace"] for b in pdbs] == ["ns0"]
    assert len(kube.calls) == 2


async def test_node_budgets_are_read_once_per_ttl_for_a_node() -> None:
    clock = Clock()
    kube = ListingKube(
        {
            "/api/v1/pods": {"items": [pod("web-1")]},
            "/apis/policy/v1/namespaces/shop/poddisruptionbudgets": {"items": [pdb(allowed=0)]},
        }
    )
    lookups = ClusterLookups(
        kube,
        nodes=FakeCache([node("n1"), node("n2")]),
        maintenances=FakeCache(),
        settings=LookupSettings(budgets_ttl=5.0),
        clock=clock,
    )
    for _ in range(100):  # forged CREATEs for one node
        assert await lookups.node_budgets("n1") == ([pod("web-1")], [pdb(allowed=0)])
    assert len(kube.calls) == 2  # the pods, their namespace's PDBs
    await lookups.node_budgets("n2")  # another node is read for itself
    assert len(kube.calls) == 4
    clock.now += 5
    await lookups.node_budgets("n1")
    await settled()
    assert len(kube.calls) == 6


async def settled() -> None:
    """Let reads started in the background finish (the fakes answer at once)."""
    for _ in range(10):
        await asyncio.sleep(0)


class GatedKube(ListingKube):
    """ListingKube whose answers wait for ``gate``; pods are ``pods[0]`` at the time."""

    def __init__(self, pods: list[Obj]) -> None:
        super().__init__({})
        self.gate = asyncio.Event()
        self.pods = pods

    @property
    def pod_lists(self) -> int:
        return sum(1 for call in self.calls if call[1] == "/api/v1/pods")

    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        self.calls.append((method, path, kw.get("params")))
        await self.gate.wait()
        if path == "/api/v1/pods":
            return {"items": list(self.pods)}
        return {"items": []}


def gated(
    pods: list[Obj], clock: Clock, *, budget_timeout: float = 2.0
) -> tuple[ClusterLookups, GatedKube]:
    kube = GatedKube(pods)
    settings = LookupSettings(budgets_ttl=5.0, budget_timeout=budget_timeout)
    lookups = ClusterLookups(
        kube,
        nodes=FakeCache([node("n1")]),
        maintenances=FakeCache(),
        settings=settings,
        clock=clock,
    )
    return lookups, kube


async def test_reviews_that_need_a_read_under_way_wait_for_that_one() -> None:
    lookups, kube = gated([pod("web-1")], Clock())
    waiting = [asyncio.create_task(lookups.node_budgets("n1")) for _ in range(10)]
    await settled()
    assert kube.pod_lists == 1  # one read for the ten
    kube.gate.set()
    assert await asyncio.gather(*waiting) == [([pod("web-1")], [])] * 10


async def test_past_the_ttl_the_last_answer_is_served_while_the_next_read_runs() -> None:
    clock = Clock()
    lookups, kube = gated([pod("web-1")], clock)
    kube.gate.set()
    assert await lookups.node_budgets("n1") == ([pod("web-1")], [])
    kube.gate.clear()
    kube.pods = [pod("web-2")]
    clock.now += 5
    # No review waits: each takes the last answer, and one read is under way.
    for _ in range(10):
        assert await lookups.node_budgets("n1") == ([pod("web-1")], [])
    await settled()
    assert kube.pod_lists == 2
    kube.gate.set()
    await settled()
    assert await lookups.node_budgets("n1") == ([pod("web-2")], [])
    assert kube.pod_lists == 2


async def test_the_last_answer_is_served_no_longer_than_ttl_plus_the_read_timeout() -> None:
    clock = Clock()
    lookups, kube = gated([pod("web-1")], clock, budget_timeout=0.05)
    kube.gate.set()
    await lookups.node_budgets("n1")
    kube.gate.clear()  # the API server stops answering
    clock.now += 5
    assert await lookups.node_budgets("n1") == ([pod("web-1")], [])  # starts a read
    clock.now += 0.05  # ttl + budget_timeout: the last answer is gone
    with pytest.raises(LookupFailed, match=r"not read within 0\.05s"):
        await asyncio.wait_for(lookups.node_budgets("n1"), 5)  # waits for that read
    assert kube.pod_lists == 2


async def test_node_budgets_is_bounded_in_time() -> None:
    lookups = lookups_with(ListingKube({}, hang=True), budget_timeout=0.05)
    with pytest.raises(LookupFailed, match=r"not read within 0\.05s"):
        await lookups.node_budgets("n1")


async def test_node_budgets_api_error_is_a_lookup_failure() -> None:
    kube = ListingKube({"/api/v1/pods": Forbidden("pods is forbidden")})
    with pytest.raises(LookupFailed, match="forbidden"):
        await lookups_with(kube).node_budgets("n1")


# -- the boundary hands API warnings to whoever listens ------------------------------------


@pytest.mark.parametrize(
    ("header", "text"),
    [
        (
            '299 - "PodDisruptionBudget a/b allows no disruption"',
            "PodDisruptionBudget a/b allows no disruption",
        ),
        ('299 - "say \\"hi\\""', 'say "hi"'),
        ("not a warn-code", "not a warn-code"),
    ],
)
def test_parse_warning(header: str, text: str) -> None:
    assert parse_warning(header) == text


async def test_warning_headers_reach_on_warning(api_server: respx.MockRouter, kube: Kube) -> None:
    api_server.post("/apis/x/v1/things").respond(
        201,
        json={"metadata": {"name": "t"}},
        headers=[("Warning", '299 - "first"'), ("Warning", '299 - "second"')],
    )
    seen: list[str] = []
    kube.on_warning = seen.append
    await kube.create("/apis/x/v1/things", {"metadata": {"name": "t"}})
    assert seen == ["first", "second"]


# -- onTimeout Delete that nmo may not perform --------------------------------------------


def update_review(old: Obj, new: Obj) -> dict[str, Any]:
    request = {"uid": "r2", "operation": "UPDATE", "object": new, "oldObject": old}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


@pytest.mark.parametrize(
    ("drain", "may", "warned"),
    [
        ({"timeoutSeconds": 60, "onTimeout": "Delete"}, False, True),
        ({"timeoutSeconds": 60, "onTimeout": "Delete"}, True, False),
        ({"timeoutSeconds": 60, "onTimeout": "Delete"}, None, False),  # unknown: no warning
        ({"timeoutSeconds": 60, "onTimeout": "Abort"}, False, False),
        (None, False, False),
    ],
    ids=["refused", "allowed", "unknown", "abort", "no-drain"],
)
async def test_create_asking_for_delete_warns_when_nmo_may_not(
    drain: Obj | None, may: bool | None, warned: bool
) -> None:
    lookups = cluster([], [], pod_deletion=may)
    decision = await validate_create(cr(drain=drain), lookups, claimant="u1")
    assert decision.allowed
    assert (POD_DELETION_WARNING in decision.warnings) is warned
    assert lookups.deletion_checks == (1 if drain and drain["onTimeout"] == "Delete" else 0)
    assert "drain.allowPodDeletion=true" in POD_DELETION_WARNING


async def test_the_deletion_check_failing_never_refuses() -> None:
    lookups = cluster([], [], failing={"access"})
    decision = await validate_create(cr(drain={"onTimeout": "Delete"}), lookups, claimant="u1")
    assert decision.allowed and decision.warnings == ()


@pytest.mark.parametrize(
    ("old", "new", "checks", "warned"),
    [
        ({"onTimeout": "Report"}, {"onTimeout": "Delete"}, 1, True),
        (None, {"onTimeout": "Delete", "timeoutSeconds": 5}, 1, True),
        ({"onTimeout": "Delete"}, {"onTimeout": "Delete", "timeoutSeconds": 5}, 0, False),
        ({"onTimeout": "Delete"}, {"onTimeout": "Report"}, 0, False),
    ],
    ids=["turned-to-delete", "drain-added", "already-delete", "turned-away"],
)
async def test_update_turning_to_delete_warns(
    old: Obj | None, new: Obj, checks: int, warned: bool
) -> None:
    lookups = cluster([], [], pod_deletion=False)
    app = create_webhook_app(lookups=lookups, metrics=Metrics())
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as http:
        resp = await http.post(WEBHOOK_PATH, json=update_review(cr(drain=old), cr(drain=new)))
    answer = resp.json()["response"]
    assert answer["allowed"] is True
    assert (answer.get("warnings") == [POD_DELETION_WARNING]) is warned
    assert lookups.deletion_checks == checks


async def test_cluster_lookups_ask_once_per_ttl() -> None:
    review = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
    kube = ListingKube({review: {"status": {"allowed": False}}})
    lookups = lookups_with(kube, access_ttl=60.0)
    assert [await lookups.may_delete_pods() for _ in range(3)] == [False, False, False]
    assert [c[:2] for c in kube.calls] == [("POST", review)]
