"""Where nmo's memory per Node goes: the node informer alone, in a fresh process.

One sandbox grown to each of ``--nodes`` (default 500 2000 5000) kwok nodes.
At each step a fresh process (the probe: this file with ``--probe``) imports
what ``nmo run`` imports, connects, runs the node informer with
``slim.node`` until it has synced, settles ``--settle`` (5) s with the watch
running, then frees what it can. Its figures, in MiB over the process after
connecting:

- ``synced``, ``hwm`` (the peak RSS), ``settled``: RSS after the LIST, its
  high-water mark, RSS after settling;
- ``after_gc``: after a full collection (httpx keeps every response in a
  reference cycle with its stream: a page's body lives until the cyclic
  collector runs);
- ``after_trim``: after glibc's ``malloc_trim(0)`` (freed heap glibc kept);
- ``cache``: the slim copies themselves (deep ``sys.getsizeof``, shared
  objects counted once), in bytes per node;
- ``ready_s``, ``cpu_s``: the LIST and sync, wall and CPU.

``--against COMMIT...`` probes those commits too (their ``src`` exported with
``git archive``), ``--variants`` this checkout with another page size or
without the informer's own release after a big LIST, e.g. ``page=500``,
``no-release``. ``--trace`` adds tracemalloc's top retained lines (slower).

    flock /tmp/nmo-bench.lock .venv/bin/python benchmarks/node_memory.py \\
        --nodes 2000 5000 --against a1f9844
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _rss() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGESIZE") / 2**20


def _hwm() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def deep_size(objs: Any) -> dict[str, int]:
    """Bytes by type of everything reachable through dicts, lists, tuples and
    mappings from ``objs``; an object shared by many is counted once."""
    seen: set[int] = set()
    by: dict[str, int] = {}
    stack = list(objs)
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        by[type(o).__name__] = by.get(type(o).__name__, 0) + sys.getsizeof(o)
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
        elif type(o).__name__ == "mappingproxy":
            stack.extend(o.keys())
            stack.extend(o.values())
    return by


async def probe(opts: argparse.Namespace) -> None:
    import fastapi  # noqa: F401  # what `nmo run` imports
    import uvicorn  # noqa: F401

    import nmo.cli.runner  # noqa: F401
    from nmo.kube import informer, slim
    from nmo.kube.client import Kube, node_path

    if opts.no_release and hasattr(informer, "release_garbage"):
        informer.release_garbage = lambda: None
    gc.collect()
    if opts.trace:
        tracemalloc.start()
    kube = await Kube.connect(kubeconfig=opts.kubeconfig)
    base = _rss()
    before = tracemalloc.take_snapshot() if opts.trace else None
    paging = {"page_size": opts.page_size} if opts.page_size else {}  # else its default
    cache = informer.Informer(kube, node_path(), name="nodes", transform=slim.node, **paging)
    started, cpu = time.monotonic(), time.process_time()
    task = asyncio.create_task(cache.run())
    await cache.synced.wait()
    out: dict[str, Any] = {
        "nodes": len(cache.store),
        "ready_s": round(time.monotonic() - started, 2),
        "cpu_s": round(time.process_time() - cpu, 2),
        "synced": _rss() - base,
        "hwm": _hwm() - base,
    }
    sizes = deep_size(cache.store.values())
    out["cache_bytes_per_node"] = round(sum(sizes.values()) / max(1, len(cache.store)))
    out["cache_by_type"] = {k: round(v / max(1, len(cache.store))) for k, v in sizes.items()}
    await asyncio.sleep(opts.settle)
    out["settled"] = _rss() - base
    if before is not None:
        diff = tracemalloc.take_snapshot().compare_to(before, "lineno")
        out["top"] = [
            f"{d.size_diff / 1024:.0f} KiB {d.count_diff:+d} {d.traceback[0].filename}:"
            f"{d.traceback[0].lineno}"
            for d in diff[:12]
        ]
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    gc.collect()
    out["after_gc"] = _rss() - base
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    out["after_trim"] = _rss() - base
    for key in ("synced", "hwm", "settled", "after_gc", "after_trim"):
        out[key] = round(out[key], 1)
    print(json.dumps(out), flush=True)


def run_probe(kubeconfig: Path, src: Path | None, args: list[str]) -> dict[str, Any]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    done = subprocess.run(
        [sys.executable, __file__, "--probe", "--kubeconfig", str(kubeconfig), *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"probe failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def main(opts: argparse.Namespace) -> int:
    from idle_compare import export_src
    from scale_bench import add_nodes

    from nmo_sandbox import Sandbox

    common = ["--settle", str(opts.settle), *(["--trace"] if opts.trace else [])]
    with tempfile.TemporaryDirectory(prefix="nmo-node-memory-") as tmp:
        work = Path(tmp)
        runs: list[tuple[str, Path | None, list[str]]] = [("this", None, [])]
        for commit in opts.against:
            (work / commit).mkdir()
            runs.append((commit, export_src(commit, work / commit), []))
        for variant in opts.variants:
            name, _, value = variant.partition("=")
            flag = ["--page-size", value] if name == "page" else ["--no-release"]
            runs.append((f"this,{variant}", None, flag))
        rows = []
        async with Sandbox(work / "sandbox", nodes=0) as sb, sb.client(timeout=120) as http:
            have = 0
            for total in sorted(opts.nodes):
                started = time.monotonic()
                await add_nodes(http, [f"idle-{i}" for i in range(have, total)], "bench-idle")
                have = total
                print(f"{total} nodes Ready ({time.monotonic() - started:.1f}s)", flush=True)
                for label, src, args in runs:
                    row = {"run": label} | run_probe(sb.kubeconfig, src, [*common, *args])
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    print(
        f"\n{'run':<22} {'nodes':>5} {'ready(s)':>8} {'CPU(s)':>6} {'cache B/node':>12} "
        f"{'synced':>7} {'peak':>7} {'settled':>7} {'after gc':>8} {'after trim':>10}  (MiB)"
    )
    for r in rows:
        print(
            f"{r['run']:<22} {r['nodes']:>5} {r['ready_s']:>8} {r['cpu_s']:>6} "
            f"{r['cache_bytes_per_node']:>12} {r['synced']:>7} {r['hwm']:>7} "
            f"{r['settled']:>7} {r['after_gc']:>8} {r['after_trim']:>10}"
        )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[500, 2000, 5000])
    parser.add_argument("--against", nargs="*", default=[], help="commits to probe too")
    parser.add_argument(
        "--variants", nargs="*", default=[], help="this checkout also with: page=N, no-release"
    )
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--trace", action="store_true", help="tracemalloc's top retained lines")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    parser.add_argument("--page-size", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--no-release", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(asyncio.run(probe(opts) if opts.probe else main(opts)) or 0)
