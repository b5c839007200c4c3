"""nmo's HTTP/1.1 protocol on a recording transport: what it writes, and what
it tells the app about the body it holds.

A response leaves in one write (its head waits for its body,
:class:`nmo.server.listener.HeadWithBody`): over TLS, one record and one
``send`` instead of two. The ``complete`` hint of
:data:`nmo.server.intake.BUFFERED` is true exactly while the next receive
returns the rest of the body without waiting, which is what lets
:func:`nmo.server.intake.read_review_body` take such a body without a deadline.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvicorn
from test_intake import review
from uvicorn.server import ServerState
from webhook_fakes import FakeLookups, node

from nmo.api.constants import WEBHOOK_PATH
from nmo.server.app import create_webhook_app
from nmo.server.intake import BUFFERED
from nmo.server.listener import ConnectionLimits, HeadWithBody, guarded_protocol
from nmo.telemetry.metrics import Metrics

Scope = dict[str, Any]
ASGIHandler = Callable[[Scope, Any, Any], Any]


class Recording(asyncio.Transport):
    """A transport that keeps what is written to it."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("10.0.0.1", 40000), "sockname": ("10.0.0.2", 9443)}.get(name, default)

    def write(self, data: Any) -> None:
        if data:
            self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def connect(app: ASGIHandler) -> tuple[Any, Recording]:
    config = uvicorn.Config(app, lifespan="off", log_config=None, date_header=False)
    config.load()
    cls = guarded_protocol(ConnectionLimits())
    protocol = cls(config=config, server_state=ServerState(), app_state={})
    transport = Recording()
    protocol.connection_made(transport)
    return protocol, transport


def post(body: bytes, *, length: int | None = None, path: str = "/r") -> bytes:
    size = len(body) if length is None else length
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    return head.encode() + b"Content-Length: %d\r\n\r\n" % size + body


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def answer_ok(scope: Scope, receive: Any, send: Any) -> None:
    await receive()
    headers = [(b"content-length", b"8")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"answered"})


async def test_a_response_leaves_in_one_write() -> None:
    protocol, transport = connect(answer_ok)
    protocol.data_received(post(b"{}"))
    await settle()
    assert len(transport.writes) == 1
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.writes[0].endswith(b"\r\n\r\nanswered")
    # The next request on the kept-alive connection, the same.
    protocol.data_received(post(b"{}"))
    await settle()
    assert len(transport.writes) == 2
    assert transport.writes[1].endswith(b"\r\n\r\nanswered")


async def test_a_head_held_when_the_app_fails_is_written_before_the_close() -> None:
    async def fails_after_the_head(scope: Scope, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("bug")

    protocol, transport = connect(fails_after_the_head)
    protocol.data_received(post(b"{}"))
    await settle()
    assert transport.closed
    assert [w[:15] for w in transport.writes] == [b"HTTP/1.1 200 OK"]


class Cycle:
    response_started = False


@pytest.mark.parametrize("body", [b"ok", b""])
def test_the_head_waits_for_the_body_and_nothing_else_waits(body: bytes) -> None:
    transport, cycle = Recording(), Cycle()
    out = HeadWithBody(transport, cycle)
    out.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # before the response: at once
    cycle.response_started = True
    out.write(b"HEAD")
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    out.write(body)
    out.write(b"")  # uvicorn's end of a sized message
    out.write(b"more")
    assert transport.writes[1:] == [b"HEAD" + body, b"more"]
    assert out.is_closing() is False  # everything else is the transport's
    out.close()
    assert transport.closed


async def test_complete_says_whether_the_next_receive_returns_the_rest_at_once() -> None:
    seen: list[tuple[str, bool, int]] = []
    gate = asyncio.Event()

    async def reader(scope: Scope, receive: Any, send: Any) -> None:
        hints = scope["extensions"][BUFFERED]
        seen.append(("headers in", hints["complete"](), hints["pending"]()))
        await gate.wait()
        seen.append(("body in", hints["complete"](), hints["pending"]()))
        message = await receive()
        seen.append(("received", hints["complete"](), len(message["body"])))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    protocol, transport = connect(reader)
    protocol.data_received(post(b"", length=6))  # headers only
    await settle()
    protocol.data_received(b"{}")  # part of the body
    await settle()
    partly = protocol.cycle.scope["extensions"][BUFFERED]["complete"]()
    protocol.data_received(b"{}{}")  # the rest
    gate.set()
    await settle()
    assert partly is False
    assert seen == [("headers in", False, 0), ("body in", True, 6), ("received", False, 6)]
    assert transport.writes[0].startswith(b"HTTP/1.1 204 ")


@pytest.fixture
def collected() -> Iterator[list[object]]:
    """What the collector finds unreachable meanwhile (kept, not freed)."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


async def test_an_answered_review_leaves_nothing_for_the_collector(
    collected: list[object],
) -> None:
    """Its objects are freed when dropped: at a thousand reviews a second,
    reference cycles made the collector's runs, and its full ones, part of
    the latency."""
    app = create_webhook_app(lookups=FakeLookups(nodes={"n1": node("n1")}), metrics=Metrics())
    protocol, transport = connect(app)
    for _ in range(20):
        protocol.data_received(post(json.dumps(review()).encode(), path=WEBHOOK_PATH))
        await settle()
    del protocol
    gc.collect()
    assert len(transport.writes) == 20
    assert all(b'"allowed":true' in w for w in transport.writes)
    assert [type(o).__name__ for o in collected] == []
