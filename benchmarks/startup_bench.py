"""Startup benchmark: how long nmo's commands take to start, and their memory, next to Python's.

Each command runs ``--runs`` times (default 5) after one untimed warm-up
run (the page cache then holds the interpreter and every module, as on a
second invocation); reported are the median wall time, measured around the
whole process, and its maximum resident set size (``/usr/bin/time -f
%M``, the kernel's ``ru_maxrss``), each also as a multiple of ``python -c
pass`` with the same interpreter. Issue 21 item 6: a command imports only
what it uses, so ``nmo version`` and ``--help`` load no client, server or
model library; tests/unit/test_cli_startup.py holds that rule, this says
what it is worth.

No cluster is needed. The commands are the console scripts next to this
interpreter (``.venv/bin/nmo``, ``kubectl-nm``); ``PYTHONPATH`` may point at
another source tree to measure it with the same environment.

Run: ``.venv/bin/python benchmarks/startup_bench.py``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

TIME = "/usr/bin/time"
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Command:
    label: str
    argv: list[str]


COMMANDS = [
    Command("python -c pass", [sys.executable, "-c", "pass"]),
    Command("nmo version", [str(BIN / "nmo"), "version"]),
    Command("nmo --help", [str(BIN / "nmo"), "--help"]),
    Command("import nmo.cli", [sys.executable, "-c", "import nmo.cli"]),
    Command("kubectl-nm --help", [str(BIN / "kubectl-nm"), "--help"]),
]


@dataclass(frozen=True)
class Figures:
    label: str
    wall: float  # seconds, median
    rss: float  # MiB, the largest of the runs

    def row(self, base: Figures) -> str:
        return (
            f"{self.label:<20} {self.wall:8.3f} s {self.wall / base.wall:6.1f}x"
            f" {self.rss:8.1f} MiB {self.rss / base.rss:6.1f}x"
        )


def once(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and max RSS (MiB) of one run of ``argv``; raises if it fails."""
    started = time.perf_counter()
    done = subprocess.run(
        [TIME, "-f", "%M", *argv], capture_output=True, text=True, check=False, timeout=120
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    kib = int(done.stderr.strip().splitlines()[-1])
    return wall, kib / 1024


def measure(command: Command, runs: int) -> Figures:
    once(command.argv)  # warm-up, not counted
    samples = [once(command.argv) for _ in range(runs)]
    return Figures(
        command.label,
        wall=statistics.median(wall for wall, _ in samples),
        rss=max(rss for _, rss in samples),
    )


def main(runs: int) -> int:
    if not Path(TIME).exists():
        print(f"{TIME} is missing (GNU time: apt-get install time)", file=sys.stderr)
        return 1
    figures = [measure(command, runs) for command in COMMANDS]
    base = figures[0]
    print(f"median wall time and max RSS of {runs} runs; x: as a multiple of the first row")
    print(f"{'command':<20} {'wall':>10} {'':>7} {'max RSS':>12}")
    for item in figures:
        print(item.row(base))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per command")
    sys.exit(main(parser.parse_args().runs))
