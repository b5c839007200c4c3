"""Hostile bodies are refused quickly and never stall the loop (issue 14, item 3).

The real limits (:data:`MAX_BODY_BYTES`), through the ASGI app: a 3 MiB body,
declared or chunked, is 413 without being parsed; deep nesting is a 400; a
big but valid review is parsed off the loop and answered; slow uploads hold at
most ``Uploads.limit`` slots, beyond which the answer is 429 at once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from test_webhook_intake import review
from webhook_fakes import FakeLookups, node

from nmo.api.constants import WEBHOOK_PATH
from nmo.core.metrics import Metrics
from nmo.webhooks.app import PARSE_INLINE_BYTES, create_webhook_app
from nmo.webhooks.intake import MAX_BODY_BYTES, Uploads

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


async def test_slow_uploads_beyond_the_bound_get_429_at_once() -> None:
    gate = asyncio.Event()

    async def stalled() -> AsyncIterator[bytes]:
        yield b"{"
        await gate.wait()
        yield b"}"

    async with client(uploads=Uploads(1, wait=0.05)) as http:
        first = asyncio.create_task(http.post(WEBHOOK_PATH, content=stalled()))
        await asyncio.sleep(0.01)  # let the first request take the slot
        started = time.perf_counter()
        second = await http.post(WEBHOOK_PATH, content=json.dumps(review()).encode())
        assert second.status_code == 429
        assert second.headers["retry-after"] == "1"
        assert "too many admission requests" in second.text
        assert time.perf_counter() - started < 1.0
        gate.set()
        assert (await first).status_code == 400  # "{}" has no uid
        third = await http.post(WEBHOOK_PATH, content=json.dumps(review()).encode())
        assert third.status_code == 200
