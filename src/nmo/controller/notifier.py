"""Maintenance notifications: POST a JSON document to one receiver, in the background.

:mod:`nmo.core.maintenance.notifications` decides what a pass notifies;
the :class:`Notifier` delivers it to ``--notify-url``. What it guarantees:

* :meth:`Notifier.enqueue` is synchronous and O(1): a reconcile pass never
  waits on the receiver, however slow or dead it is.
* One task (:meth:`Notifier.run`, the leader-only runnable ``notifier``)
  delivers the notifications one at a time, in the order they were made.
* The queue is bounded (``queue_size``): beyond it the oldest notification
  is dropped (result ``dropped``, and a warning at most every 10 s).
* A connection error (refused, reset, timed out), a 5xx, a 429 or a 408 is retried
  with :mod:`nmo.kube.backoff` (the answer's ``Retry-After`` is a floor,
  capped like the rest); any other answer but a 2xx fails at once. After
  ``attempts`` attempts, or once the notification would be older than
  ``max_age``, it fails: result ``failed`` and a warning. A receiver's
  failure is never an error of the maintenance.
* Delivery is at least once: an answer lost on its way back is retried, so
  a receiver should treat ``(maintenance, kind, time)`` as the key.
* A hostile or broken receiver cannot hold the leader: one attempt (connect,
  send, the answer's head and body) has one total deadline, ``timeout``, a
  byte trickled now and then included. The answer's body is read no further
  than :data:`MAX_ANSWER_BODY` bytes (nmo needs only the status and
  ``Retry-After``), so at most one network read (64 KiB) of it is ever held.
* The URL is logged and echoed as ``scheme://host[:port]`` only
  (:func:`shown`): Slack and Discord put the secret in the path, others in
  the query or the user info.
* When the task is cancelled (shutdown, leadership lost) it tries each
  notification left once more, for at most ``flush_timeout`` seconds in
  all; what is still left is dropped.

Each notification ends counted once in ``nmo_notifications_total{kind,result}``;
``nmo_notification_retries_total{kind}`` counts the retries.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from nmo import __version__
from nmo.core.maintenance.notifications import Kind, Notification
from nmo.kube import backoff
from nmo.telemetry.metrics import Metrics

log = logging.getLogger("nmo.notify")

USER_AGENT = f"nmo/{__version__}"
RESULTS = ("delivered", "failed", "dropped")
MAX_ANSWER_BODY = 4096  # bytes of an answer's body read at most; the rest is never read
_DROP_WARNING_EVERY = 10.0  # seconds between two warnings about dropped notifications


@dataclass(frozen=True)
class NotifySettings:
    url: str
    timeout: float = 5.0  # seconds, one attempt in all (connect, send, the whole answer)
    attempts: int = 5
    max_age: float = 600.0  # seconds from enqueue after which retrying stops
    queue_size: int = 1000
    backoff_base: float = 1.0
    backoff_cap: float = 60.0
    flush_timeout: float = 5.0  # seconds, on cancellation


def check_url(url: str) -> str | None:
    """Why ``url`` cannot be a receiver (None: it can): http or https, with a host."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        return f"not a valid URL: {exc}"
    if parsed.scheme not in ("http", "https") or not parsed.host:
        return "must be an http:// or https:// URL with a host"
    return None


_ORIGIN = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(?:[^/?#]*@)?([^/?#@]*)")


def shown(url: str) -> str:
    """The URL for logs and messages: ``scheme://host[:port]``, nothing else.

    The path, the query and the user info may each hold the secret (Slack and
    Discord webhooks put it in the path), so none of them is shown; where
    there was more, ``/<redacted>`` says so. Works on an invalid URL too: a
    value that is no ``scheme://...`` at all is shown as ``<redacted>``.
    """
    match = _ORIGIN.match(url.strip())
    if match is None:
        return "<redacted>"
    rest = url.strip()[match.end() :]
    return f"{match.group(1)}://{match.group(2)}" + ("/<redacted>" if rest.strip("/") else "")


def retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds from a Retry-After header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


@dataclass(frozen=True)
class Outcome:
    """One attempt: delivered, or why not and whether it is worth retrying."""

    delivered: bool
    retry: bool = False
    retry_after: float | None = None
    why: str = ""


def answered(status: int, headers: httpx.Headers, now: datetime) -> Outcome:
    """What a receiver's answer means (2xx delivered; 5xx and 429 retried)."""
    if 200 <= status < 300:
        return Outcome(delivered=True)
    why = f"HTTP {status}"
    if status in (408, 429) or status >= 500:
        return Outcome(
            False, retry=True, retry_after=retry_after(headers.get("Retry-After"), now), why=why
        )
    return Outcome(False, why=why)


@dataclass
class _Item:
    notification: Notification
    body: bytes
    queued: float  # clock() when enqueued
    attempts: int = 0


class Notifier:
    def __init__(
        self,
        settings: NotifySettings,
        *,
        metrics: Metrics,
        operator: str,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.operator = operator
        self._transport = transport
        self._clock = clock
        self._sleep = sleep
        self._queue: deque[_Item] = deque()
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._current: _Item | None = None
        self._dropped_warned: float | None = None
        for kind in Kind:
            metrics.notification_retries.labels(kind=kind.value)
            for result in RESULTS:
                metrics.notifications.labels(kind=kind.value, result=result)

    @property
    def pending(self) -> int:
        """Notifications not yet delivered, failed or dropped."""
        return len(self._queue) + (self._current is not None)

    # -- the reconciler's side ---------------------------------------------
    def enqueue(self, notification: Notification) -> None:
        """Queue one notification for delivery; never blocks, never raises."""
        if len(self._queue) >= self.settings.queue_size:
            self._dropped(self._queue.popleft())
        body = json.dumps(notification.document(), separators=(",", ":")).encode()
        self._queue.append(_Item(notification, body, self._clock()))
        self._idle.clear()
        self._ready.set()

    async def join(self) -> None:
        """Wait until every notification queued so far has its outcome."""
        await self._idle.wait()

    # -- the background task -------------------------------------------------
    async def run(self) -> None:
        """Deliver until cancelled, then flush what is left (best effort)."""
        log.info("notifications enabled: POST to %s", shown(self.settings.url))
        async with httpx.AsyncClient(
            timeout=self.settings.timeout,
            headers={"User-Agent": USER_AGENT, "Content-Type": "application/json"},
            transport=self._transport,
        ) as client:
            try:
                while True:
                    while not self._queue:
                        self._idle.set()
                        self._ready.clear()
                        await self._ready.wait()
                    self._current = self._queue.popleft()
                    await self._deliver(client, self._current)
                    self._current = None
            except asyncio.CancelledError:
                await self._flush(client)
                raise

    async def _deliver(self, client: httpx.AsyncClient, item: _Item) -> None:
        s = self.settings
        failures = 0
        while True:
            outcome = await self._attempt(client, item)
            if outcome.delivered:
                self._count(item, "delivered")
                return
            failures += 1
            wait = backoff.delay(
                failures - 1,
                base=s.backoff_base,
                cap=s.backoff_cap,
                retry_after=outcome.retry_after,
            )
            too_old = self._clock() - item.queued + wait > s.max_age
            if not outcome.retry or failures >= s.attempts or too_old:
                self._failed(item, outcome.why)
                return
            self.metrics.notification_retries.labels(kind=item.notification.kind.value).inc()
            log.info(
                "notification %s for maintenance %s: %s, retrying in %.1fs",
                item.notification.kind.value,
                item.notification.maintenance,
                outcome.why,
                wait,
                extra=_ctx(item.notification),
            )
            await self._sleep(wait)

    async def _attempt(self, client: httpx.AsyncClient, item: _Item) -> Outcome:
        item.attempts += 1
        deadline = self.settings.timeout
        outcome: Outcome | None = None
        try:
            # httpx's timeout is per operation: a receiver trickling a byte
            # now and then would hold the attempt for ever without this one.
            async with asyncio.timeout(deadline):
                async with client.stream("POST", self.settings.url, content=item.body) as resp:
                    outcome = answered(resp.status_code, resp.headers, datetime.now(UTC))
                    await _skim(resp)
        except TimeoutError:
            if outcome is not None:  # the body was late, the answer was not: it stands
                return outcome
            return Outcome(False, retry=True, why=f"no answer within {deadline:g}s")
        except httpx.TransportError as exc:  # refused, reset, timed out, TLS...
            return Outcome(False, retry=True, why=f"{type(exc).__name__}: {exc}".rstrip(": "))
        except httpx.HTTPError as exc:  # e.g. too many redirects: not worth retrying
            return Outcome(False, why=f"{type(exc).__name__}: {exc}")
        assert outcome is not None  # the stream was entered, or an exception said why not
        return outcome

    async def _flush(self, client: httpx.AsyncClient) -> None:
        items = ([self._current] if self._current is not None else []) + list(self._queue)
        self._current = None
        self._queue.clear()
        self._idle.set()
        if not items:
            return
        done = 0
        try:
            async with asyncio.timeout(self.settings.flush_timeout):
                for item in items:
                    outcome = await self._attempt(client, item)
                    if outcome.delivered:
                        self._count(item, "delivered")
                    else:
                        self._failed(item, outcome.why)
                    done += 1
        except TimeoutError:
            pass
        for item in items[done:]:
            self._count(item, "dropped")
        if done < len(items):
            log.warning(
                "stopping: %d notification(s) dropped, not delivered within %.1fs",
                len(items) - done,
                self.settings.flush_timeout,
            )

    # -- outcomes ------------------------------------------------------------
    def _count(self, item: _Item, result: str) -> None:
        self.metrics.notifications.labels(kind=item.notification.kind.value, result=result).inc()

    def _failed(self, item: _Item, why: str) -> None:
        self._count(item, "failed")
        n = item.notification
        log.warning(
            "notification %s for maintenance %s not delivered after %d attempt(s): %s",
            n.kind.value,
            n.maintenance,
            item.attempts,
            why,
            extra=_ctx(n),
        )

    def _dropped(self, item: _Item) -> None:
        self._count(item, "dropped")
        now = self._clock()
        if self._dropped_warned is None or now - self._dropped_warned >= _DROP_WARNING_EVERY:
            self._dropped_warned = now
            n = item.notification
            log.warning(
                "notification queue full (%d): dropped the oldest, %s for maintenance %s",
                self.settings.queue_size,
                n.kind.value,
                n.maintenance,
                extra=_ctx(n),
            )


async def _skim(resp: httpx.Response) -> None:
    """Read at most :data:`MAX_ANSWER_BODY` bytes of the answer's body, as sent.

    A short body read to its end leaves the connection reusable; a longer one
    is left unread, and closing the stream closes the connection. Raw bytes:
    decoding a compressed body would let a few bytes grow into many. A body
    cut short changes nothing: the status and headers are the answer.
    """
    if resp.is_stream_consumed:  # read already (a transport that buffers, as in tests)
        return
    read = 0
    try:
        async for chunk in resp.aiter_raw():
            read += len(chunk)
            if read >= MAX_ANSWER_BODY:
                return
    except httpx.TransportError:
        return


def _ctx(n: Notification) -> dict[str, str]:
    return {"maintenance": n.maintenance, "node": n.node, "notification": n.kind.value}
