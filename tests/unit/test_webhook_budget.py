"""Untrusted callers cannot spend the operator's API budget (issue 14, item 7):
repeated bad input is answered from negative caches, and what gets through
is bounded in flight and in rate, failing fast instead of queueing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_webhook_lookups import Clock, make

from nmo.core.errors import TooManyRequests
from nmo.webhooks.budget import BudgetedKube, Forgetful, TokenBucket
from nmo.webhooks.metrics_auth import AuthRejected, MetricsAuth


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


async def test_many_distinct_tokens_are_rate_limited_with_429() -> None:
    clock = Clock()
    kube = TokenReviews()
    auth = MetricsAuth(BudgetedKube(kube, rate=5.0, burst=10, clock=clock), clock=clock)
    codes = []
    for i in range(50):
        try:
            await auth.check(f"Bearer forged-{i}", path="/metrics", method="GET")
        except AuthRejected as exc:
            codes.append(exc.status_code)
    assert kube.calls == 10
    assert codes.count(401) == 10
    assert codes.count(429) == 40
    clock.now += 1  # five more a second
    with pytest.raises(AuthRejected, match="Unauthorized"):
        await auth.check("Bearer later", path="/metrics", method="GET")


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
