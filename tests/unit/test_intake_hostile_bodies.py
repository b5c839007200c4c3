"""Hostile bodies are refused quickly and never stall the loop (issue 14, item 3).

The real limits (:data:`MAX_BODY_BYTES`), through the ASGI app: a 3 MiB body,
declared or chunked, is 413 without being parsed; deep nesting is a 400; a
big but valid review is parsed off the loop and answered; slow big uploads
hold at most ``Uploads.limit`` slots, beyond which the answer is 429 at once,
while a review of the usual size needs none; a stalled body is cut after a
short grace (issue 20).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from test_intake import review
from webhook_fakes import FakeLookups, node

from nmo.api.constants import WEBHOOK_PATH
from nmo.server.app import PARSE_INLINE_BYTES, create_webhook_app
from nmo.server.intake import (
    BUFFERED,
    FREE_BODY_BYTES,
    MAX_BODY_BYTES,
    Unacceptable,
    Uploads,
    read_review_body,
)
from nmo.telemetry.metrics import Metrics

THREE_MIB = 3 * 1024 * 1024


def client(**kw: Any) -> httpx.AsyncClient:
    app = create_webhook_app(lookups=FakeLookups(nodes={"n1": node("n1")}), metrics=Metrics(), **kw)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://wh.test")


async def chunks(total: int, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    for _ in range(total // size):
        yield b" " * size


def test_the_limit_fits_a_nodemaintenance_review_and_nothing_much_bigger() -> None:
    # two objects at the apiserver's 256 KiB annotation cap, and room to spare
    assert 2 * 256 * 1024 < MAX_BODY_BYTES <= 1024 * 1024


@pytest.mark.parametrize("how", ["declared", "chunked"])
async def test_three_mib_is_413_quickly(how: str) -> None:
    body: Any = b"{" * THREE_MIB if how == "declared" else chunks(THREE_MIB)
    started = time.perf_counter()
    async with client() as http:
        resp = await http.post(WEBHOOK_PATH, content=body)
    assert resp.status_code == 413
    assert f"exceeds the webhook's limit of {MAX_BODY_BYTES} bytes" in resp.text
    assert time.perf_counter() - started < 1.0


async def test_deep_nesting_is_a_quick_400() -> None:
    body = b"[" * 200_000 + b"]" * 200_000
    started = time.perf_counter()
    async with client() as http:
        resp = await http.post(WEBHOOK_PATH, content=body)
    assert resp.status_code == 400
    assert "not JSON" in resp.text
    assert time.perf_counter() - started < 1.0


async def test_a_big_valid_review_is_parsed_off_the_loop_and_answered() -> None:
    doc = review()
    doc["request"]["object"]["metadata"]["annotations"] = {"a": "x" * 300_000}
    body = json.dumps(doc).encode()
    assert len(body) > PARSE_INLINE_BYTES
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    try:
        async with client() as http:
            resp = await http.post(WEBHOOK_PATH, content=body)
    finally:
        task.cancel()
    assert resp.status_code == 200
    assert resp.json()["response"]["allowed"] is True
    assert ticks > 0


async def test_slow_big_uploads_beyond_the_bound_get_429_at_once() -> None:
    gate, holding = asyncio.Event(), asyncio.Event()

    async def stalled() -> AsyncIterator[bytes]:
        yield b"[" + b" " * FREE_BODY_BYTES  # past the free bytes: holds the one slot
        holding.set()  # the app asks for more: it has taken the slot
        await gate.wait()
        yield b"]"

    big = review()
    big["request"]["object"]["metadata"]["annotations"] = {"a": "x" * FREE_BODY_BYTES}
    async with client(uploads=Uploads(1, wait=0.05)) as http:
        first = asyncio.create_task(http.post(WEBHOOK_PATH, content=stalled()))
        await holding.wait()
        started = time.perf_counter()
        second = await http.post(WEBHOOK_PATH, content=json.dumps(big).encode())
        assert second.status_code == 429
        assert second.headers["retry-after"] == "1"
        assert "too many admission requests" in second.text
        assert time.perf_counter() - started < 1.0
        # A review of the usual few KiB needs no slot: answered meanwhile.
        small = await http.post(WEBHOOK_PATH, content=json.dumps(review()).encode())
        assert small.status_code == 200
        assert small.json()["response"]["allowed"] is True
        gate.set()
        assert (await first).status_code == 400  # a list, not a review
        third = await http.post(WEBHOOK_PATH, content=json.dumps(big).encode())
        assert third.status_code == 200


async def test_a_stalled_body_is_408_after_the_grace_not_the_deadline() -> None:
    never = asyncio.Event()

    async def stalled() -> AsyncIterator[bytes]:
        yield b"{"
        await never.wait()

    # The grace and rate are small so the test is quick; the deadline is not.
    async with client(body_seconds=60, min_body_rate=1000, body_grace=0.05) as http:
        resp = await http.post(WEBHOOK_PATH, content=stalled())
    assert resp.status_code == 408
    assert resp.text.startswith("request body arriving slower than 1000 bytes/s (1 bytes in 0.1s)")
    assert resp.headers["connection"] == "close"


async def test_a_deadline_missed_by_the_loop_not_the_client_is_not_a_408() -> None:
    """The server holds the body (its protocol received it) but the app's turn
    came after the deadline, as on a loaded loop: the body is read, not cut."""
    held = bytearray(json.dumps(review()).encode())
    waited = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if not waited.is_set():  # the first turn comes too late
            waited.set()
            await asyncio.Event().wait()
        body, held[:] = bytes(held), b""
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {
        "type": "http",
        "method": "POST",
        "path": WEBHOOK_PATH,
        "headers": [],
        "extensions": {BUFFERED: {"pending": lambda: len(held)}},
    }
    body = await read_review_body(Request(scope, receive), grace=0.01, min_rate=1000)
    assert json.loads(body) == review()
    assert waited.is_set()
    # Nothing held: the same miss is the client's.
    waited.clear()
    scope["extensions"] = {BUFFERED: {"pending": lambda: 0}}
    with pytest.raises(Unacceptable, match="slower than 1000 bytes/s") as late:
        await read_review_body(Request(scope, receive), grace=0.01, min_rate=1000)
    assert late.value.status_code == 408


def held(body: bytes, *, disconnected: bool = False) -> Request:
    """A request whose body the server already holds whole (the ``complete`` hint)."""
    rest = bytearray(body)

    async def receive() -> dict[str, Any]:
        if disconnected:
            return {"type": "http.disconnect"}
        part, rest[:] = bytes(rest), b""
        return {"type": "http.request", "body": part, "more_body": False}

    hints = {"pending": lambda: len(rest), "complete": lambda: bool(rest) or disconnected}
    scope = {"type": "http", "method": "POST", "path": WEBHOOK_PATH, "headers": []}
    scope["extensions"] = {BUFFERED: hints}
    return Request(scope, receive)


async def test_a_body_held_whole_is_taken_at_once_without_a_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_deadline(when: float | None) -> Any:
        raise AssertionError("a deadline was armed for a body already held")

    monkeypatch.setattr(asyncio, "timeout_at", no_deadline)
    body = json.dumps(review()).encode()
    # Even past every deadline and with no upload slot free: nothing is left to wait for.
    uploads = Uploads(1, wait=0.01)
    async with uploads.slot():
        got = await read_review_body(held(body), uploads=uploads, body_seconds=0, grace=0)
    assert got == body


@pytest.mark.parametrize(
    ("request_", "limit", "status", "message"),
    [
        (lambda: held(b"x" * 11), 10, 413, "request body of 11 bytes exceeds"),
        (lambda: held(b"", disconnected=True), 10, 400, "client disconnected"),
    ],
    ids=["over the limit", "disconnected"],
)
async def test_a_body_held_whole_meets_the_same_bounds(
    request_: Any, limit: int, status: int, message: str
) -> None:
    with pytest.raises(Unacceptable, match=message) as refused:
        await read_review_body(request_(), limit=limit)
    assert refused.value.status_code == status
    assert refused.value.close is False


async def test_a_big_body_held_whole_still_needs_an_upload_slot() -> None:
    body = json.dumps(review()).encode()
    uploads = Uploads(1, wait=0.01, free_bytes=len(body) - 1)
    async with uploads.slot():  # the one slot is taken
        with pytest.raises(Unacceptable, match="too many admission requests") as refused:
            await read_review_body(held(body), uploads=uploads)
    assert refused.value.status_code == 429
    assert await read_review_body(held(body), uploads=uploads) == body


@pytest.mark.parametrize(
    ("size", "threaded"),
    [(PARSE_INLINE_BYTES, False), (PARSE_INLINE_BYTES + 1, True)],
    ids=["at the threshold: inline", "past it: a worker thread"],
)
async def test_only_a_body_past_the_threshold_is_parsed_in_a_thread(
    monkeypatch: pytest.MonkeyPatch, size: int, threaded: bool
) -> None:
    handed: list[int] = []
    to_thread = asyncio.to_thread

    async def counting(func: Any, body: bytes) -> Any:
        handed.append(len(body))
        return await to_thread(func, body)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    doc = json.dumps(review()).encode()
    body = doc + b" " * (size - len(doc))  # JSON may end in whitespace
    assert len(body) == size
    async with client() as http:
        resp = await http.post(WEBHOOK_PATH, content=body)
    assert resp.json()["response"]["allowed"] is True
    assert handed == ([size] if threaded else [])
