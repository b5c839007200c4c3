"""Untrusted callers cannot spend the operator's API budget (issue 14, item 7):
repeated bad input is answered from negative caches, and what gets through
is bounded in flight and in rate, failing fast instead of queueing.

Nor can they spend a proven caller's (issue 20): each peer address has its
own share; a metrics caller let in before, and an address whose review
became a NodeMaintenance (the apiserver), spend a budget of their own, which
no amount of random tokens or forged reviews reaches."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import httpx
import pytest
from test_intake import review
from test_lookups import Clock, FakeCache, FakeKube, make
from webhook_fakes import FakeLookups, node

from nmo.api.constants import WEBHOOK_PATH
from nmo.kube.allowance import BudgetedKube, Forgetful, Shares, TokenBucket
from nmo.kube.errors import TooManyRequests
from nmo.server.app import create_webhook_app
from nmo.server.metricsauth import TOKEN_REVIEWS, UNPROVEN, AuthRejected, MetricsAuth
from nmo.telemetry.metrics import Metrics
from nmo.webhooks.lookups import PROVEN as PROVEN_LOOKUPS
from nmo.webhooks.lookups import UNPROVEN as UNPROVEN_LOOKUPS
from nmo.webhooks.lookups import ClusterLookups, LookupSettings
from nmo.webhooks.validators import LookupFailed


class Reviews:
    """TokenReviews and SubjectAccessReviews: the tokens in USERS are their
    users', and only ``prometheus`` may get /metrics; counts the reviews."""

    USERS = {
        "prometheus": "system:serviceaccount:monitoring:prometheus",
        "prometheus-rotated": "system:serviceaccount:monitoring:prometheus",
        "grafana": "system:serviceaccount:monitoring:grafana",
        "stranger": "system:serviceaccount:default:default",
    }
    READERS = {
        "system:serviceaccount:monitoring:prometheus",
        "system:serviceaccount:monitoring:grafana",
    }

    def __init__(self) -> None:
        self.calls = 0

    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        self.calls += 1
        spec = kw["body"]["spec"]
        if path == TOKEN_REVIEWS:
            name = self.USERS.get(spec["token"])
            if name is None:
                return {"status": {"authenticated": False, "error": "invalid bearer token"}}
            return {"status": {"authenticated": True, "user": {"username": name}}}
        return {"status": {"allowed": spec["user"] in self.READERS}}


async def scrapes(auth: MetricsAuth, tokens: list[str], *, source: str) -> list[int]:
    """The HTTP status of a scrape with each token, from ``source``."""
    codes = []
    for token in tokens:
        try:
            await auth.check(f"Bearer {token}", path="/metrics", method="GET", source=source)
            codes.append(200)
        except AuthRejected as exc:
            codes.append(exc.status_code)
    return codes


class TokenReviews:
    """Rejects every token; counts the reviews."""

    def __init__(self) -> None:
        self.calls = 0

    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        self.calls += 1
        return {"status": {"authenticated": False, "error": "invalid bearer token"}}


async def test_a_rejected_token_costs_one_token_review() -> None:
    kube = TokenReviews()
    auth = MetricsAuth(kube)
    for _ in range(100):
        with pytest.raises(AuthRejected) as refused:
            await auth.check("Bearer forged", path="/metrics", method="GET")
        assert refused.value.status_code == 401
    assert kube.calls == 1


async def test_random_tokens_from_one_address_spend_only_its_share() -> None:
    clock = Clock()
    kube = Reviews()
    auth = MetricsAuth(kube, clock=clock)
    codes = await scrapes(auth, [f"forged-{i}" for i in range(50)], source="10.0.0.66")
    assert kube.calls == UNPROVEN.share_burst
    assert Counter(codes) == {401: UNPROVEN.share_burst, 429: 50 - UNPROVEN.share_burst}
    # A first scrape from another address has its own share, and is let in.
    assert await scrapes(auth, ["prometheus"], source="10.0.0.7") == [200]
    clock.now += 1  # a share grows back at its own rate
    assert await scrapes(auth, ["forged-x", "forged-y"], source="10.0.0.66") == [401, 429]


async def test_a_proven_scraper_keeps_its_budget_while_random_tokens_drain_the_rest() -> None:
    clock = Clock()
    kube = Reviews()
    auth = MetricsAuth(kube, clock=clock)
    assert await scrapes(auth, ["prometheus"], source="10.0.0.7") == [200]
    # Random tokens from twenty addresses: the unproven budget is spent.
    for i in range(20):
        await scrapes(auth, [f"forged-{i}-{j}" for j in range(10)], source=f"10.0.1.{i}")
    assert auth.unproven.kube.refused > 0  # type: ignore[attr-defined]
    assert await scrapes(auth, ["grafana"], source="10.0.0.8") == [429]  # new and unproven
    before = kube.calls
    # The proven scraper, its token rotated (a new token from its address) ...
    assert await scrapes(auth, ["prometheus-rotated"], source="10.0.0.7") == [200]
    # ... or its token's cache entry expired, even from a new address.
    clock.now += 61
    assert await scrapes(auth, ["prometheus"], source="10.0.0.9") == [200]
    # A TokenReview each; one SubjectAccessReview (the rotated token's user was allowed a
    # moment before, cached).
    assert kube.calls - before == 3
    assert auth.proven.refused == 0


async def test_an_authenticated_caller_without_the_role_spends_its_own_share() -> None:
    kube = Reviews()
    auth = MetricsAuth(kube)
    codes = await scrapes(auth, ["stranger"] * 20, source="10.0.0.66")
    # Cached: one TokenReview; never allowed: a SubjectAccessReview each, within the share.
    assert kube.calls == UNPROVEN.share_burst
    assert set(codes) == {403, 429}
    assert await scrapes(auth, ["prometheus"], source="10.0.0.7") == [200]


def test_shares_are_per_key_and_bounded() -> None:
    clock = Clock()
    shares = Shares(TokenReviews(), rate=1.0, burst=2, max_keys=2, clock=clock)
    assert [shares.take("a") for _ in range(3)] == [True, True, False]
    assert shares.take("b") and shares.take("b") and not shares.take("b")
    assert shares.refused == 2
    shares.take("c")  # "a" is forgotten: it would start full again
    assert shares.take("a") and shares.take("a")
    clock.now += 1
    assert shares.take("b")


async def test_a_share_refuses_with_429_before_the_pool_is_asked() -> None:
    kube = TokenReviews()
    shares = Shares(BudgetedKube(kube, rate=100, burst=100), rate=1.0, burst=1)
    await shares.for_key("x").request("POST", "/x")
    with pytest.raises(TooManyRequests, match="for this caller"):
        await shares.for_key("x").request("POST", "/x")
    await shares.for_key("y").request("POST", "/x")
    assert kube.calls == 2


# -- webhook lookups: charged to the review's sender --------------------------------------


def lookups_for(kube: FakeKube, clock: Clock) -> tuple[ClusterLookups, FakeCache]:
    cache = FakeCache()
    lookups = ClusterLookups(
        kube,
        nodes=FakeCache([{"metadata": {"name": "n1"}}]),
        maintenances=cache,
        settings=LookupSettings(budgets_ttl=0),
        clock=clock,
    )
    return lookups, cache


async def test_an_address_whose_review_became_a_cr_keeps_its_lookups_under_forgeries() -> None:
    clock = Clock()
    kube = FakeKube({"/api/v1/pods": {"items": []}})
    lookups, cache = lookups_for(kube, clock)
    apiserver = lookups.for_requester("10.0.0.1")
    assert await apiserver.claim_node("n1", "uid-real") is True
    forger = lookups.for_requester("10.0.0.66")
    assert await forger.claim_node("n2", "uid-real") is True  # the same uid, second: no proof
    cache.emit("ADDED", {"metadata": {"name": "real", "uid": "uid-real"}, "spec": {}})
    # Forged reviews from many addresses spend the unproven budget ...
    failed = 0
    for i in range(40):
        for _ in range(UNPROVEN_LOOKUPS.share_burst):
            try:
                await lookups.for_requester(f"10.0.1.{i}").node_budgets("n1")
            except LookupFailed:
                failed += 1
    assert failed > 0
    with pytest.raises(LookupFailed, match="too many"):
        await lookups.for_requester("10.0.0.66").node_budgets("n1")  # unproven
    # ... never the proven address's.
    for _ in range(PROVEN_LOOKUPS.share_burst):
        assert await lookups.for_requester("10.0.0.1").node_budgets("n1") == ([], [])


async def test_dry_runs_and_denials_prove_nothing() -> None:
    clock = Clock()
    lookups, cache = lookups_for(FakeKube({"/api/v1/pods": {"items": []}}), clock)
    sender = lookups.for_requester("10.0.0.5")
    assert await sender.claim_node("n1", "uid-dry", dry_run=True) is True
    cache.emit("ADDED", {"metadata": {"name": "x", "uid": "uid-dry"}, "spec": {}})
    for _ in range(UNPROVEN_LOOKUPS.share_burst):
        await sender.node_budgets("n1")
    with pytest.raises(LookupFailed, match="too many"):
        await sender.node_budgets("n1")


async def test_a_uid_copied_from_an_existing_cr_proves_nothing() -> None:
    clock = Clock()
    lookups, cache = lookups_for(FakeKube({"/api/v1/pods": {"items": []}}), clock)
    existing = {"metadata": {"name": "old", "uid": "uid-old"}, "spec": {"nodeName": "n9"}}
    cache.emit("ADDED", existing)
    forger = lookups.for_requester("10.0.0.66")
    assert await forger.claim_node("n1", "uid-old") is True
    for handler in cache.handlers:  # the CR changes: its status, a label
        handler("MODIFIED", existing, existing)
    for _ in range(UNPROVEN_LOOKUPS.share_burst):
        await forger.node_budgets("n1")
    with pytest.raises(LookupFailed, match="too many"):
        await forger.node_budgets("n1")


async def test_the_webhook_app_charges_each_review_to_its_peer_address() -> None:
    lookups = FakeLookups(nodes={"n1": node("n1")})
    app = create_webhook_app(lookups=lookups, metrics=Metrics())
    transport = httpx.ASGITransport(app=app, client=("10.0.0.9", 4321))
    async with httpx.AsyncClient(transport=transport, base_url="https://wh.test") as http:
        resp = await http.post(WEBHOOK_PATH, content=json.dumps(review()).encode())
    assert resp.json()["response"]["allowed"] is True
    assert lookups.requesters == ["10.0.0.9"]


async def test_a_missing_node_costs_one_get_per_ttl() -> None:
    clock = Clock()
    lookups, _, kube = make(clock=clock)
    for _ in range(100):
        assert await lookups.get_node("made-up") is None
    assert len(kube.calls) == 1
    clock.now += 6
    assert await lookups.get_node("made-up") is None
    assert len(kube.calls) == 2


async def test_budgeted_kube_refuses_beyond_its_in_flight_bound_at_once() -> None:
    gate = asyncio.Event()

    class Slow:
        async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
            await gate.wait()
            return {}

    kube = BudgetedKube(Slow(), max_in_flight=2)
    first = [asyncio.create_task(kube.request("GET", "/api/v1/nodes/x")) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(TooManyRequests):
        await kube.request("GET", "/api/v1/nodes/y")
    gate.set()
    assert await asyncio.gather(*first) == [{}, {}]
    assert await kube.request("GET", "/api/v1/nodes/y") == {}


def test_token_bucket_and_forgetful_set() -> None:
    clock = Clock()
    bucket = TokenBucket(2.0, 3, clock=clock)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    clock.now += 0.5
    assert bucket.take() and not bucket.take()
    seen = Forgetful(10.0, max_entries=2, clock=clock)
    for key in ("a", "b", "c"):
        seen.add(key)
    assert "a" not in seen and "b" in seen and "c" in seen  # oldest left when full
    clock.now += 10
    assert "b" not in seen
