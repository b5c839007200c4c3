"""The three HTTP servers of ``nmo run``, inside the operator's event loop.

Why this module exists: NMO's manager serves a webhook (:9443, TLS), probes
(:8081, plain) and metrics (:8443, TLS with authn/authz), and nmo must answer
on the same ports (behavior.md A7). uvicorn is normally run as the process's
main; here each server is a task in the one asyncio loop:

* sockets are bound by nmo (so a taken port is a clear ``OSError`` from
  :meth:`Servers.start`, and port 0 works in tests), then handed to uvicorn;
  their connections send small writes at once (no Nagle, see :func:`bind`)
  and stay open while idle longer than the apiserver keeps them, so it is
  never the server that closes a connection a request is on its way to;
* connections are accepted by nmo's own :class:`~nmo.server.listener.Listener`
  (one per port), not uvicorn's: a cap per port and per peer address, idle
  connections closed for newcomers least recently used first, and deadlines
  for the TLS handshake and a request's headers, so idle or trickling
  sockets can neither fill the memory limit (issue 14) nor hold the slots
  (issue 20);
* the API requests untrusted callers can cause (webhook lookups, metrics
  TokenReviews) go through budgets of their own, shared out per caller
  (:class:`~nmo.kube.allowance.Shares`), proven callers apart;
* uvicorn's signal handlers are disabled: the process's manager
  (:mod:`nmo.controller.manager`) owns SIGTERM/SIGINT; it starts the servers
  before anything else and stops them last (:meth:`Servers.start`,
  :meth:`Servers.wait`, :meth:`Servers.stop`);
* a shutdown first *drains* (:meth:`Servers.drain`): the servers keep
  answering, ``/readyz`` fails its ``shutdown`` check, and every response
  carries ``Connection: close``. The kube-apiserver pools its webhook
  connections by Service name and keeps using a connection to a pod after
  the pod has left the Service's endpoints; a request it sends on a
  connection the server is closing that instant fails the admission ("use of
  closed network connection"). Told to close, it closes the connection
  itself after the answer and dials again, to a pod still in the Service.
  Only connections unused for the whole delay are closed by nmo;
* TLS uses a context from :mod:`nmo.server.tls`, given to uvicorn through
  ``ssl_context_factory`` so the certificate can be rotated in place;
  HTTP/2 is never served (uvicorn's h11 protocol is HTTP/1.1 only, which is
  also controller-runtime's default since CVE-2023-44487).

Without certificates the process keeps running: the webhook server is off,
the log says why, ``/readyz`` fails its ``webhook`` check with that reason
(unless ``require_webhook_for_ready`` is off), and the server starts as soon
as a certificate pair appears in the cert dir.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import socket
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from nmo.api.constants import DEFAULT_CERT_DIR, WEBHOOK_PATH
from nmo.kube.client import KubeClient
from nmo.server.app import create_metrics_app, create_probes_app, create_webhook_app
from nmo.server.intake import BODY_GRACE_SECONDS, BODY_SECONDS, MIN_BODY_RATE
from nmo.server.listener import ConnectionLimits, Listener, guarded_protocol
from nmo.server.metricsauth import MetricsAuth
from nmo.server.probes import Check, CheckFailed, Leading, Probes
from nmo.server.tls import ReloadingCertificate, require_client_certificates, write_self_signed
from nmo.telemetry.metrics import Metrics
from nmo.webhooks.lookups import LookupSettings, ObjectCache, build_lookups
from nmo.webhooks.validators import Lookups

log = logging.getLogger("nmo.webhooks.servers")


@dataclass(frozen=True)
class ServerSettings:
    """Where and how the servers listen. A port of None turns a server off."""

    bind_address: str = ""  # every interface, both families (see bind)
    # Per-server hosts (the Go flags --health-probe-bind-address and
    # --metrics-bind-address); None: ``bind_address``; "": every interface.
    probes_bind_address: str | None = None
    metrics_bind_address: str | None = None
    webhook_port: int | None = 9443
    probes_port: int | None = 8081
    metrics_port: int | None = 8443
    cert_dir: Path = field(default_factory=lambda: Path(DEFAULT_CERT_DIR))
    cert_name: str | None = None
    key_name: str | None = None
    metrics_secure: bool = True
    metrics_cert_dir: Path | None = None
    require_webhook_for_ready: bool = True
    enable_http2: bool = False
    cert_poll_interval: float = 5.0
    metrics_auth_cache_ttl: float = 60.0
    graceful_shutdown_seconds: int = 5
    # How long a shutdown drains before the servers stop (see Servers.drain):
    # long enough for the EndpointSlice change to reach the apiserver and for
    # its pooled connections to this pod to carry one more request each.
    shutdown_delay_seconds: float = 0.0
    # Longer than the clients' own idle timeout (Go's transports, the
    # kube-apiserver's included, drop idle connections after 90 s): the client
    # must be the side that closes, or a request sent on a connection the
    # server is closing that instant fails ("EOF"), a failed admission.
    keep_alive_seconds: int = 120
    # Per port; see nmo.server.listener (issue 14: idle sockets filled 512 Mi).
    connection_limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    body_seconds: float = BODY_SECONDS  # an admission request's body must arrive within
    min_body_rate: float = MIN_BODY_RATE  # bytes a second, on average, after body_grace
    body_grace: float = BODY_GRACE_SECONDS
    # With a CA file, the webhook port requires a client certificate signed by
    # it (the apiserver presents one when its AdmissionConfiguration says so):
    # then no pod can post a review at all.
    webhook_client_ca: Path | None = None


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its signal handlers (the CLI owns the signals), whose
    connections are accepted by a bounded :class:`Listener`."""

    def __init__(self, config: uvicorn.Config, *, limits: ConnectionLimits, name: str) -> None:
        super().__init__(config)
        self.limits = limits
        self.name = name
        self.listeners: list[Listener] = []

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            raise RuntimeError(f"the {self.name} app failed to start")
        config = self.config

        def create_protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )

        for sock in sockets or []:
            listener = Listener(
                sock, create_protocol, ssl_context=config.ssl, limits=self.limits, name=self.name
            )
            listener.start()
            self.listeners.append(listener)
        self.servers = self.listeners  # type: ignore[assignment]  # uvicorn closes them
        self.started = True


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket (IPv6 dual-stack for ``::``) whose connections
    send small writes at once.

    asyncio turns Nagle's algorithm off only for sockets whose ``proto`` is
    ``IPPROTO_TCP``, and ``socket.create_server`` leaves it 0; every accepted
    connection would then hold a response's second segment (uvicorn writes
    headers and body separately, TLS adds session tickets) until the client's
    delayed ACK, 40 ms later.
    """
    if host == "":  # every interface, as Go's net.Listen(":port"): IPv6 and IPv4 when possible
        host = "::" if socket.has_dualstack_ipv6() else "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Inherited by accepted sockets on Linux; asyncio sets it again anyway.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if family == socket.AF_INET6:
            dual = host in ("::", "") and socket.has_dualstack_ipv6()
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual else 1)
        sock.bind((host, port))
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    return sock


def url_host(host: str) -> str:
    """``host`` as a URL writes it: brackets around IPv6, and what ``""`` binds."""
    if host == "":
        host = "::" if socket.has_dualstack_ipv6() else "0.0.0.0"
    return f"[{host}]" if ":" in host else host


SHARED_MEMORY = "/dev/shm"


def private_dir(prefix: str, *, fallback: str = SHARED_MEMORY) -> Path:
    """A new 0700 directory in the temporary directory, else in ``fallback``.

    The Go NMO's Deployment and CSV run with a read-only root filesystem and
    no volume at /tmp (controller-runtime keeps its self-signed metrics
    certificate in memory); the container's /dev/shm is a tmpfs of its own
    that stays writable there.
    """
    try:
        return Path(tempfile.mkdtemp(prefix=prefix))
    except OSError as exc:
        log.info("no writable temporary directory (%s); using %s", exc, fallback)
        return Path(tempfile.mkdtemp(prefix=prefix, dir=fallback))


class WebhookState:
    """Why the webhook server is not serving (None once it is)."""

    def __init__(self) -> None:
        self.reason: str | None = "webhook server not started yet"

    def check(self) -> None:
        if self.reason is not None:
            raise CheckFailed(self.reason)


ASGIMessage = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[ASGIMessage]]
Send = Callable[[ASGIMessage], Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]

CONNECTION_CLOSE: tuple[bytes, bytes] = (b"connection", b"close")


def closing_while(app: ASGIApp, draining: asyncio.Event) -> ASGIApp:
    """``app``, whose responses say ``Connection: close`` once ``draining`` is set.

    h11 then closes the connection after the response, and the client knows
    before it could reuse it (no race with a server-side close).
    """

    async def wrapped(scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def send_closing(message: ASGIMessage) -> None:
            if message["type"] == "http.response.start" and draining.is_set():
                headers = [h for h in message.get("headers", []) if h[0].lower() != b"connection"]
                message = {**message, "headers": [*headers, CONNECTION_CLOSE]}
            await send(message)

        await app(scope, receive, send_closing)

    return wrapped


class Servers:
    """Starts, supervises and stops the webhook, probes and metrics servers."""

    def __init__(
        self,
        settings: ServerSettings,
        *,
        kube: KubeClient,
        lookups: Lookups,
        metrics: Metrics,
        probes: Probes | None = None,
        draining: asyncio.Event | None = None,
    ) -> None:
        self.settings = settings
        self.kube = kube
        # Set by drain(); shared with the CLI, which sets it on SIGTERM.
        self.draining = asyncio.Event() if draining is None else draining
        self.lookups = lookups
        self.metrics = metrics
        self.probes = probes or Probes()
        self.webhook = WebhookState()
        self.ports: dict[str, int] = {}
        self.certificates: dict[str, ReloadingCertificate] = {}
        self._servers: dict[str, tuple[_EmbeddedServer, socket.socket]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._tmp: Path | None = None
        self._stopping = False
        if settings.require_webhook_for_ready and settings.webhook_port is not None:
            self.probes.add_readyz("webhook", self.webhook.check)
        if settings.webhook_port is None:
            self.webhook.reason = None
        self.probes.add_readyz("shutdown", self._not_draining)

    def _not_draining(self) -> None:
        if self.draining.is_set():
            raise CheckFailed("shutting down: answering requests in flight, then stopping")

    def drain(self) -> None:
        """Keep serving, but fail readiness and close each connection after
        its response (see the module docstring); :meth:`stop` ends it."""
        self.draining.set()

    async def start(self) -> None:
        """Bind and start every enabled server; raises OSError on a taken port."""
        s = self.settings
        if s.enable_http2:
            log.warning("HTTP/2 was requested but is not supported; serving HTTP/1.1 only")
        try:
            if s.probes_port is not None:
                await self._start("probes", create_probes_app(self.probes), s.probes_port, None)
            if s.metrics_port is not None:
                await self._start_metrics(s.metrics_port)
            if s.webhook_port is not None:
                await self._start_webhook(s.webhook_port)
        except BaseException:
            await self.stop()  # whatever did start must not linger
            raise

    async def _start_metrics(self, port: int) -> None:
        s = self.settings
        if not s.metrics_secure:
            app = create_metrics_app(metrics=self.metrics, auth=None)
            await self._start("metrics", app, port, None)
            return
        if s.metrics_cert_dir is not None:
            cert = ReloadingCertificate(s.metrics_cert_dir)
        else:
            self._tmp = private_dir("nmo-metrics-cert-")
            write_self_signed(self._tmp, ["localhost", "127.0.0.1", socket.gethostname()])
            cert = ReloadingCertificate(self._tmp)
            log.info("metrics server uses a self-signed certificate")
        cert.load()
        self.certificates["metrics"] = cert
        auth = MetricsAuth(self.kube, cache_ttl=s.metrics_auth_cache_ttl)
        app = create_metrics_app(
            metrics=self.metrics,
            auth=auth,
            background={"nmo-metrics-cert-watcher": lambda: cert.watch(s.cert_poll_interval)},
        )
        await self._start("metrics", app, port, cert.context)

    async def _start_webhook(self, port: int) -> None:
        s = self.settings
        cert = ReloadingCertificate(s.cert_dir, cert_name=s.cert_name, key_name=s.key_name)
        if s.webhook_client_ca is not None:
            require_client_certificates(cert.context, s.webhook_client_ca)
            log.info(
                "webhook requires client certificates",
                extra={"client_ca": str(s.webhook_client_ca)},
            )
        self.certificates["webhook"] = cert
        if self._load_webhook_cert(cert):
            await self._serve_webhook(cert, port)
        else:
            self._tasks["webhook-starter"] = asyncio.create_task(
                self._wait_for_certs(cert, port), name="nmo-webhook-starter"
            )

    def _load_webhook_cert(self, cert: ReloadingCertificate) -> bool:
        s = self.settings
        try:
            cert.load()
            return True
        except (OSError, ssl.SSLError) as exc:
            reason = f"webhook server is off: {exc}"
            if reason != self.webhook.reason:
                log.warning(
                    "%s; NodeMaintenance admission is not served until a certificate "
                    "appears (checked every %gs)",
                    reason,
                    s.cert_poll_interval,
                    extra={"cert_dir": str(s.cert_dir)},
                )
            self.webhook.reason = reason
            return False

    async def _wait_for_certs(self, cert: ReloadingCertificate, port: int) -> None:
        while True:
            await asyncio.sleep(self.settings.cert_poll_interval)
            if self._load_webhook_cert(cert):
                await self._serve_webhook(cert, port)
                return

    async def _serve_webhook(self, cert: ReloadingCertificate, port: int) -> None:
        s = self.settings
        app = create_webhook_app(
            lookups=self.lookups,
            metrics=self.metrics,
            body_seconds=s.body_seconds,
            min_body_rate=s.min_body_rate,
            body_grace=s.body_grace,
            background={"nmo-webhook-cert-watcher": lambda: cert.watch(s.cert_poll_interval)},
        )
        await self._start("webhook", app, port, cert.context)
        self.webhook.reason = None
        log.info(
            "webhook server for maintenance admission listening",
            extra={
                "url": f"https://{url_host(s.bind_address)}:{self.ports['webhook']}{WEBHOOK_PATH}"
            },
        )

    async def _start(self, name: str, app: ASGIApp, port: int, ctx: ssl.SSLContext | None) -> None:
        s = self.settings
        options: dict[str, Any] = {}
        if ctx is not None:
            options["ssl_context_factory"] = lambda _config, _default: ctx
        config = uvicorn.Config(
            closing_while(app, self.draining),
            lifespan="on",
            log_config=None,
            access_log=False,
            http=guarded_protocol(s.connection_limits),
            ws="none",
            proxy_headers=False,
            server_header=False,
            timeout_graceful_shutdown=s.graceful_shutdown_seconds,
            timeout_keep_alive=s.keep_alive_seconds,
            **options,
        )
        host = {"probes": s.probes_bind_address, "metrics": s.metrics_bind_address}.get(name)
        host = s.bind_address if host is None else host
        sock = bind(host, port)
        try:
            server = _EmbeddedServer(config, limits=s.connection_limits, name=name)
            config.load()
            server.lifespan = config.lifespan_class(config)
            await server.startup(sockets=[sock])
        except BaseException:
            sock.close()
            raise
        self.ports[name] = sock.getsockname()[1]
        self._servers[name] = (server, sock)
        self._tasks[name] = asyncio.create_task(self._run(server, sock), name=f"nmo-{name}-server")
        log.info(
            "%s server listening",
            name,
            extra={"address": host or "*", "port": self.ports[name], "tls": ctx is not None},
        )

    def listener(self, name: str) -> Listener:
        """The accept loop of a running server (for its counters)."""
        return self._servers[name][0].listeners[0]

    @staticmethod
    async def _run(server: _EmbeddedServer, sock: socket.socket) -> None:
        await server.main_loop()
        await server.shutdown(sockets=[sock])

    async def wait(self) -> None:
        """Return never; raise when a server ends on its own."""
        while True:
            tasks = list(self._tasks.values())
            if not tasks:
                await asyncio.Event().wait()  # every server is turned off
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                name = next(n for n, t in self._tasks.items() if t is task)
                if task.cancelled() or self._stopping:
                    raise RuntimeError(f"{name} server was stopped")
                exc = task.exception()
                if exc is not None:
                    raise RuntimeError(f"{name} server failed: {exc}") from exc
                if name != "webhook-starter":
                    raise RuntimeError(f"{name} server stopped unexpectedly")
                del self._tasks[name]

    async def stop(self) -> None:
        """Stop accepting, let requests in flight finish, then close."""
        self._stopping = True
        starter = self._tasks.pop("webhook-starter", None)
        if starter is not None:
            starter.cancel()
            await asyncio.gather(starter, return_exceptions=True)
        for server, _sock in self._servers.values():
            server.should_exit = True
        timeout = self.settings.graceful_shutdown_seconds + 5
        pending = [t for t in self._tasks.values() if not t.done()]
        if pending:
            _, still = await asyncio.wait(pending, timeout=timeout)
            for task in still:
                task.cancel()
            await asyncio.gather(*still, return_exceptions=True)
        for _server, sock in self._servers.values():
            sock.close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
        self._servers.clear()
        self._tasks.clear()


def caches_synced(*caches: ObjectCache) -> Check:
    """A readiness check that fails until every informer has listed once."""

    def check() -> None:
        if not all(cache.synced.is_set() for cache in caches):
            raise CheckFailed("node and NodeMaintenance caches have not synced yet")

    return check


def build_servers(
    settings: ServerSettings,
    *,
    kube: KubeClient,
    nodes: ObjectCache,
    maintenances: ObjectCache,
    metrics: Metrics,
    readiness: Mapping[str, Check] | None = None,
    liveness: Mapping[str, Check] | None = None,
    leading: Leading | None = None,
    lookup_settings: LookupSettings | None = None,
    draining: asyncio.Event | None = None,
) -> Servers:
    """The webhook, probes and metrics servers of the operator, not started.

    ``nodes`` and ``maintenances`` are the operator's informers for all Nodes
    and all NodeMaintenances (see :func:`nmo.webhooks.lookups.build_lookups`,
    whose handlers are registered here: call this before the informers run);
    ``readiness``/``liveness`` add named checks to ``/readyz``/``/healthz``;
    ``leading`` (whether this replica runs the maintenance workers) answers
    ``/leaderz``; setting ``draining`` starts the drain of a shutdown (see
    :meth:`Servers.drain`).
    """
    # Budgets of their own (a share of the operator's client, issue 14 item 7),
    # made by the lookups and the metrics authentication from the client, each
    # split between proven callers and the rest (issue 20): webhook lookups and
    # metrics authentication cannot starve each other, nor forgers either.
    lookups = build_lookups(kube, nodes=nodes, maintenances=maintenances, settings=lookup_settings)
    ready = dict(readiness or {})
    if settings.require_webhook_for_ready and settings.webhook_port is not None:
        ready.setdefault("webhook-caches", caches_synced(nodes, maintenances))
    probes = Probes(healthz=liveness, readyz=ready, leading=leading)
    return Servers(
        settings,
        kube=kube,
        lookups=lookups,
        metrics=metrics,
        probes=probes,
        draining=draining,
    )


async def serve(
    settings: ServerSettings,
    *,
    kube: KubeClient,
    nodes: ObjectCache,
    maintenances: ObjectCache,
    metrics: Metrics,
    readiness: Mapping[str, Check] | None = None,
    liveness: Mapping[str, Check] | None = None,
    leading: Leading | None = None,
    lookup_settings: LookupSettings | None = None,
    draining: asyncio.Event | None = None,
) -> None:
    """Run :func:`build_servers`' servers until cancelled (its arguments).

    Raises when a server cannot start or stops on its own.
    """
    servers = build_servers(
        settings,
        kube=kube,
        nodes=nodes,
        maintenances=maintenances,
        metrics=metrics,
        readiness=readiness,
        liveness=liveness,
        leading=leading,
        lookup_settings=lookup_settings,
        draining=draining,
    )
    await servers.start()
    try:
        await servers.wait()
    finally:
        await servers.stop()
