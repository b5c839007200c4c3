"""Drain benchmark: nmo vs the Go NMO vs the raw eviction ceiling vs ``kubectl drain``, same run.

Repeat it: ``make bench`` (it builds the sandbox binaries and the Go NMO's
manager first, both cached in ``~/.cache/nmo``), or, once they are built,
``.venv/bin/python benchmarks/drain_bench.py`` with the options below. The
Go NMO is built from ``../shared/third_party``'s checksummed snapshot of
its upstream tree (commit 3a54cd15, with vendor/) by ``hack/go-nmo-bin.sh
manager`` (``make go-nmo-bin``), offline, its ``./cmd`` unchanged.

Scenarios (``--scenarios``, default all):

* ``p100``: 100 pods, no PDB;
* ``p1000``: 1000 pods, no PDB;
* ``pdb300``: 300 pods behind one PDB with ``maxUnavailable: 10%``.

For each scenario and each tool (``--tools``, in that order; default
ceiling, nmo, gonmo, kubectl) the benchmark creates a fresh, identical kwok
node, puts the scenario's Deployment pods on it (1 s grace period, see
``nmo_sandbox.manifests``), waits until they are Ready (and the PDB's status
is computed), lets replacements go to the shared spare nodes only, then
drains it with that tool alone:

* ``ceiling``: ``ceiling.drain_ceiling`` (cordon, one LIST, 100 parallel
  evictions, 50-100 ms retries on 409/429, watch until empty);
* ``nmo``: a fresh ``nmo run`` (started for this drain only, as the chart's
  ServiceAccount, caches synced first), time from creating the
  NodeMaintenance to ``phase=Succeeded``, observed by a watch; its peak RSS
  during the drain (sampled every 50 ms), the CPU time it used, its
  reconcile passes (from its /metrics) and its API requests (user agent
  ``nmo/``) in the apiserver's audit log;
* ``gonmo``: the same for the Go medik8s NMO's manager (``benchlib.GoNmo``:
  started for this drain only with the sandbox's admin kubeconfig, without
  leader election or metrics, ready once its controller has started its
  workers; its log level ``--gonmo-log-level``, default info), user agent
  ``go-nmo-manager/``. Its webhook server cannot move off port 9443, so
  nothing else may listen there while it runs (it waits up to 5 minutes);
* ``kubectl``: ``kubectl drain --ignore-daemonsets --delete-emptydir-data
  --force``, wall time; run again while it exits non-zero, as a user's
  retry loop would (kubectl retries 429 itself but gives up on a pod whose
  eviction answers 409, which concurrent evictions behind one PDB can get),
  the runs are counted, and their CPU time.

Every tool also gets ``node_empty_s``: when the benchmark's own watch saw the
node's last pod go. Between tools the cluster is cleaned: the CR deleted
(the operator uncordons and releases the lease) and the operator stopped,
the tool's namespace deleted and waited for until all its pods are gone, the
node deleted.

The summary, per scenario and tool (medians over rounds): seconds, ratio to
the ceiling and to the Go NMO (figures of the same run), when the node was
empty, CPU-seconds (the ceiling's: the benchmark process's own, an upper
bound), CPU-seconds per 1,000 evicted pods, peak RSS, requests in all and by
verb, status writes per CR (``update``/``patch`` on
``nodemaintenances/status``) and refused evictions (``create pods/eviction``
answered anything but 201: 429 from the PDB, 409...), all from the audit
log (``auditlog.py``); then the issue's targets: nmo's drain <= 1.1x the
ceiling, nmo's CPU-seconds per 1,000 pods <= the Go NMO's.

Run: ``make bench`` or ``.venv/bin/python benchmarks/drain_bench.py
[--scenarios p100 p1000 pdb300] [--tools ceiling nmo gonmo kubectl]
[--repeat N] [--nmo-log-level info] [--gonmo-log-level debug] [--work-dir DIR]
[--profile DIR]`` (``--work-dir`` keeps each drain's operator log, to read
where its time went; ``--profile`` samples nmo with py-spy during each
drain, ``benchmarks/flame.py`` draws the flame graph; ``NMO_BENCH_SRC=<src>``
runs nmo from another commit's source tree; ``--repeat``: N
rounds per scenario, each starting with the next tool; the summary shows
medians and ranges). The machine has 2 cores shared by
the whole control plane, the operators and the benchmark; figures are
noisy, compare ratios within one run, and never run two benchmarks at once
(``flock /tmp/nmo-bench.lock make bench``).
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
    go_nmo_binary,
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


def _values(results: list[dict[str, Any]], key: str) -> list[float]:
    return sorted(float(r[key]) for r in results if r.get(key) is not None)


def _median(results: list[dict[str, Any]], key: str) -> float | None:
    values = _values(results, key)
    return statistics.median(values) if values else None


def _cell(results: list[dict[str, Any]], key: str = "seconds", fmt: str = ".2f") -> str:
    """The median, with the range when there were several rounds."""
    values = _values(results, key)
    if not values:
        return "-"
    med = format(statistics.median(values), fmt)
    if len(values) == 1:
        return med
    return f"{med} ({format(values[0], fmt)}-{format(values[-1], fmt)})"


OPERATORS = ("nmo", "gonmo")
TARGET_OVER_CEILING = 1.1  # issue 22: every drain scenario <= 1.1x the ceiling
HEADER = (
    "tool", "seconds", "/ceiling", "/gonmo", "node empty(s)", "CPU-s", "CPU-s/1000 pods",
    "peak RSS(MiB)", "requests", "status writes/CR", "refused evictions",
)  # fmt: skip


def _tool_row(tool: str, rows: list[dict[str, Any]], med: dict[str, float | None]) -> list[str]:
    operator = tool in OPERATORS
    # The ceiling's is the benchmark process's own CPU time: an upper bound.
    cpu = "<=" + _cell(rows, "client_cpu_s") if tool == "ceiling" else _cell(rows, "cpu_s")
    return [
        tool,
        _cell(rows),
        ratio(med[tool], med["ceiling"]),
        ratio(med[tool], med["gonmo"]),
        _cell(rows, "node_empty_s"),
        cpu,
        _cell(rows, "cpu_s_per_1000_pods") if operator else "-",
        _cell(rows, "peak_rss_mib", ".1f") if operator else "-",
        _cell(rows, "requests", ".0f"),
        _cell(rows, "status_writes_per_cr", ".1f") if operator else "-",
        _cell(rows, "refused_evictions", ".0f"),
    ]


def table(rows: list[list[str]] | list[tuple[str, ...]]) -> list[str]:
    """Columns as wide as their widest cell, the first left-aligned, the others right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [c.rjust(w) for c, w in zip(row, widths, strict=True)]
        cells[0] = row[0].ljust(widths[0])
        lines.append("  ".join(cells))
    return lines


def _verbs(rows: list[dict[str, Any]]) -> str:
    """Requests by verb of the first round (the others are in the JSON lines above)."""
    verbs: dict[str, int] = rows[0].get("requests_by_verb") or {}
    return ", ".join(f"{v} {n}" for v, n in verbs.items()) or "none"


def summary(results: list[dict[str, Any]], scenarios: list[str]) -> str:
    """Per scenario: one row per tool (medians over rounds), requests by verb, the targets."""
    out: list[str] = []
    for name in scenarios:
        by = {t: [r for r in results if r["scenario"] == name and r["tool"] == t] for t in TOOLS}
        if not any(by.values()):
            continue
        rounds = max(len(v) for v in by.values())
        med = {t: _median(by[t], "seconds") for t in TOOLS}
        more = f", median of {rounds} rounds (range)" if rounds > 1 else ""
        out += ["", f"{name}: {SCENARIOS[name].pods} pods{more}"]
        out += table([HEADER, *(_tool_row(t, by[t], med) for t in TOOLS if by[t])])
        out.append("requests by verb" + (" (first round):" if rounds > 1 else ":"))
        out += [f"  {t}: {_verbs(by[t])}" for t in TOOLS if by[t]]
        cpu = {t: _median(by[t], "cpu_s_per_1000_pods") for t in OPERATORS}
        if any(v is not None for v in cpu.values()):
            figures = ", ".join(f"{t} {cpu[t]:.2f}" for t in OPERATORS if cpu[t] is not None)
            verdict = ""
            if cpu["nmo"] is not None and cpu["gonmo"]:
                met = "met" if cpu["nmo"] <= cpu["gonmo"] else "MISSED"
                verdict = f", nmo/gonmo {ratio(cpu['nmo'], cpu['gonmo'])} (target <= 1: {met})"
            out.append(f"CPU-s per 1000 pods: {figures}{verdict}")
        if med["ceiling"] and med["nmo"] is not None:
            over = med["nmo"] / med["ceiling"]
            met = "met" if over <= TARGET_OVER_CEILING else "MISSED"
            out.append(f"nmo/ceiling {over:.2f}x (target <= {TARGET_OVER_CEILING}x: {met})")
    for r in results:
        if r["tool"] == "kubectl" and r.get("kubectl_runs", 1) > 1:
            out.append(
                f"note: {r['scenario']} round {r.get('round', 0)}: kubectl drain needed "
                f"{r['kubectl_runs']} runs (first error: {r['kubectl_first_error']})"
            )
    return "\n".join(out)


async def main(opts: argparse.Namespace) -> int:
    began = time.monotonic()
    print(f"nmo: {nmo_commit()}", flush=True)
    results: list[dict[str, Any]] = []
    tools: list[str] = opts.tools
    if "gonmo" in tools:  # built (or found cached) before the sandbox starts
        print(f"the Go NMO: {go_nmo_binary()}", flush=True)
    with contextlib.ExitStack() as stack:
        if opts.work_dir is not None:
            work = Path(opts.work_dir)
            os.makedirs(work, exist_ok=True)
            print(f"work directory (kept: operator logs, sandbox): {work}", flush=True)
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
                gonmo_log_level=opts.gonmo_log_level,
                ceiling_parallel=opts.ceiling_parallel,
                profile=opts.profile,
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
        "--gonmo-log-level",
        choices=["info", "debug"],
        default="info",
        help="the Go NMO's --zap-log-level (its quietest level that says when it is ready)",
    )
    parser.add_argument(
        "--work-dir",
        default=None,
        help="keep nmo's logs and the sandbox here (default: a temp dir)",
    )
    parser.add_argument("--ceiling-parallel", type=int, default=100, help="evictions in flight")
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="py-spy's stacks of nmo during each drain into this directory "
        "(benchmarks/flame.py draws them; needs pip install py-spy)",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="rounds per scenario (tool order rotates); medians"
    )
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(asyncio.run(main(parser.parse_args())))
