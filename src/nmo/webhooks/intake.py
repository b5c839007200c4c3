"""Reading an admission request off the wire, with bounds.

Why this module exists: the webhook port is reachable by anything in the
cluster network, not only the kube-apiserver, so what arrives there can be
any bytes at all. Before a body is parsed it must be the kind of body the
apiserver sends (``Content-Type: application/json``) and of a size the
apiserver can send for a NodeMaintenance (:data:`MAX_BODY_BYTES`), read
within a deadline, with a bounded number of uploads at once
(:class:`Uploads`): a 3 MiB body costs about half a second of CPU to parse,
and there is only one event loop (issue 14, item 3).

Guarantees of :func:`read_review_body`:

* at most ``Uploads.limit`` bodies are being read at once; a request that
  finds no free slot within ``Uploads.wait`` seconds is 429 (Retry-After 1),
  and a body not complete within ``body_seconds`` is 408, connection closed;
* a ``Content-Type`` other than JSON is :class:`Unacceptable` with 415 and
  the body is never read (a missing one is taken to mean JSON);
* a declared ``Content-Length`` over the limit is 413 without the app reading
  a byte of the body; a chunked body is kept up to the limit and no further,
  so at most ``limit`` bytes are ever held in memory;
* when the rest of an oversized body is small enough to be discarded
  (``drain_limit``, by uvicorn for a declared length, here for a chunked
  one), the connection stays usable and the client reads the 413 calmly;
  otherwise the answer closes the connection instead of reading on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
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
JSON: Final = "application/json"


class Uploads:
    """A bound on the bodies being read at once (slow uploads hold a slot)."""

    def __init__(self, limit: int = 32, *, wait: float = 1.0) -> None:
        self.limit = limit
        self.wait = wait
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


async def read_review_body(
    request: Request,
    *,
    limit: int = MAX_BODY_BYTES,
    drain_limit: int = DRAIN_BYTES,
    uploads: Uploads | None = None,
    body_seconds: float = BODY_SECONDS,
) -> bytes:
    """The body of an admission request; raises :class:`Unacceptable`."""
    check_content_type(request.headers.get("content-type"))
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        # Not a byte read: the server discards a bounded rest, or closes.
        raise _too_large(f"of {int(declared)} bytes ", limit, close=int(declared) > drain_limit)
    async with contextlib.AsyncExitStack() as stack:
        if uploads is not None:
            await stack.enter_async_context(uploads.slot())
        try:
            async with asyncio.timeout(body_seconds):
                return await _read(request, limit=limit, drain_limit=drain_limit)
        except TimeoutError:
            raise Unacceptable(
                408, f"request body not received within {body_seconds:g}s", close=True
            ) from None
    raise AssertionError("unreachable")  # pragma: no cover


async def _read(request: Request, *, limit: int, drain_limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    try:
        stream = request.stream()
        async for chunk in stream:
            size += len(chunk)
            if size > limit:
                chunks.clear()
                # Undeclared length: discard a bounded rest so the client can
                # read the answer; past that the connection is not worth keeping.
                async for rest in stream:
                    size += len(rest)
                    if size > limit + drain_limit:
                        raise _too_large("", limit, close=True)
                raise _too_large(f"of {size} bytes ", limit, close=False)
            chunks.append(chunk)
    except ClientDisconnect as exc:
        raise Unacceptable(400, "client disconnected before the body was complete") from exc
    return b"".join(chunks)
