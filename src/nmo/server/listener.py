"""Accepting connections with bounds: how many, from whom, and for how long.

Why this module exists: the webhook and metrics ports are reachable by any
pod, and asyncio's TLS layer allocates a 256 KiB read buffer for every
accepted socket before a byte is exchanged. uvicorn's own accept path has no
cap and no deadline before the first request, so about 2,000 idle or
trickling sockets filled the 512 Mi limit (issue 14, item 1); and a cap alone
is a lock anyone can hold: 256 connections that each sent one request and
then idle through the keep-alive kept the apiserver out (issue 20). nmo
accepts connections itself, one accept loop per port, and hands each one to
uvicorn's protocol.

Guarantees of :class:`Listener` and :class:`GuardedH11Protocol`:

* at most :attr:`ConnectionLimits.max_connections` connections per port exist
  at once (TLS handshakes included), and at most
  :attr:`ConnectionLimits.max_per_source` from one peer address (a pod, a
  node; an IPv4-mapped IPv6 address counts as its IPv4 one);
* a newcomer over either bound takes the place of an *idle* connection,
  closed for it: between requests (the keep-alive wait), or still without a
  request ``drop_after_seconds`` after it was accepted, or uploading a body
  more than ``upload_grace_seconds`` after its headers (a real client sends a
  review's few KiB at once). Over the per-source bound, the victim is that
  source's least recently used idle connection; over the port's bound, the
  least recently used idle connection of the source holding the most
  connections (a flood's own, before the apiserver's one or two), and never
  one of another source holding no more than the newcomer's: under a flood, a
  client's slow handshake must not make its connection the flood's prey.
  When the heaviest source has no idle connection, a newcomer from a source
  lighter even once it is in takes the place of a *young* one (in its
  handshake, its first request or its upload's grace): a flood that
  reconnects as fast as it is closed cannot keep every slot young. When
  there is none, the newcomer is closed at once, before any TLS state;
* once a quarter of the port is taken, or when a connection is closed for
  it, a source's newcomer needs one of the source's ``admit_burst`` tokens
  (refilled at ``admit_rate`` a second), or it is closed at once too: a
  flood cannot turn its losses into a TLS handshake (a CPU cost) each;
* a connection is *used* when it is accepted, when a request's headers
  arrive and when a response ends;
* the backlog is drained in batches, so a real client's connection does not
  wait a turn of the loop for each connection of a flood queued before it;
* a connection answering a request is never closed for a newcomer;
* a TLS handshake must finish within ``handshake_seconds``;
* a request's headers must have arrived within ``header_seconds`` of the
  connection (or of the request's first byte on a kept-alive connection);
  the body's own deadline and minimum rate are the app's (see
  :mod:`nmo.server.intake`);
* the probes port has its own listener and loop task, so a flood on the
  webhook port only costs it event-loop turns, never a connection slot.

A source is one party: the apiserver is told apart from a flood only by
its address, and holding few connections. A flood from the apiserver's own
address (hostNetwork pods on its node, a NAT in between) shares its bounds
and its tokens; from any other address, it competes with itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import ipaddress
import logging
import socket
import ssl
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from nmo.kube.allowance import KeyedBuckets
from nmo.server.intake import BODY_GRACE_SECONDS, BUFFERED

log = logging.getLogger("nmo.webhooks.listener")

ACCEPT_BATCH = 64  # connections taken from the backlog in one turn of the loop, at most


@dataclass(frozen=True)
class ConnectionLimits:
    # 256 connections cost at most 64 MiB of TLS buffers; the apiserver keeps
    # a few connections per webhook, Prometheus one per scrape target.
    max_connections: int = 256
    # One address holds at most a quarter of the port: a pod flooding it
    # competes with its own connections, never with the apiserver's.
    max_per_source: int = 64
    handshake_seconds: float = 5.0
    header_seconds: float = 10.0
    # A connection without a request is closed for a newcomer only once this
    # old: a real client completes its handshake and request in milliseconds,
    # and a burst of sockets costs one cheap accept-and-close each, not a
    # 256 KiB TLS buffer each.
    drop_after_seconds: float = 0.5
    # A body still arriving this long after its headers is a slow upload,
    # closed for a newcomer like an idle connection.
    upload_grace_seconds: float = BODY_GRACE_SECONDS
    # Once a quarter of the port is taken, or when a connection must be closed
    # for it, a source's new connection costs one of its tokens: admit_burst
    # at once, admit_rate a second. A flood that reconnects whatever it loses
    # (or a trickler cut after its grace) is turned away before its TLS
    # handshake, a CPU cost each, instead of churning the port; the
    # apiserver's rare new connection always finds a token.
    admit_rate: float = 1.0
    admit_burst: int = 16


class State(enum.Enum):
    """What closing a connection for a newcomer would cost."""

    IDLE = "idle"  # nothing: between requests, never sent one in time, or a slow upload
    YOUNG = "young"  # a client mid-start: handshake, first request or upload under way
    ANSWERING = "answering"  # a review being decided: never closed for a newcomer


@functools.lru_cache(maxsize=1024)
def source_of(host: str) -> str:
    """The peer address connections are counted by (IPv4-mapped IPv6 as IPv4).

    Remembered for the last 1,024 hosts: every review asks it of its peer,
    and parsing an address costs more than the rest of the lookup.
    """
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for each request's headers,
    telling its :class:`Listener` when it is used."""

    header_seconds: float = ConnectionLimits.header_seconds

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.request_started: float | None = None  # loop time the headers arrived
        self.on_lost: Callable[[], None] | None = None
        self.on_used: Callable[[], None] | None = None
        self._header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._header_deadline is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # a new request begins on a kept-alive connection
        super().data_received(data)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's headers are in
            self.request_started = self.loop.time()
            self._used()
            started = self.cycle
            # Its task has not run yet: the response goes out in one write.
            # (A stand-in with every method of a transport, see HeadWithBody.)
            started.transport = HeadWithBody(self.transport, started)  # type: ignore[assignment]
            extensions = started.scope.setdefault("extensions", {})
            extensions[BUFFERED] = {
                "pending": lambda: len(started.body),
                # The next receive returns the rest of the body at once, without waiting.
                "complete": lambda: not started.more_body and started.message_event.is_set(),
            }

    def on_response_complete(self) -> None:
        self._disarm()
        self._used()
        cycle = self.cycle
        if cycle is not None:
            # Undo the two references back to the request that handle_events
            # made (its transport, its body hints): the request's objects are
            # then freed as soon as they are dropped, not left as reference
            # cycles for the collector, whose runs delay every review waiting.
            cycle.transport = self.transport
            cycle.scope.get("extensions", {}).pop(BUFFERED, None)
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        self.on_used = None
        on_lost, self.on_lost = self.on_lost, None
        if on_lost is not None:
            on_lost()

    def state(self, now: float, limits: ConnectionLimits) -> State | None:
        """Whether a newcomer may take this connection's place (see
        :class:`State`); None before its first request (its age decides)."""
        cycle = self.cycle
        if cycle is None:
            return None
        if cycle.response_complete:
            return State.IDLE
        if not cycle.more_body:
            return State.ANSWERING
        started = self.request_started
        if started is not None and now - started >= limits.upload_grace_seconds:
            return State.IDLE  # a slow upload
        return State.YOUNG

    def _used(self) -> None:
        if self.on_used is not None:
            self.on_used()

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


class HeadWithBody:
    """The transport one request's response is written to: its status line and
    headers are held back until the body's first part, and both go out in one
    write.

    uvicorn writes the head when the app starts the response and the body
    when it sends it, and over TLS each write is a record of its own and a
    ``send`` of its own. On loopback and in a VM that send (which wakes the
    client) was the costliest single step of a review (docs/performance.md),
    and a client reads nothing useful from a head alone. Anything else is
    passed through: writes before the response starts (``100 Continue``), and
    a close, which first writes a head still held (an app that failed after
    starting its response).
    """

    __slots__ = ("_cycle", "_head", "_held", "_transport")

    def __init__(self, transport: asyncio.BaseTransport, cycle: Any) -> None:
        self._transport = transport
        self._cycle = cycle
        self._head = b""
        self._held = False  # whether the head came and was held

    def write(self, data: bytes | bytearray | memoryview) -> None:
        transport: Any = self._transport
        if not self._held and self._cycle.response_started:
            self._held = True  # uvicorn marks the response started, then writes its head
            self._head = bytes(data)
            return
        if self._head:
            data, self._head = self._head + data, b""
        transport.write(data)

    def close(self) -> None:
        transport: Any = self._transport
        if self._head:
            transport.write(self._head)
            self._head = b""
        transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """A :class:`GuardedH11Protocol` class with these limits (uvicorn's ``http``)."""
    return type(
        "GuardedH11Protocol", (GuardedH11Protocol,), {"header_seconds": limits.header_seconds}
    )


class _Connection:
    __slots__ = ("born", "protocol", "setup", "source", "used")

    def __init__(self, born: float, source: str) -> None:
        self.born = born
        self.used = born
        self.source = source
        self.setup: asyncio.Task[None] | None = None
        self.protocol: GuardedH11Protocol | None = None

    def state(self, now: float, limits: ConnectionLimits) -> State:
        state = None if self.protocol is None else self.protocol.state(now, limits)
        if state is None:  # in its TLS handshake, or no request yet
            return State.IDLE if now - self.born >= limits.drop_after_seconds else State.YOUNG
        return state

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
        # Per peer address, least recently used first.
        self.sources: dict[str, OrderedDict[_Connection, None]] = {}
        self.refused = 0
        self.dropped = 0
        self._admitting = KeyedBuckets(limits.admit_rate, limits.admit_burst, max_keys=4096)
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

    def held(self, source: str) -> int:
        """How many connections from ``source`` are open."""
        return len(self.sources.get(source_of(source), ()))

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn_sock, address = await loop.sock_accept(self._sock)
            except OSError as exc:  # EMFILE and the like: pause, do not spin
                log.warning("accept failed on the %s port: %s", self.name, exc)
                await asyncio.sleep(0.1)
                continue
            self._take(conn_sock, address, loop.time())
            # Whatever else waits in the backlog, in the same turn of the loop:
            # one accept a turn would leave a real client's connection queued
            # behind a flood's while handshakes fill the turns.
            for _ in range(ACCEPT_BATCH):
                try:
                    conn_sock, address = self._sock.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:
                    log.warning("accept failed on the %s port: %s", self.name, exc)
                    break
                conn_sock.setblocking(False)
                self._take(conn_sock, address, loop.time())

    def _take(self, conn_sock: socket.socket, address: Any, now: float) -> None:
        source = source_of(str(address[0])) if address else ""
        if not self._make_room(source, now):
            self.refused += 1
            conn_sock.close()
            return
        conn = _Connection(now, source)
        self.connections[conn] = None
        self.sources.setdefault(source, OrderedDict())[conn] = None
        conn.setup = asyncio.create_task(self._serve(conn, conn_sock))

    def _make_room(self, source: str, now: float) -> bool:
        """Whether a connection from ``source`` may be accepted, closing one
        connection for it when a bound is reached (see ``admit_rate``)."""
        own = self.sources.get(source)
        victim: _Connection | None = None
        if own is not None and len(own) >= self.limits.max_per_source:
            victim = self._first(own, (State.IDLE,), now)
            if victim is None:
                return False
        elif len(self.connections) >= self.limits.max_connections:
            victim = self._victim(source, now)
            if victim is None:
                return False
        crowded = victim is not None or 4 * len(self.connections) >= self.limits.max_connections
        if crowded and not self._admitting.take(source):
            return False
        if victim is not None:
            self.dropped += 1
            self._forget(victim)
            victim.drop()
        return True

    def _first(
        self, held: OrderedDict[_Connection, None], states: tuple[State, ...], now: float
    ) -> _Connection | None:
        return next((c for c in held if c.state(now, self.limits) in states), None)

    def _victim(self, source: str, now: float) -> _Connection | None:
        """For a newcomer from ``source``: a connection of the heaviest source
        holding more than ``source`` (or of ``source`` itself), its least
        recently used idle one, else (when that source holds more even once
        the newcomer is in) its least recently used young one. A lighter
        source never gives way."""
        holding = len(self.sources.get(source, ()))
        best: _Connection | None = None
        best_rank = (0, False, 0.0)
        for key, held in self.sources.items():
            if len(held) <= holding and key != source:
                continue
            conn = self._first(held, (State.IDLE,), now)
            if conn is None and len(held) > holding + 1:
                conn = self._first(held, (State.YOUNG,), now)
            if conn is None:
                continue
            rank = (len(held), conn.state(now, self.limits) is State.IDLE, -conn.used)
            if best is None or rank > best_rank:
                best, best_rank = conn, rank
        return best

    def _forget(self, conn: _Connection) -> None:
        if conn not in self.connections:
            return
        del self.connections[conn]
        held = self.sources[conn.source]
        del held[conn]
        if not held:
            del self.sources[conn.source]

    def _use(self, conn: _Connection) -> None:
        held = self.sources.get(conn.source)
        if held is not None and conn in held:
            conn.used = asyncio.get_running_loop().time()
            held.move_to_end(conn)

    async def _serve(self, conn: _Connection, conn_sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        protocol = self._factory()

        def lost() -> None:
            self._forget(conn)

        if isinstance(protocol, GuardedH11Protocol):
            protocol.on_lost = lost
            protocol.on_used = lambda: self._use(conn)
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
