"""nmo's command line: every flag of every ``nmo`` command, its default and its help.

Why this module exists: ``nmo --help``, ``nmo version`` and a usage error
need the parser and nothing else, so it imports only the standard library
and nmo's light constants (no kr8s, pydantic, FastAPI or uvicorn: issue 21
item 6, tests/unit/test_cli_startup.py). What the flags mean is read by
:mod:`nmo.cli.settings` (``nmo run``) and :mod:`nmo.cli.toolkit` (the
operations toolkit); ``kubectl nm`` (:mod:`nmo.cli.plugin`) shares
:func:`add_plan_arguments`.

Arguments that start with a flag are ``run``'s, and ``run``'s Go flags are
normalized first (:func:`command_line`, :mod:`nmo.cli.goflags`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Final, TypeAlias

from nmo.api import constants as c
from nmo.cli import goflags
from nmo.cli.defaults import CONTROLLER_RUNTIME_CERT_DIR, IN_POD_SHUTDOWN_DELAY, namespaces_arg

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

# spec.drain.onTimeout's values (nmo.api.models.OnTimeout, a pydantic module
# the help must not load); tests/unit/test_cli_startup.py keeps them equal.
ON_TIMEOUT: Final = ("Report", "Delete", "Abort")


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def _env_bool(name: str) -> bool:
    return (os.environ.get(name) or "").strip().lower() in ("1", "true", "yes", "on")


def _volume_timeout(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds") from None
    if not 1 <= value <= c.VOLUME_DETACH_TIMEOUT_MAX:
        raise argparse.ArgumentTypeError(
            f"{text!r}: must be 1 to {c.VOLUME_DETACH_TIMEOUT_MAX} seconds (no wait without "
            "a deadline)"
        )
    return value


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
    add_run_parser(sub)
    sub.add_parser("crd", help="print the NodeMaintenance CRD as YAML")
    sub.add_parser("version", help="print the version")
    add_ops_parsers(sub)
    return parser


def add_run_parser(sub: Subparsers) -> None:
    """``nmo run``'s flags: nmo's own, then the Go NMO's."""
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
        "--max-parallel-evictions", type=int, default=_env_int("NMO_MAX_PARALLEL_EVICTIONS", 100)
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
        "--pdb-recheck-interval",
        type=_positive_float,
        default=60.0,
        metavar="SECONDS",
        help="a PodDisruptionBudget that refused an eviction is asked again when its "
        "status changes, and otherwise this often, one pod per PDB (default 60)",
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
        choices=list(ON_TIMEOUT),
        default=os.environ.get("NMO_DRAIN_ON_TIMEOUT") or ON_TIMEOUT[0],
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
        "--node-conditions",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="keep the node lifecycle conditions (MaintenancePlanned, MaintenanceInProgress, "
        "DrainInProgress, Drained) on Node.status.conditions while a maintenance holds the "
        "node; needs patch on nodes/status (default: off, as the Go NMO, which writes none)",
    )
    eng.add_argument(
        "--wait-for-volume-detach",
        action=argparse.BooleanOptionalAction,
        default=_env_bool("NMO_WAIT_FOR_VOLUME_DETACH"),
        help="after the last pod left, keep the maintenance Running until no "
        "VolumeAttachment of a drained pod's volume is left on the node (condition "
        "VolumesDetached), as Cluster API and Karpenter do; a NodeMaintenance's "
        "spec.drain.waitForVolumeDetach.enabled overrides it (default: off, as the Go NMO)",
    )
    eng.add_argument(
        "--volume-detach-timeout",
        type=_volume_timeout,
        default=_env_int("NMO_VOLUME_DETACH_TIMEOUT", c.VOLUME_DETACH_TIMEOUT_DEFAULT),
        metavar="SECONDS",
        help="how long a maintenance waits for volumes to detach, 1 to 86400 (default "
        f"{c.VOLUME_DETACH_TIMEOUT_DEFAULT}); at the end it reports (event "
        "VolumeDetachTimedOut) and succeeds",
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
        choices=list(ON_TIMEOUT),
        default=os.environ.get("NMO_MAX_DRAIN_ACTION") or ON_TIMEOUT[0],
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
    fleet.add_argument(
        "--fleet-soak-seconds",
        type=int,
        default=_env_int("NMO_FLEET_SOAK_SECONDS", 0),
        metavar="SECONDS",
        help="after a node returns from a maintenance (its CR deleted or failed), the next "
        "queued maintenance starts this much later at the earliest (0: no soak)",
    )
    gate = run.add_argument_group("alert gate (kured-style, off by default)")
    gate.add_argument(
        "--blocking-prometheus-url",
        default=os.environ.get("NMO_BLOCKING_PROMETHEUS_URL", ""),
        metavar="URL",
        help="Prometheus to ask for firing alerts (GET URL/api/v1/alerts); while one "
        "matching --blocking-alerts fires, or Prometheus does not answer, no new "
        "maintenance starts (empty: no gate)",
    )
    gate.add_argument(
        "--blocking-alerts",
        default=os.environ.get("NMO_BLOCKING_ALERTS", ""),
        metavar="REGEX",
        help="alert names that block (a regular expression, searched unanchored as kured's; "
        "'.*' blocks on every alert); needed with --blocking-prometheus-url",
    )
    gate.add_argument(
        "--blocking-prometheus-token-file",
        default=os.environ.get("NMO_BLOCKING_PROMETHEUS_TOKEN_FILE") or None,
        metavar="PATH",
        help="bearer token sent to Prometheus, read afresh for each query "
        "(e.g. /var/run/secrets/kubernetes.io/serviceaccount/token)",
    )
    gate.add_argument(
        "--blocking-prometheus-ca-file",
        default=os.environ.get("NMO_BLOCKING_PROMETHEUS_CA_FILE") or None,
        metavar="PATH",
        help="CA bundle to verify Prometheus's certificate (default: the system's)",
    )
    gate.add_argument(
        "--blocking-prometheus-interval",
        type=float,
        default=float(os.environ.get("NMO_BLOCKING_PROMETHEUS_INTERVAL") or 30.0),
        metavar="SECONDS",
        help="how often Prometheus is asked; the answer is cached in between",
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


def _connection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    p.add_argument("--context", default=None)
    p.add_argument(
        "--lease-namespace",
        default=os.environ.get(c.LEASE_NAMESPACE_ENV) or c.LEASE_NAMESPACE_DEFAULT,
        help="namespace of the medik8s node leases (env LEASE_NAMESPACE)",
    )


def add_ops_parsers(sub: Subparsers) -> None:
    """``nmo gather``, ``cleanup``, ``status`` and ``plan`` (:mod:`nmo.cli.toolkit` runs them)."""
    g = sub.add_parser("gather", help="collect a must-gather bundle (directory and .tar.gz)")
    g.add_argument("--dest", default=".", help="where the bundle is written (default: .)")
    g.add_argument("--since", default=None, help="only logs newer than this (e.g. 30m, 2h)")
    g.add_argument("--operator-namespace", default=c.OPERATOR_NAMESPACE)
    _connection(g)

    cu = sub.add_parser(
        "cleanup",
        help="emergency: take a node out of maintenance without the operator",
        description="Undo what a dead operator left on NODE (guide section 6). "
        "This bypasses the operator; prefer deleting the NodeMaintenance while it runs.",
    )
    cu.add_argument("node")
    cu.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    cu.add_argument("--force", action="store_true", help="proceed even if an nmo leader is alive")
    cu.add_argument(
        "--delete-maintenance",
        action="store_true",
        help="also delete the node's NodeMaintenance objects",
    )
    cu.add_argument("--operator-namespace", default=c.OPERATOR_NAMESPACE)
    _connection(cu)

    s = sub.add_parser("status", help="show maintenances: phase, progress, pending pods, lease")
    s.add_argument("name", nargs="?", default=None)
    s.add_argument("--node", default=None, help="the maintenance of this node")
    s.add_argument("--watch", "-w", action="store_true", help="redraw as the status changes")
    s.add_argument("-o", "--output", choices=["text", "json"], default="text")
    _connection(s)

    p = sub.add_parser(
        "plan",
        help="preflight: what a maintenance of NODE would evict, skip and wait on, "
        "and which PodDisruptionBudgets would block it now",
        description="Changes nothing. Exit codes: 0 nothing blocks, 3 a drain would be "
        "blocked right now (a PodDisruptionBudget allowing no disruption, a pod under two "
        "PDBs, an unknown drain rule), 1 an error such as a missing node.",
    )
    add_plan_arguments(p)
    _connection(p)


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    """``plan``'s arguments, shared by ``nmo plan`` and ``kubectl nm plan``."""
    p.add_argument("nodes", nargs="+", metavar="NODE")
    p.add_argument(
        "--pod-selector",
        default=None,
        metavar="SELECTOR",
        help="evict only the pods matching this label selector, as spec.drain.podSelector "
        "would (kubectl -l syntax, e.g. 'app=web,tier!=db')",
    )
    p.add_argument(
        "--critical-pods-last",
        action="store_true",
        help="order the drain as an operator started with --critical-pods-last does "
        "(critical priority classes after the others)",
    )
    p.add_argument(
        "--pod-drain-rules-namespaces",
        type=namespaces_arg,
        default=frozenset(),
        metavar="NS[,NS...]",
        help="honour pods' own drain rules in these namespaces, as an operator started "
        "with the same flag does ('*': every namespace; default: none, as the Go NMO)",
    )
    p.add_argument("-o", "--output", choices=["text", "json"], default="text")


def run_error(message: str) -> int:
    """``nmo run``'s usage error, as argparse words its own (exit code 2)."""
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
