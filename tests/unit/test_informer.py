"""The list-then-watch loop against a scripted apiserver (respx).

Covers what a real apiserver does only on bad days: a watch that ends, a
410 Gone (as an ERROR event), a dropped stream, a 500, an apiserver that is
down for a while (backoff grows and is capped; time is faked).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import respx

from nmo.kube import informer
from nmo.kube.client import Kube
from nmo.kube.informer import Informer

PATH = "/api/v1/nodes"


def node(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv, "managedFields": [{"big": "x"}]}}


def events(*items: tuple[str, dict[str, Any]]) -> bytes:
    return "".join(json.dumps({"type": t, "object": o}) + "\n" for t, o in items).encode()


class Script:
    """Answers LISTs and WATCHes from queues and records the watch params."""

    def __init__(self, lists: list[httpx.Response], watches: list[Any]) -> None:
        self.lists = lists
        self.watches = watches
        self.watch_params: list[dict[str, str]] = []
        self.done = asyncio.Event()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        if params.get("watch") == "true":
            self.watch_params.append(params)
            if not self.watches:
                self.done.set()
                return httpx.Response(200, content=b"")
            nxt = self.watches.pop(0)
            if isinstance(nxt, Exception):
                raise nxt
            return nxt
        return self.lists.pop(0)


@pytest.fixture
def no_wait(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Fake the watch loop's backoff sleeps; returns the delays it asked for."""
    delays: list[float] = []
    real_sleep = asyncio.sleep

    async def fake_sleep(delay: float) -> None:
        delays.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(informer.asyncio, "sleep", fake_sleep)
    return delays


async def run_until(informer: Informer, done: asyncio.Event) -> None:
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(done.wait(), 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_list_watch_resume_and_relist(
    api_server: respx.MockRouter, kube: Kube, no_wait: list[float]
) -> None:
    seen: list[tuple[str, str]] = []
    script = Script(
        lists=[
            httpx.Response(
                200, json={"metadata": {"resourceVersion": "10"}, "items": [node("a", "5")]}
            ),
            httpx.Response(
                200, json={"metadata": {"resourceVersion": "30"}, "items": [node("b", "25")]}
            ),
        ],
        watches=[
            # a clean end after events and a bookmark: resume from the last RV
            httpx.Response(
                200, content=events(("ADDED", node("b", "11")), ("BOOKMARK", node("", "15")))
            ),
            # a dropped connection: back off, resume from the same RV
            httpx.RemoteProtocolError("peer closed connection"),
            # 410 as an ERROR event: re-list
            httpx.Response(200, content=events(("ERROR", {"code": 410, "message": "too old"}))),
            # a 500: back off, resume
            httpx.Response(500, json={"message": "etcdserver: leader changed"}),
        ],
    )
    api_server.get(PATH).mock(side_effect=script)
    informer = Informer(kube, PATH, name="nodes")
    informer.add_handler(lambda e, o, _old: seen.append((e, o["metadata"]["name"])))
    await run_until(informer, script.done)

    rvs = [p.get("resourceVersion") for p in script.watch_params]
    assert rvs[:4] == ["10", "15", "15", "30"], rvs
    assert all(p["allowWatchBookmarks"] == "true" for p in script.watch_params)
    assert all(int(p["timeoutSeconds"]) > 0 for p in script.watch_params)
    assert informer.lists == 2
    assert set(informer.store) == {"b"}
    assert ("DELETED", "a") in seen  # the re-list noticed a deletion it had missed
    assert "managedFields" not in informer.store["b"]["metadata"]
    assert informer.synced.is_set()
    assert len(no_wait) >= 2  # the dropped stream and the 500 were backed off


async def test_an_apiserver_that_is_down_gets_capped_jittered_backoff(
    api_server: respx.MockRouter, kube: Kube, no_wait: list[float]
) -> None:
    enough = asyncio.Event()

    def informer_delays() -> list[float]:
        return [d for d in no_wait if d > 0.05]  # the boundary's own retries are shorter

    def down(request: httpx.Request) -> httpx.Response:
        if len(informer_delays()) >= 12:
            enough.set()
        raise httpx.ConnectError("connection refused")

    api_server.get(PATH).mock(side_effect=down)
    informer = Informer(kube, PATH, name="nodes", max_backoff=30)
    await run_until(informer, enough)
    delays = informer_delays()[:12]
    assert delays[0] <= 1.0
    assert max(delays) <= 30
    assert delays[-1] >= 15, "backoff does not grow"
    assert len(set(delays)) == len(delays), "backoff is not jittered"
    assert not informer.synced.is_set()


async def test_watches_that_end_at_once_do_not_hot_loop(
    api_server: respx.MockRouter, kube: Kube, no_wait: list[float]
) -> None:
    enough = asyncio.Event()

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("watch") != "true":
            return httpx.Response(200, json={"metadata": {"resourceVersion": "1"}, "items": []})
        if len(no_wait) >= 5:
            enough.set()
        return httpx.Response(200, content=b"")  # closed at once, nothing in it

    api_server.get(PATH).mock(side_effect=answer)
    informer = Informer(kube, PATH, name="nodes")
    await run_until(informer, enough)
    assert len(no_wait) >= 5
    assert no_wait[4] > no_wait[0]


async def test_the_transform_applies_to_lists_and_events_and_sync_is_announced_once(
    api_server: respx.MockRouter, kube: Kube, no_wait: list[float]
) -> None:
    script = Script(
        lists=[
            httpx.Response(
                200,
                json={
                    "metadata": {"resourceVersion": "10", "continue": "more"},
                    "items": [node("a", "5")],
                },
            ),
            httpx.Response(
                200, json={"metadata": {"resourceVersion": "10"}, "items": [node("b", "6")]}
            ),
            httpx.Response(200, json={"metadata": {"resourceVersion": "30"}, "items": []}),
        ],
        watches=[
            httpx.Response(200, content=events(("ADDED", node("c", "11")))),
            httpx.Response(200, content=events(("ERROR", {"code": 410, "message": "too old"}))),
        ],
    )
    route = api_server.get(PATH).mock(side_effect=script)
    synced: list[int] = []
    informer = Informer(
        kube,
        PATH,
        name="nodes",
        params={"fieldSelector": "spec.nodeName=n1"},
        transform=lambda o: {"metadata": {"name": o["metadata"]["name"], "slim": True}},
        page_size=1,
        on_synced=lambda: synced.append(len(informer.store)),
    )
    await run_until(informer, script.done)
    pages = [dict(c.request.url.params) for c in route.calls if "watch" not in c.request.url.params]
    assert [p.get("limit") for p in pages] == ["1", "1", "1"]
    assert all(p.get("fieldSelector") == "spec.nodeName=n1" for p in pages)
    assert synced == [2], "announced once, after the first complete LIST"
    assert informer.store == {}, "the re-list after 410 removed everything"
    assert informer.lists == 2


async def test_stored_objects_are_the_transformed_ones(
    api_server: respx.MockRouter, kube: Kube, no_wait: list[float]
) -> None:
    script = Script(
        lists=[
            httpx.Response(
                200, json={"metadata": {"resourceVersion": "1"}, "items": [node("a", "1")]}
            )
        ],
        watches=[httpx.Response(200, content=events(("ADDED", node("b", "2"))))],
    )
    api_server.get(PATH).mock(side_effect=script)
    informer = Informer(
        kube, PATH, name="nodes", transform=lambda o: {"metadata": {"name": o["metadata"]["name"]}}
    )
    await run_until(informer, script.done)
    assert informer.store == {"a": {"metadata": {"name": "a"}}, "b": {"metadata": {"name": "b"}}}


async def test_an_event_older_than_a_write_through_does_not_regress_the_store(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    informer = Informer(kube, PATH, name="nodes")
    informer.store["a"] = node("a", "20")  # our own write, seen before the watch
    seen: list[str] = []
    informer.add_handler(lambda e, o, _old: seen.append(o["metadata"]["resourceVersion"]))
    informer._apply("MODIFIED", node("a", "19"))
    assert informer.store["a"]["metadata"]["resourceVersion"] == "20" and seen == []
    informer._apply("MODIFIED", node("a", "21"))
    assert informer.store["a"]["metadata"]["resourceVersion"] == "21" and seen == ["21"]


async def test_a_big_list_is_read_in_small_pages_and_its_garbage_released(
    api_server: respx.MockRouter,
    kube: Kube,
    no_wait: list[float],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pages of 100 by default; after a LIST of COMPACT_AFTER objects or more
    (not a smaller one) the garbage is released once, before ``synced``."""
    released: list[int] = []
    count = informer.COMPACT_AFTER

    def page(start: int, stop: int, cont: str | None, rv: str = "40") -> httpx.Response:
        meta = {"resourceVersion": rv} | ({"continue": cont} if cont else {})
        items = [node(f"n{i}", "5") for i in range(start, stop)]
        return httpx.Response(200, json={"metadata": meta, "items": items})

    per = informer.PAGE_SIZE
    lists = [page(i, min(i + per, count), str(i + per) if i + per < count else None)
             for i in range(0, count, per)]  # fmt: skip
    script = Script(
        lists=[*lists, page(0, 10, None, rv="50")],
        watches=[httpx.Response(200, content=events(("ERROR", {"code": 410, "message": "old"})))],
    )
    route = api_server.get(PATH).mock(side_effect=script)
    cache = Informer(kube, PATH, name="nodes", on_synced=lambda: released.append(-1))
    monkeypatch.setattr(informer, "release_garbage", lambda: released.append(len(cache.store)))
    await run_until(cache, script.done)
    pages = [dict(c.request.url.params) for c in route.calls if "watch" not in c.request.url.params]
    assert {p.get("limit") for p in pages} == {str(per)}
    assert len(pages) == len(lists) + 1
    assert released == [count, -1], (
        "once after the big LIST, before synced; not after the small one"
    )
    assert len(cache.store) == 10


def test_release_garbage_trims_the_c_heap_where_it_can() -> None:
    informer.release_garbage()  # glibc: malloc_trim; elsewhere a collection only
    trim = informer._malloc_trim()
    assert trim is None or trim(0) in (0, 1)
