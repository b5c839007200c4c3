"""Drain benchmark: nmo vs the raw eviction ceiling vs ``kubectl drain``, same run.

Scenarios (``--scenarios``, default all):

* ``p100``: 100 pods, no PDB;
* ``p1000``: 1000 pods, no PDB;
* ``pdb300``: 300 pods behind one PDB with ``maxUnavailable: 10%``.

For each scenario and each tool (``--tools``, in that order; default
ceiling, nmo, kubectl) the benchmark creates a fresh, identical kwok node,
puts the scenario's Deployment pods on it (1 s grace period, see
``nmo.sandbox.manifests``), waits until they are Ready (and the PDB's status
is computed), lets replacements go to the shared spare nodes only, then
drains it with that tool alone:

* ``ceiling``: ``ceiling.drain_ceiling`` (cordon, one LIST, 100 parallel
  evictions, 50-100 ms retries on 409/429, watch until empty);
* ``nmo``: a fresh ``nmo run`` (started for this drain only, caches synced
  first), time from creating the NodeMaintenance to ``phase=Succeeded``,
  observed by a watch; its peak RSS during the drain (sampled every 50 ms)
  and its API requests (user agent ``nmo/``) in the apiserver's audit log;
* ``kubectl``: ``kubectl drain --ignore-daemonsets --delete-emptydir-data
  --force``, wall time.

Every tool also gets ``node_empty_s``: when the benchmark's own watch saw the
node's last pod go. Between tools the cluster is cleaned: the CR deleted
(nmo uncordons and releases the lease) and nmo stopped, the tool's namespace
deleted and waited for until all its pods are gone, the node deleted. The
ratios nmo/ceiling and kubectl/ceiling compare figures from the same run.

Run: ``make bench`` or ``.venv/bin/python benchmarks/drain_bench.py
[--scenarios p100 p1000 pdb300] [--tools ceiling nmo kubectl]``. The machine
has 2 cores shared by the whole control plane, nmo and the benchmark; figures
are noisy, compare ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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

from nmo.sandbox import Sandbox

SCENARIOS = {
    "p100": Scenario("p100", 100),
    "p1000": Scenario("p1000", 1000),
    "pdb300": Scenario("pdb300", 300, {"maxUnavailable": "10%"}),
}


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def _show(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _get(by: dict[str, dict[str, Any]], tool: str, key: str = "seconds") -> float | None:
    return float(by[tool][key]) if tool in by else None


def summary(results: list[dict[str, Any]], scenarios: list[str]) -> str:
    rows = [
        "scenario  pods  ceiling(s)  nmo(s)  nmo empty(s)  kubectl(s)  nmo/ceiling  "
        "kubectl/ceiling  requests ceiling/nmo/kubectl  nmo peak RSS",
    ]
    for name in scenarios:
        by = {r["tool"]: r for r in results if r["scenario"] == name}
        if not by:
            continue
        sec = {t: _get(by, t) for t in TOOLS}

        req = "/".join(str(by[t]["requests"]) if t in by else "-" for t in TOOLS)
        rss = f"{by['nmo']['nmo_peak_rss_mib']} MiB" if "nmo" in by else "-"
        rows.append(
            f"{name:<8}  {SCENARIOS[name].pods:>4}  {_show(sec['ceiling']):>10}  "
            f"{_show(sec['nmo']):>6}  {_show(_get(by, 'nmo', 'node_empty_s')):>12}  "
            f"{_show(sec['kubectl']):>10}  {ratio(sec['nmo'], sec['ceiling']):>11}  "
            f"{ratio(sec['kubectl'], sec['ceiling']):>15}  {req:>28}  {rss:>12}"
        )
    return "\n".join(rows)


async def main(scenarios: list[str], tools: list[str], spares: int, log_level: str) -> int:
    began = time.monotonic()
    print(f"nmo: {nmo_commit()}", flush=True)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="nmo-drain-bench-") as tmp:
        work = Path(tmp)
        async with Sandbox(work / "sandbox", nodes=0) as sb, sb.client(timeout=60) as http:
            await install_crd(http)
            ctx = DrainContext(sb, http, work, [], nmo_log_level=log_level)
            await make_spares(ctx, spares)
            print(f"sandbox ready after {time.monotonic() - began:.1f}s", flush=True)
            for name in scenarios:
                scen_began = time.monotonic()
                for tool in tools:
                    res = await run_drain(ctx, SCENARIOS[name], tool)
                    results.append(res)
                    print(json.dumps(res), flush=True)
                print(f"scenario {name}: {time.monotonic() - scen_began:.1f}s", flush=True)
    print()
    print(summary(results, scenarios))
    print(f"\n{environment_note()}")
    print(f"drain benchmark runtime: {time.monotonic() - began:.1f}s")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--tools", nargs="+", choices=TOOLS, default=list(TOOLS))
    parser.add_argument("--spares", type=int, default=3, help="nodes for the replacements")
    parser.add_argument("--nmo-log-level", default="warning")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    opts = parser.parse_args()
    sys.exit(asyncio.run(main(opts.scenarios, opts.tools, opts.spares, opts.nmo_log_level)))
