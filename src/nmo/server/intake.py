"""Reading an admission request off the wire, with bounds.

Why this module exists: the webhook port is reachable by anything in the
cluster network, not only the kube-apiserver, so what arrives there can be
any bytes at all. Before a body is parsed it must be the kind of body the
apiserver sends (``Content-Type: application/json``) and of a size the
apiserver can send for a NodeMaintenance (:data:`MAX_BODY_BYTES`), read
within a deadline and at a minimum rate, with a bounded number of big
uploads at once (:class:`Uploads`): a 3 MiB body costs about half a second of
CPU to parse, and there is only one event loop (issue 14, item 3); and a body
sent a byte a second must not hold anything for long (issue 20).

Guarantees of :func:`read_review_body`:

* a body not complete within ``body_seconds`` is 408, connection closed; so
  is one that, ``grace`` seconds after the app began reading it, has arrived
  slower than ``min_rate`` bytes a second on average (a byte-a-second upload
  is cut after about ``grace``; the apiserver sends a review's few KiB at
  once), unless the bytes are there, held by the server for a late turn of
  the event loop (:data:`BUFFERED`);
* the first ``Uploads.free_bytes`` of a body need no slot (a real review is
  a few KiB, and uvicorn buffers that much for any connection anyway); past
  them, at most ``Uploads.limit`` bodies are being read at once, and a
  request that finds no free slot within ``Uploads.wait`` seconds is 429
  (Retry-After 1); waiting for a slot does not count against the body's
  pace;
* a ``Content-Type`` other than JSON is :class:`Unacceptable` with 415 and
  the body is never read (a missing one is taken to mean JSON);
* a declared ``Content-Length`` over the limit is 413 without the app reading
  a byte of the body; a chunked body is kept up to the limit and no further,
  so at most ``limit`` bytes are ever held in memory;
* when the rest of an oversized body is small enough to be discarded
  (``drain_limit``, by uvicorn for a declared length, here for a chunked
  one), the connection stays usable and the client reads the 413 calmly;
  otherwise the answer closes the connection instead of reading on.

A body the server already holds whole (the apiserver sends a review's few
KiB at once) and that needs no upload slot is taken in one receive, without
a deadline, a pace or a slot: nothing is left to wait for (the ``complete``
hint of :data:`BUFFERED`). The bounds above still decide its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Final

from starlette.requests import ClientDisconnect, Request

# What a NodeMaintenance review can weigh: the spec is a few hundred bytes,
# but metadata may hold up to 256 KiB of annotations (the apiserver's
# TotalAnnotationSizeLimitB) and an UPDATE carries the object twice (object
# and oldObject), plus managedFields and the review's own fields: 2 x 256 KiB
# and room to spare. Anything larger cannot come from the apiserver.
MAX_BODY_BYTES: Final = 768 * 1024
# How much of an oversized body the server may still swallow (and discard)
# so that a keep-alive client sees the 413 instead of a reset.
DRAIN_BYTES: Final = 8 * 1024 * 1024
BODY_SECONDS: Final = 10.0  # the apiserver's default webhook timeout
# After the grace, a body must keep up this rate on average (bytes a second),
# or it is cut with 408: a few KiB a second, which any real link exceeds by
# orders of magnitude, while a trickle of a byte a second holds nothing for
# longer than the grace.
MIN_BODY_RATE: Final = 4 * 1024
BODY_GRACE_SECONDS: Final = 2.0
# The ASGI scope extension through which nmo's HTTP protocol tells how many
# bytes of the body it holds that the app has not read yet (its "pending"):
# a deadline that fires while they wait for a late turn of the event loop is
# not the client's; and whether they are the whole rest of the body, so that
# the next receive returns them without waiting (its "complete").
BUFFERED: Final = "nmo.body_buffered"
# What uvicorn buffers for any connection before it stops reading (its
# HIGH_WATER_LIMIT); a NodeMaintenance review is a few KiB.
FREE_BODY_BYTES: Final = 64 * 1024
JSON: Final = "application/json"


class Uploads:
    """A bound on the big bodies being read at once (their slow uploads hold a
    slot; the first ``free_bytes`` of any body need none)."""

    def __init__(
        self, limit: int = 32, *, wait: float = 1.0, free_bytes: int = FREE_BODY_BYTES
    ) -> None:
        self.limit = limit
        self.wait = wait
        self.free_bytes = free_bytes
        self._slots = asyncio.Semaphore(limit)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        try:
            await asyncio.wait_for(self._slots.acquire(), self.wait)
        except TimeoutError:
            raise Unacceptable(
                429,
                f"too many admission requests are being uploaded at once (limit {self.limit}); "
                "try again",
                close=True,
            ) from None
        try:
            yield
        finally:
            self._slots.release()


class Unacceptable(Exception):
    """The request is refused before it is parsed: an HTTP status and why.

    ``close`` asks for the connection to be closed after the answer (the
    rest of the body is not worth reading).
    """

    def __init__(self, status_code: int, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.close = close


def _media_type(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


def check_content_type(value: str | None) -> None:
    """415 unless the media type is ``application/json`` (parameters allowed).

    A request without the header is read as JSON: that is what hand-made
    requests (``curl --data-binary``, test clients) most often look like.
    """
    if value is not None and _media_type(value) != JSON:
        shown = value if len(value) <= 100 else value[:100] + "..."
        raise Unacceptable(
            415, f"Content-Type {shown!r} is not supported; an AdmissionReview is sent as {JSON}"
        )


def _too_large(what: str, limit: int, *, close: bool) -> Unacceptable:
    return Unacceptable(
        413, f"request body {what}exceeds the webhook's limit of {limit} bytes", close=close
    )


class _Pace:
    """How long the body read so far may take to grow: ``seconds`` in all, and
    ``min_rate`` bytes a second on average once ``grace`` has passed; a slot of
    ``uploads`` once it is past their free bytes."""

    def __init__(
        self,
        *,
        seconds: float,
        min_rate: float,
        grace: float,
        uploads: Uploads | None,
        slot: contextlib.AsyncExitStack,
    ) -> None:
        self.seconds, self.min_rate, self.grace = seconds, min_rate, grace
        self.start = asyncio.get_running_loop().time()
        self.size = 0
        self._uploads, self._slot, self._held = uploads, slot, False

    def due(self) -> float:
        """When the body must be complete or bigger than now."""
        end = self.start + self.seconds
        if self.min_rate <= 0:
            return end
        return min(end, self.start + self.grace + self.size / self.min_rate)

    async def grew(self, by: int) -> None:
        self.size += by
        if self._uploads is not None and not self._held and self.size > self._uploads.free_bytes:
            asked = asyncio.get_running_loop().time()
            await self._slot.enter_async_context(self._uploads.slot())
            self._held = True
            self.start += asyncio.get_running_loop().time() - asked  # not the client's slowness

    def late(self) -> Unacceptable:
        if self.due() < self.start + self.seconds:
            message = (
                f"request body arriving slower than {self.min_rate:g} bytes/s "
                f"({self.size} bytes in {self.due() - self.start:.1f}s)"
            )
        else:
            message = f"request body not received within {self.seconds:g}s"
        return Unacceptable(408, message, close=True)


async def read_review_body(
    request: Request,
    *,
    limit: int = MAX_BODY_BYTES,
    drain_limit: int = DRAIN_BYTES,
    uploads: Uploads | None = None,
    body_seconds: float = BODY_SECONDS,
    min_rate: float = MIN_BODY_RATE,
    grace: float = BODY_GRACE_SECONDS,
) -> bytes:
    """The body of an admission request; raises :class:`Unacceptable`."""
    check_content_type(request.headers.get("content-type"))
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        # Not a byte read: the server discards a bounded rest, or closes.
        raise _too_large(f"of {int(declared)} bytes ", limit, close=int(declared) > drain_limit)
    first = b""
    if _held_whole(request, uploads):
        message = await request.receive()  # returns at once: no deadline can pass
        if message["type"] == "http.disconnect":
            raise Unacceptable(400, "client disconnected before the body was complete")
        first = bytes(message.get("body", b""))
        if not message.get("more_body", False):
            if len(first) > limit:
                raise _too_large(f"of {len(first)} bytes ", limit, close=False)
            return first
    async with contextlib.AsyncExitStack() as slot:
        pace = _Pace(
            seconds=body_seconds, min_rate=min_rate, grace=grace, uploads=uploads, slot=slot
        )
        return await _read(request, limit=limit, drain_limit=drain_limit, pace=pace, first=first)
    raise AssertionError("unreachable")  # pragma: no cover


def _held_whole(request: Request, uploads: Uploads | None) -> bool:
    """Whether the server holds the whole body, few enough bytes to need no
    upload slot (see :data:`BUFFERED`)."""
    hints = (request.scope.get("extensions") or {}).get(BUFFERED) or {}
    complete, pending = hints.get("complete"), hints.get("pending")
    if complete is None or pending is None or not complete():
        return False
    return uploads is None or pending() <= uploads.free_bytes


async def _parts(request: Request, pace: _Pace, first: bytes) -> AsyncGenerator[bytes, None]:
    """The body's parts (``first``, already received, before the rest), each
    within the pace's deadline."""
    if first:
        await pace.grew(len(first))
        yield first
    buffered = ((request.scope.get("extensions") or {}).get(BUFFERED) or {}).get("pending")
    while True:
        try:
            async with asyncio.timeout_at(pace.due()):
                message = await request.receive()
        except TimeoutError:
            if buffered is not None and buffered() > 0:
                continue  # it arrived meanwhile: this loop was late, not the client
            raise pace.late() from None
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        part: bytes = message.get("body", b"")
        if part:
            await pace.grew(len(part))
            yield part
        if not message.get("more_body", False):
            return


async def _read(
    request: Request, *, limit: int, drain_limit: int, pace: _Pace, first: bytes
) -> bytes:
    chunks: list[bytes] = []
    try:
        async with contextlib.aclosing(_parts(request, pace, first)) as parts:
            async for chunk in parts:
                if pace.size > limit:
                    chunks.clear()
                    # Undeclared length: discard a bounded rest so the client can
                    # read the answer; past that the connection is not worth keeping.
                    async for _rest in parts:
                        if pace.size > limit + drain_limit:
                            raise _too_large("", limit, close=True)
                    raise _too_large(f"of {pace.size} bytes ", limit, close=False)
                chunks.append(chunk)
    except ClientDisconnect as exc:
        raise Unacceptable(400, "client disconnected before the body was complete") from exc
    return b"".join(chunks)
