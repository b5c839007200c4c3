"""ClusterLookups: cache answers, claims that make duplicates impossible, discovery TTL."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import pytest

import builders
from nmo.kube.client import Params
from nmo.kube.errors import NotFound, Transient
from nmo.webhooks.lookups import ClusterLookups, LookupSettings, selector_query
from nmo.webhooks.validators import LookupFailed, validate_create

Obj = dict[str, Any]


class FakeCache:
    def __init__(self, objs: list[Obj] | None = None, *, synced: bool = True) -> None:
        self.store: dict[str, Obj] = {o["metadata"]["name"]: o for o in objs or []}
        self.synced = asyncio.Event()
        if synced:
            self.synced.set()
        self.handlers: list[Any] = []

    def add_handler(self, handler: Any) -> None:
        self.handlers.append(handler)

    def emit(self, event: str, obj: Obj) -> None:
        self.store[obj["metadata"]["name"]] = obj
        for handler in self.handlers:
            handler(event, obj, None)


class FakeKube:
    """Answers GETs from a dict of path -> object (or exception)."""

    def __init__(self, answers: dict[str, Obj | Exception] | None = None) -> None:
        self.answers = answers or {}
        self.calls: list[tuple[str, str, Params | None]] = []

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: Any = None,
        content_type: str = "application/json",
        retry: bool = True,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        self.calls.append((method, path, params))
        answer = self.answers.get(path, NotFound("not found"))
        if isinstance(answer, Exception):
            raise answer
        return answer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


node = partial(builders.node, labels={})
nm = partial(builders.nm, uid="uid-{name}")


def make(
    *,
    nodes: list[Obj] | None = None,
    nms: list[Obj] | None = None,
    kube: FakeKube | None = None,
    clock: Clock | None = None,
    nm_synced: bool = True,
) -> tuple[ClusterLookups, FakeCache, FakeKube]:
    cache = FakeCache(nms, synced=nm_synced)
    kube = kube or FakeKube()
    lookups = ClusterLookups(
        kube,
        nodes=FakeCache(nodes),
        maintenances=cache,
        settings=LookupSettings(
            claim_ttl=30.0, claim_wait=0.05, sync_timeout=0.05, openshift_ttl=60.0
        ),
        clock=clock or Clock(),
    )
    return lookups, cache, kube


async def test_node_from_cache_without_requests() -> None:
    lookups, _, kube = make(nodes=[node("n1")])
    assert await lookups.get_node("n1") == node("n1")
    assert kube.calls == []


async def test_node_missing_from_cache_is_confirmed_with_one_get() -> None:
    kube = FakeKube({"/api/v1/nodes/fresh": node("fresh")})
    lookups, _, _ = make(kube=kube)
    assert await lookups.get_node("fresh") == node("fresh")
    assert await lookups.get_node("gone") is None
    assert [c[:2] for c in kube.calls] == [
        ("GET", "/api/v1/nodes/fresh"),
        ("GET", "/api/v1/nodes/gone"),
    ]


async def test_node_api_error_is_a_lookup_failure() -> None:
    lookups, _, _ = make(kube=FakeKube({"/api/v1/nodes/x": Transient("boom")}))
    with pytest.raises(LookupFailed, match="boom"):
        await lookups.get_node("x")


@pytest.mark.parametrize("deleting", [False, True])
async def test_existing_maintenance_blocks_a_claim(deleting: bool) -> None:
    lookups, _, _ = make(nms=[nm("a", "n1", deleting=deleting)])
    assert await lookups.claim_node("n1", "x") is False
    assert await lookups.claim_node("n2", "x") is True


async def test_unsynced_cache_is_a_lookup_failure() -> None:
    lookups, _, _ = make(nm_synced=False)
    with pytest.raises(LookupFailed, match="not synced"):
        await lookups.claim_node("n1", "x")


async def test_fifty_concurrent_creates_admit_exactly_one() -> None:
    lookups, cache, _ = make(nodes=[node("n1")])
    creates = asyncio.gather(
        *(validate_create(nm(f"m{i}", "n1"), lookups, claimant=f"c{i}") for i in range(50))
    )
    for _ in range(3):  # let the creates reach the claim
        await asyncio.sleep(0)
    (winner,) = lookups.claims.values()
    cache.emit("ADDED", nm(winner.removeprefix("c"), "n1"))  # the apiserver stored it
    decisions = await creates
    assert sum(d.allowed for d in decisions) == 1
    assert decisions[int(winner.removeprefix("c"))].allowed


async def test_claim_released_when_the_informer_sees_the_cr() -> None:
    lookups, cache, _ = make()
    assert await lookups.claim_node("n1", "uid-a")
    cache.emit("ADDED", nm("a", "n1"))
    assert lookups.claims == {}
    # The cache now answers: still a duplicate for everyone else.
    assert await lookups.claim_node("n1", "uid-b") is False


async def test_claim_expires_when_the_create_never_materialises() -> None:
    clock = Clock()
    lookups, _, _ = make(clock=clock)
    assert await lookups.claim_node("n1", "uid-a")
    clock.now += 31
    assert lookups.claims == {}
    assert await lookups.claim_node("n1", "uid-b") is True
    assert lookups.claims == {"n1": "uid-b"}


async def test_a_repeat_never_extends_a_claim() -> None:
    # issue 14 item 2: a forged review re-sent every few seconds held the node
    clock = Clock()
    lookups, _, _ = make(clock=clock)
    assert await lookups.claim_node("n1", "forged")
    for _ in range(4):
        clock.now += 6
        assert await lookups.claim_node("n1", "forged") is True
    assert lookups.claims == {"n1": "forged"}  # 24 s after the first: within the TTL
    clock.now += 6
    assert lookups.claims == {}  # 30 s: over, repeats or not


async def test_an_unconfirmed_claim_only_delays_another_create() -> None:
    lookups, _, _ = make()
    assert await lookups.claim_node("n1", "forged")
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await lookups.claim_node("n1", "real") is True
    assert 0.04 <= loop.time() - started < 1.0  # waited claim_wait (0.05 s) for it
    assert lookups.claims == {"n1": "real"}


async def test_a_waiting_create_is_a_duplicate_once_the_cr_shows() -> None:
    lookups, cache, _ = make()
    assert await lookups.claim_node("n1", "uid-a")
    second = asyncio.create_task(lookups.claim_node("n1", "uid-b"))
    await asyncio.sleep(0)
    cache.emit("ADDED", nm("a", "n1"))
    assert await second is False


async def test_a_waiting_create_goes_ahead_when_the_claim_is_released() -> None:
    lookups, _, _ = make()
    assert await lookups.claim_node("n1", "uid-a")
    second = asyncio.create_task(lookups.claim_node("n1", "uid-b"))
    await asyncio.sleep(0)
    lookups.release_node("n1", "uid-a")  # e.g. denied by the quorum rule
    assert await asyncio.wait_for(second, 0.04) is True


async def test_same_claimant_may_claim_again_and_release() -> None:
    lookups, _, _ = make()
    assert await lookups.claim_node("n1", "a")
    assert await lookups.claim_node("n1", "a")
    lookups.release_node("n1", "b")  # not the holder: ignored
    assert lookups.claims == {"n1": "a"}
    lookups.release_node("n1", "a")
    assert lookups.claims == {}


async def test_openshift_discovery_is_cached_with_a_ttl() -> None:
    clock = Clock()
    kube = FakeKube({"/apis/config.openshift.io/v1": {"kind": "APIResourceList"}})
    lookups, _, _ = make(kube=kube, clock=clock)
    assert await lookups.is_openshift() is True
    assert await lookups.is_openshift() is True
    assert len(kube.calls) == 1
    del kube.answers["/apis/config.openshift.io/v1"]
    clock.now += 61
    assert await lookups.is_openshift() is False
    assert len(kube.calls) == 2


async def test_openshift_discovery_error_keeps_the_last_answer() -> None:
    clock = Clock()
    kube = FakeKube()
    lookups, _, _ = make(kube=kube, clock=clock)
    assert await lookups.is_openshift() is False
    kube.answers["/apis/config.openshift.io/v1"] = Transient("apiserver restarting")
    clock.now += 61
    assert await lookups.is_openshift() is False


async def test_openshift_discovery_error_without_an_answer_fails() -> None:
    kube = FakeKube({"/apis/config.openshift.io/v1": Transient("down")})
    lookups, _, _ = make(kube=kube)
    with pytest.raises(LookupFailed, match="down"):
        await lookups.is_openshift()


async def test_etcd_lookups_query_openshift_etcd_with_the_selector() -> None:
    pdbs = "/apis/policy/v1/namespaces/openshift-etcd/poddisruptionbudgets"
    pods = "/api/v1/namespaces/openshift-etcd/pods"
    kube = FakeKube({pdbs: {"items": [{"metadata": {"name": "p"}}]}, pods: {"items": []}})
    lookups, _, _ = make(kube=kube)
    assert [p["metadata"]["name"] for p in await lookups.list_etcd_pdbs()] == ["p"]
    assert await lookups.list_etcd_pods({"matchLabels": {"app": "guard"}}) == []
    assert kube.calls[-1] == ("GET", pods, {"labelSelector": "app=guard"})


@pytest.mark.parametrize(
    ("selector", "query"),
    [
        (None, ""),
        ({"matchLabels": {"b": "2", "a": "1"}}, "a=1,b=2"),
        (
            {
                "matchExpressions": [
                    {"key": "k", "operator": "In", "values": ["x", "y"]},
                    {"key": "e", "operator": "Exists"},
                    {"key": "d", "operator": "DoesNotExist"},
                    {"key": "n", "operator": "NotIn", "values": ["z"]},
                ]
            },
            "k in (x,y),e,!d,n notin (z)",
        ),
    ],
)
def test_selector_query(selector: Obj | None, query: str) -> None:
    assert selector_query(selector) == query
