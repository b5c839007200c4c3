"""A hostile or broken notification receiver cannot hold the leader (issue 20).

Real HTTP/1.1 servers on 127.0.0.1, each misbehaving in one way: an answer
whose body never ends, a head or a body trickled a byte at a time (each byte
well within httpx's per-read timeout, so only a total deadline ends the
attempt). Each test bounds itself (``asyncio.timeout``): before the cap and
the deadline, every one of them hung until that bound. Real time is the
subject (a deadline against a peer that keeps time), so these live here and
not among the unit tests; they need no sandbox.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import pytest

from nmo.controller.notifier import MAX_ANSWER_BODY, Notifier, NotifySettings, shown
from nmo.core.maintenance.notifications import Kind, Notification
from nmo.telemetry.metrics import Metrics

pytestmark = pytest.mark.integration

Serve = Callable[[asyncio.StreamWriter, "Peer"], Awaitable[None]]  # one misbehaviour
TRICKLE = 0.02  # seconds between two bytes: far below any per-read timeout here


def note() -> Notification:
    return Notification(
        Kind.BLOCKED, "nm-1", "node-2", "Running", "r", "m", datetime.now(UTC), "op"
    )


def count(metrics: Metrics, result: str) -> float:
    labels = {"kind": Kind.BLOCKED.value, "result": result}
    return metrics.registry.get_sample_value("nmo_notifications_total", labels) or 0.0


class Peer:
    """What the hostile server saw: bytes it sent, and whether the client hung up."""

    def __init__(self) -> None:
        self.sent = 0
        self.hung_up = asyncio.Event()


async def _read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    await reader.readexactly(length)


@asynccontextmanager
async def receiver(serve: Serve) -> AsyncIterator[tuple[str, Peer]]:
    peer = Peer()
    handlers: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            await _read_request(reader)
            await serve(writer, peer)
        except (ConnectionError, asyncio.IncompleteReadError):
            peer.hung_up.set()
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/services/T0/B0/s3cr3t", peer
    finally:
        server.close()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


async def endless_body(writer: asyncio.StreamWriter, peer: Peer) -> None:
    """200 at once, then a chunked body that never ends (until the client hangs up)."""
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"x" * 65536
    while True:
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await writer.drain()
        peer.sent += len(chunk)


def trickled(data: bytes, *, then: bytes = b"") -> Serve:
    """Send ``then`` at once, then ``data`` one byte every :data:`TRICKLE` seconds."""

    async def serve(writer: asyncio.StreamWriter, peer: Peer) -> None:
        writer.write(then)
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            peer.sent += 1
            await asyncio.sleep(TRICKLE)

    return serve


async def deliver(url: str, *, timeout: float, bound: float = 10.0) -> Metrics:
    """One notification through a real Notifier with one attempt; its outcome in the metrics."""
    metrics = Metrics()
    settings = NotifySettings(url, timeout=timeout, attempts=1)
    n = Notifier(settings, metrics=metrics, operator="op-1")
    task = asyncio.create_task(n.run())
    try:
        n.enqueue(note())
        async with asyncio.timeout(bound):  # before the fix: this bound, not the notifier, ended it
            await n.join()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return metrics


async def test_an_endless_body_is_not_read() -> None:
    """The status decides; the body is read only to MAX_ANSWER_BODY, then the connection closes.

    The deadline (30 s) is far beyond the test's bound: only the cap can end it.
    """
    async with receiver(endless_body) as (url, peer):
        metrics = await deliver(url, timeout=30.0)
        assert count(metrics, "delivered") == 1
        async with asyncio.timeout(10):
            await peer.hung_up.wait()
    # What the server pushed is what loopback buffers hold, not what it would send.
    assert peer.sent < 64 * 2**20
    assert MAX_ANSWER_BODY <= 8192


async def test_a_trickled_head_meets_one_total_deadline(caplog: pytest.LogCaptureFixture) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" * 100  # about 4 s at TRICKLE
    async with receiver(trickled(head)) as (url, peer):
        with caplog.at_level(logging.WARNING, logger="nmo.notify"):
            metrics = await deliver(url, timeout=0.5, bound=3.0)
    assert count(metrics, "failed") == 1
    assert count(metrics, "delivered") == 0
    assert 0 < peer.sent < len(head)
    (failed,) = [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]
    assert failed.endswith("after 1 attempt(s): no answer within 0.5s"), failed


async def test_a_trickled_body_keeps_the_answer_and_the_deadline() -> None:
    """The head came in time: a 200 whose body dribbles in is delivered at the deadline."""
    body = b"y" * 4000  # about 80 s at TRICKLE, under MAX_ANSWER_BODY
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
    async with receiver(trickled(body, then=head)) as (url, peer):
        metrics = await deliver(url, timeout=0.5, bound=3.0)
    assert count(metrics, "delivered") == 1
    assert 0 < peer.sent < len(body)


async def test_the_logged_url_is_its_origin(caplog: pytest.LogCaptureFixture) -> None:
    """Slack and Discord put the secret in the path: the start-up line shows scheme://host:port."""
    async with receiver(endless_body) as (url, _):
        with caplog.at_level(logging.INFO, logger="nmo.notify"):
            await deliver(url, timeout=30.0)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert f"POST to {shown(url)}" in text
    assert "s3cr3t" not in text and "/services" not in text
