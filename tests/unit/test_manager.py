"""The manager's phases and its stop in reverse (issue 21 item 3).

The manager is the subject; the controller, its caches, the elector and the
HTTP servers are fakes that write what happens to them into one journal, so
each test reads the order of the process's start and stop from it. No step
waits on a clock: every phase ends on an event the test sets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

from nmo.controller.manager import Group, Manager, Runnable

Work = Callable[[], Coroutine[Any, Any, None]]


class Journal(list[str]):
    """What happened, in order; :meth:`until` waits for an entry, never on a clock."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()

    def append(self, entry: str) -> None:
        super().append(entry)
        self.changed.set()

    async def until(self, check: Callable[[], bool]) -> None:
        async with asyncio.timeout(10):
            while not check():
                self.changed.clear()
                await self.changed.wait()

    async def forever(self, name: str) -> None:
        self.append(f"start {name}")
        try:
            await asyncio.Event().wait()
        finally:
            self.append(f"stop {name}")


class FakeServer:
    def __init__(self, journal: Journal, *, fails: BaseException | None = None) -> None:
        self.journal = journal
        self.fails = fails
        self.ended = asyncio.Event()  # set: the server stops on its own

    async def start(self) -> None:
        if self.fails is not None:
            raise self.fails
        self.journal.append("servers listening")

    async def wait(self) -> None:
        await self.ended.wait()
        raise RuntimeError("webhook server stopped unexpectedly")

    def drain(self) -> None:
        self.journal.append("servers draining")

    async def stop(self) -> None:
        self.journal.append("servers stopped")


class FakeElector:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.elected = asyncio.Event()

    async def run(self, lead: Work) -> None:
        await self.elected.wait()
        self.journal.append("elected")
        await lead()

    async def release(self) -> None:
        self.journal.append("lease released")


class FakeController:
    def __init__(self, journal: Journal, *, election: bool = False, caches: int = 2) -> None:
        self.journal = journal
        self.synced = [asyncio.Event() for _ in range(caches)]
        self.elector: FakeElector | None = FakeElector(journal) if election else None
        self.crash: BaseException | None = None  # raised by the first cache once it runs

    async def _cache(self, i: int) -> None:
        if i == 0 and self.crash is not None:
            raise self.crash
        await self.journal.forever(f"cache-{i}")

    def runnables(self) -> list[Runnable]:
        def cache(i: int) -> Runnable:
            return Runnable(f"cache-{i}", lambda: self._cache(i), Group.CACHES, self.synced[i])

        def leader(name: str) -> Runnable:
            return Runnable(name, lambda: self.journal.forever(name), Group.LEADER)

        return [*(cache(i) for i in range(len(self.synced))), leader("worker"), leader("resync")]

    def caches_synced(self) -> None:
        self.journal.append("caches synced")

    @contextlib.asynccontextmanager
    async def leadership(self) -> AsyncIterator[None]:
        self.journal.append("leading")
        try:
            yield
        finally:
            self.journal.append("not leading")

    async def quiesce(self) -> None:
        self.journal.append("quiesced")

    def forget(self) -> None:
        self.journal.append("forgotten")


def build(
    *, election: bool = False, delay: float = 0.0, server: bool = True
) -> tuple[Journal, FakeController, FakeServer, Manager]:
    journal = Journal()
    controller = FakeController(journal, election=election)
    fake = FakeServer(journal)
    manager = Manager(controller, shutdown_delay=delay, signals=())
    if server:
        manager.add_server("servers", fake)
    return journal, controller, fake, manager


async def test_servers_listen_then_caches_sync_then_the_leader_group_runs() -> None:
    journal, controller, _, manager = build()
    running = asyncio.create_task(manager.run())
    await journal.until(lambda: "start cache-1" in journal)
    assert journal == ["servers listening", "start cache-0", "start cache-1"]
    controller.synced[1].set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert "caches synced" not in journal, "the leader group began before every cache synced"
    controller.synced[0].set()
    await journal.until(lambda: "start resync" in journal)
    assert journal[3:] == ["caches synced", "leading", "start worker", "start resync"]
    manager.stop()
    assert await running == 0


async def test_a_stop_runs_in_reverse_leader_group_first_servers_last() -> None:
    journal, controller, _, manager = build(election=True)
    for event in controller.synced:
        event.set()
    running = asyncio.create_task(manager.run())
    assert controller.elector is not None
    controller.elector.elected.set()
    await journal.until(lambda: "start resync" in journal)
    del journal[:]
    manager.stop()
    assert await running == 0
    assert journal[:2] == ["servers draining", "quiesced"]
    leader_stopped = journal.index("not leading")
    assert {"stop worker", "stop resync"} == set(journal[2:leader_stopped])
    assert journal[leader_stopped + 1 :] == [
        "forgotten",
        "lease released",
        "stop cache-0",
        "stop cache-1",
        "servers stopped",
    ]


async def test_a_stop_before_the_caches_synced_never_leads() -> None:
    journal, _, _, manager = build(election=True)
    running = asyncio.create_task(manager.run())
    await journal.until(lambda: "start cache-1" in journal)
    manager.stop()
    assert await running == 0
    assert "caches synced" not in journal and "leading" not in journal
    assert journal[-4:] == ["lease released", "stop cache-0", "stop cache-1", "servers stopped"]


async def test_the_shutdown_delay_keeps_the_caches_and_servers_until_a_second_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="nmo.manager")
    journal, controller, _, manager = build(delay=3600)
    for event in controller.synced:
        event.set()
    running = asyncio.create_task(manager.run())
    await journal.until(lambda: "start resync" in journal)
    manager.stop()
    await journal.until(lambda: "lease released" in journal or "forgotten" in journal)
    for _ in range(5):
        await asyncio.sleep(0)
    assert not running.done(), "the delay was not kept"
    assert "stop cache-0" not in journal and "servers stopped" not in journal
    manager.stop()  # a second signal ends the delay
    assert await running == 0
    assert journal[-3:] == ["stop cache-0", "stop cache-1", "servers stopped"]
    said = [r.getMessage() for r in caplog.records]
    assert "nmo shutting down" in said
    assert any(m.startswith("still answering for 3600s (--shutdown-delay-seconds)") for m in said)


async def test_a_crashed_cache_ends_the_process_with_1_and_skips_the_delay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal, controller, _, manager = build(delay=3600)
    controller.crash = RuntimeError("boom")
    assert await asyncio.wait_for(manager.run(), 10) == 1
    assert "task cache-0 failed: RuntimeError('boom')" in [r.getMessage() for r in caplog.records]
    assert journal[-2:] == ["stop cache-1", "servers stopped"]
    assert "leading" not in journal


async def test_a_server_that_cannot_listen_ends_the_start_before_any_cache(
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal = Journal()
    controller = FakeController(journal)
    manager = Manager(controller, signals=())
    manager.add_server("servers", FakeServer(journal, fails=OSError(98, "address in use")))
    assert await asyncio.wait_for(manager.run(), 10) == 1
    assert "task servers failed: OSError(98, 'address in use')" in [
        r.getMessage() for r in caplog.records
    ]
    assert journal == ["servers draining", "quiesced", "forgotten"]


async def test_a_server_that_stops_on_its_own_ends_the_process(
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal, controller, server, manager = build(delay=3600)
    for event in controller.synced:
        event.set()
    running = asyncio.create_task(manager.run())
    await journal.until(lambda: "start resync" in journal)
    del journal[:]
    server.ended.set()
    assert await asyncio.wait_for(running, 10) == 1  # at once: no delay after a failure
    assert "task servers failed: RuntimeError('webhook server stopped unexpectedly')" in [
        r.getMessage() for r in caplog.records
    ]
    assert journal[:3] == ["servers stopped", "servers draining", "quiesced"]
    assert journal[-3:] == ["forgotten", "stop cache-0", "stop cache-1"]


async def test_the_logger_is_the_callers(caplog: pytest.LogCaptureFixture) -> None:
    """``nmo run`` logs its stop under ``nmo.cli``, as it always has."""
    journal = Journal()
    manager = Manager(FakeController(journal), logger=logging.getLogger("nmo.cli"), signals=())
    caplog.set_level(logging.INFO, logger="nmo.cli")
    running = asyncio.create_task(manager.run())
    await journal.until(lambda: "start cache-1" in journal)
    manager.stop()
    assert await running == 0
    assert [(r.name, r.getMessage()) for r in caplog.records] == [("nmo.cli", "nmo shutting down")]


async def test_a_signal_stops_it() -> None:
    journal = Journal()
    manager = Manager(FakeController(journal), signals=(signal.SIGUSR1,))
    running = asyncio.create_task(manager.run())
    await journal.until(lambda: "start cache-1" in journal)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert await asyncio.wait_for(running, 10) == 0
    finally:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR1)
