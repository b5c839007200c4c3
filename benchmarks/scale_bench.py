"""Scale benchmark: nmo's memory, reaction latency and drain speed in a big cluster.

One sandbox, grown step by step (``--parts``, default all four):

(a) idle RSS. ``--pods`` (default 0 5000 10000 20000) Running pods spread
    over ``--bulk-nodes`` (20) kwok nodes, made by Deployments of up to
    ``--replicas-per-deployment`` (1000) replicas and waited for until
    Ready; then, with the pods gone, ``--nodes`` (100 500) nodes in total
    (up to the 5,000 of Kubernetes' limits: created 50 at a time; 2,000 in
    about a minute, 5,000 in about 10 on 2 cores, where kwok's lease
    renewals, 500 a second, keep the apiserver busy). At each step a fresh
    ``nmo run`` is started, ``/readyz`` (caches synced) awaited, and after
    ``--settle`` (10) s its RSS is read. Printed: MiB per step, the delta
    vs the first step and KiB per node added since it, the time to ready,
    the startup peak and the CPU time used until ready and while settling.
    ``--against COMMIT...`` runs those commits' nmo beside this one's at
    every step (before/after in one sandbox; their ``src`` exported with
    ``git archive``), ``--idle-tools nmo gonmo`` the Go NMO too (it caches
    no Nodes). ``--latency-nodes`` (e.g. 100 5000) runs part (b)'s latency
    at those node steps too: a maintenance in a small and a big cluster.
(b) reaction latency, at the ``--workload-pods`` step (default 10000): for
    each of ``--latency-crs`` (50) empty nodes, ONE AT A TIME, create a
    NodeMaintenance and time create -> everything in place (phase Running
    or later, finalizer ``foregroundDeleteNodeMaintenance``, lease
    ``medik8s-leases/node-<node>`` held by ``node-maintenance``, taints
    ``node.kubernetes.io/unschedulable:NoSchedule`` and
    ``medik8s.io/drain:NoSchedule``, ``spec.unschedulable``), then delete it
    and time delete -> node uncordoned (no maintenance taints) and lease
    gone. Observed by watches on the CRs, leases and nodes (no polling).
    p50/p99 (nearest rank), plus the p50 of each milestone.
(c) at the same step: ``--drain-pods`` (500) pods on one node, the raw
    ceiling (``ceiling.py``), nmo and the Go NMO (``--drain-tools``), each
    alone, cluster cleaned in between, as ``drain_bench.py`` drains: per
    tool seconds, ratio to the ceiling and to the Go NMO, CPU-seconds (and
    per 1,000 evicted pods), peak RSS, requests (by verb), status writes per
    CR and refused evictions.
(d) at the same step: ``--concurrent-nodes`` (50) NodeMaintenances created
    at once on nodes with ``--concurrent-pods`` (100) pods each, one node's
    pods behind a PDB with ``minAvailable`` = replicas (never allows an
    eviction): time until the other 49 are Succeeded, for nmo and then for
    the Go NMO (``--concurrent-tools``; each in a fresh namespace, CRs
    deleted in between; neither ever finishes the blocked node, the Go NMO
    spends a 30 s drain pass on it again and again, one reconcile at a time,
    hence ``--concurrent-timeout``, 3600 s); then the same 49 nodes
    refilled and drained concurrently by the ceiling (one client, 100
    connections shared by all nodes); ratios to the ceiling and nmo/gonmo,
    and the same figures as (c) (status writes per CR over all 50 CRs,
    CPU per 1,000 pods over the 49 nodes' pods).

The Go NMO is ``benchlib.GoNmo``: its manager built from
``../shared/third_party`` by ``hack/go-nmo-bin.sh manager`` (``make
go-nmo-bin``), run out of cluster as the sandbox admin.

Quick run: ``.venv/bin/python benchmarks/scale_bench.py --pods 0 2000
--workload-pods 2000 --nodes 100 --latency-crs 10``, or parts (c) and (d)
alone, small: ``--parts c d --workload-pods 2000 --drain-pods 200
--concurrent-nodes 5 --concurrent-pods 20``. Full run: ``make bench-scale``
(it builds the sandbox binaries and the Go NMO's manager first, cached in
``~/.cache/nmo``; 20,000 pods: creating them takes several minutes on 2
cores). The whole control plane, the operators and the benchmark share the
machine's cores: figures are noisy, compare ratios within one run, and never
run two benchmarks at once (``flock /tmp/nmo-bench.lock make bench-scale``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from benchlib import (
    LEASES,
    NM,
    AuditWindow,
    DrainContext,
    GoNmo,
    Hub,
    Mirror,
    Nmo,
    RssSampler,
    Scenario,
    create_deployment,
    create_namespace,
    create_nodes,
    delete_namespace,
    delete_nodes,
    environment_note,
    go_nmo_binary,
    install_crd,
    maintenance,
    make_spares,
    metrics_delta,
    nmo_commit,
    ok,
    operator,
    per_1000,
    prepare_workload,
    profiled,
    quantile,
    ready_replicas,
    request_figures,
    run_drain,
    until,
)
from ceiling import (
    client_from_kubeconfig,
    drain_ceiling_detailed,
    evictable,
    list_node_pods,
    wait_node_empty,
)
from idle_compare import export_src

from nmo.api import constants as c
from nmo_sandbox import Sandbox
from nmo_sandbox.nodes import node_is_ready, node_manifest

OPERATORS = ("nmo", "gonmo")
# Each operator's figures of a part (c) drain, in the part's record as <tool>_<figure>.
OPERATOR_FIGURES = (
    "node_empty_s",
    "requests",
    "requests_by_verb",
    "status_writes_per_cr",
    "refused_evictions",
    "peak_rss_mib",
    "cpu_s",
    "cpu_s_per_1000_pods",
)
# The ceiling's: its CPU time is the benchmark process's own (an upper bound).
CEILING_FIGURES = ("requests", "requests_by_verb", "refused_evictions", "client_cpu_s")
BULK_NS = "bulk"
BULK_LABEL = "bench-bulk"
Obj = dict[str, Any]


@dataclass(frozen=True)
class Idler:
    """Who idles at each step of part (a): nmo (this checkout or ``src``) or the Go NMO."""

    label: str
    tool: str = "nmo"
    src: Path | None = None  # another commit's src/ (``--against``)


@dataclass
class Bench:
    sb: Sandbox
    http: httpx.AsyncClient
    work: Path
    opts: argparse.Namespace
    out: dict[str, Any]
    idlers: tuple[Idler, ...] = (Idler("nmo"),)

    def ctx(self) -> DrainContext:
        return DrainContext(
            self.sb, self.http, self.work, [], timeout=1800.0, profile=self.opts.profile
        )


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


# -- the background pods ------------------------------------------------------


async def scale_bulk(b: Bench, pods: int) -> float:
    """Make the bulk namespace hold ``pods`` Ready pods; returns seconds taken."""
    http, per = b.http, b.opts.replicas_per_deployment
    started = time.monotonic()
    if pods == 0:
        if (await http.get(f"/api/v1/namespaces/{BULK_NS}")).status_code == 200:
            await delete_namespace(http, BULK_NS, timeout=7200)
        return time.monotonic() - started
    if (await http.get(f"/api/v1/namespaces/{BULK_NS}")).status_code == 404:
        await create_namespace(http, BULK_NS)
    items = (await ok(http.get(f"/apis/apps/v1/namespaces/{BULK_NS}/deployments")))["items"]
    have = {d["metadata"]["name"]: int(d["spec"]["replicas"]) for d in items}
    count = math.ceil(pods / per)
    for i in range(count):
        name, want = f"bulk-{i}", min(per, pods - i * per)
        if name not in have:
            await create_deployment(http, BULK_NS, name, want, {BULK_LABEL: "yes"})
        elif have[name] != want:
            await ok(
                http.patch(
                    f"/apis/apps/v1/namespaces/{BULK_NS}/deployments/{name}/scale",
                    json={"spec": {"replicas": want}},
                    headers={"Content-Type": "application/merge-patch+json"},
                )
            )
    for name in have:
        if int(name.split("-")[1]) >= count:
            await ok(http.delete(f"/apis/apps/v1/namespaces/{BULK_NS}/deployments/{name}"))
    last_report = started

    async def ready() -> bool:
        nonlocal last_report
        n = await ready_replicas(http, BULK_NS)
        if time.monotonic() - last_report > 30:
            last_report = time.monotonic()
            rate = n / (last_report - started)
            print(f"  ... {n}/{pods} pods Ready ({rate:.0f}/s overall)", flush=True)
        return n == pods

    await until(ready, 7200, f"{pods} bulk pods Ready", interval=1.0)
    return time.monotonic() - started


async def node_count(http: httpx.AsyncClient) -> int:
    nodes = await ok(http.get("/api/v1/nodes", params={"resourceVersion": "0"}))
    return len(nodes["items"])


# -- (a) idle RSS ---------------------------------------------------------------


async def add_nodes(http: httpx.AsyncClient, names: list[str], label: str) -> None:
    """Create kwok nodes labelled ``label=yes``, 50 at a time, and wait until
    all are usable, reading only the nodes so labelled from the apiserver's
    cache (``create_nodes`` reads the whole node list every half second: at
    5,000 nodes that slows the apiserver which is making them Ready)."""
    sem = asyncio.Semaphore(50)

    async def one(name: str) -> None:
        async with sem:
            body = node_manifest(name, labels={label: "yes"})
            await ok(http.post("/api/v1/nodes", json=body), 201, 409)

    await asyncio.gather(*(one(n) for n in names))
    wanted = set(names)
    params = {"resourceVersion": "0", "labelSelector": f"{label}=yes"}

    async def ready() -> bool:
        items = (await ok(http.get("/api/v1/nodes", params=params)))["items"]
        return wanted <= {n["metadata"]["name"] for n in items if node_is_ready(n)}

    # Past 2,000 nodes the sandbox slows down: kwok renews every node's lease
    # every 10 s (500 writes a second at 5,000 nodes, on the same 2 cores).
    await until(
        ready,
        max(300.0, len(names) * 0.5),
        f"{len(names)} nodes to be Ready",
        interval=0.2 if len(names) < 50 else 3.0 if len(names) < 1000 else 10.0,
    )


async def idle_rss(b: Bench, label: str, pods: int, who: Idler = Idler("nmo")) -> dict[str, Any]:
    if who.tool == "gonmo":
        proc: Nmo | GoNmo = GoNmo(b.sb, b.work / f"gonmo-idle-{label}.log")
    else:
        proc = Nmo(b.sb, b.work / f"{who.label}-idle-{label}.log")
    saved = os.environ.get("NMO_BENCH_SRC")
    if who.src is not None:
        os.environ["NMO_BENCH_SRC"] = str(who.src)
    try:
        await proc.start(timeout=1200)
    finally:
        if saved is None:
            os.environ.pop("NMO_BENCH_SRC", None)
        else:
            os.environ["NMO_BENCH_SRC"] = saved
    try:
        async with RssSampler(proc.pid, interval=0.2) as rss:
            # Part of the definition of "idle": 10 s after the caches synced.
            await asyncio.sleep(b.opts.settle)
        record = {
            "part": "a",
            "step": label,
            "nmo": who.label,
            "nodes": await node_count(b.http),
            "pods": pods,
            "ready_s": round(proc.ready_after, 2),
            "startup_peak_rss_mib": round(proc.startup_peak_rss, 1),
            "startup_cpu_s": round(proc.startup_cpu, 2),
            "settle_cpu_s": round(rss.cpu, 2),
            "settle_peak_rss_mib": round(rss.peak, 1),
            "idle_rss_mib": round(rss.last, 1),
        }
    finally:
        await proc.stop()
    emit(record)
    return record


async def idle_step(b: Bench, label: str, pods: int) -> list[dict[str, Any]]:
    """One step of part (a): each idler in turn, the order reversed every other
    step (the nodes just created are still being updated: whoever runs first
    sees more watch events while settling)."""
    who = list(b.idlers)
    if len(b.out["a"]) // len(who) % 2:
        who.reverse()
    return [await idle_rss(b, label, pods, w) for w in who]


# -- (b) latency ----------------------------------------------------------------


def _taints(node: Obj) -> set[tuple[str, str]]:
    return {
        (str(t.get("key")), str(t.get("effect")))
        for t in (node.get("spec") or {}).get("taints") or []
    }


MAINT_TAINTS = {(k, c.TAINT_EFFECT) for k in c.MAINTENANCE_TAINT_KEYS}


async def latency(b: Bench) -> dict[str, Any]:
    http, n = b.http, b.opts.latency_crs
    nodes = [f"lat-{i}" for i in range(n)]
    await add_nodes(http, nodes, "bench-latency")
    hub = Hub()
    lease_ns = c.LEASE_NAMESPACE_DEFAULT
    enter: list[float] = []
    leave: list[float] = []
    milestones: dict[str, list[float]] = {}
    nmo = Nmo(b.sb, b.work / "nmo-latency.log")
    await nmo.start(timeout=1200)
    try:
        async with (
            Mirror(http, NM, hub) as crs,
            Mirror(http, LEASES, hub) as leases,
            Mirror(http, "/api/v1/nodes", hub, {"labelSelector": "bench-latency=yes"}) as nodes_m,
        ):
            for node in nodes:
                name = f"lat-{node}"
                lease_key = f"{lease_ns}/{c.lease_name(node)}"

                def checks(
                    name: str = name, node: str = node, key: str = lease_key
                ) -> dict[str, bool]:
                    cr = crs.store.get(name) or {}
                    meta, st = cr.get("metadata") or {}, cr.get("status") or {}
                    lease = leases.store.get(key) or {}
                    obj = nodes_m.store.get(node) or {}
                    return {
                        "finalizer": c.FINALIZER in (meta.get("finalizers") or []),
                        "running": st.get("phase") in ("Running", "Succeeded"),
                        "lease": (lease.get("spec") or {}).get("holderIdentity") == c.LEASE_HOLDER,
                        "taints": _taints(obj) >= MAINT_TAINTS,
                        "unschedulable": bool((obj.get("spec") or {}).get("unschedulable")),
                    }

                seen: dict[str, float] = {}
                started = time.monotonic()

                def in_place(checks: Any = checks, seen: dict[str, float] = seen) -> bool:
                    now = time.monotonic()
                    for what, held in checks().items():
                        if held:
                            seen.setdefault(what, now)
                    return len(seen) == 5

                await ok(http.post(NM, json=maintenance(name, node)))
                done = await hub.wait(in_place, 120, f"maintenance {name} in place")
                enter.append(done - started)
                for what, at in seen.items():
                    milestones.setdefault(what, []).append(at - started)

                def restored(node: str = node, key: str = lease_key) -> bool:
                    obj = nodes_m.store.get(node) or {}
                    return (
                        key not in leases.store
                        and not (obj.get("spec") or {}).get("unschedulable")
                        and not (MAINT_TAINTS & _taints(obj))
                    )

                started = time.monotonic()
                await ok(http.delete(f"{NM}/{name}"))
                done = await hub.wait(restored, 120, f"node {node} restored")
                leave.append(done - started)

                def gone(name: str = name) -> bool:
                    return name not in crs.store

                await hub.wait(gone, 120, f"{name} gone")
    finally:
        await nmo.stop()
        await delete_nodes(http, nodes)

    def stats(values: list[float]) -> dict[str, float]:
        return {
            "p50_ms": round(quantile(values, 0.5) * 1000, 1),
            "p99_ms": round(quantile(values, 0.99) * 1000, 1),
            "max_ms": round(max(values) * 1000, 1),
            "mean_ms": round(statistics.fmean(values) * 1000, 1),
        }

    record = {
        "part": "b",
        "crs": n,
        "mode": "sequential (one CR at a time, the next created once the previous is gone)",
        "create_to_in_place": stats(enter),
        "delete_to_restored": stats(leave),
        "milestone_p50_ms": {
            k: round(quantile(v, 0.5) * 1000, 1) for k, v in sorted(milestones.items())
        },
    }
    emit(record)
    return record


# -- (c) one big drain in a big cluster --------------------------------------------


async def big_drain(b: Bench) -> dict[str, Any]:
    ctx = b.ctx()
    await make_spares(ctx, 2, capacity=1000)
    scenario = Scenario(f"c{b.opts.drain_pods}", b.opts.drain_pods)
    results: dict[str, Any] = {}
    try:
        for tool in b.opts.drain_tools:
            res = await run_drain(ctx, scenario, tool)
            emit({"part": "c", **res})
            results[tool] = res
    finally:
        await delete_nodes(b.http, ctx.spares)
    record: dict[str, Any] = {"part": "c", "pods": b.opts.drain_pods}
    for tool, res in results.items():
        record[f"{tool}_s"] = res["seconds"]
    for tool in OPERATORS:
        if tool in results:
            res = results[tool]
            record |= {f"{tool}_{k}": res[k] for k in OPERATOR_FIGURES}
    if "ceiling" in results:
        res = results["ceiling"]
        record |= {f"ceiling_{k}": res[k] for k in CEILING_FIGURES}
    for tool in OPERATORS:
        for base in ("ceiling", "gonmo"):
            if tool != base and tool in results and base in results:
                record[f"{tool}_over_{base}"] = round(
                    results[tool]["seconds"] / results[base]["seconds"], 2
                )
    emit(record)
    return record


# -- (d) concurrent maintenances ---------------------------------------------------


async def _empty_watchers(
    http: httpx.AsyncClient, nodes: list[str], timeout: float
) -> list[asyncio.Task[float]]:
    tasks = []
    for node in nodes:
        pods, rv = await list_node_pods(http, node)
        present = {str(p["metadata"]["uid"]) for p in pods if evictable(p)}
        tasks.append(
            asyncio.create_task(
                wait_node_empty(http, node, present=present, resource_version=rv, timeout=timeout)
            )
        )
    return tasks


@contextlib.asynccontextmanager
async def _cancelling(tasks: list[asyncio.Task[float]]) -> AsyncIterator[None]:
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()


async def _concurrent_operator(
    b: Bench, ctx: DrainContext, tool: str, nodes: list[str], per: int
) -> dict[str, Any]:
    """One operator: all CRs at once, ``nodes[0]`` held by a PDB that never allows an eviction."""
    http = b.http
    blocked, others = nodes[0], nodes[1:]
    ns = f"bench-conc-{tool}"
    await prepare_workload(ctx, ns, nodes, per, {"minAvailable": per})
    hub = Hub()
    op = operator(ctx, tool, b.work / f"{tool}-concurrent.log")
    await op.start(timeout=1200)
    counters: dict[str, float] = {}
    try:
        async with Mirror(http, NM, hub) as crs:

            def phase(node: str) -> str | None:
                obj = crs.store.get(f"bench-{node}") or {}
                return (obj.get("status") or {}).get("phase")

            empties = await _empty_watchers(http, others, ctx.timeout)
            window = AuditWindow.open(b.sb)
            if isinstance(op, Nmo):
                counters = await op.metrics()
            profile = None
            if ctx.profile is not None and isinstance(op, Nmo):
                profile = ctx.profile / f"{tool}-concurrent.txt"
            async with (
                RssSampler(op.pid) as rss,
                _cancelling(empties),
                profiled(op.pid, profile),
            ):
                started = time.monotonic()
                await asyncio.gather(
                    *(ok(http.post(NM, json=maintenance(f"bench-{n}", n))) for n in nodes)
                )
                created = time.monotonic()
                done = await hub.wait(
                    lambda: all(phase(n) == "Succeeded" for n in others),
                    ctx.timeout,
                    f"{len(others)} maintenances to succeed ({op.name})",
                )
                emptied = max(await asyncio.gather(*empties))
            if isinstance(op, Nmo):
                counters = metrics_delta(counters, await op.metrics())
            await window.close(http)
            held = crs.store.get(f"bench-{blocked}") or {}
            status = held.get("status") or {}
            details = status.get("pendingPodsDetails") or [{}]
            figures = request_figures(window.tally(op.agent), crs=len(nodes))
            record = {
                f"{tool}_create_all_s": round(created - started, 2),
                f"{tool}_others_succeeded_s": round(done - started, 2),
                f"{tool}_others_empty_s": round(emptied - started, 2),
                f"{tool}_blocked_phase": phase(blocked),
                # nmo says why in pendingPodsDetails; the Go NMO has lastError only.
                f"{tool}_blocked_reason": details[0].get("reason")
                or str(status.get("lastError") or "")[:120],
                **{f"{tool}_{k}": v for k, v in figures.items()},
                f"{tool}_peak_rss_mib": round(rss.peak, 1),
                f"{tool}_cpu_s": round(rss.cpu, 2),
                f"{tool}_cpu_s_per_1000_pods": per_1000(rss.cpu, per * len(others)),
            }
            if counters:
                record[f"{tool}_metrics"] = counters
            for n in nodes:
                await ok(http.delete(f"{NM}/bench-{n}"), 200, 202, 404)
            await hub.wait(
                lambda: not any(k.startswith("bench-conc-") for k in crs.store),
                300,
                f"the maintenances to be removed ({op.name})",
            )
    finally:
        await op.stop()
    await delete_namespace(http, ns)
    return record


async def concurrent(b: Bench) -> dict[str, Any]:
    http, count, per = b.http, b.opts.concurrent_nodes, b.opts.concurrent_pods
    ctx = b.ctx()
    ctx.timeout = b.opts.concurrent_timeout
    nodes = [f"conc-{i}" for i in range(count)]
    others = nodes[1:]
    replacements = per * count
    await make_spares(ctx, 3, capacity=max(1000, math.ceil(replacements / 3) + 100))
    await create_nodes(http, nodes)
    record: dict[str, Any] = {"part": "d", "nodes": count, "pods_per_node": per}
    try:
        for tool in b.opts.concurrent_tools:
            figures = await _concurrent_operator(b, ctx, tool, nodes, per)
            emit({"part": "d", "tool": tool, **figures})
            record |= figures

        # The ceiling: the same 49 nodes refilled, drained concurrently over one client.
        ns = "bench-conc-ceiling"
        await prepare_workload(ctx, ns, others, per, None)
        window = AuditWindow.open(b.sb)
        async with client_from_kubeconfig(b.sb.kubeconfig) as client:
            started = time.monotonic()
            results = await asyncio.gather(*(drain_ceiling_detailed(client, n) for n in others))
            ceiling_s = time.monotonic() - started
        await window.close(http)
        record |= {
            "ceiling_s": round(ceiling_s, 2),
            "ceiling_slowest_node_s": round(max(r.seconds for r in results), 2),
            "ceiling_requests": window.count("raw-ceiling/")[0],
        }
        for tool in b.opts.concurrent_tools:
            took = record[f"{tool}_others_succeeded_s"]
            record[f"{tool}_over_ceiling"] = round(took / ceiling_s, 2)
            if tool != "gonmo" and "gonmo_others_succeeded_s" in record:
                record[f"{tool}_over_gonmo"] = round(took / record["gonmo_others_succeeded_s"], 2)
        await delete_namespace(http, ns)
    finally:
        await delete_nodes(http, [*nodes, *ctx.spares])
    emit(record)
    return record


# -- the run ----------------------------------------------------------------------


def print_summary(out: dict[str, Any]) -> None:
    rows = out.get("a") or []
    if rows:
        print("\n(a) idle RSS of a fresh operator (caches synced, then settled)")
        print(
            f"{'operator':<14}  {'step':<13}  {'nodes':>5}  {'pods':>5}  {'ready(s)':>8}  "
            f"{'CPU to ready(s)':>15}  {'startup peak':>12}  {'idle RSS':>10}  "
            f"{'delta vs first':>14}  {'KiB/node added':>14}  {'CPU settling(s)':>15}"
        )
        first: dict[str, dict[str, Any]] = {}
        for r in rows:
            base = first.setdefault(r["nmo"], r)
            delta = r["idle_rss_mib"] - base["idle_rss_mib"]
            added = r["nodes"] - base["nodes"]
            per_node = f"{delta * 1024 / added:.1f}" if added > 0 else "-"
            print(
                f"{r['nmo']:<14}  {r['step']:<13}  {r['nodes']:>5}  {r['pods']:>5}  "
                f"{r['ready_s']:>8}  {r['startup_cpu_s']:>15}  "
                f"{r['startup_peak_rss_mib']:>8} MiB  {r['idle_rss_mib']:>6} MiB  "
                f"{delta:>+10.1f} MiB  {per_node:>14}  {r['settle_cpu_s']:>15}"
            )
    for lat in out.get("b_nodes") or []:
        s = lat["create_to_in_place"]
        print(
            f"\n(b) at {lat['nodes']} nodes, {lat['crs']} CRs one at a time: create -> in place "
            f"p50 {s['p50_ms']} ms, p99 {s['p99_ms']} ms, max {s['max_ms']} ms; delete -> "
            f"restored p50 {lat['delete_to_restored']['p50_ms']} ms; milestones (p50): "
            f"{lat['milestone_p50_ms']}"
        )
    lat = out.get("b")
    if lat:
        print(f"\n(b) latency over {lat['crs']} CRs, {lat['mode']}")
        for what in ("create_to_in_place", "delete_to_restored"):
            s = lat[what]
            print(
                f"{what:<20} p50 {s['p50_ms']:>7} ms  p99 {s['p99_ms']:>7} ms  "
                f"max {s['max_ms']:>7} ms  mean {s['mean_ms']:>7} ms"
            )
        print("milestones (p50 after create):", lat["milestone_p50_ms"])
    big = out.get("c")
    if big:
        print(f"\n(c) {big['pods']} pods on one node of the big cluster")
        print(
            f"{'tool':<8}  {'seconds':>8}  {'/ceiling':>8}  {'/gonmo':>7}  {'CPU-s':>7}  "
            f"{'CPU-s/1000 pods':>15}  {'peak RSS(MiB)':>13}  {'requests':>8}  "
            f"{'status writes/CR':>16}  {'refused evictions':>17}"
        )
        for tool in ("ceiling", *OPERATORS):
            if f"{tool}_s" not in big:
                continue
            secs = big[f"{tool}_s"]

            def fig(key: str, tool: str = tool) -> str:
                value = big.get(f"{tool}_{key}")
                return "-" if value is None else str(value)

            cpu = "<=" + fig("client_cpu_s") if tool == "ceiling" else fig("cpu_s")
            print(
                f"{tool:<8}  {secs:>8}  {_ratio(secs, big.get('ceiling_s')):>8}  "
                f"{_ratio(secs, big.get('gonmo_s')):>7}  {cpu:>7}  "
                f"{fig('cpu_s_per_1000_pods'):>15}  {fig('peak_rss_mib'):>13}  "
                f"{fig('requests'):>8}  {fig('status_writes_per_cr'):>16}  "
                f"{fig('refused_evictions'):>17}"
            )
        for tool in ("ceiling", *OPERATORS):
            if f"{tool}_requests_by_verb" in big:
                print(f"  {tool} requests by verb: {_verbs(big[f'{tool}_requests_by_verb'])}")
        _cpu_verdict(big)
    conc = out.get("d")
    if conc:
        print(
            f"\n(d) {conc['nodes']} concurrent maintenances x {conc['pods_per_node']} pods, one "
            f"PDB-blocked; the ceiling drains the others in {conc['ceiling_s']} s "
            f"({conc['ceiling_requests']} requests)"
        )
        for tool in OPERATORS:
            if f"{tool}_others_succeeded_s" not in conc:
                continue

            def d(key: str, tool: str = tool) -> Any:
                return conc.get(f"{tool}_{key}")

            over_go = f", {tool}/gonmo {d('over_gonmo')}x" if d("over_gonmo") is not None else ""
            print(
                f"{tool}: {d('others_succeeded_s')} s until the others Succeeded (nodes empty at "
                f"{d('others_empty_s')} s), {tool}/ceiling {d('over_ceiling')}x{over_go}; "
                f"blocked: {d('blocked_phase')} ({d('blocked_reason')}); requests "
                f"{d('requests')}, status writes/CR {d('status_writes_per_cr')}, refused "
                f"evictions {d('refused_evictions')}, peak RSS {d('peak_rss_mib')} MiB, "
                f"CPU {d('cpu_s')} s ({d('cpu_s_per_1000_pods')} per 1000 pods)"
            )
            print(f"  {tool} requests by verb: {_verbs(d('requests_by_verb') or {})}")
        _cpu_verdict(conc)


def _verbs(verbs: dict[str, int]) -> str:
    return ", ".join(f"{v} {n}" for v, n in verbs.items()) or "none"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def _cpu_verdict(record: dict[str, Any]) -> None:
    """The issue's target: nmo's CPU-seconds per 1,000 evicted pods <= the Go NMO's."""
    nmo, go = record.get("nmo_cpu_s_per_1000_pods"), record.get("gonmo_cpu_s_per_1000_pods")
    if nmo is not None and go:
        met = "met" if nmo <= go else "MISSED"
        print(
            f"CPU-s per 1000 pods: nmo {nmo}, gonmo {go}, nmo/gonmo {_ratio(nmo, go)} "
            f"(target <= 1: {met})"
        )


def idlers(opts: argparse.Namespace, work: Path) -> tuple[Idler, ...]:
    out = [Idler("nmo")]
    for commit in opts.against:
        (work / commit).mkdir()
        out.append(Idler(f"nmo@{commit}", src=export_src(commit, work / commit)))
    if "gonmo" in opts.idle_tools:
        out.append(Idler("gonmo", tool="gonmo"))
    return tuple(out)


async def main(opts: argparse.Namespace) -> int:
    began = time.monotonic()
    print(f"nmo: {nmo_commit()}", flush=True)
    parts = set(opts.parts)
    steps = sorted(set(opts.pods) | ({opts.workload_pods} if parts & {"b", "c", "d"} else set()))
    if "a" not in parts:
        steps = [opts.workload_pods]
    out: dict[str, Any] = {"a": []}
    if (
        ("a" in parts and "gonmo" in opts.idle_tools)
        or ("c" in parts and "gonmo" in opts.drain_tools)
        or ("d" in parts and "gonmo" in opts.concurrent_tools)
    ):  # built (or found cached) before the sandbox starts
        print(f"the Go NMO: {go_nmo_binary()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="nmo-scale-bench-") as tmp:
        work = Path(tmp)
        async with Sandbox(work / "sandbox", nodes=0) as sb, sb.client(timeout=120) as http:
            await install_crd(http)
            b = Bench(sb, http, work, opts, out, idlers(opts, work))
            bulk = [f"bulk-{i}" for i in range(opts.bulk_nodes)]
            capacity = max(1000, math.ceil(max(steps) / opts.bulk_nodes * 1.1))
            await create_nodes(http, bulk, labels={BULK_LABEL: "yes"}, pods_capacity=capacity)
            print(f"sandbox with {len(bulk)} nodes after {time.monotonic() - began:.1f}s")
            for pods in steps:
                took = await scale_bulk(b, pods)
                print(f"{pods} pods Ready ({took:.1f}s)", flush=True)
                if "a" in parts and pods in opts.pods:
                    out["a"] += await idle_step(b, f"pods={pods}", pods)
                if pods == opts.workload_pods:
                    for part, fn in (("b", latency), ("c", big_drain), ("d", concurrent)):
                        if part in parts:
                            t = time.monotonic()
                            out[part] = await fn(b)
                            print(f"part {part}: {time.monotonic() - t:.1f}s", flush=True)
            if "a" in parts and opts.nodes:
                await scale_bulk(b, 0)
                have = await node_count(http)
                for total in sorted(opts.nodes):
                    if total > have:
                        extra = [f"idle-{i}" for i in range(have, total)]
                        t = time.monotonic()
                        await add_nodes(http, extra, "bench-idle")
                        print(f"{total} nodes Ready ({time.monotonic() - t:.1f}s)", flush=True)
                        have = total
                    out["a"] += await idle_step(b, f"nodes={total}", 0)
                    if total in opts.latency_nodes:
                        t = time.monotonic()
                        out.setdefault("b_nodes", []).append({"nodes": total} | await latency(b))
                        print(f"part b at {total} nodes: {time.monotonic() - t:.1f}s", flush=True)
    print_summary(out)
    print(f"\n{environment_note()}")
    print(f"scale benchmark runtime: {time.monotonic() - began:.1f}s")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=["a", "b", "c", "d"], default=list("abcd"))
    parser.add_argument("--pods", type=int, nargs="*", default=[0, 5000, 10000, 20000])
    parser.add_argument("--nodes", type=int, nargs="*", default=[100, 500])
    parser.add_argument(
        "--against",
        nargs="*",
        default=[],
        help="part (a): also run these commits' nmo at every step (before/after)",
    )
    parser.add_argument(
        "--idle-tools", nargs="+", choices=["nmo", "gonmo"], default=["nmo"], help="part (a)"
    )
    parser.add_argument(
        "--latency-nodes",
        type=int,
        nargs="*",
        default=[],
        help="part (a): run part (b)'s latency at these --nodes steps too",
    )
    parser.add_argument("--bulk-nodes", type=int, default=20)
    parser.add_argument("--replicas-per-deployment", type=int, default=1000)
    parser.add_argument("--workload-pods", type=int, default=10000, help="cluster size for b, c, d")
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--latency-crs", type=int, default=50)
    parser.add_argument("--drain-pods", type=int, default=500)
    parser.add_argument(
        "--drain-tools",
        nargs="+",
        choices=["ceiling", "nmo", "gonmo"],
        default=["ceiling", "nmo", "gonmo"],
        help="part (c)'s tools, in this order",
    )
    parser.add_argument("--concurrent-nodes", type=int, default=50)
    parser.add_argument("--concurrent-pods", type=int, default=100)
    parser.add_argument(
        "--concurrent-tools",
        nargs="+",
        choices=list(OPERATORS),
        default=list(OPERATORS),
        help="part (d)'s operators, in this order (the ceiling always runs last)",
    )
    parser.add_argument(
        "--concurrent-timeout",
        type=float,
        default=3600.0,
        help="part (d): seconds each operator may take (the Go NMO drains one node at a time)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="py-spy's stacks of nmo during parts (c) and (d) into this directory "
        "(benchmarks/flame.py draws them; needs pip install py-spy)",
    )
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(asyncio.run(main(parser.parse_args())))
