"""Connection bounds of the servers (issue 14, item 1; issue 20): a cap per
port and per peer address, idle connections closed for newcomers least
recently used first, deadlines before a request and a minimum body rate, on
real sockets on 127.0.0.1 (other peers bind 127.0.0.2 and up: the whole of
127/8 is loopback on Linux).

Small limits keep each case well under a second; waiting is for the server's
own deadlines, bounded by :func:`until`.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from test_tls_reload import make_pair, running, settings, until  # noqa: F401

from nmo.api.constants import WEBHOOK_PATH
from nmo.server.intake import BODY_GRACE_SECONDS
from nmo.server.listener import ConnectionLimits, Listener
from nmo.server.servers import Servers, ServerSettings

Start = Callable[[ServerSettings], Awaitable[Servers]]


def limits(**kw: float) -> ConnectionLimits:
    base = {
        "max_connections": 8,
        "max_per_source": 8,
        "handshake_seconds": 0.3,
        "header_seconds": 0.3,
        "drop_after_seconds": 0.0,
    }
    return ConnectionLimits(**{**base, **kw})  # type: ignore[arg-type]


def patient(**kw: float) -> ConnectionLimits:
    """:func:`limits` whose deadlines a loaded machine cannot reach between a
    connection and its first request."""
    return limits(**{"handshake_seconds": 5, "header_seconds": 5, **kw})


async def serving(tmp_path: Path, running: Start, **kw: float) -> tuple[int, Listener]:  # noqa: F811
    """A webhook server with :func:`patient` limits: its port and its listener."""
    make_pair(tmp_path / "certs", "webhook", names=("tls.crt", "tls.key"))
    servers = await running(settings(tmp_path / "certs", connection_limits=patient(**kw)))
    return servers.ports["webhook"], servers.listener("webhook")


@pytest.fixture
async def webhook(tmp_path: Path, running: Start) -> Servers:  # noqa: F811
    make_pair(tmp_path / "certs", "webhook", names=("tls.crt", "tls.key"))
    return await running(
        settings(tmp_path / "certs", probes_port=0, connection_limits=limits(handshake_seconds=5))
    )


async def idle_sockets(port: int, n: int, source: str = "127.0.0.1") -> list[asyncio.StreamWriter]:
    writers = []
    for _ in range(n):
        _r, w = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        writers.append(w)
    return writers


def tls() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    return ctx


class KeptAlive:
    """A TLS connection that sends requests one after the other, as the
    apiserver's pooled connections do."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, source: str = "127.0.0.1") -> KeptAlive:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=tls(), local_addr=(source, 0)
        )
        return cls(reader, writer)

    async def ask(self) -> int:
        """GET / (404): the status, or 0 when the server closed the connection."""
        try:
            self.writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5)
        except (asyncio.IncompleteReadError, ConnectionError):
            return 0
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await self.reader.readexactly(length)
        return int(head.split()[1])

    async def closed(self) -> bool:
        """Whether the server has closed it (waits for the end of the stream)."""
        return await asyncio.wait_for(self.reader.read(), 5) == b""

    def close(self) -> None:
        self.writer.close()


async def test_idle_sockets_never_exceed_the_cap_and_a_real_review_gets_in(
    webhook: Servers,
) -> None:
    port = webhook.ports["webhook"]
    # From another address than the review's: one address is one party, and
    # may open only so many connections once the port is crowded (admit_burst).
    writers = await idle_sockets(port, 40, source="127.0.0.2")
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


async def test_at_the_cap_the_least_recently_used_idle_connection_makes_room(
    tmp_path: Path,
    running: Start,  # noqa: F811
) -> None:
    port, listener = await serving(tmp_path, running, max_connections=4)
    kept = [await KeptAlive.open(port) for _ in range(4)]
    for conn in kept:  # each served a request: kept alive, idle
        assert await conn.ask() == 404
    assert await kept[0].ask() == 404  # the first is now the most recently used
    newcomer = await KeptAlive.open(port)
    assert await newcomer.ask() == 404
    assert await kept[1].closed()  # the least recently used went
    assert [await c.ask() for c in (kept[0], kept[2], kept[3])] == [404, 404, 404]
    assert (len(listener.connections), listener.dropped, listener.refused) == (4, 1, 0)
    for conn in [*kept, newcomer]:
        conn.close()


async def test_a_source_at_its_bound_competes_with_itself_only(
    tmp_path: Path,
    running: Start,  # noqa: F811
) -> None:
    port, listener = await serving(
        tmp_path, running, max_connections=16, max_per_source=3, drop_after_seconds=60
    )
    flood = await idle_sockets(port, 10, source="127.0.0.2")  # young: none may go

    async def all_seen() -> bool:
        return listener.refused + listener.held("127.0.0.2") >= 10

    await until(all_seen, "the 10 sockets to be accepted or refused")
    assert (listener.held("127.0.0.2"), listener.refused) == (3, 7)
    # Another address is not held back by the first one's flood.
    real = await KeptAlive.open(port, source="127.0.0.3")
    assert await real.ask() == 404
    assert listener.held("127.0.0.3") == 1
    for w in flood:
        w.close()
    real.close()


async def test_a_source_at_its_bound_gives_up_its_own_least_recently_used(
    tmp_path: Path,
    running: Start,  # noqa: F811
) -> None:
    port, listener = await serving(tmp_path, running, max_connections=16, max_per_source=2)
    other = await KeptAlive.open(port, source="127.0.0.3")
    assert await other.ask() == 404
    first, second = [await KeptAlive.open(port, source="127.0.0.2") for _ in range(2)]
    assert await first.ask() == 404
    assert await second.ask() == 404
    third = await KeptAlive.open(port, source="127.0.0.2")
    assert await third.ask() == 404
    assert await first.closed()
    assert await second.ask() == 404
    assert await other.ask() == 404  # never the victim of another address's bound
    assert (listener.held("127.0.0.2"), listener.held("127.0.0.3")) == (2, 1)
    for conn in (other, first, second, third):
        conn.close()


async def test_at_the_cap_the_heaviest_source_gives_way_first(
    tmp_path: Path,
    running: Start,  # noqa: F811
) -> None:
    port, listener = await serving(tmp_path, running, max_connections=4)
    apiserver = await KeptAlive.open(port)  # used first: the least recently used of all
    assert await apiserver.ask() == 404
    flood = [await KeptAlive.open(port, source="127.0.0.2") for _ in range(3)]
    for conn in flood:
        assert await conn.ask() == 404
    newcomer = await KeptAlive.open(port, source="127.0.0.3")
    assert await newcomer.ask() == 404
    assert await flood[0].closed()
    assert await apiserver.ask() == 404
    assert (listener.held("127.0.0.1"), listener.held("127.0.0.2")) == (1, 2)
    for conn in (apiserver, *flood, newcomer):
        conn.close()


async def test_a_trickling_body_is_cut_with_408_after_the_grace(
    tmp_path: Path,
    running: Start,  # noqa: F811
) -> None:
    make_pair(tmp_path / "certs", "webhook", names=("tls.crt", "tls.key"))
    servers = await running(settings(tmp_path / "certs"))  # the default deadlines and rate
    reader, writer = await asyncio.open_connection("127.0.0.1", servers.ports["webhook"], ssl=tls())
    started = time.perf_counter()
    writer.write(
        f"POST {WEBHOOK_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 100\r\n\r\n{".encode()
    )
    answer = await asyncio.wait_for(reader.read(), 5)  # the old bound was the 10 s deadline
    took = time.perf_counter() - started
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"request body arriving slower than 4096 bytes/s" in answer
    assert b"connection: close" in answer.lower()
    assert BODY_GRACE_SECONDS <= took < BODY_GRACE_SECONDS + 2


async def test_at_the_cap_a_slow_upload_makes_room(
    tmp_path: Path,
    running: Start,  # noqa: F811
) -> None:
    port, listener = await serving(tmp_path, running, max_connections=2, upload_grace_seconds=0.05)
    uploads = []
    for _ in range(2):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls())
        writer.write(
            f"POST {WEBHOOK_PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{".encode()
        )
        uploads.append((reader, writer))

    async def uploading() -> bool:
        return (
            sum(
                c.protocol is not None and c.protocol.request_started is not None
                for c in listener.connections
            )
            == 2
        )

    await until(uploading, "both bodies to be under way")
    admitted: list[KeptAlive] = []

    async def newcomer_served() -> bool:  # refused at once within the grace: again
        try:
            conn = await KeptAlive.open(port)
        except ConnectionError:  # refused before its TLS handshake ended (a loaded machine)
            return False
        if await conn.ask() == 404:
            admitted.append(conn)
            return True
        conn.close()
        return False

    await until(newcomer_served, "a newcomer to take a slow upload's place")
    assert listener.dropped == 1
    ends = [await asyncio.wait_for(r.read(), 5) for r, _w in uploads]
    assert b"" in ends  # the victim was closed without an answer
    for _r, w in uploads:
        w.close()
    admitted[0].close()


async def test_once_crowded_a_source_opens_only_its_burst_then_its_rate(
    tmp_path: Path,
    running: Start,  # noqa: F811
) -> None:
    port, listener = await serving(
        tmp_path, running, max_connections=16, admit_burst=3, admit_rate=0.001
    )
    early = await idle_sockets(port, 4, source="127.0.0.3")  # a quarter of the port: crowded

    def seen(n: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return len(listener.connections) + listener.refused >= n

        return check

    await until(seen(4), "the first four sockets to be accepted")
    flood = await idle_sockets(port, 10, source="127.0.0.2")  # far below the caps
    await until(seen(14), "the flood to be accepted or refused")
    assert (listener.held("127.0.0.2"), listener.refused) == (3, 7)
    real = await KeptAlive.open(port)  # another address has tokens of its own
    assert await real.ask() == 404
    for w in [*early, *flood]:
        w.close()
    real.close()


async def test_a_flood_of_young_connections_cannot_keep_a_lighter_source_out(
    tmp_path: Path,
    running: Start,  # noqa: F811
) -> None:
    port, listener = await serving(tmp_path, running, max_connections=4, drop_after_seconds=60)
    flood = await idle_sockets(port, 4, source="127.0.0.2")  # young for a minute: none idle

    async def filled() -> bool:
        return listener.held("127.0.0.2") == 4

    await until(filled, "the flood to fill the port")
    real = await KeptAlive.open(port)  # from an address holding none
    assert await real.ask() == 404
    assert (listener.held("127.0.0.2"), listener.dropped) == (3, 1)
    more = await idle_sockets(port, 1, source="127.0.0.2")  # the flood's own newcomer: no room

    async def refused() -> bool:
        return listener.refused == 1

    await until(refused, "the flood's newcomer to be refused")
    assert await real.ask() == 404  # a lighter source never gives way
    for w in [*flood, *more]:
        w.close()
    real.close()
