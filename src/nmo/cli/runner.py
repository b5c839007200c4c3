"""``nmo run``: the operator process, from its flags to its exit code.

Why this module exists: it is the one place that wires the operator
together. It sets up logging and the temporary directory, turns the flags
into settings (:mod:`nmo.cli.settings`), connects to the API, creates the
metrics registry, the engine and the HTTP servers, and hands them to the
process's :class:`~nmo.controller.manager.Manager`, which starts them in
phases, handles the signals and stops them in reverse; nothing below it
builds any of these (no global state).

Exit codes: 0 a clean stop (SIGTERM/SIGINT), 1 a failure (no API, a task
that crashed, a port taken), 2 a usage error found before connecting.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from nmo import __version__
from nmo.cli import goflags
from nmo.cli.defaults import temporary_directory
from nmo.cli.flags import run_error
from nmo.cli.settings import settings_from
from nmo.controller.engine import Engine
from nmo.controller.manager import Manager
from nmo.kube.client import Kube
from nmo.kube.errors import KubeconfigError
from nmo.server.probes import CheckFailed
from nmo.server.servers import Servers, ServerSettings, build_servers
from nmo.telemetry import logsetup
from nmo.telemetry.metrics import Metrics

log = logging.getLogger("nmo.cli")  # the name every line of ``nmo run`` was logged under


def command(args: argparse.Namespace) -> int:
    """``nmo run`` with parsed ``args``: set up logging, then run until stopped."""
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
        return run_error(str(exc))
    logsetup.setup(logs.level, logs.fmt, time_encoding=logs.time_encoding)
    try:
        tmp, why = temporary_directory()
    except FileNotFoundError as exc:
        log.error("%s, nor is /dev/shm: mount an emptyDir at /tmp", exc)
        return 1
    if why is not None:
        log.info("%s; using %s", why, tmp)
    return asyncio.run(run(args))


async def run(args: argparse.Namespace) -> int:
    """Check, connect, build, then :meth:`Manager.run <nmo.controller.manager.Manager.run>`."""
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
    manager = Manager(engine, shutdown_delay=settings.servers.shutdown_delay_seconds, logger=log)
    # Built before anything runs: the servers' cache handlers are registered
    # before the informers start (the manager starts them after the servers).
    manager.add_server("servers", _servers(settings.servers, kube, engine, metrics))
    code = await manager.run()
    await kube.close()
    return code


def _servers(settings: ServerSettings, kube: Kube, engine: Engine, metrics: Metrics) -> Servers:
    """The FastAPI side (webhook, probes, metrics), answering from the engine's caches."""

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

    return build_servers(
        settings,
        kube=kube,
        nodes=engine.nodes,
        maintenances=engine.maintenances,
        metrics=metrics,
        readiness={"informers": caches, "leader-election": leadership},
        leading=lambda: engine.leading,
    )
