"""nmo.kube.transport against a real HTTP/1.1 server on loopback (no mocks).

The server answers by path: ``/echo`` (the body back, keep-alive), ``/close``
(``Connection: close``), ``/bye`` (keep-alive headers, then it hangs up),
``/hold`` (answers once the test says so), ``/hangup`` (no answer),
``/partial`` (a body cut short), ``/stream`` (a chunked body in three
chunks, the last once the test says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import kr8s
import pytest
import respx

from conftest import KUBECONFIG
from nmo.kube.client import Kube, _widen_pool
from nmo.kube.transport import READ_SIZE, Transport
from nmo_sandbox.pki import generate_pki, issue_serving_cert


class Server:
    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.connections = 0
        self.requests: list[tuple[str, bytes]] = []
        self.release = asyncio.Event()
        self.hung_up = asyncio.Event()
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                path = lines[0].split(" ")[1]
                length = next(
                    (int(h.split(":")[1]) for h in lines if h.lower().startswith("content-length")),
                    0,
                )
                body = await reader.readexactly(length) if length else b""
                self.requests.append((path, body))
                if not await self._answer(path, body, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    async def _answer(self, path: str, body: bytes, writer: asyncio.StreamWriter) -> bool:
        """Write the answer; False: the connection ends here."""
        if path == "/hangup":
            return False
        if path == "/partial":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            await writer.drain()
            return False
        if path == "/stream":
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(b"6\r\nline1\n\r\n6\r\nline2\n\r\n")
            await writer.drain()
            await self.release.wait()
            writer.write(b"6\r\nline3\n\r\n0\r\n\r\n")
            await writer.drain()
            return True
        if path == "/big":
            payload = bytes(range(256)) * 4096  # 1 MiB
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload))
            writer.write(payload)
            await writer.drain()
            return True
        if path == "/hold":
            await self.release.wait()
        close = path == "/close"
        payload = body or path.encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s"
            % (len(payload), b"Connection: close\r\n" if close else b"", payload)
        )
        await writer.drain()
        if path == "/bye":
            writer.close()
            await writer.wait_closed()
            self.hung_up.set()
            return False
        return not close


@contextlib.asynccontextmanager
async def client(**limits: float) -> AsyncIterator[tuple[Server, httpx.AsyncClient, Transport]]:
    args = {"max_connections": 10.0, "max_keepalive": 10.0, "keepalive_expiry": 5.0} | limits
    transport = Transport(ssl_context=None, **args)
    async with (
        Server() as server,
        httpx.AsyncClient(base_url=server.url, transport=transport) as http,
    ):
        yield server, http, transport


async def test_requests_share_one_kept_alive_connection() -> None:
    async with client() as (server, http, transport):
        for i in range(5):
            resp = await http.post("/echo", content=f"body {i}".encode())
            assert (resp.status_code, resp.text) == (200, f"body {i}")
            assert resp.http_version == "HTTP/1.1"
        assert server.connections == transport.connections_opened == 1
        assert [b for _, b in server.requests] == [f"body {i}".encode() for i in range(5)]


async def test_concurrent_requests_open_at_most_max_connections() -> None:
    async with client(max_connections=3) as (server, http, transport):
        answers = await asyncio.gather(*(http.get("/echo") for _ in range(20)))
        assert all(a.text == "/echo" for a in answers)
        assert 1 <= server.connections <= 3
        assert transport.open_connections <= 3


async def test_a_request_past_the_cap_waits_for_the_pool_timeout() -> None:
    async with client(max_connections=1, max_keepalive=1) as (server, http, transport):
        held = asyncio.create_task(http.get("/hold"))
        while not server.requests:  # the held request is on the only connection
            await server_turn()
        with pytest.raises(httpx.PoolTimeout):
            await http.get("/echo", timeout=httpx.Timeout(5.0, pool=0.05))
        server.release.set()
        assert (await held).text == "/hold"
        # The connection came back: the next request takes it.
        assert (await http.get("/echo")).text == "/echo"
        assert server.connections == transport.connections_opened == 1


async def server_turn() -> None:
    """Let the event loop run the server's side once (no clock involved)."""
    done = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(done.set_result, None)
    await done


async def test_connection_close_is_honoured() -> None:
    async with client() as (server, http, transport):
        assert (await http.get("/close")).text == "/close"
        assert (await http.get("/echo")).text == "/echo"
        assert server.connections == transport.connections_opened == 2
        assert transport.open_connections == 1


async def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    async with client() as (server, http, transport):
        assert (await http.get("/bye")).text == "/bye"
        await server.hung_up.wait()
        (idle,) = transport._idle[("http", "127.0.0.1", server.port)]
        assert await asyncio.wait_for(idle.wire.read(), 5) == b""  # the client saw the EOF
        assert (await http.get("/echo")).text == "/echo"  # on a new connection, no error
        assert server.connections == transport.connections_opened == 2


async def test_an_idle_connection_past_its_expiry_is_not_reused() -> None:
    async with client(keepalive_expiry=0.0) as (server, http, transport):
        await http.get("/echo")
        await http.get("/echo")
        assert server.connections == transport.connections_opened == 2
        assert transport.open_connections == 1


async def test_idle_connections_beyond_max_keepalive_are_closed() -> None:
    async with client(max_keepalive=1) as (_server, http, transport):
        await asyncio.gather(*(http.get("/echo") for _ in range(4)))
        assert transport.open_connections == 1


async def test_a_streamed_body_arrives_in_chunks_and_gives_the_connection_back() -> None:
    async with client() as (server, http, _transport):
        lines: list[str] = []
        async with http.stream("GET", "/stream") as resp:
            async for line in resp.aiter_lines():
                lines.append(line)
                if len(lines) == 2:
                    server.release.set()
        assert lines == ["line1", "line2", "line3"]
        assert (await http.get("/echo")).text == "/echo"
        assert server.connections == 1


async def test_a_stream_closed_early_closes_its_connection() -> None:
    async with client() as (server, http, transport):
        async with http.stream("GET", "/stream") as resp:
            async for _ in resp.aiter_lines():
                break  # a cancelled watch
        assert transport.open_connections == 0
        server.release.set()
        assert (await http.get("/echo")).text == "/echo"
        assert server.connections == 2


async def test_no_answer_is_a_remote_protocol_error() -> None:
    async with client() as (_server, http, transport):
        with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
            await http.get("/hangup")
        with pytest.raises(httpx.RemoteProtocolError):
            await http.get("/partial")
        assert transport.open_connections == 0


async def test_a_slow_answer_is_a_read_timeout_and_its_connection_is_dropped() -> None:
    async with client() as (server, http, transport):
        with pytest.raises(httpx.ReadTimeout):
            await http.get("/hold", timeout=httpx.Timeout(5.0, read=0.05))
        assert transport.open_connections == 0
        server.release.set()


async def test_nothing_listening_is_a_connect_error() -> None:
    async with Server() as server:
        port = server.port
    transport = Transport(ssl_context=None, max_connections=2, max_keepalive=2)
    async with httpx.AsyncClient(transport=transport) as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(f"http://127.0.0.1:{port}/echo")
    assert transport.open_connections == 0


async def test_a_closed_transport_takes_no_request() -> None:
    async with client() as (_server, http, transport):
        await http.get("/echo")
        await transport.aclose()
        assert transport.open_connections == 0
        with pytest.raises(RuntimeError, match="closed"):
            await http.get("/echo")


async def test_a_kubeconfig_with_a_proxy_keeps_httpxs_transport(
    api_server: respx.MockRouter,
) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "t",
                "cluster": {
                    "server": "https://k8s.test:6443",
                    "insecure-skip-tls-verify": True,
                    "proxy-url": "http://proxy.test:3128",
                },
            }
        ],
        "users": [{"name": "t", "user": {"token": "t"}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
        "current-context": "t",
    }
    api = await kr8s.asyncio.api(kubeconfig=config)  # type: ignore[arg-type]
    await api._create_session()
    await _widen_pool(api, httpx.Limits(max_connections=4, max_keepalive_connections=2))
    assert api._session is not None
    assert not isinstance(api._session._transport, Transport)
    await Kube(api).close()


@pytest.fixture
def tls(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(the server's context for 127.0.0.1 and "apiserver.test", a client's trusting its CA)."""
    generate_pki(tmp_path / "pki")
    cert = issue_serving_cert(tmp_path / "pki", ["127.0.0.1", "apiserver.test"], name="server")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert.cert_file, cert.key_file)
    return server, ssl.create_default_context(cafile=str(cert.ca_file))


async def test_tls_requests_keep_their_connection_and_bodies(
    tls: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    server_ctx, client_ctx = tls
    big = bytes(range(256)) * (3 * READ_SIZE // 256 + 7)  # several TLS records and reads
    transport = Transport(ssl_context=client_ctx, max_connections=4, max_keepalive=4)
    async with (
        Server(server_ctx) as server,
        httpx.AsyncClient(base_url=server.url, transport=transport) as http,
    ):
        for _ in range(3):
            resp = await http.post("/echo", content=big)
            assert resp.content == big
        assert server.connections == transport.connections_opened == 1


async def test_tls_checks_the_name_and_takes_the_sni_extension(
    tls: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    server_ctx, client_ctx = tls
    transport = Transport(ssl_context=client_ctx, max_connections=4, max_keepalive=4)
    async with Server(server_ctx) as server, httpx.AsyncClient(transport=transport) as http:
        # localhost is not in the certificate: refused, as a ConnectError naming why
        with pytest.raises(httpx.ConnectError, match="certificate verify failed"):
            await http.get(f"https://localhost:{server.port}/echo")
        # kr8s's tls-server-name: the name checked is the extension's
        resp = await http.get(
            f"https://localhost:{server.port}/echo",
            extensions={"sni_hostname": "apiserver.test"},
        )
        assert resp.text == "/echo"
        assert transport.open_connections == 1


async def test_tls_refuses_a_server_its_ca_does_not_trust(
    tls: tuple[ssl.SSLContext, ssl.SSLContext], tmp_path: Path
) -> None:
    server_ctx, _ = tls
    generate_pki(tmp_path / "other")
    other = ssl.create_default_context(cafile=str(tmp_path / "other" / "ca.crt"))
    transport = Transport(ssl_context=other, max_connections=4, max_keepalive=4)
    async with Server(server_ctx) as server, httpx.AsyncClient(transport=transport) as http:
        with pytest.raises(httpx.ConnectError, match="certificate verify failed"):
            await http.get(f"{server.url}/echo")
        assert transport.open_connections == 0
        assert server.requests == []


async def test_a_large_body_read_slowly_arrives_whole(
    tls: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    """More than the wire buffers before it pauses reading (a lagging watch consumer)."""
    server_ctx, client_ctx = tls
    transport = Transport(ssl_context=client_ctx, max_connections=4, max_keepalive=4)
    async with (
        Server(server_ctx) as server,
        httpx.AsyncClient(base_url=server.url, transport=transport) as http,
    ):
        got = bytearray()
        async with http.stream("GET", "/big") as resp:
            async for chunk in resp.aiter_raw():
                got += chunk
                for _ in range(20):
                    await server_turn()  # the server writes on meanwhile
        assert bytes(got) == bytes(range(256)) * 4096
        assert (await http.get("/echo")).text == "/echo"
        assert server.connections == 1


async def test_a_new_tls_connection_resumes_the_last_session(
    tls: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    """No certificate exchange once a session is known: a burst of new
    connections (evictions) costs a resumption each, not a full handshake."""
    server_ctx, client_ctx = tls
    transport = Transport(ssl_context=client_ctx, max_connections=8, max_keepalive=8)
    async with (
        Server(server_ctx) as server,
        httpx.AsyncClient(base_url=server.url, transport=transport) as http,
    ):
        assert (await http.get("/echo")).text == "/echo"  # a full handshake; its ticket kept
        assert transport.sessions_resumed == 0
        server.release.set()
        answers = await asyncio.gather(*(http.get("/hold") for _ in range(4)))
        assert [a.text for a in answers] == ["/hold"] * 4
        assert transport.connections_opened == server.connections == 4
        assert transport.sessions_resumed == 3  # the three opened for the burst
        assert transport.sessions_taken == 1  # a resumed session is not copied again


async def test_a_kept_session_resumes_many_connections_and_is_renewed_when_old(
    tls: tuple[ssl.SSLContext, ssl.SSLContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    server_ctx, client_ctx = tls
    transport = Transport(ssl_context=client_ctx, max_connections=16, max_keepalive=16)
    async with (
        Server(server_ctx) as server,
        httpx.AsyncClient(base_url=server.url, transport=transport) as http,
    ):
        server.release.set()

        async def burst(n: int) -> None:
            answers = await asyncio.gather(*(http.get("/hold") for _ in range(n)))
            assert [a.text for a in answers] == ["/hold"] * n

        assert (await http.get("/echo")).text == "/echo"  # full handshake, session taken
        await burst(4)
        await burst(8)  # 7 new connections in all, every one on that first session
        assert (transport.connections_opened, transport.sessions_resumed) == (8, 7)
        assert transport.sessions_taken == 1
        monkeypatch.setattr("nmo.kube.transport.SESSION_MAX_AGE", 0.0)
        await burst(10)  # two more, resumed, and their (newer) sessions taken
        assert (transport.connections_opened, transport.sessions_resumed) == (10, 9)
        assert transport.sessions_taken == 3


async def test_a_waiter_cancelled_after_its_wake_up_passes_it_on() -> None:
    async with client(max_connections=1, max_keepalive=1) as (server, http, transport):
        held = asyncio.create_task(http.get("/hold"))
        while not server.requests:
            await server_turn()
        long = httpx.Timeout(60.0)
        first = asyncio.create_task(http.get("/echo", timeout=long))
        second = asyncio.create_task(http.get("/echo", timeout=long))
        while len(transport._waiters) < 2:
            await server_turn()
        wake = transport._wake

        def wake_then_cancel() -> None:  # `first` is woken, and cancelled before it runs
            transport._wake = wake  # type: ignore[method-assign]
            wake()
            first.cancel()

        transport._wake = wake_then_cancel  # type: ignore[method-assign]
        server.release.set()
        assert (await held).text == "/hold"
        assert (await asyncio.wait_for(second, 5)).text == "/echo"  # not stuck for 60 s
        assert first.cancelled()
        assert server.connections == transport.connections_opened == 1


# -- found in review (each failed before its fix) ------------------------------


async def test_without_a_context_httpxs_default_is_built_once_and_sessions_resume(
    tls: tuple[ssl.SSLContext, ssl.SSLContext], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kr8s's ssl_context() is True for a kubeconfig with no CA nor client cert:
    httpx's default context (SSL_CERT_FILE here), one for every connection, so
    a session taken on one resumes on the next (a context per connection made
    every second connection fail with a ValueError)."""
    server_ctx, _ = tls
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "pki" / "ca.crt"))
    transport = Transport(ssl_context=None, max_connections=8, max_keepalive=8)
    async with (
        Server(server_ctx) as server,
        httpx.AsyncClient(base_url=server.url, transport=transport) as http,
    ):
        assert (await http.get("/echo")).text == "/echo"
        server.release.set()
        answers = await asyncio.gather(http.get("/hold"), http.get("/hold"))
        assert [a.text for a in answers] == ["/hold", "/hold"]
        assert transport.sessions_resumed == 1


async def test_a_request_cancelled_in_the_handshake_closes_its_socket() -> None:
    accepted = asyncio.Event()
    closed = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        await reader.read()  # the ClientHello is never answered; b"" once the client closes
        while not reader.at_eof():
            await reader.read()
        closed.set()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = Transport(
        ssl_context=ssl.create_default_context(), max_connections=2, max_keepalive=2
    )
    async with httpx.AsyncClient(transport=transport) as http:
        task = asyncio.create_task(http.get(f"https://127.0.0.1:{port}/", timeout=30))
        await accepted.wait()
        for _ in range(5):
            await server_turn()  # the ClientHello is out: the request waits for the answer
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(closed.wait(), 5)  # the server saw the client close
        assert transport.open_connections == 0
    server.close()


async def test_a_body_closed_while_its_reader_was_woken_is_not_pooled() -> None:
    """aclose() from another task between the wake-up and the read: the
    connection is dropped once, never pooled (it used to be pooled closed, and
    its slot given back twice)."""
    async with client(max_connections=4, max_keepalive=4) as (server, http, transport):
        async with http.stream("GET", "/stream") as resp:
            chunks = resp.aiter_raw()
            body: Any = resp.stream
            wire = body._stream._conn.wire

            async def next_chunk() -> bytes:
                return await anext(chunks)

            got = b""
            while b"line2" not in got:  # the two chunks the server sends at once
                got += await next_chunk()
            reader = asyncio.create_task(next_chunk())
            while wire._waiter is None:  # it waits on the socket (the last chunk held)
                await server_turn()
            wire.data_received(b"6\r\nline3\n\r\n0\r\n\r\n")  # the end arrives: woken
            await resp.aclose()  # ...and the body is closed before the reader runs
            with pytest.raises(httpx.StreamClosed):
                await reader
        assert not any(transport._idle.values())
        assert transport.open_connections == 0
        server.release.set()
        assert (await http.get("/echo")).text == "/echo"
        assert transport.open_connections == 1


async def test_a_header_h11_refuses_is_an_httpx_transport_error() -> None:
    async with client() as (_server, http, transport):
        with pytest.raises(httpx.LocalProtocolError):
            await http.get("/echo", headers={"Authorization": "Bearer abc\x00"})
        assert transport.open_connections == 0


async def test_a_response_head_of_21_kib_in_two_reads_is_read() -> None:
    warnings = b"".join(b'Warning: 299 - "%s"\r\n' % (b"x" * 200) for _ in range(100))
    head = b"HTTP/1.1 200 OK\r\n" + warnings

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(head[:17000])
        await writer.drain()
        for _ in range(5):
            await server_turn()
        writer.write(head[17000:] + b"Content-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = Transport(ssl_context=None, max_connections=1, max_keepalive=1)
    async with httpx.AsyncClient(transport=transport) as http:
        resp = await http.get(f"http://127.0.0.1:{port}/")
        assert resp.text == "ok" and len(resp.headers.get_list("warning")) == 100
    server.close()


@pytest.mark.parametrize(
    ("env", "ours"),
    [
        ({"HTTPS_PROXY": "http://proxy.test:3128"}, False),
        ({"ALL_PROXY": "http://proxy.test:3128"}, False),
        ({"HTTPS_PROXY": "http://proxy.test:3128", "NO_PROXY": "k8s.test"}, True),
        ({}, True),
    ],
)
async def test_a_proxy_from_the_environment_keeps_httpxs_transport(
    api_server: respx.MockRouter,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    ours: bool,
) -> None:
    """httpx reads HTTP(S)_PROXY, ALL_PROXY and NO_PROXY only without a transport
    of one's own: nmo's is used only when the environment proxies nothing."""
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    api = await kr8s.asyncio.api(kubeconfig=KUBECONFIG)  # type: ignore[arg-type]
    await api._create_session()
    await _widen_pool(api, httpx.Limits(max_connections=4, max_keepalive_connections=2))
    assert api._session is not None
    assert isinstance(api._session._transport, Transport) is ours
    await Kube(api).close()
