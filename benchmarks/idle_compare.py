"""Idle ``nmo run`` at this checkout against another commit, in one sandbox.

Both run as the chart's ServiceAccount against the same sandbox (kwok
nodes, a NodeMaintenance CRD, no maintenance), alternately, ``--rounds``
times each; "idle" is ``--settle`` seconds after ``/readyz`` said the caches
synced. The other commit's ``src/`` is exported with ``git archive`` and put
first on ``PYTHONPATH`` for its runs (the same virtualenv serves both).
Prints each run and the median ratio of this checkout to the other commit:
idle RSS, seconds to ready, CPU-seconds to ready and while idle.

    .venv/bin/python benchmarks/idle_compare.py --against 844f480
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchlib import Nmo, RssSampler, create_nodes, install_crd, nmo_commit

from nmo_sandbox import Sandbox

ROOT = Path(__file__).resolve().parents[1]


def export_src(commit: str, into: Path) -> Path:
    """The commit's ``src/`` tree, unpacked under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "src"


async def one(
    sb: Sandbox, work: Path, label: str, settle: float, src: Path | None
) -> dict[str, Any]:
    saved = os.environ.get("PYTHONPATH")
    if src is not None:
        os.environ["PYTHONPATH"] = str(src)
    try:
        nmo = Nmo(sb, work / f"nmo-{label}.log")
        ready = await nmo.start(timeout=600)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    try:
        async with RssSampler(nmo.pid, interval=0.2) as rss:
            await asyncio.sleep(settle)
        return {
            "run": label,
            "ready_s": round(ready, 2),
            "startup_cpu_s": round(nmo.startup_cpu, 2),
            "idle_cpu_s": round(rss.cpu, 2),
            "idle_rss_mib": round(rss.last, 1),
        }
    finally:
        await nmo.stop()


async def main(opts: argparse.Namespace) -> int:
    print(f"this checkout: {nmo_commit()}; against: {opts.against}", flush=True)
    with tempfile.TemporaryDirectory(prefix="nmo-idle-compare-") as tmp:
        work = Path(tmp)
        other = export_src(opts.against, work)
        async with Sandbox(work / "sandbox", nodes=0) as sb, sb.client(timeout=120) as http:
            await install_crd(http)
            await create_nodes(http, [f"idle-{i}" for i in range(opts.nodes)])
            runs: dict[str, list[dict[str, Any]]] = {"this": [], "other": []}
            for i in range(opts.rounds):
                for name, src in (("this", None), ("other", other)):
                    record = await one(sb, work, f"{name}-{i}", opts.settle, src)
                    runs[name].append(record)
                    print(record, flush=True)

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    for key in ("idle_rss_mib", "ready_s", "startup_cpu_s", "idle_cpu_s"):
        this, that = med("this", key), med("other", key)
        ratio = this / that if that else float("nan")
        print(f"{key}: this {this}, {opts.against} {that}, ratio {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--against", required=True, help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--nodes", type=int, default=100, help="kwok nodes in the sandbox")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(asyncio.run(main(parser.parse_args())))
