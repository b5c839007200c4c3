"""Accepting connections with bounds: how many, and how long before a request.

Why this module exists: the webhook and metrics ports are reachable by any
pod, and asyncio's TLS layer allocates a 256 KiB read buffer for every
accepted socket before a byte is exchanged. uvicorn's own accept path has no
cap and no deadline before the first request, so about 2,000 idle or
trickling sockets filled the 512 Mi limit (issue 14, item 1). nmo accepts
connections itself, one accept loop per port, and hands each one to uvicorn's
protocol.

Guarantees of :class:`Listener` and :class:`GuardedH11Protocol`:

* at most :attr:`ConnectionLimits.max_connections` connections per port exist
  at once (TLS handshakes included); at the cap, the oldest connection that
  has not sent a request's headers within ``drop_after_seconds`` is dropped
  to make room (a real client completes its handshake and request in
  milliseconds, so sockets left idle cannot keep it out); when there is no
  such connection, the new one is closed at once, before any TLS state;
* a TLS handshake must finish within ``handshake_seconds``;
* a request's headers must have arrived within ``header_seconds`` of the
  connection (or of the request's first byte on a kept-alive connection);
  the body's own deadline is the app's (see :mod:`nmo.webhooks.intake`);
* the probes port has its own listener and loop task, so a flood on the
  webhook port only costs it event-loop turns, never a connection slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("nmo.webhooks.listener")


@dataclass(frozen=True)
class ConnectionLimits:
    # 256 connections cost at most 64 MiB of TLS buffers; the apiserver keeps
    # a few connections per webhook, Prometheus one per scrape target.
    max_connections: int = 256
    handshake_seconds: float = 5.0
    header_seconds: float = 10.0
    # At the cap, only a connection this old without a request is dropped for
    # a newcomer; younger ones are left alone and the newcomer is closed at
    # once, before any TLS state exists. A burst of sockets thus costs one
    # cheap accept-and-close each, not a 256 KiB TLS buffer each.
    drop_after_seconds: float = 0.5


class GuardedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for each request's headers."""

    header_seconds: float = ConnectionLimits.header_seconds

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.proven = False  # served a request: no longer the first to be dropped
        self.on_lost: Callable[[], None] | None = None
        self._header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._header_deadline is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # a new request begins on a kept-alive connection
        super().data_received(data)

    def on_response_complete(self) -> None:
        self.proven = True
        self._disarm()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        on_lost, self.on_lost = self.on_lost, None
        if on_lost is not None:
            on_lost()

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(self.header_seconds, self._headers_late)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_late(self) -> None:
        self._header_deadline = None
        if self.cycle is not None and not self.cycle.response_complete:
            return  # the headers are in: the app is reading the body or answering
        if not self.transport.is_closing():
            log.debug("closing a connection that sent no request headers in time")
            self.transport.abort()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """A :class:`GuardedH11Protocol` class with these limits (uvicorn's ``http``)."""
    return type(
        "GuardedH11Protocol", (GuardedH11Protocol,), {"header_seconds": limits.header_seconds}
    )


class _Connection:
    __slots__ = ("born", "protocol", "setup")

    def __init__(self, born: float) -> None:
        self.born = born
        self.setup: asyncio.Task[None] | None = None
        self.protocol: GuardedH11Protocol | None = None

    @property
    def proven(self) -> bool:
        """Served a request, or has one whose headers are in: not dropped at the cap."""
        p = self.protocol
        if p is None:
            return False
        return p.proven or (p.cycle is not None and not p.cycle.response_complete)

    def drop(self) -> None:
        if self.protocol is not None:
            self.protocol.transport.abort()
        elif self.setup is not None:
            self.setup.cancel()  # still in its TLS handshake


class Listener:
    """One port's accept loop; quacks like the ``asyncio.Server`` uvicorn closes."""

    def __init__(
        self,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.Protocol],
        *,
        ssl_context: ssl.SSLContext | None,
        limits: ConnectionLimits,
        name: str,
    ) -> None:
        self._sock = sock
        self._factory = protocol_factory
        self._ssl = ssl_context
        self.limits = limits
        self.name = name
        self.connections: dict[_Connection, None] = {}  # in accept order
        self.refused = 0
        self.dropped = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._sock.setblocking(False)
        self._task = asyncio.create_task(self._accept_loop(), name=f"nmo-{self.name}-accept")

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def wait_closed(self) -> None:
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn_sock, _ = await loop.sock_accept(self._sock)
            except OSError as exc:  # EMFILE and the like: pause, do not spin
                log.warning("accept failed on the %s port: %s", self.name, exc)
                await asyncio.sleep(0.1)
                continue
            if len(self.connections) >= self.limits.max_connections and not self._make_room():
                self.refused += 1
                conn_sock.close()
                continue
            conn = _Connection(loop.time())
            self.connections[conn] = None
            conn.setup = asyncio.create_task(self._serve(conn, conn_sock))

    def _make_room(self) -> bool:
        # Accept order: the first unproven connection is the oldest one.
        victim = next((c for c in self.connections if not c.proven), None)
        old_enough = asyncio.get_running_loop().time() - self.limits.drop_after_seconds
        if victim is None or victim.born > old_enough:
            return False
        self.dropped += 1
        del self.connections[victim]
        victim.drop()
        return True

    async def _serve(self, conn: _Connection, conn_sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        protocol = self._factory()

        def lost() -> None:
            self.connections.pop(conn, None)

        if isinstance(protocol, GuardedH11Protocol):
            protocol.on_lost = lost
        try:
            if self._ssl is None:
                await loop.connect_accepted_socket(lambda: protocol, conn_sock)
            else:
                await loop.connect_accepted_socket(
                    lambda: protocol,
                    conn_sock,
                    ssl=self._ssl,
                    ssl_handshake_timeout=self.limits.handshake_seconds,
                )
        except (OSError, ssl.SSLError, asyncio.CancelledError, TimeoutError, ConnectionError):
            lost()
            with contextlib.suppress(OSError):
                conn_sock.close()
            return
        conn.setup = None
        if isinstance(protocol, GuardedH11Protocol):
            conn.protocol = protocol
            if conn not in self.connections:  # dropped while its handshake ended
                protocol.transport.abort()
