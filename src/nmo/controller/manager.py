"""The process's runnables, in groups started in phases and stopped in reverse.

Why this module exists: ``nmo run`` is one asyncio process that serves HTTP,
keeps caches and, on the leader only, reconciles. What starts when, and what
stops first, is decided here once, as controller-runtime's manager does
(``pkg/manager/runnable_group.go`` and ``internal.go``), with every task
named and guarded as in kopf's ``_core/reactor/running.py``. The CLI builds
everything first (handlers are registered before anything runs) and hands
it over: the controller (:class:`Controller`, nmo's
:class:`~nmo.controller.engine.Engine`) and the HTTP servers
(:class:`Server`, added by the CLI like controller-runtime's ``mgr.Add``:
the controller room never imports the server room).

Start, phase by phase; a phase begins when the one before it is done, never
after a turn of the event loop:

1. the servers (webhook, probes, metrics) listen: ``/healthz`` answers
   during a long first LIST, and a port that is taken fails the start;
2. the caches every replica keeps (:attr:`Group.CACHES`; the webhook answers
   from them) run until each has listed once;
3. the leader group (:attr:`Group.LEADER`: the reconcile workers, the
   resync, the PDB watch, the notifier) runs once this replica is elected
   (at once without leader election), inside the controller's
   :meth:`Controller.leadership`.

Stop, on the first SIGTERM or SIGINT or when a task ends on its own, in
reverse. The servers begin to *drain* at once (they keep answering, readiness
fails, each connection closes after its response). The leader group stops
first (the controller takes no more work, then the leader lease is
released, so a standby leads at once). On a clean stop the servers go on
draining, with the caches behind them, until the shutdown delay has passed
since the stop began or a second signal ends it; then the caches stop, and
the servers last. Whatever ended on its own is logged, and the exit code is
1 if anything raised, else 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import signal
from collections.abc import Callable, Coroutine, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger("nmo.manager")

Work = Callable[[], Coroutine[Any, Any, None]]


class Group(enum.Enum):
    """Where a runnable runs: on every replica (a cache), or only on the leader."""

    CACHES = "caches"
    LEADER = "leader"


@dataclass(frozen=True)
class Runnable:
    """A named background task and its group; a cache says when it has listed."""

    name: str
    run: Work
    group: Group
    synced: asyncio.Event | None = None  # a cache's: set once its first LIST is in


class Server(Protocol):
    """HTTP servers the manager starts first and stops last
    (:class:`nmo.server.servers.Servers`)."""

    async def start(self) -> None:
        """Listen; raise when it cannot (a port taken)."""

    async def wait(self) -> None:
        """Return never; raise when a server ends on its own."""

    def drain(self) -> None:
        """Keep answering, but fail readiness and close each connection after its response."""

    async def stop(self) -> None:
        """Stop accepting, let the requests in flight finish, then close."""


class Elector(Protocol):
    """Leader election (:class:`nmo.controller.leader.LeaderElector`)."""

    async def run(self, lead: Work) -> None:
        """Wait for leadership, then run ``lead`` while renewing; raise on loss."""

    async def release(self) -> None:
        """Give the lease up, so that a standby takes over at once."""


class Controller(Protocol):
    """What the manager runs of a controller (:class:`nmo.controller.engine.Engine`)."""

    @property
    def elector(self) -> Elector | None:
        """None: no leader election, this process leads."""

    def runnables(self) -> Iterable[Runnable]:
        """Every cache and leader-only runnable."""

    def caches_synced(self) -> None:
        """Called once every cache has listed, on every replica."""

    def leadership(self) -> AbstractAsyncContextManager[None]:
        """Entered once elected, around the leader group; its exit undoes it."""

    async def quiesce(self) -> None:
        """At shutdown, before the leader group is cancelled: hand out no more work."""

    def forget(self) -> None:
        """At shutdown, once the leader group ended: stop what leading left running."""


class Manager:
    """Starts the servers, the caches and the leader group in phases; stops them in reverse."""

    def __init__(
        self,
        controller: Controller,
        *,
        shutdown_delay: float = 0.0,
        logger: logging.Logger = log,
        signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
    ) -> None:
        self.controller = controller
        self.shutdown_delay = shutdown_delay
        self.log = logger
        self.signals = tuple(signals)
        self.runnables = list(controller.runnables())
        self.servers: list[tuple[str, Server]] = []
        self._starter: asyncio.Task[None] | None = None
        self._server_tasks: list[asyncio.Task[None]] = []
        self._cache_tasks: list[asyncio.Task[None]] = []
        self._leader: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()  # a stop was asked for, or a task ended on its own
        self._hurry = asyncio.Event()  # a second stop: the shutdown delay ends
        self._stop_asked = False
        self._stopping = False

    def add_server(self, name: str, server: Server) -> None:
        """Run ``server`` as the task ``name``, started before the caches."""
        self.servers.append((name, server))

    def stop(self) -> None:
        """Begin the stop (the signal handler); a second call ends the shutdown delay."""
        if self._stop_asked:
            self._hurry.set()
        self._stop_asked = True
        self._wake.set()

    async def run(self) -> int:
        """Run until stopped or until a task ends on its own; the exit code."""
        loop = asyncio.get_running_loop()
        for sig in self.signals:  # kept until the loop closes: a late signal never kills
            loop.add_signal_handler(sig, self.stop)
        self._starter = self._spawn("startup", self._start())
        await self._wake.wait()
        code = self._outcome()
        await self._shutdown(code)
        return code

    # -- start ---------------------------------------------------------------
    def _spawn(self, name: str, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work, name=name)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        if self._stopping or task.cancelled():
            return
        if task is self._starter and task.exception() is None:
            return  # every phase has begun
        self._wake.set()

    async def _start(self) -> None:
        for name, server in self.servers:
            listening = asyncio.Event()
            self._server_tasks.append(self._spawn(name, self._serve(server, listening)))
            await listening.wait()
        caches = [r for r in self.runnables if r.group is Group.CACHES]
        for runnable in caches:
            self._cache_tasks.append(self._spawn(runnable.name, runnable.run()))
        for runnable in caches:
            if runnable.synced is not None:
                await runnable.synced.wait()
        self.controller.caches_synced()
        elector = self.controller.elector
        if elector is not None:
            self._leader = self._spawn("leader-election", elector.run(self._lead))
        else:
            self._leader = self._spawn("leader-work", self._lead())

    @staticmethod
    async def _serve(server: Server, listening: asyncio.Event) -> None:
        await server.start()
        listening.set()
        try:
            await server.wait()
        finally:
            await server.stop()

    async def _lead(self) -> None:
        async with self.controller.leadership(), asyncio.TaskGroup() as group:
            for runnable in self.runnables:
                if runnable.group is Group.LEADER:
                    group.create_task(runnable.run(), name=runnable.name)

    # -- stop ----------------------------------------------------------------
    def _tasks(self) -> list[asyncio.Task[None]]:
        leader = [] if self._leader is None else [self._leader]
        starter = [] if self._starter is None else [self._starter]
        return [*starter, *self._server_tasks, *self._cache_tasks, *leader]

    def _outcome(self) -> int:
        code = 0
        for task in self._tasks():
            if task.done() and not task.cancelled() and task.exception() is not None:
                self.log.error("task %s failed: %r", task.get_name(), task.exception())
                code = 1
        return code

    async def _shutdown(self, code: int) -> None:
        self._stopping = True
        self.log.info("nmo shutting down")
        for _name, server in self.servers:
            server.drain()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.shutdown_delay
        await _cancel(self._starter)  # no phase begins any more
        await self._stop_leading()  # the lease is released at once: a standby leads
        serving = [t for t in self._server_tasks if not t.done()]
        if code == 0 and self.shutdown_delay > 0 and serving:
            self.log.info(
                "still answering for %gs (--shutdown-delay-seconds) while the Service drops "
                "this pod; readiness fails and each connection closes after its response",
                self.shutdown_delay,
            )
            hurried = asyncio.create_task(self._hurry.wait(), name="second-signal")
            await asyncio.wait(
                [*serving, hurried],
                timeout=max(deadline - loop.time(), 0.0),
                return_when=asyncio.FIRST_COMPLETED,
            )
            hurried.cancel()
        await _cancel(*self._cache_tasks)
        await _cancel(*self._server_tasks)

    async def _stop_leading(self) -> None:
        await self.controller.quiesce()
        if self._leader is not None and not self._leader.done():
            self._leader.cancel()  # no renewal can take the lease back after release
            await asyncio.gather(self._leader, return_exceptions=True)
        self.controller.forget()
        elector = self.controller.elector
        if elector is not None:
            with contextlib.suppress(Exception):
                await elector.release()


async def _cancel(*tasks: asyncio.Task[None] | None) -> None:
    """Cancel ``tasks`` and wait until each has ended."""
    running = [t for t in tasks if t is not None]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
