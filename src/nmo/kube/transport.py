"""nmo's HTTP/1.1 transport to the API server: asyncio streams, h11, a plain pool.

httpx's default transport (httpcore over anyio) costs more CPU than the
request itself once many requests are in flight: on every request and every
response its pool walks all its connections, for each idle one asking anyio
(a dict built per call) and ``poll(2)`` whether the server closed it, and it
counts idle connections once per idle connection (quadratic). A drain of
1,000 pods spent over half of nmo's CPU there (docs/performance.md).

This transport keeps what nmo needs and nothing else:

* HTTP/1.1 with keep-alive over ``asyncio.open_connection`` (TLS with the
  kubeconfig's :class:`ssl.SSLContext`, the ``sni_hostname`` extension kr8s
  sets for ``tls-server-name``), parsed by h11, as httpcore does;
* a pool per origin: a LIFO stack of idle connections, taken in O(1); one
  the server closed (asyncio saw the EOF) or idle past ``keepalive_expiry``
  is dropped, never reused; at most ``max_connections`` open (a request past
  that waits, bounded by the pool timeout), at most ``max_keepalive`` idle;
* httpx's timeouts (connect, read, write, pool) and exceptions
  (:class:`httpx.ConnectError`, :class:`httpx.ReadTimeout`, ...), so
  kr8s and :mod:`nmo.kube.client` see what they saw from httpx's transport;
* responses streamed (watches): a body read to its end gives the connection
  back, a body closed early (a cancelled watch) closes it.

No proxy: when the kubeconfig names one, :mod:`nmo.kube.client` keeps httpx's
own transport.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import h11
import httpx

Origin = tuple[str, str, int]  # scheme, host, port
READ_SIZE = 64 * 1024
# The reason phrase of a status line, as httpx expects it in the extensions.
_HTTP11 = b"HTTP/1.1"


def _timeouts(request: httpx.Request) -> dict[str, float | None]:
    value: dict[str, float | None] = request.extensions.get("timeout") or {}
    return value


class _Connection:
    """One keep-alive connection: its streams and its h11 state machine."""

    __slots__ = ("h11", "idle_since", "origin", "reader", "writer")

    def __init__(
        self, origin: Origin, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.origin = origin
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0

    def reusable(self, now: float, expiry: float) -> bool:
        """Idle, not expired, and the server has not closed it (nor sent anything)."""
        return (
            now - self.idle_since < expiry
            and not self.reader.at_eof()
            and not self.reader._buffer  # type: ignore[attr-defined]  # bytes before a request: broken
            and not self.writer.transport.is_closing()
        )

    def close(self) -> None:
        self.writer.close()

    async def send(self, request: httpx.Request, body: bytes, timeout: float | None) -> None:
        headers = request.headers.raw
        target = request.url.raw_path
        out = self.h11.send(h11.Request(method=request.method, target=target, headers=headers))
        assert out is not None
        data = [out]
        if body:
            chunk = self.h11.send(h11.Data(data=body))
            assert chunk is not None
            data.append(chunk)
        end = self.h11.send(h11.EndOfMessage())
        assert end is not None
        data.append(end)
        try:
            self.writer.write(b"".join(data))
            async with asyncio.timeout(timeout):
                await self.writer.drain()
        except TimeoutError as exc:
            raise httpx.WriteTimeout("timed out writing the request", request=request) from exc
        except OSError as exc:
            raise httpx.WriteError(str(exc) or type(exc).__name__, request=request) from exc

    async def next_event(self, request: httpx.Request, timeout: float | None) -> Any:
        """The next h11 event of the response, reading from the socket as needed."""
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise httpx.RemoteProtocolError(str(exc), request=request) from exc
            if event is not h11.NEED_DATA:
                return event
            try:
                async with asyncio.timeout(timeout):
                    data = await self.reader.read(READ_SIZE)
            except TimeoutError as exc:
                raise httpx.ReadTimeout("timed out reading the response", request=request) from exc
            except (OSError, ssl.SSLError) as exc:
                raise httpx.ReadError(str(exc) or type(exc).__name__, request=request) from exc
            if not data and self.h11.their_state is h11.SEND_RESPONSE:
                raise httpx.RemoteProtocolError(
                    "Server disconnected without sending a response.", request=request
                )
            self.h11.receive_data(data)  # b"" past the status line: h11 says what it means


class _Body(httpx.AsyncByteStream):
    """A response body read off its connection; gives the connection back at its end."""

    def __init__(
        self, pool: Transport, conn: _Connection, request: httpx.Request, timeout: float | None
    ) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self._request = request
        self._timeout = timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            return
        while True:
            event = await conn.next_event(self._request, self._timeout)
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._conn = None
                self._pool._finished(conn)
                return
            elif isinstance(event, h11.ConnectionClosed):
                self._conn = None
                self._pool._discard(conn)
                raise httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body",
                    request=self._request,
                )

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:  # not read to its end (a cancelled watch): not reusable
            self._pool._discard(conn)


class Transport(httpx.AsyncBaseTransport):
    """See the module docstring."""

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None,
        max_connections: float,
        max_keepalive: float,
        keepalive_expiry: float = 5.0,
    ) -> None:
        self._ssl = ssl_context
        self.max_connections = max_connections  # open at once, busy or idle
        self.max_keepalive = max_keepalive  # idle ones kept
        self.keepalive_expiry = keepalive_expiry  # seconds an idle one is kept
        self._idle: dict[Origin, deque[_Connection]] = {}
        self._idle_count = 0
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False
        self.connections_opened = 0  # for tests and the benchmarks

    @property
    def open_connections(self) -> int:
        return self._open

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise RuntimeError("the transport is closed")
        url = request.url
        scheme = url.scheme
        if scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported scheme {scheme!r}", request=request)
        port = url.port or (443 if scheme == "https" else 80)
        origin: Origin = (scheme, url.host, port)
        timeouts = _timeouts(request)
        body = await request.aread()
        conn = await self._acquire(origin, request, timeouts)
        try:
            await conn.send(request, body, timeouts.get("write"))
            read_timeout = timeouts.get("read")
            event = await conn.next_event(request, read_timeout)
            while isinstance(event, h11.InformationalResponse):
                event = await conn.next_event(request, read_timeout)
            if isinstance(event, h11.ConnectionClosed):
                raise httpx.RemoteProtocolError(
                    "Server disconnected without sending a response.", request=request
                )
            assert isinstance(event, h11.Response), event
        except BaseException:
            self._discard(conn)
            raise
        return httpx.Response(
            event.status_code,
            headers=event.headers.raw_items(),
            stream=_Body(self, conn, request, read_timeout),
            extensions={"http_version": _HTTP11, "reason_phrase": bytes(event.reason)},
        )

    # -- the pool ----------------------------------------------------------
    async def _acquire(
        self, origin: Origin, request: httpx.Request, timeouts: dict[str, float | None]
    ) -> _Connection:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            self._idle_count -= 1
            if conn.reusable(now, self.keepalive_expiry):
                return conn
            self._drop(conn)
        while self._open >= self.max_connections:
            if not self._close_one_idle():
                await self._wait(request, timeouts.get("pool"))
                idle = self._idle.get(origin)
                if idle:  # a connection came back meanwhile
                    return await self._acquire(origin, request, timeouts)
        self._open += 1
        try:
            return await self._connect(origin, request, timeouts.get("connect"))
        except BaseException:
            self._open -= 1
            self._wake()
            raise

    async def _wait(self, request: httpx.Request, timeout: float | None) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError as exc:
            raise httpx.PoolTimeout("no connection free in time", request=request) from exc
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _close_one_idle(self) -> bool:
        for idle in self._idle.values():
            if idle:
                self._idle_count -= 1
                self._drop(idle.popleft())
                return True
        return False

    async def _connect(
        self, origin: Origin, request: httpx.Request, timeout: float | None
    ) -> _Connection:
        scheme, host, port = origin
        tls = self._ssl if scheme == "https" else None
        if scheme == "https" and tls is None:
            tls = ssl.create_default_context()
        sni = request.extensions.get("sni_hostname") or host
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    host,
                    port,
                    ssl=tls,
                    server_hostname=sni if tls is not None else None,
                    limit=READ_SIZE,
                )
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from exc
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from exc
        self.connections_opened += 1
        return _Connection(origin, reader, writer)

    def _finished(self, conn: _Connection) -> None:
        """A response was read to its end: keep the connection for the next request."""
        state = conn.h11
        if (
            self._closed
            or state.our_state is not h11.DONE
            or state.their_state is not h11.DONE
            or self._idle_count >= self.max_keepalive
        ):
            self._discard(conn)
            return
        state.start_next_cycle()
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.origin, deque()).append(conn)
        self._idle_count += 1
        self._wake()

    def _discard(self, conn: _Connection) -> None:
        self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        conn.close()
        self._open -= 1
        self._wake()

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            while idle:
                self._drop(idle.popleft())
        self._idle_count = 0
