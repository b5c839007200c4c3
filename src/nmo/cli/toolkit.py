"""CLI glue for the operations toolkit: ``nmo gather``, ``cleanup``, ``status``, ``plan``.

Connects, asks for confirmation and prints; the flags are in
:mod:`nmo.cli.flags`, the decisions and the I/O in :mod:`nmo.ops`. Exit
codes: 0 done (or nothing to do), 1 an error or a refusal, 2 bad usage;
``nmo plan`` also exits 3 when a drain would be blocked right now
(:data:`EXIT_BLOCKED`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.markup import escape

from nmo.api import constants as c
from nmo.core.maintenance.selectors import parse_selector
from nmo.kube.client import Kube, RetryPolicy
from nmo.kube.errors import Conflict, KubeconfigError, KubeError
from nmo.ops import cleanup, preflight, summary
from nmo.ops.bundle import Item, parse_duration
from nmo.ops.gather import Gatherer, GatherSettings, Unreachable
from nmo.ops.observe import NodeMissing, plan_node

COMMANDS = ("gather", "cleanup", "status", "plan")
EXIT_BLOCKED = 3  # nmo plan: some node's drain would be blocked right now


def main(args: argparse.Namespace) -> int:
    try:
        if args.command == "gather":
            return asyncio.run(gather(args))
        if args.command == "cleanup":
            return asyncio.run(cleanup_command(args))
        if args.command == "status":
            if args.name and args.node:
                print("nmo status: give NAME or --node, not both", file=sys.stderr)
                return 2
            return asyncio.run(status(args))
        if args.command == "plan":
            return asyncio.run(plan(args))
    except KeyboardInterrupt:
        return 130
    return 2


async def connect(args: argparse.Namespace, err: Console) -> Kube | None:
    try:
        return await Kube.connect(kubeconfig=args.kubeconfig, context=args.context)
    except KubeconfigError as exc:  # as kubectl: error: stat <path>: no such file or directory
        err.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        return None
    except Exception as exc:
        err.print(f"[red]error:[/] cannot connect to the Kubernetes API: {escape(str(exc))}")
        return None


# -- gather --------------------------------------------------------------------

_MARK = {
    "ok": "[green]✓[/]",
    "skipped": "[dim]-[/]",
    "not-served": "[yellow]~[/]",
    "not-found": "[yellow]~[/]",
}


async def gather(args: argparse.Namespace) -> int:
    err = Console(stderr=True, highlight=False)
    try:
        since = parse_duration(args.since) if args.since else None
    except ValueError as exc:
        err.print(f"[red]error:[/] --since: {escape(str(exc))}")
        return 2
    kube = await connect(args, err)
    if kube is None:
        return 1
    kube.retry = RetryPolicy(attempts=3, base_delay=0.2, max_delay=2.0)

    def progress(item: Item) -> None:
        mark = _MARK.get(item.status, "[red]✗[/]")
        count = f" ({item.count})" if item.count is not None else ""
        where = f" -> {escape(str(item.file))}" if item.file and item.status == "ok" else ""
        detail = (
            f" [dim]{escape(item.status)}: {escape(str(item.detail))}[/]"
            if item.status != "ok"
            else ""
        )
        err.print(f"{mark} {escape(str(item.name))}{count}{where}{detail}", soft_wrap=True)

    settings = GatherSettings(
        dest=Path(args.dest),
        operator_namespace=args.operator_namespace,
        lease_namespace=args.lease_namespace,
        since=since,
    )
    try:
        err.print(f"Gathering maintenance diagnostics from {escape(str(kube.server))}")
        bundle = await Gatherer(kube, settings, progress=progress).run()
    except Unreachable as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        return 1
    finally:
        await kube.close()
    problems = [i for i in bundle.items if i.problem]
    if problems:
        err.print(f"[yellow]{len(problems)} item(s) could not be collected; see SUMMARY.txt[/]")
    print(bundle.directory)
    print(bundle.archive)
    return 0


# -- cleanup -------------------------------------------------------------------


def _show_plan(out: Console, plan: cleanup.Plan) -> None:
    if plan.steps:
        out.print(
            f"nmo cleanup will change (bypassing the operator) for {escape(str(plan.node_name))}:"
        )
        for step in plan.steps:
            out.print(f"  - {escape(str(step))}", soft_wrap=True, highlight=False)
    for line in plan.kept:
        out.print(f"  [dim]keep:[/] {escape(str(line))}", soft_wrap=True, highlight=False)
    for line in plan.notes:
        out.print(f"  [yellow]note:[/] {escape(str(line))}", soft_wrap=True, highlight=False)


def _confirm(out: Console, yes: bool) -> bool | None:
    """True to go on, False when declined, None when there is no one to ask."""
    if yes:
        return True
    if not sys.stdin.isatty():
        return None
    answer = out.input("Apply these changes? \\[y/N] ")
    return answer.strip().lower() in ("y", "yes")


async def cleanup_command(args: argparse.Namespace) -> int:
    out = Console(highlight=False)
    err = Console(stderr=True, highlight=False)
    kube = await connect(args, err)
    if kube is None:
        return 1
    try:
        return await _cleanup(kube, args, out, err)
    except KubeError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        return 1
    finally:
        await kube.close()


async def _cleanup(kube: Kube, args: argparse.Namespace, out: Console, err: Console) -> int:
    node = args.node

    async def plan_now() -> tuple[cleanup.Observed, cleanup.Plan]:
        seen = await cleanup.observe(
            kube,
            node,
            lease_namespace=args.lease_namespace,
            operator_namespace=args.operator_namespace,
        )
        plan = cleanup.plan_cleanup(
            node,
            node=seen.node,
            maintenances=seen.maintenances,
            lease=seen.lease,
            lease_namespace=args.lease_namespace,
            delete_maintenances=args.delete_maintenance,
        )
        return seen, plan

    seen, plan = await plan_now()
    missing = 0 if plan.node_found else 1
    if missing:
        err.print(f'[red]error:[/] node "{escape(str(node))}" not found')
    if plan.empty:
        _show_plan(out, plan)
        if not missing:
            out.print(f"Nothing to do: {escape(str(node))} carries no maintenance left by nmo.")
        return missing
    leader = None
    holder = str(((seen.leader or {}).get("spec") or {}).get("holderIdentity") or "")
    if holder and not args.force:
        err.print(
            f"checking whether the nmo leader {escape(repr(holder))} still renews its lease "
            f"(up to {cleanup.LEADER_WINDOW:g}s)",
            soft_wrap=True,
        )
        leader = await cleanup.watch_leader(kube, args.operator_namespace, seen.leader)
    if leader:
        err.print(
            f"[red]refusing:[/] the nmo leader {escape(repr(leader))} is alive (lease "
            f"{args.operator_namespace}/{c.LEADER_ELECTION_ID}); it would redo or undo these "
            "changes. Delete the NodeMaintenance instead (kubectl delete nm <name>), "
            "or pass --force if the operator is known to be stuck."
        )
        return 1
    _show_plan(out, plan)
    answer = _confirm(out, args.yes)
    if answer is None:
        err.print("[red]refusing:[/] stdin is not a terminal; re-run with --yes to apply")
        return 1
    if not answer:
        out.print("Aborted; nothing changed.")
        return 1
    confirmed = plan
    for attempt in range(3):
        try:
            done = await cleanup.execute(kube, plan, lease_namespace=args.lease_namespace)
            break
        except Conflict:
            _, plan = await plan_now()
            if not cleanup.same_or_smaller(plan, confirmed) or attempt == 2:
                err.print("[red]error:[/] the objects changed while cleaning up; run again")
                return 1
    for line in done:
        out.print(f"done: {escape(str(line))}", soft_wrap=True)
    return missing


# -- status --------------------------------------------------------------------


async def status(args: argparse.Namespace) -> int:
    err = Console(stderr=True, highlight=False)
    kube = await connect(args, err)
    if kube is None:
        return 1
    try:
        if args.watch:
            return await watch_status(kube, args, err)
        summaries = await _summaries(kube, args)
        now = datetime.now(UTC)
        if args.output == "json":
            print(json.dumps(summary.document(summaries, now), indent=2))
        else:
            Console().print(summary.render(summaries, now))
        return 0
    except (summary.StatusError, KubeError) as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        return 1
    finally:
        await kube.close()


async def _summaries(kube: Kube, args: argparse.Namespace) -> list[summary.Obj]:
    return await summary.collect(
        kube,
        name=args.name,
        node=args.node,
        lease_namespace=args.lease_namespace,
        now=datetime.now(UTC),
    )


Done = Callable[[list[summary.Obj]], int | None]


async def watch_status(
    kube: Kube, args: argparse.Namespace, err: Console, done: Done | None = None
) -> int:
    """Poll every second; redraw (text) or print one JSON line per change (json).

    ``done`` ends the watch with its exit code once it returns one (``kubectl
    nm start --wait``); without it the watch runs until Ctrl-C or the CR is
    deleted.
    """
    as_json = args.output == "json"
    live = None if as_json else Live(summary.render([], datetime.now(UTC)), auto_refresh=False)
    last: list[summary.Obj] | None = None
    if live is not None:
        live.start()
    try:
        while True:
            try:
                summaries = await _summaries(kube, args)
            except summary.StatusError as exc:
                if last is None:
                    raise
                err.print(f"{escape(str(exc))} (it was deleted)")
                return 0
            now = datetime.now(UTC)
            if live is not None:
                # Ages change every second, so redraw on every poll.
                live.update(summary.render(summaries, now), refresh=True)
            elif summaries != last:
                print(json.dumps(summary.document(summaries, now)), flush=True)
            last = summaries
            if done is not None and (code := done(summaries)) is not None:
                return code
            await asyncio.sleep(1)
    finally:
        if live is not None:
            live.stop()


# -- plan ----------------------------------------------------------------------


async def plan(args: argparse.Namespace) -> int:
    """``nmo plan NODE...``: 0 nothing blocks, 3 a drain would be blocked now, 1 an error."""
    err = Console(stderr=True, highlight=False)
    selector = None
    if args.pod_selector is not None:
        try:
            selector = parse_selector(args.pod_selector)
        except ValueError as exc:
            err.print(f"[red]error:[/] --pod-selector: {escape(str(exc))}")
            return 2
    kube = await connect(args, err)
    if kube is None:
        return 1
    results: list[preflight.Preflight] = []
    errors: dict[str, str] = {}
    try:
        for node in dict.fromkeys(args.nodes):
            try:
                results.append(
                    await plan_node(
                        kube,
                        node,
                        selector,
                        critical_last=args.critical_pods_last,
                        pod_rules_namespaces=args.pod_drain_rules_namespaces,
                    )
                )
            except (NodeMissing, KubeError) as exc:
                errors[node] = str(exc)
                err.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
    finally:
        await kube.close()
    if args.output == "json":
        print(json.dumps(preflight.document(results, errors, datetime.now(UTC)), indent=2))
    else:
        print("\n\n".join(preflight.render(p) for p in results))
    if errors:
        return 1
    return EXIT_BLOCKED if any(p.blocked for p in results) else 0
