"""Connection bounds of the servers (issue 14, item 1): a cap per port and
deadlines before a request, on real sockets on 127.0.0.1.

Small limits keep each case well under a second; waiting is for the server's
own deadlines, bounded by :func:`until`.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from test_tls_reload import make_pair, running, settings, until  # noqa: F401

from nmo.api.constants import WEBHOOK_PATH
from nmo.webhooks.listener import ConnectionLimits
from nmo.webhooks.servers import Servers, ServerSettings

Start = Callable[[ServerSettings], Awaitable[Servers]]


def limits(**kw: float) -> ConnectionLimits:
    base = {
        "max_connections": 8,
        "handshake_seconds": 0.3,
        "header_seconds": 0.3,
        "drop_after_seconds": 0.0,
    }
    return ConnectionLimits(**{**base, **kw})  # type: ignore[arg-type]


@pytest.fixture
async def webhook(tmp_path: Path, running: Start) -> Servers:  # noqa: F811
    make_pair(tmp_path / "certs", "webhook", names=("tls.crt", "tls.key"))
    return await running(
        settings(tmp_path / "certs", probes_port=0, connection_limits=limits(handshake_seconds=5))
    )


async def idle_sockets(port: int, n: int) -> list[asyncio.StreamWriter]:
    writers = []
    for _ in range(n):
        _r, w = await asyncio.open_connection("127.0.0.1", port)
        writers.append(w)
    return writers


async def test_idle_sockets_never_exceed_the_cap_and_a_real_review_gets_in(
    webhook: Servers,
) -> None:
    port = webhook.ports["webhook"]
    writers = await idle_sockets(port, 40)
    listener = webhook.listener("webhook")

    async def all_seen() -> bool:
        return listener.dropped + listener.refused + len(listener.connections) >= 40

    await until(all_seen, "the 40 sockets to be accepted")
    assert len(listener.connections) <= 8
    async with httpx.AsyncClient(verify=False) as http:
        review = await http.post(f"https://127.0.0.1:{port}{WEBHOOK_PATH}", content=b"{}")
        ready = await http.get(f"http://127.0.0.1:{webhook.ports['probes']}/healthz")
    assert review.status_code == 400  # answered (no uid: plain 400)
    assert ready.status_code == 200
    for w in writers:
        w.close()


async def test_at_the_cap_young_connections_stay_and_the_newcomer_is_closed(
    tmp_path: Path,
    running: Start,  # noqa: F811
) -> None:
    make_pair(tmp_path / "certs", "webhook", names=("tls.crt", "tls.key"))
    servers = await running(
        settings(tmp_path / "certs", connection_limits=limits(drop_after_seconds=60))
    )
    listener = servers.listener("webhook")
    writers = await idle_sockets(servers.ports["webhook"], 12)

    async def all_seen() -> bool:
        return listener.refused + len(listener.connections) >= 12

    await until(all_seen, "the 12 sockets to be accepted")
    assert (len(listener.connections), listener.refused, listener.dropped) == (8, 4, 0)
    for w in writers:
        w.close()


async def test_a_connection_that_never_handshakes_is_closed(
    tmp_path: Path,
    running: Start,  # noqa: F811
) -> None:
    make_pair(tmp_path / "certs", "webhook", names=("tls.crt", "tls.key"))
    servers = await running(settings(tmp_path / "certs", connection_limits=limits()))
    reader, writer = await asyncio.open_connection("127.0.0.1", servers.ports["webhook"])
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
    writer.close()


async def test_slow_headers_are_cut_off_after_the_handshake(
    tmp_path: Path,
    running: Start,  # noqa: F811
) -> None:
    make_pair(tmp_path / "certs", "webhook", names=("tls.crt", "tls.key"))
    servers = await running(settings(tmp_path / "certs", connection_limits=limits()))
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    reader, writer = await asyncio.open_connection("127.0.0.1", servers.ports["webhook"], ssl=ctx)

    async def trickle() -> None:
        for byte in b"POST /validate HTTP/1.1\r\n":
            writer.write(bytes([byte]))
            await asyncio.sleep(0.05)

    task = asyncio.create_task(trickle())
    try:
        assert await asyncio.wait_for(reader.read(), 5) == b""
    finally:
        task.cancel()
        writer.close()


async def test_a_body_that_never_ends_is_408(
    tmp_path: Path,
    running: Start,  # noqa: F811
) -> None:
    make_pair(tmp_path / "certs", "webhook", names=("tls.crt", "tls.key"))
    servers = await running(settings(tmp_path / "certs", body_seconds=0.2))
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    reader, writer = await asyncio.open_connection("127.0.0.1", servers.ports["webhook"], ssl=ctx)
    writer.write(
        f"POST {WEBHOOK_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 100\r\n\r\n{".encode()
    )
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"request body not received within 0.2s" in answer
