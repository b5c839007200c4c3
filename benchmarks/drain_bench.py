"""Drain benchmark: nmo vs the raw eviction ceiling vs ``kubectl drain``, same run.

Scenarios (``--scenarios``, default all):

* ``p100``: 100 pods, no PDB;
* ``p1000``: 1000 pods, no PDB;
* ``pdb300``: 300 pods behind one PDB with ``maxUnavailable: 10%``.

For each scenario and each tool (``--tools``, in that order; default
ceiling, nmo, kubectl) the benchmark creates a fresh, identical kwok node,
puts the scenario's Deployment pods on it (1 s grace period, see
``nmo_sandbox.manifests``), waits until they are Ready (and the PDB's status
is computed), lets replacements go to the shared spare nodes only, then
drains it with that tool alone:

* ``ceiling``: ``ceiling.drain_ceiling`` (cordon, one LIST, 100 parallel
  evictions, 50-100 ms retries on 409/429, watch until empty);
* ``nmo``: a fresh ``nmo run`` (started for this drain only, caches synced
  first), time from creating the NodeMaintenance to ``phase=Succeeded``,
  observed by a watch; its peak RSS during the drain (sampled every 50 ms),
  the CPU time it used, its reconcile passes (from its /metrics) and its
  API requests (user agent ``nmo/``) in the apiserver's audit log;
* ``kubectl``: ``kubectl drain --ignore-daemonsets --delete-emptydir-data
  --force``, wall time; run again while it exits non-zero, as a user's
  retry loop would (kubectl retries 429 itself but gives up on a pod whose
  eviction answers 409, which concurrent evictions behind one PDB can get),
  the runs are counted.

Every tool also gets ``node_empty_s``: when the benchmark's own watch saw the
node's last pod go. Between tools the cluster is cleaned: the CR deleted
(nmo uncordons and releases the lease) and nmo stopped, the tool's namespace
deleted and waited for until all its pods are gone, the node deleted. The
ratios nmo/ceiling and kubectl/ceiling compare figures from the same run.

Run: ``make bench`` or ``.venv/bin/python benchmarks/drain_bench.py
[--scenarios p100 p1000 pdb300] [--tools ceiling nmo kubectl] [--repeat N]
[--nmo-log-level info --work-dir DIR]`` (``--work-dir`` keeps each drain's nmo
log, to read where its time went)
(``--repeat``: N rounds per scenario, each starting with the next tool;
the summary shows medians and ranges). The machine
has 2 cores shared by the whole control plane, nmo and the benchmark; figures
are noisy, compare ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import (
    TOOLS,
    DrainContext,
    Scenario,
    environment_note,
    install_crd,
    make_spares,
    nmo_commit,
    run_drain,
)

from nmo_sandbox import Sandbox

SCENARIOS = {
    "p100": Scenario("p100", 100),
    "p1000": Scenario("p1000", 1000),
    "pdb300": Scenario("pdb300", 300, {"maxUnavailable": "10%"}),
}


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def _median(results: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in results]
    return statistics.median(values) if values else None


def _cell(results: list[dict[str, Any]], key: str = "seconds") -> str:
    """The median, with the range when there were several rounds."""
    values = sorted(float(r[key]) for r in results)
    if not values:
        return "-"
    med = f"{statistics.median(values):.2f}"
    return med if len(values) == 1 else f"{med} ({values[0]:.1f}-{values[-1]:.1f})"


def summary(results: list[dict[str, Any]], scenarios: list[str]) -> str:
    rows = [
        "scenario  pods  ceiling(s)  nmo(s)  nmo node empty(s)  kubectl(s)  nmo/ceiling  "
        "kubectl/ceiling  requests ceiling/nmo/kubectl  nmo peak RSS (MiB)  nmo CPU(s)  nmo passes",
    ]
    for name in scenarios:
        by = {t: [r for r in results if r["scenario"] == name and r["tool"] == t] for t in TOOLS}
        if not any(by.values()):
            continue
        med = {t: _median(by[t], "seconds") for t in TOOLS}
        req = "/".join(str(int(_median(by[t], "requests") or 0)) if by[t] else "-" for t in TOOLS)
        rss = _cell(by["nmo"], "nmo_peak_rss_mib")
        cpu = _cell(by["nmo"], "nmo_cpu_s")
        passes = _cell(by["nmo"], "nmo_reconciles")
        rows.append(
            f"{name:<8}  {SCENARIOS[name].pods:>4}  {_cell(by['ceiling']):>10}  "
            f"{_cell(by['nmo']):>6}  {_cell(by['nmo'], 'node_empty_s'):>17}  "
            f"{_cell(by['kubectl']):>10}  {ratio(med['nmo'], med['ceiling']):>11}  "
            f"{ratio(med['kubectl'], med['ceiling']):>15}  {req:>28}  {rss:>18}  "
            f"{cpu:>10}  {passes:>10}"
        )
    for r in results:
        if r["tool"] == "kubectl" and r.get("kubectl_runs", 1) > 1:
            rows.append(
                f"note: {r['scenario']} round {r.get('round', 0)}: kubectl drain needed "
                f"{r['kubectl_runs']} runs (first error: {r['kubectl_first_error']})"
            )
    return "\n".join(rows)


async def main(opts: argparse.Namespace) -> int:
    began = time.monotonic()
    print(f"nmo: {nmo_commit()}", flush=True)
    results: list[dict[str, Any]] = []
    tools: list[str] = opts.tools
    with contextlib.ExitStack() as stack:
        if opts.work_dir is not None:
            work = Path(opts.work_dir)
            os.makedirs(work, exist_ok=True)
            print(f"work directory (kept: nmo logs, sandbox): {work}", flush=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nmo-drain-bench-")))
        async with Sandbox(work / "sandbox", nodes=0) as sb, sb.client(timeout=60) as http:
            await install_crd(http)
            ctx = DrainContext(
                sb,
                http,
                work,
                [],
                nmo_log_level=opts.nmo_log_level,
                ceiling_parallel=opts.ceiling_parallel,
            )
            await make_spares(ctx, opts.spares)
            print(f"sandbox ready after {time.monotonic() - began:.1f}s", flush=True)
            for name in opts.scenarios:
                scen_began = time.monotonic()
                for rnd in range(opts.repeat):
                    # Each round starts with the next tool, so no tool always goes first.
                    order = tools[rnd % len(tools) :] + tools[: rnd % len(tools)]
                    for tool in order:
                        res = await run_drain(ctx, SCENARIOS[name], tool, tag=f"r{rnd}")
                        results.append(res | {"round": rnd})
                        print(json.dumps(res | {"round": rnd}), flush=True)
                print(f"scenario {name}: {time.monotonic() - scen_began:.1f}s", flush=True)
    print()
    print(summary(results, opts.scenarios))
    print(f"\n{environment_note()}")
    print(f"drain benchmark runtime: {time.monotonic() - began:.1f}s")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--tools", nargs="+", choices=TOOLS, default=list(TOOLS))
    parser.add_argument("--spares", type=int, default=3, help="nodes for the replacements")
    parser.add_argument("--nmo-log-level", default="warning")
    parser.add_argument(
        "--work-dir",
        default=None,
        help="keep nmo's logs and the sandbox here (default: a temp dir)",
    )
    parser.add_argument("--ceiling-parallel", type=int, default=100, help="evictions in flight")
    parser.add_argument(
        "--repeat", type=int, default=1, help="rounds per scenario (tool order rotates); medians"
    )
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(asyncio.run(main(parser.parse_args())))
