"""The ``nmo`` command: run, gather, cleanup, status, plan, crd and version.

The sandbox and the demo are development tooling: ``nmo-sandbox`` (the
``nmo-sandbox`` distribution in ``sandbox/``), never part of the image.

The CLI is the only place that wires things together: it builds the
settings from flags and environment, creates the API client, the metrics
registry and the engine, and hands them down (no global state).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from nmo import __version__
from nmo.api import constants as c
from nmo.api.crd import crd
from nmo.api.models import OnTimeout
from nmo.cli import goflags
from nmo.cli.defaults import (
    CONTROLLER_RUNTIME_CERT_DIR,
    IN_POD_SHUTDOWN_DELAY,
    leader_election_namespace,
    namespaces_arg,
    shutdown_delay,
    temporary_directory,
    webhook_cert_dir,
)
from nmo.controller.engine import Engine, EngineSettings
from nmo.controller.notifier import NotifySettings, check_url, shown
from nmo.core.maintenance.admission import BudgetSettings, parse_max_unavailable, parse_window
from nmo.core.maintenance.planner import PlanSettings
from nmo.kube.client import Kube
from nmo.kube.errors import KubeconfigError
from nmo.server.probes import CheckFailed
from nmo.server.servers import ServerSettings, serve
from nmo.telemetry import logsetup
from nmo.telemetry.metrics import Metrics

log = logging.getLogger("nmo.cli")


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0 seconds")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nmo",
        description="Node Maintenance Operator: run it, or inspect and repair maintenances "
        "(gather, cleanup, status, plan).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    # No abbreviations: Go's flag package has none, and an abbreviated flag
    # that argparse would complete silently is an unknown flag to the Go NMO.
    run = sub.add_parser(
        "run",
        help="run the operator (reconcilers, webhook, probes, metrics)",
        description="Run the operator. The Go NMO's flags (its Deployment and CSV "
        "pass them to /manager) work too, with one dash or two.",
        allow_abbrev=False,
    )
    conn = run.add_argument_group("connection")
    conn.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    conn.add_argument("--context", default=None)
    conn.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    eng = run.add_argument_group("maintenance engine")
    eng.add_argument(
        "--max-concurrent-reconciles",
        type=int,
        default=_env_int("NMO_MAX_CONCURRENT_RECONCILES", 10),
    )
    eng.add_argument(
        "--max-parallel-evictions", type=int, default=_env_int("NMO_MAX_PARALLEL_EVICTIONS", 50)
    )
    eng.add_argument(
        "--lease-namespace",
        default=os.environ.get(c.LEASE_NAMESPACE_ENV) or c.LEASE_NAMESPACE_DEFAULT,
        help="namespace of the medik8s node leases (env LEASE_NAMESPACE)",
    )
    eng.add_argument(
        "--lease-renew-interval",
        type=float,
        default=300.0,
        help="seconds between background lease renewals",
    )
    eng.add_argument(
        "--status-interval",
        type=float,
        default=1.0,
        help="minimum seconds between drain status writes per CR",
    )
    eng.add_argument(
        "--status-heartbeat",
        type=_positive_float,
        default=60.0,
        metavar="SECONDS",
        help="lastUpdate of a Pending or Running CR is never older than this (default 60)",
    )
    eng.add_argument(
        "--drain-timeout",
        type=int,
        default=_env_int("NMO_DRAIN_TIMEOUT", 0),
        metavar="SECONDS",
        help="default drain deadline for CRs without spec.drain.timeoutSeconds "
        "(0: no deadline, as the Go NMO)",
    )
    eng.add_argument(
        "--drain-on-timeout",
        choices=[a.value for a in OnTimeout],
        default=os.environ.get("NMO_DRAIN_ON_TIMEOUT") or OnTimeout.REPORT.value,
        help="default for spec.drain.onTimeout: Report keeps draining and reports, "
        "Delete deletes the remaining pods (bypassing PDBs), Abort restores the node "
        "and fails the maintenance",
    )
    eng.add_argument(
        "--critical-pods-last",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="within one drain order, evict pods of the system-cluster-critical and "
        "system-node-critical priority classes after the others (default: off, every "
        "pod at once, as the Go NMO)",
    )
    eng.add_argument(
        "--pod-drain-rules-namespaces",
        type=namespaces_arg,
        default=namespaces_arg(os.environ.get("NMO_POD_DRAIN_RULES_NAMESPACES") or ""),
        metavar="NS[,NS...]",
        help="honour pods' own drain rules (label nodemaintenance.medik8s.io/drain, "
        "annotation nodemaintenance.medik8s.io/drain-order) only in these namespaces; "
        "'*': every namespace; default: none, as the Go NMO (pod labels are tenant input)",
    )
    eng.add_argument(
        "--max-drain-seconds",
        type=int,
        default=_env_int("NMO_MAX_DRAIN_SECONDS", 0),
        metavar="SECONDS",
        help="a cap on every drain's duration that no CR can lift (0: none); at it, "
        "--max-drain-action applies",
    )
    eng.add_argument(
        "--max-drain-action",
        choices=[a.value for a in OnTimeout],
        default=os.environ.get("NMO_MAX_DRAIN_ACTION") or OnTimeout.REPORT.value,
        help="what happens at --max-drain-seconds: Report, Delete (pods held by their own "
        "drain rules too; needs the chart's drain.allowPodDeletion) or Abort",
    )
    fleet = run.add_argument_group("fleet budget and maintenance window")
    fleet.add_argument(
        "--max-parallel-maintenances",
        type=int,
        default=_env_int("NMO_MAX_PARALLEL_MAINTENANCES", 0),
        metavar="N",
        help="at most N maintenances started at once (0: no limit); the others wait, Pending",
    )
    fleet.add_argument(
        "--max-unavailable",
        default=os.environ.get("NMO_MAX_UNAVAILABLE", ""),
        metavar="N|P%%",
        help="start a maintenance only while fewer nodes than this (a count, or a percentage "
        "of the nodes, rounded up) are unavailable: unschedulable, NotReady or in maintenance",
    )
    fleet.add_argument(
        "--window-days",
        default=os.environ.get("NMO_WINDOW_DAYS", ""),
        metavar="DAYS",
        help="maintenance window days, e.g. Mon-Fri or Sat,Sun (empty: no window)",
    )
    fleet.add_argument("--window-start", default=os.environ.get("NMO_WINDOW_START", "00:00"))
    fleet.add_argument("--window-end", default=os.environ.get("NMO_WINDOW_END", "00:00"))
    fleet.add_argument(
        "--window-timezone",
        default=os.environ.get("NMO_WINDOW_TIMEZONE", "UTC"),
        help="IANA time zone of the window, e.g. Europe/Berlin",
    )
    fleet.add_argument(
        "--budget-namespace",
        default=None,
        help="namespace of the budget ledger Lease (default: the leader election namespace)",
    )
    note = run.add_argument_group("notifications")
    note.add_argument(
        "--notify-url",
        default=os.environ.get("NMO_NOTIFY_URL") or None,
        metavar="URL",
        help="POST a JSON document to this http(s) URL when a maintenance begins, is "
        "blocked, succeeds, fails or is removed (env NMO_NOTIFY_URL; default: off)",
    )
    note.add_argument(
        "--notify-timeout",
        type=float,
        default=float(os.environ.get("NMO_NOTIFY_TIMEOUT") or 5.0),
        metavar="SECONDS",
        help="seconds one delivery attempt may take in all: connect, send and the whole "
        "answer (env NMO_NOTIFY_TIMEOUT)",
    )
    le = run.add_argument_group("leader election")
    le.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="elect a leader through a Lease so that only one replica reconciles "
        "(off by default, as in the Go NMO; the chart turns it on); also "
        "--leader-elect=true|false",
    )
    le.add_argument(
        "--leader-election-namespace",
        default=None,
        help="namespace of the leader Lease (default: $POD_NAMESPACE, $OPERATOR_NAMESPACE, "
        f"the service account's namespace in a pod, else {c.OPERATOR_NAMESPACE})",
    )
    le.add_argument("--leader-election-id", default=c.LEADER_ELECTION_ID)
    le.add_argument("--leader-lease-duration", type=float, default=15.0)
    le.add_argument("--leader-renew-deadline", type=float, default=10.0)
    le.add_argument("--leader-retry-period", type=float, default=2.0)
    le.add_argument("--identity", default=os.environ.get("POD_NAME") or None)
    srv = run.add_argument_group("servers")
    srv.add_argument(
        "--bind-address",
        default="",
        help="where the webhook (and the probes and metrics without their Go flags) "
        "listen; default: every interface, IPv6 and IPv4 (dual-stack '::', or 0.0.0.0 "
        "on a host without IPv6), as the Go NMO's ':9443'",
    )
    srv.add_argument("--webhook-port", type=int, default=9443)
    srv.add_argument("--health-probe-port", type=int, default=None, help="default 8081")
    srv.add_argument("--metrics-port", type=int, default=None, help="default 8443")
    srv.add_argument(
        "--metrics-secure",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve /metrics over TLS with TokenReview/SubjectAccessReview (default: on, "
        "except on a loopback --metrics-bind-address, the kube-rbac-proxy layout)",
    )
    srv.add_argument(
        "--cert-dir",
        default=None,
        help=f"webhook certificate dir (default: {c.DEFAULT_CERT_DIR}, where OLM puts "
        f"apiserver.crt/apiserver.key, or else {CONTROLLER_RUNTIME_CERT_DIR} when it holds "
        "the certificate, as in the Go NMO)",
    )
    srv.add_argument(
        "--metrics-cert-dir",
        default=None,
        help="serve /metrics with tls.crt/tls.key from this dir (reloaded when renewed) "
        "instead of a self-signed certificate, so scrapers can verify it",
    )
    srv.add_argument(
        "--webhook-client-ca",
        default=None,
        help="require webhook callers to present a client certificate signed by this CA "
        "(the apiserver's AdmissionConfiguration kubeConfigFile, see docs/install.md)",
    )
    srv.add_argument(
        "--shutdown-delay-seconds",
        type=float,
        default=None,
        help="on SIGTERM, keep answering this long (readiness failing, each connection "
        "closed after its response) so no admission is lost while the Service drops "
        f"this pod (default: {IN_POD_SHUTDOWN_DELAY:g} in a pod, 0 elsewhere)",
    )
    srv.add_argument("--enable-webhook", action=argparse.BooleanOptionalAction, default=True)
    srv.add_argument(
        "--require-webhook-for-readiness", action=argparse.BooleanOptionalAction, default=True
    )
    logs = run.add_argument_group("logging")
    logs.add_argument("--log-format", choices=["text", "json"], default="text")
    logs.add_argument("--log-level", default="info")
    go = run.add_argument_group(
        "Go NMO flags",
        "the flags of the Go NMO's /manager, with its meaning (a Go flag may also start "
        "with one dash)",
    )
    go.add_argument(
        "--health-probe-bind-address",
        metavar="[HOST]:PORT|0",
        help="where /healthz and /readyz listen, e.g. :8081, 0.0.0.0:8081, [::]:8081 "
        "(empty host: every interface; 0: off)",
    )
    go.add_argument(
        "--metrics-bind-address",
        metavar="[HOST]:PORT|0",
        help="where /metrics listens, e.g. :8443 or 127.0.0.1:8080 (0: off)",
    )
    go.add_argument(
        "--enable-http2",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="accepted; nmo serves HTTP/1.1 only (the Go NMO's default, false)",
    )
    go.add_argument(
        "--zap-devel",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="true: text logs at debug; false: JSON logs at info",
    )
    go.add_argument("--zap-encoder", metavar="json|console", help="log format: json or text")
    go.add_argument(
        "--zap-log-level", metavar="LEVEL", help="debug, info, error, panic, or N > 0 (debug)"
    )
    go.add_argument(
        "--zap-stacktrace-level",
        metavar="LEVEL",
        help="info, error or panic; accepted (nmo logs a traceback with every exception)",
    )
    go.add_argument(
        "--zap-time-encoding",
        metavar="ENCODING",
        help="ts of JSON logs: epoch, millis, nanos, iso8601, rfc3339 or rfc3339nano",
    )

    sub.add_parser("crd", help="print the NodeMaintenance CRD as YAML")
    sub.add_parser("version", help="print the version")
    from nmo.cli import ops

    ops.add_parsers(sub)
    return parser


@dataclass(frozen=True)
class Connection:
    kubeconfig: str | None = None
    context: str | None = None
    in_cluster: bool = False


@dataclass(frozen=True)
class Settings:
    """Everything ``nmo run`` was told: parsed once, then passed down as one tree."""

    connection: Connection
    engine: EngineSettings
    servers: ServerSettings


def budget_settings(args: argparse.Namespace) -> BudgetSettings:
    """The fleet budget from the flags; ValueError says what is wrong."""
    if args.max_parallel_maintenances < 0:
        raise ValueError(
            f"--max-parallel-maintenances must be 0 (no limit) or more "
            f"(got {args.max_parallel_maintenances})"
        )
    if args.max_unavailable:
        parse_max_unavailable(args.max_unavailable)
    window = None
    if args.window_days:
        window = parse_window(
            args.window_days, args.window_start, args.window_end, args.window_timezone
        )
    return BudgetSettings(
        max_parallel=args.max_parallel_maintenances,
        max_unavailable=args.max_unavailable,
        window=window,
    )


def notify_settings(args: argparse.Namespace) -> NotifySettings | None:
    """Notifications from the flags (None: off); ValueError says what is wrong."""
    if not args.notify_url:
        return None
    if (problem := check_url(args.notify_url)) is not None:
        # Echoed as scheme://host[:port]: the rest may be the secret (Slack, Discord).
        raise ValueError(f"--notify-url {problem} (got {shown(args.notify_url)!r})")
    if args.notify_timeout <= 0:
        raise ValueError(f"--notify-timeout must be more than 0 (got {args.notify_timeout:g})")
    return NotifySettings(url=args.notify_url, timeout=args.notify_timeout)


def _address(
    go_flag: str, go_value: str | None, port_flag: str, port: int | None, default: int
) -> tuple[str | None, int | None]:
    """(host, port) of one server from its Go address or nmo's port flag.

    host None: nmo's ``--bind-address``; port None: the server is off.
    """
    if go_value is None:
        return None, default if port is None else port
    if port is not None:
        raise ValueError(f"give --{go_flag} or {port_flag}, not both")
    address = goflags.parse_bind_address(go_flag, go_value)
    if address is None:
        return None, None
    return address.host, address.port


def _loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_settings(args: argparse.Namespace) -> ServerSettings:
    """The servers from nmo's and the Go NMO's flags; ValueError says what is wrong."""
    probes_host, probes_port = _address(
        "health-probe-bind-address",
        args.health_probe_bind_address,
        "--health-probe-port",
        args.health_probe_port,
        8081,
    )
    metrics_host, metrics_port = _address(
        "metrics-bind-address", args.metrics_bind_address, "--metrics-port", args.metrics_port, 8443
    )
    # The Go NMO up to 0.20 served plain /metrics (on :8080) to a kube-rbac-proxy
    # sidecar, which does the TLS and the authorization and proxies
    # http://127.0.0.1:8080/; its Deployments pass --metrics-bind-address=
    # 127.0.0.1:8080. A loopback metrics address keeps that layout working.
    secure = args.metrics_secure
    if secure is None:
        secure = not _loopback(metrics_host)
    return ServerSettings(
        bind_address=args.bind_address,
        probes_bind_address=probes_host,
        metrics_bind_address=metrics_host,
        webhook_port=args.webhook_port if args.enable_webhook else None,
        probes_port=probes_port,
        metrics_port=metrics_port,
        cert_dir=Path(webhook_cert_dir(args.cert_dir)),
        webhook_client_ca=Path(args.webhook_client_ca) if args.webhook_client_ca else None,
        metrics_secure=secure,
        metrics_cert_dir=Path(args.metrics_cert_dir) if args.metrics_cert_dir else None,
        require_webhook_for_ready=args.require_webhook_for_readiness,
        enable_http2=args.enable_http2,
        shutdown_delay_seconds=shutdown_delay(args.shutdown_delay_seconds, os.environ),
    )


def settings_from(args: argparse.Namespace) -> Settings:
    engine = EngineSettings(
        lease_namespace=args.lease_namespace,
        max_concurrent_reconciles=args.max_concurrent_reconciles,
        max_parallel_evictions=args.max_parallel_evictions,
        lease_renew_interval=args.lease_renew_interval,
        leader_election=args.leader_elect,
        leader_election_namespace=leader_election_namespace(
            args.leader_election_namespace, os.environ
        ),
        leader_election_id=args.leader_election_id,
        leader_lease_duration=args.leader_lease_duration,
        leader_renew_deadline=args.leader_renew_deadline,
        leader_retry_period=args.leader_retry_period,
        budget=budget_settings(args),
        budget_namespace=args.budget_namespace,
        plan=PlanSettings(
            status_interval=args.status_interval,
            heartbeat=args.status_heartbeat,
            drain_timeout=args.drain_timeout,
            on_timeout=OnTimeout(args.drain_on_timeout),
            critical_last=args.critical_pods_last,
            pod_rules_namespaces=args.pod_drain_rules_namespaces,
            max_drain_seconds=max(0, args.max_drain_seconds),
            max_drain_action=OnTimeout(args.max_drain_action),
        ),
    )
    if args.identity:
        engine.identity = args.identity
    engine.notify = notify_settings(args)
    servers = server_settings(args)
    return Settings(
        connection=Connection(
            kubeconfig=args.kubeconfig, context=args.context, in_cluster=args.in_cluster
        ),
        engine=engine,
        servers=servers,
    )


async def run(args: argparse.Namespace) -> int:
    for name, value in (
        ("--max-concurrent-reconciles", args.max_concurrent_reconciles),
        ("--max-parallel-evictions", args.max_parallel_evictions),
    ):
        if value < 1:
            log.error("%s must be at least 1 (got %d)", name, value)
            return 2
    if args.drain_timeout < 0:
        log.error("--drain-timeout must be 0 (no deadline) or more (got %d)", args.drain_timeout)
        return 2
    try:
        settings = settings_from(args)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    conn = settings.connection
    try:
        kube = await Kube.connect(
            kubeconfig=conn.kubeconfig, context=conn.context, in_cluster=conn.in_cluster
        )
    except KubeconfigError as exc:  # never the pod's own account instead
        log.error("cannot read the kubeconfig: %s", exc)
        return 1
    except Exception as exc:
        log.error("cannot connect to the Kubernetes API: %s", exc)
        return 1
    metrics = Metrics()
    engine = Engine(kube, settings.engine, metrics)
    log.info(
        "nmo %s starting maintenance operator (api %s, lease namespace %s)",
        __version__,
        kube.server,
        settings.engine.lease_namespace,
    )
    if settings.engine.leader_election:
        log.info(
            "leader election on: only the holder of Lease %s/%s reconciles",
            settings.engine.leader_election_namespace,
            settings.engine.leader_election_id,
        )
    else:
        log.info("leader election off (--leader-elect turns it on): this process reconciles")
    stop, hurry, draining = asyncio.Event(), asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        (hurry if stop.is_set() else stop).set()  # a second signal ends the delay

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    # The servers register their cache handlers before the informers start.
    servers = asyncio.create_task(
        _servers(settings.servers, kube, engine, metrics, draining), name="servers"
    )
    tasks = [servers]
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(engine.run(), name="engine"))
    stopper = asyncio.create_task(stop.wait(), name="signal")
    done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
    code = 0
    for task in done:
        if task is not stopper and task.exception() is not None:
            log.error("task %s failed: %r", task.get_name(), task.exception())
            code = 1
    log.info("nmo shutting down")
    draining.set()
    delay = settings.servers.shutdown_delay_seconds
    deadline = loop.time() + delay
    await engine.shutdown()  # the lease is released at once: a standby leads
    if code == 0 and delay > 0 and not servers.done():
        log.info(
            "still answering for %gs (--shutdown-delay-seconds) while the Service drops "
            "this pod; readiness fails and each connection closes after its response",
            delay,
        )
        hurried = asyncio.create_task(hurry.wait(), name="second-signal")
        await asyncio.wait(
            [servers, hurried],
            timeout=max(deadline - loop.time(), 0.0),
            return_when=asyncio.FIRST_COMPLETED,
        )
        hurried.cancel()
    for task in [*tasks, stopper]:
        task.cancel()
    await asyncio.gather(*tasks, stopper, return_exceptions=True)
    await kube.close()
    return code


async def _servers(
    settings: ServerSettings,
    kube: Kube,
    engine: Engine,
    metrics: Metrics,
    draining: asyncio.Event,
) -> None:
    """The FastAPI side (webhook, probes, metrics) in this event loop."""

    def caches() -> None:
        if not engine.synced():
            raise CheckFailed("maintenance and node caches have not synced yet")

    def leadership() -> None:
        if engine.elector is None:
            return
        if engine.elector.problem is not None:
            raise CheckFailed(engine.elector.problem)
        if engine.elector.is_leader != engine.leading:
            raise CheckFailed("leader election state and reconcile workers disagree")

    await serve(
        settings,
        kube=kube,
        nodes=engine.nodes,
        maintenances=engine.maintenances,
        metrics=metrics,
        readiness={"informers": caches, "leader-election": leadership},
        leading=lambda: engine.leading,
        draining=draining,
    )


def _run_error(message: str) -> int:
    print(f"nmo run: error: {message}", file=sys.stderr)
    return 2


def command_line(argv: list[str]) -> list[str]:
    """The arguments as the parser reads them.

    Arguments that start with a flag (not ``-h``/``--help``) are ``run``'s:
    a pod spec written for the Go NMO's image, whose entry point is the
    operator, gives only ``args`` (``--leader-elect``, ...), and nmo's image
    runs ``nmo`` with them. ``run``'s Go flags are normalized
    (:mod:`nmo.cli.goflags`; raises :class:`goflags.GoFlagError`).
    """
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["run", *argv]
    if argv[:1] == ["run"]:
        argv = ["run", *goflags.normalize(argv[1:])]
    return argv


def main(argv: list[str] | None = None) -> int:
    try:
        argv = command_line(list(sys.argv[1:] if argv is None else argv))
    except goflags.GoFlagError as exc:
        return _run_error(str(exc))
    args = build_parser().parse_args(argv)
    if args.command == "version":
        print(f"nmo {__version__}")
        return 0
    if args.command == "crd":
        print(yaml.safe_dump(crd(), sort_keys=False), end="")
        return 0
    if args.command == "run":
        zap = goflags.ZapOptions(
            devel=args.zap_devel,
            encoder=args.zap_encoder,
            log_level=args.zap_log_level,
            stacktrace_level=args.zap_stacktrace_level,
            time_encoding=args.zap_time_encoding,
        )
        try:
            logs = goflags.log_choice(zap, level=args.log_level, fmt=args.log_format)
        except goflags.GoFlagError as exc:
            return _run_error(str(exc))
        logsetup.setup(logs.level, logs.fmt, time_encoding=logs.time_encoding)
        try:
            tmp, why = temporary_directory()
        except FileNotFoundError as exc:
            log.error("%s, nor is /dev/shm: mount an emptyDir at /tmp", exc)
            return 1
        if why is not None:
            log.info("%s; using %s", why, tmp)
        return asyncio.run(run(args))
    if args.command in ("gather", "cleanup", "status", "plan"):
        from nmo.cli import ops

        return ops.main(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
