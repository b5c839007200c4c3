"""``kubectl nm``: the maintenance workflow as a kubectl plugin (console script ``kubectl-nm``).

kubectl runs any ``kubectl-<name>`` executable on PATH as ``kubectl <name>``,
passing every argument after the plugin name; installing nmo puts
``kubectl-nm`` next to ``nmo``. The subcommands are thin: ``status``,
``plan`` and ``cleanup`` are the ``nmo`` commands of the same names
(:mod:`nmo.cli.toolkit`), ``start`` creates a NodeMaintenance and ``stop``
deletes the node's. kubectl's ``--kubeconfig`` and ``--context`` are taken
before or after the subcommand (kubectl itself refuses flags placed before
a plugin's name: ``kubectl nm --context x status``, not ``kubectl --context
x nm status``); ``$KUBECONFIG`` is honoured.

Exit codes: 0 done, 1 an error (the API's message, e.g. a webhook denial,
printed as is), 2 bad usage, 3 ``plan`` found a drain that would be blocked,
130 interrupted.

A command loads the client and the console when it runs, not before:
``kubectl nm --help`` and a usage error need only the parser, and no
command loads the HTTP server (tests/unit/test_cli_startup.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from nmo.api import constants as c
from nmo.cli.flags import ON_TIMEOUT, add_plan_arguments
from nmo.core.maintenance.selectors import parse_selector

if TYPE_CHECKING:
    from rich.console import Console

    from nmo.kube.client import Kube
    from nmo.kube.errors import KubeError
    from nmo.ops import summary

PROG = "kubectl nm"
POLL_SECONDS = 1.0


def _global(p: argparse.ArgumentParser) -> None:
    """kubectl's connection flags; SUPPRESS lets them appear before or after the subcommand."""
    p.add_argument("--kubeconfig", default=argparse.SUPPRESS, help="path to the kubeconfig file")
    p.add_argument("--context", default=argparse.SUPPRESS, help="the kubeconfig context to use")
    p.add_argument(
        "--lease-namespace",
        default=argparse.SUPPRESS,
        help="namespace of the medik8s node leases (env LEASE_NAMESPACE)",
    )


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 (no deadline) or more")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Node maintenance from kubectl: status, plan, start, stop, cleanup."
    )
    _global(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("status", help="show maintenances: phase, progress, pending pods, lease")
    s.add_argument("name", nargs="?", default=None)
    s.add_argument("--node", default=None, help="the maintenance of this node")
    s.add_argument("--watch", "-w", action="store_true", help="redraw as the status changes")
    s.add_argument("-o", "--output", choices=["text", "json"], default="text")
    _global(s)

    p = sub.add_parser(
        "plan",
        help="preflight: what a maintenance of NODE would do now, and what would block it",
        description="Changes nothing. Exit 0 when nothing blocks, 3 when a drain would be "
        "blocked right now, 1 on errors.",
    )
    add_plan_arguments(p)
    _global(p)

    start = sub.add_parser("start", help="put NODE into maintenance (create a NodeMaintenance)")
    start.add_argument("node", metavar="NODE")
    start.add_argument("--reason", default=None, help="why (spec.reason)")
    start.add_argument("--name", default=None, help="the NodeMaintenance's name (nm-<node>)")
    start.add_argument(
        "--timeout-seconds",
        type=_non_negative,
        default=None,
        metavar="N",
        help="spec.drain.timeoutSeconds: the drain's deadline (0: none)",
    )
    start.add_argument(
        "--on-timeout",
        choices=list(ON_TIMEOUT),
        default=None,
        help="spec.drain.onTimeout: what happens at the deadline",
    )
    start.add_argument(
        "--pod-selector",
        default=None,
        metavar="SELECTOR",
        help="spec.drain.podSelector: evict only the matching pods (e.g. 'app=web')",
    )
    start.add_argument(
        "--wait", action="store_true", help="follow the maintenance until Succeeded or Failed"
    )
    start.add_argument("-o", "--output", choices=["text", "json"], default="text")
    _global(start)

    stop = sub.add_parser("stop", help="take NODE out of maintenance (delete its NodeMaintenance)")
    stop.add_argument("node", metavar="NODE")
    stop.add_argument(
        "--wait", action="store_true", help="wait until the node is restored and the CR gone"
    )
    _global(stop)

    cu = sub.add_parser(
        "cleanup",
        help="emergency: take a node out of maintenance without the operator (nmo cleanup)",
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
    _global(cu)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    for name, default in (
        ("kubeconfig", os.environ.get("KUBECONFIG") or None),
        ("context", None),
        ("lease_namespace", os.environ.get(c.LEASE_NAMESPACE_ENV) or c.LEASE_NAMESPACE_DEFAULT),
    ):
        if not hasattr(args, name):
            setattr(args, name, default)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.command in ("status", "plan", "cleanup"):
            from nmo.cli import toolkit

            if args.command == "status" and args.name and args.node:
                print(f"{PROG} status: give NAME or --node, not both", file=sys.stderr)
                return 2
            return toolkit.main(args)
        import asyncio

        if args.command == "start":
            return asyncio.run(start(args))
        if args.command == "stop":
            return asyncio.run(stop(args))
    except KeyboardInterrupt:
        return 130
    return 2


def maintenance_body(args: argparse.Namespace) -> dict[str, Any]:
    """The NodeMaintenance ``kubectl nm start`` creates (pure)."""
    spec: dict[str, Any] = {"nodeName": args.node}
    if args.reason:
        spec["reason"] = args.reason
    drain: dict[str, Any] = {}
    if args.timeout_seconds is not None:
        drain["timeoutSeconds"] = args.timeout_seconds
    if args.on_timeout is not None:
        drain["onTimeout"] = args.on_timeout
    if args.pod_selector is not None:
        drain["podSelector"] = parse_selector(args.pod_selector)
    if drain:
        spec["drain"] = drain
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND,
        "metadata": {"name": args.name or f"nm-{args.node}"},
        "spec": spec,
    }


def _api_error(err: Console, exc: KubeError) -> None:
    """The API's answer as kubectl shows it: ``Error from server (Reason): message``."""
    reason = exc.reason or type(exc).__name__
    err.print(f"Error from server ({reason}): {exc.message}", soft_wrap=True, markup=False)


async def _connect(args: argparse.Namespace, err: Console) -> Kube | None:
    from nmo.cli import toolkit

    kube = await toolkit.connect(args, err)
    if kube is not None:
        kube.on_warning = lambda text: err.print(f"Warning: {text}", soft_wrap=True, markup=False)
    return kube


def _phase_done(summaries: list[summary.Obj]) -> int | None:
    """``start --wait`` ends at Succeeded (0) or Failed (1)."""
    phase = summaries[0].get("phase") if summaries else None
    if phase == "Succeeded":
        return 0
    if phase == "Failed":
        return 1
    return None


async def start(args: argparse.Namespace) -> int:
    from rich.console import Console

    from nmo.cli import toolkit
    from nmo.kube.client import nm_path
    from nmo.kube.errors import KubeError
    from nmo.ops import summary

    err = Console(stderr=True, highlight=False)
    try:
        body = maintenance_body(args)
    except ValueError as exc:
        err.print(f"error: --pod-selector: {exc}", markup=False)
        return 2
    name = body["metadata"]["name"]
    kube = await _connect(args, err)
    if kube is None:
        return 1
    try:
        try:
            await kube.create(nm_path(), body)
        except KubeError as exc:
            _api_error(err, exc)
            return 1
        print(f"nodemaintenance.{c.GROUP}/{name} created", flush=True)
        if not args.wait:
            return 0
        watch = argparse.Namespace(
            name=name, node=None, lease_namespace=args.lease_namespace, output=args.output
        )
        try:
            code = await toolkit.watch_status(kube, watch, err, done=_phase_done)
        except (summary.StatusError, KubeError) as exc:
            err.print(f"error: {exc}", markup=False)
            return 1
        if code == 0:
            err.print(
                f"node {args.node} is in maintenance (nodemaintenance/{name} Succeeded)",
                markup=False,
            )
        else:
            err.print(
                f"nodemaintenance/{name} did not succeed; see: {PROG} status {name}", markup=False
            )
        return code
    finally:
        await kube.close()


def restored(node: dict[str, Any]) -> bool:
    """Whether nmo's marks are gone from the node: the drain taint and the exclusion label."""
    taints = (node.get("spec") or {}).get("taints") or []
    labels = (node.get("metadata") or {}).get("labels") or {}
    return not any(t.get("key") == c.DRAIN_TAINT_KEY for t in taints) and (
        c.EXCLUDE_FROM_REMEDIATION_LABEL not in labels
    )


async def stop(args: argparse.Namespace) -> int:
    from rich.console import Console

    from nmo.kube.errors import KubeError

    err = Console(stderr=True, highlight=False)
    kube = await _connect(args, err)
    if kube is None:
        return 1
    try:
        return await _stop(kube, args, err)
    except KubeError as exc:
        _api_error(err, exc)
        return 1
    finally:
        await kube.close()


async def _maintenances_of(kube: Kube, node: str) -> list[str]:
    from nmo.kube.client import nm_path

    items = (await kube.list_all(nm_path())).get("items") or []
    return sorted(
        str(m["metadata"]["name"]) for m in items if (m.get("spec") or {}).get("nodeName") == node
    )


async def _stop(kube: Kube, args: argparse.Namespace, err: Console) -> int:
    import asyncio

    from nmo.kube.client import nm_path, node_path
    from nmo.kube.errors import NotFound

    node = args.node
    names = await _maintenances_of(kube, node)
    if not names:
        err.print(f'error: no NodeMaintenance for node "{node}"', markup=False)
        return 1
    for name in names:
        try:
            await kube.delete(nm_path(name))
        except NotFound:
            pass
        print(f'nodemaintenance.{c.GROUP} "{name}" deleted', flush=True)
    if not args.wait:
        return 0
    err.print(
        f"waiting for the operator to restore {node} and remove {', '.join(names)} "
        f"(if no operator runs, see: {PROG} cleanup {node})",
        soft_wrap=True,
        markup=False,
    )
    while True:
        left = await _maintenances_of(kube, node)
        try:
            obj = await kube.get(node_path(node))
        except NotFound:
            obj = None
        if not left and (obj is None or restored(obj)):
            break
        await asyncio.sleep(POLL_SECONDS)
    err.print(f"node {node} is out of maintenance" if obj else f"node {node} is gone", markup=False)
    return 0
