"""``nmo run``'s flags as settings: parsed once, then passed down as one tree.

Why this module exists: the flags (:mod:`nmo.cli.flags`) say what the user
typed; the settings say what each part of the operator is to do (the engine,
its plan and fleet budget, the notifications, the servers). A value that
is wrong raises ValueError with the sentence ``nmo run`` logs before it
exits 2, before anything connects (:func:`nmo.cli.runner.run` checks the
counts first).
Nothing here does I/O but read the environment and the service account's
namespace file (:mod:`nmo.cli.defaults`).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from nmo.api.models import OnTimeout
from nmo.cli import goflags
from nmo.cli.defaults import leader_election_namespace, shutdown_delay, webhook_cert_dir
from nmo.controller.alertgate import AlertGateSettings
from nmo.controller.engine import EngineSettings
from nmo.controller.notifier import NotifySettings, check_url, shown
from nmo.core.maintenance.admission import BudgetSettings, parse_max_unavailable, parse_window
from nmo.core.maintenance.policy import PlanSettings
from nmo.server.servers import ServerSettings


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
    if args.fleet_soak_seconds < 0:
        raise ValueError(
            f"--fleet-soak-seconds must be 0 (no soak) or more (got {args.fleet_soak_seconds})"
        )
    gate = alert_gate_settings(args)
    return BudgetSettings(
        max_parallel=args.max_parallel_maintenances,
        max_unavailable=args.max_unavailable,
        window=window,
        soak_seconds=float(args.fleet_soak_seconds),
        blocking_url=gate.url if gate else "",
        blocking_alerts=gate.pattern if gate else "",
        blocking_interval=gate.interval if gate else 30.0,
    )


def alert_gate_settings(args: argparse.Namespace) -> AlertGateSettings | None:
    """The alert gate from the flags (None: off); ValueError says what is wrong."""
    if not args.blocking_prometheus_url:
        if args.blocking_alerts:
            raise ValueError("--blocking-alerts needs --blocking-prometheus-url")
        return None
    url = args.blocking_prometheus_url
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--blocking-prometheus-url must be an http(s) URL (got {url!r})")
    if not args.blocking_alerts:
        raise ValueError(
            "--blocking-prometheus-url needs --blocking-alerts: a regular expression of the "
            "alert names that hold new maintenances ('.*' for every alert)"
        )
    try:
        re.compile(args.blocking_alerts)
    except re.error as exc:
        pattern = args.blocking_alerts
        raise ValueError(f"--blocking-alerts {pattern!r} is not valid: {exc}") from None
    if args.blocking_prometheus_interval <= 0:
        raise ValueError(
            "--blocking-prometheus-interval must be more than 0 "
            f"(got {args.blocking_prometheus_interval:g})"
        )
    return AlertGateSettings(
        url=url,
        pattern=args.blocking_alerts,
        interval=args.blocking_prometheus_interval,
        token_file=args.blocking_prometheus_token_file,
        ca_file=args.blocking_prometheus_ca_file,
        timeout=min(10.0, args.blocking_prometheus_interval),
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
        alert_gate=alert_gate_settings(args),
        plan=PlanSettings(
            status_interval=args.status_interval,
            pdb_recheck=args.pdb_recheck_interval,
            heartbeat=args.status_heartbeat,
            drain_timeout=args.drain_timeout,
            on_timeout=OnTimeout(args.drain_on_timeout),
            critical_last=args.critical_pods_last,
            node_conditions=args.node_conditions,
            pod_rules_namespaces=args.pod_drain_rules_namespaces,
            max_drain_seconds=max(0, args.max_drain_seconds),
            max_drain_action=OnTimeout(args.max_drain_action),
            volume_detach=args.wait_for_volume_detach,
            volume_detach_timeout=args.volume_detach_timeout,
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
