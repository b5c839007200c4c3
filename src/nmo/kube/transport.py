"""nmo's HTTP/1.1 transport to the API server: asyncio streams, h11, a plain pool.

httpx's default transport (httpcore over anyio) costs more CPU than the
request itself once many requests are in flight: on every request and every
response its pool walks all its connections, for each idle one asking anyio
(a dict built per call) and ``poll(2)`` whether the server closed it, and it
counts idle connections once per idle connection (quadratic). A drain of
1,000 pods spent over half of nmo's CPU there (docs/performance.md).

This transport keeps what nmo needs and nothing else:

* HTTP/1.1 with keep-alive over an asyncio protocol (TLS through
  :class:`ssl.MemoryBIO` with the kubeconfig's :class:`ssl.SSLContext`, the
  ``sni_hostname`` extension kr8s sets for ``tls-server-name``), parsed by
  h11, as httpcore does;
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
# A resumed connection's session is taken again after this long (a Go API
# server's ticket keys rotate daily and live a week).
SESSION_MAX_AGE = 3600.0
# The reason phrase of a status line, as httpx expects it in the extensions.
_HTTP11 = b"HTTP/1.1"


def _timeouts(request: httpx.Request) -> dict[str, float | None]:
    value: dict[str, float | None] = request.extensions.get("timeout") or {}
    return value


class _Wire(asyncio.Protocol):
    """One connection's bytes, plain or TLS through :class:`ssl.MemoryBIO`.

    asyncio's own TLS (``open_connection(ssl=...)``) keeps a 256 KiB read
    buffer per connection, for the connection's life: 12.5 MiB of RSS with
    50 evictions in flight. Here TLS records are decrypted as they arrive,
    in 64 KiB reads, into a buffer only as large as what is unread.
    """

    def __init__(
        self,
        tls: ssl.SSLContext | None,
        server_hostname: str,
        session: ssl.SSLSession | None = None,
    ) -> None:
        self._sslobj: ssl.SSLObject | None = None
        self._in = self._out = None
        if tls is not None:
            self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
            self._sslobj = tls.wrap_bio(
                self._in, self._out, server_hostname=server_hostname, session=session
            )
        loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[None] = loop.create_future()  # connected (handshake done)
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None  # set while writing is paused
        self._paused = False

    # -- asyncio's side ------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if self._sslobj is None:
            self.ready.set_result(None)
        else:
            self._handshake()

    def data_received(self, data: bytes) -> None:
        if self._sslobj is None:
            self._buffer += data
        else:
            assert self._in is not None
            self._in.write(data)
            if not self.ready.done():
                self._handshake()
            if self.ready.done():
                self._decrypt()
        if len(self._buffer) > 4 * READ_SIZE and self._transport is not None:
            self._transport.pause_reading()  # a reader that lags (a watch's consumer)
            self._paused = True
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        if exc is not None and self._error is None:
            self._error = exc
        if not self.ready.done():
            self.ready.set_exception(exc or ConnectionResetError("connection closed"))
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._wake()

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # -- TLS -----------------------------------------------------------------
    def _handshake(self) -> None:
        assert self._sslobj is not None
        try:
            self._sslobj.do_handshake()
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLError as exc:
            self._flush()
            self.ready.set_exception(exc)
            if self._transport is not None:
                self._transport.close()
            return
        else:
            self.ready.set_result(None)
        self._flush()

    def _decrypt(self) -> None:
        assert self._sslobj is not None
        while True:
            try:
                chunk = self._sslobj.read(READ_SIZE)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:  # the server's close_notify
                self._eof = True
                break
            except ssl.SSLError as exc:
                self._error = exc
                break
            if not chunk:
                self._eof = True
                break
            self._buffer += chunk
        self._flush()  # TLS 1.3 may answer (a key update)

    def _flush(self) -> None:
        if self._out is not None and self._out.pending and self._transport is not None:
            self._transport.write(self._out.read())

    # -- the connection's side -------------------------------------------------
    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def read(self) -> bytes:
        """What has arrived (up to 64 KiB), waiting for some; b"" at the end."""
        while not self._buffer and not self._eof and self._error is None:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._buffer:
            data = bytes(self._buffer[:READ_SIZE])
            del self._buffer[:READ_SIZE]
            if self._paused and len(self._buffer) < READ_SIZE and self._transport is not None:
                self._transport.resume_reading()
                self._paused = False
            return data
        if self._error is not None:
            raise self._error
        return b""

    async def write(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the connection is closed")
        if self._sslobj is None:
            transport.write(data)
        else:
            self._sslobj.write(data)
            self._flush()
        if self._writable is not None:
            await self._writable

    @property
    def resumed(self) -> bool:
        return self._sslobj is not None and self._sslobj.session_reused

    @property
    def session(self) -> ssl.SSLSession | None:
        """The TLS session to resume on the next connection (TLS 1.3 sends its
        ticket after the handshake: there once a response was read)."""
        return None if self._sslobj is None else self._sslobj.session

    def usable(self) -> bool:
        """Open, nothing unread, the server has not closed it."""
        transport = self._transport
        return (
            transport is not None
            and not transport.is_closing()
            and not self._eof
            and not self._buffer
            and self._error is None
        )

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class _Connection:
    """One keep-alive connection: its bytes and its h11 state machine."""

    __slots__ = ("dropped", "fresh", "h11", "idle_since", "origin", "sni", "wire")

    def __init__(self, origin: Origin, wire: _Wire, sni: str) -> None:
        self.origin = origin
        self.wire = wire
        self.sni = sni
        self.fresh = True  # no response read yet
        self.dropped = False
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=100 * 1024)
        self.idle_since = 0.0

    def reusable(self, now: float, expiry: float) -> bool:
        """Idle, not expired, and the server has not closed it (nor sent anything)."""
        return now - self.idle_since < expiry and self.wire.usable()

    def close(self) -> None:
        self.wire.close()

    async def send(self, request: httpx.Request, body: bytes, timeout: float | None) -> None:
        headers = request.headers.raw
        target = request.url.raw_path
        try:
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
        except h11.LocalProtocolError as exc:
            raise httpx.LocalProtocolError(str(exc), request=request) from exc
        try:
            async with asyncio.timeout(timeout):
                await self.wire.write(b"".join(data))
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
                    data = await self.wire.read()
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
            if self._conn is not conn:  # closed meanwhile (aclose): already discarded
                raise httpx.StreamClosed()
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
        # kr8s's ssl_context() is True (not a context) when the kubeconfig names no
        # CA, client cert nor insecure flag: httpx's default then (certifi or
        # SSL_CERT_FILE), built once -- a TLS session resumes only on its own context.
        self._ssl = ssl_context if ssl_context is not None else httpx.create_ssl_context()
        self.max_connections = max_connections  # open at once, busy or idle
        self.max_keepalive = max_keepalive  # idle ones kept
        self.keepalive_expiry = keepalive_expiry  # seconds an idle one is kept
        self._idle: dict[Origin, deque[_Connection]] = {}
        self._idle_count = 0
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        # A TLS session per (origin, server name) and when it was taken: a new
        # connection resumes it (no certificate exchange, no signature) instead
        # of a full handshake.
        self._sessions: dict[tuple[Origin, str], tuple[ssl.SSLSession, float]] = {}
        self._closed = False
        self.connections_opened = 0  # for tests and the benchmarks
        self.sessions_resumed = 0
        self.sessions_taken = 0

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
        except BaseException as exc:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            elif waiter.done() and not waiter.cancelled():
                self._wake()  # woken, then cancelled: the free slot goes to the next
            if isinstance(exc, TimeoutError):
                raise httpx.PoolTimeout("no connection free in time", request=request) from exc
            raise

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
        sni = request.extensions.get("sni_hostname") or host
        loop = asyncio.get_running_loop()
        wire: _Wire | None = None
        try:
            async with asyncio.timeout(timeout):
                kept = self._sessions.get((origin, sni)) if tls is not None else None
                session = None if kept is None else kept[0]
                _, wire = await loop.create_connection(lambda: _Wire(tls, sni, session), host, port)
                await wire.ready
        except TimeoutError as exc:
            if wire is not None:
                wire.close()
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from exc
        except (OSError, ssl.SSLError) as exc:
            if wire is not None:
                wire.close()
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from exc
        except BaseException:  # cancelled mid-handshake: nobody else will close it
            if wire is not None:
                wire.close()
            raise
        self.connections_opened += 1
        if wire.resumed:
            self.sessions_resumed += 1
        return _Connection(origin, wire, sni)

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
        now = time.monotonic()
        if conn.fresh:  # its first response: the server's ticket has come with it
            conn.fresh = False
            self._keep_session(conn, now)
        conn.idle_since = now
        self._idle.setdefault(conn.origin, deque()).append(conn)
        self._idle_count += 1
        self._wake()

    def _keep_session(self, conn: _Connection, now: float) -> None:
        """Keep ``conn``'s TLS session for the next connections, unless it resumed
        one that is still young: asking OpenSSL for a session copies it (its
        certificates serialized and parsed again), which costs as much as a
        request, and a Go API server takes a ticket more than once."""
        key = (conn.origin, conn.sni)
        kept = self._sessions.get(key)
        if kept is not None and conn.wire.resumed and now - kept[1] < SESSION_MAX_AGE:
            return
        session = conn.wire.session
        self.sessions_taken += 1
        if session is not None:
            self._sessions[key] = (session, now)

    def _discard(self, conn: _Connection) -> None:
        self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        if conn.dropped:  # its slot was given back already
            return
        conn.dropped = True
        conn.close()
        self._open -= 1
        self._wake()

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            while idle:
                self._drop(idle.popleft())
        self._idle_count = 0
