"""A work queue of reconcile keys (the semantics of client-go's workqueue).

Guarantees:
- a key is queued at most once however often it is added (deduplication);
- a key is never handed to two workers at once: adding a key that is being
  processed marks it dirty, and it is queued again when ``done`` is called;
- ``add_after`` delays a key without holding any worker (one timer per key,
  the earliest wins); a pass that starts supersedes the key's pending timer
  (the pass reads everything the timer was set for and asks for its own
  requeue), so a drain that finished is not looked at again by a stale
  debounce or retry timer;
- ``backoff`` gives per-key capped exponential delays, ``forget`` resets them.

Once :meth:`instrument` is called, the queue serves client-go's ``workqueue_*``
series with client-go's meaning: ``adds`` counts a key becoming due for a
pass (not a deduplicated add), ``depth`` is the keys due and not yet handed
out (those waiting for their own pass to finish included), the durations run
from the first add to ``get`` and from ``get`` to ``done``, and ``retries``
counts the requeues of a reconcile's result (``backoff`` and ``add_after``
with ``retry=True``), not the delays nmo adds to debounce pod events.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from nmo.kube import backoff
from nmo.telemetry.metrics import CONTROLLER, Metrics, QueueInstruments


class WorkQueue:
    def __init__(
        self,
        *,
        base_delay: float = 0.5,
        max_delay: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ready: asyncio.Queue[str | None] = asyncio.Queue()
        self._queued: set[str] = set()
        self._processing: set[str] = set()
        self._dirty: set[str] = set()
        self._timers: dict[str, tuple[float, asyncio.TimerHandle]] = {}
        self._failures: dict[str, int] = {}
        self._shutdown = False
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._clock = clock
        self._metrics: QueueInstruments | None = None
        self._added: dict[str, float] = {}  # key -> when it became due
        self._started: dict[str, float] = {}  # key -> when its pass began

    def instrument(self, metrics: Metrics, name: str = CONTROLLER) -> None:
        """Serve this queue's ``workqueue_*`` series under ``name``."""
        self._metrics = metrics.workqueue(
            name,
            depth=lambda: float(len(self._queued) + len(self._dirty)),
            unfinished=lambda: sum(self._ages(), 0.0),
            longest=lambda: max(self._ages(), default=0.0),
        )

    def _ages(self) -> list[float]:
        now = self._clock()
        return [now - started for started in self._started.values()]

    def _due(self, key: str) -> None:
        if self._metrics is not None:
            self._metrics.adds.inc()
            self._added.setdefault(key, self._clock())

    def __len__(self) -> int:
        return len(self._queued)

    @property
    def scheduled(self) -> int:
        """Keys with a pending ``add_after`` timer."""
        return len(self._timers)

    @property
    def processing(self) -> int:
        return len(self._processing)

    def add(self, key: str) -> None:
        if self._shutdown:
            return
        if key in self._processing:
            if key not in self._dirty:
                self._due(key)
                self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._due(key)
        self._push(key)

    def _push(self, key: str) -> None:
        self._queued.add(key)
        self._ready.put_nowait(key)

    def add_after(self, key: str, delay: float, *, retry: bool = False) -> None:
        """Add ``key`` after ``delay`` s; ``retry``: a reconcile's requeue (counted)."""
        if self._shutdown:
            return
        if retry and self._metrics is not None:
            self._metrics.retries.inc()
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        existing = self._timers.get(key)
        if existing is not None:
            if existing[0] <= when:
                return
            existing[1].cancel()
        handle = loop.call_at(when, self._fire, key)
        self._timers[key] = (when, handle)

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def backoff(self, key: str) -> float:
        """Requeue with per-key exponential backoff; returns the delay used."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = backoff.delay(failures, base=self.base_delay, cap=self.max_delay)
        self.add_after(key, delay, retry=True)
        return delay

    def forget(self, key: str) -> None:
        self._failures.pop(key, None)

    def failures(self, key: str) -> int:
        return self._failures.get(key, 0)

    async def get(self) -> str | None:
        """The next key (marked as processing), or None after shutdown."""
        while True:
            key = await self._ready.get()
            if key is None or self._shutdown:
                self._ready.put_nowait(None)  # wake the next worker too
                return None
            if key not in self._queued:
                continue
            self._queued.discard(key)
            self._processing.add(key)
            pending = self._timers.pop(key, None)
            if pending is not None:
                pending[1].cancel()  # this pass supersedes it
            if self._metrics is not None:
                now = self._clock()
                self._started[key] = now
                added = self._added.pop(key, None)
                if added is not None:
                    self._metrics.latency.observe(now - added)
            return key

    def done(self, key: str) -> None:
        self._processing.discard(key)
        started = self._started.pop(key, None)
        if started is not None and self._metrics is not None:
            self._metrics.work_duration.observe(self._clock() - started)
        if key in self._dirty:
            self._dirty.discard(key)
            if not self._shutdown:
                self._push(key)

    async def shutdown(self) -> None:
        self._shutdown = True
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self._ready.put_nowait(None)
