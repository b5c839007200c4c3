"""Work queue guarantees: dedupe, one worker per key, delayed adds."""

import asyncio

from nmo.kube.workqueue import WorkQueue


async def test_dedupes_and_orders() -> None:
    q = WorkQueue()
    for key in ["a", "b", "a", "c", "b"]:
        q.add(key)
    assert len(q) == 3
    assert [await q.get() for _ in range(3)] == ["a", "b", "c"]


async def test_key_never_processed_twice_at_once() -> None:
    q = WorkQueue()
    q.add("a")
    assert await q.get() == "a"
    q.add("a")  # while processing: marked dirty, not queued
    assert len(q) == 0
    q.done("a")
    assert len(q) == 1
    assert await q.get() == "a"


async def test_add_after_keeps_earliest() -> None:
    q = WorkQueue()
    q.add_after("a", 1000)
    q.add_after("a", 0.001)
    assert await asyncio.wait_for(q.get(), 5) == "a"


async def test_a_pass_supersedes_the_pending_timer() -> None:
    """A debounce timer set before a pass began does not cause another pass:
    the pass already read what the timer was set for."""
    q = WorkQueue()
    q.add_after("a", 0.05)  # e.g. a pod event, debounced
    q.add("a")  # e.g. the pod is gone: a pass at once
    assert await q.get() == "a"
    assert q.scheduled == 0  # the timer is cancelled: it cannot fire after the pass
    q.done("a")
    assert len(q) == 0
    q.add_after("a", 0.05)  # a timer set after the pass began is kept
    assert await asyncio.wait_for(q.get(), 5) == "a"
    q.done("a")
    await q.shutdown()


async def test_a_timer_set_during_a_pass_is_kept() -> None:
    q = WorkQueue()
    q.add("a")
    assert await q.get() == "a"
    q.add_after("a", 0.01)  # a pod event while the pass runs
    q.done("a")
    assert await asyncio.wait_for(q.get(), 5) == "a"
    await q.shutdown()


async def test_backoff_grows_and_forget_resets() -> None:
    q = WorkQueue(base_delay=1, max_delay=8)
    delays = [q.backoff("k") for _ in range(5)]
    assert delays[0] <= 1 and delays[-1] <= 8 and delays[-1] >= 4
    q.forget("k")
    assert q.failures("k") == 0
    await q.shutdown()


async def test_shutdown_releases_waiters() -> None:
    q = WorkQueue()
    waiter = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    await q.shutdown()
    assert await asyncio.wait_for(waiter, 5) is None
