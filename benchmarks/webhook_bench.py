"""Webhook benchmark: admission latency of ``nmo run``'s TLS webhook under open-loop load.

Starts the sandbox and a real ``nmo run`` (webhook on TLS with a certificate
from the sandbox CA, default log level, so every decision is logged as users
get it), then sends AdmissionReviews straight to
``https://127.0.0.1:<port>/validate-...``: dry-run CREATEs of a NodeMaintenance
for an existing node, each with a fresh uid, all allowed (a dry run takes no
claim on the node, so the duplicate rule never denies, see
``nmo/webhooks/lookups.py``).

The load is open loop: request *i* is due at ``t0 + i / rate`` whatever
happened to earlier ones, and its latency is measured from that due time, so
a stalled server (or a stalled generator) shows up in the figures instead of
slowing the load down. Requests go over many HTTP/1.1 keep-alive connections
(32 opened up front, more on demand up to ``--max-connections``, default 64;
a request due while all are busy waits for one, and that wait counts). The
cap matters: opened without limit, a short stall of either process turns
into a storm of TLS handshakes that costs more CPU than the admissions
(``--max-connections 100000`` shows it).

Phases: a steady 200 req/s for 30 s, then steps of 200, 400, ... req/s for
10 s each; reported are p50/p99/max latency, errors, nmo's CPU and RSS
(``VmRSS``) idle and at peak, and the highest step rate with p99 < 10 ms.
The load generator is plain asyncio on the same machine: it shares the CPU
cores with nmo and the sandbox, which the output says.

Run: ``make bench-webhook`` or ``.venv/bin/python benchmarks/webhook_bench.py``.
``--nmo-src DIR`` runs nmo from another ``src/`` tree (e.g. a ``git worktree``
of an older commit, first on its ``PYTHONPATH``; the same virtualenv and the
same load generator), so before and after are measured in one session.
Shorter runs for a quick look: ``--steady-seconds 10 --steps 1000``;
``--samples FILE`` keeps every request's latency with the time it was due, to
see whether the slow ones come together (a pause) or alone.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from procstats import free_port, rss_mib

from nmo.api import constants as c
from nmo.api.crd import crd
from nmo_sandbox import Sandbox
from nmo_sandbox.identity import apply_chart_identity

NM = f"/apis/{c.API_VERSION}/{c.PLURAL}"
NODE = "bench-webhook-node"
TIMEOUT = 5.0
PREWARM = 32  # keep-alive connections open before the load starts
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (``/proc/<pid>/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def review_template() -> bytes:
    kind = {"group": c.GROUP, "version": c.VERSION, "kind": c.KIND}
    res = {"group": c.GROUP, "version": c.VERSION, "resource": c.PLURAL}
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "@REQ@",
            "kind": kind,
            "resource": res,
            "requestKind": kind,
            "requestResource": res,
            "name": "nm-@OBJ@",
            "operation": "CREATE",
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
            "object": {
                "apiVersion": c.API_VERSION,
                "kind": c.KIND,
                "metadata": {"name": "nm-@OBJ@", "uid": "@OBJ@"},
                "spec": {"nodeName": NODE, "reason": "webhook benchmark"},
            },
            "oldObject": None,
            "dryRun": True,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }
    return json.dumps(review).encode()


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Target:
    """Raw HTTP/1.1 over TLS, cheap enough that the generator is not the bottleneck,
    on a pool of at most ``max_connections`` keep-alive connections."""

    def __init__(self, port: int, ca_file: Path, max_connections: int) -> None:
        self.port = port
        self.ctx = ssl.create_default_context(cafile=str(ca_file))
        self.template = review_template()
        self.head = (
            f"POST {c.WEBHOOK_PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Content-Type: application/json\r\nAccept: application/json\r\n"
        )
        self.max_connections = max_connections
        self.idle: asyncio.Queue[Conn] = asyncio.Queue()
        self.open = 0
        self.opened = 0

    def request(self) -> bytes:
        body = self.template.replace(b"@REQ@", str(uuid.uuid4()).encode()).replace(
            b"@OBJ@", str(uuid.uuid4()).encode()
        )
        return (self.head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    async def connect(self) -> Conn:
        self.open += 1
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", self.port, ssl=self.ctx, server_hostname="127.0.0.1"
            )
        except BaseException:
            self.open -= 1
            raise
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.opened += 1
        return reader, writer

    async def prewarm(self, count: int) -> None:
        for conn in await asyncio.gather(*(self.connect() for _ in range(count))):
            self.idle.put_nowait(conn)

    async def acquire(self) -> Conn:
        if not self.idle.empty():
            return self.idle.get_nowait()
        if self.open < self.max_connections:
            return await self.connect()
        return await self.idle.get()  # waiting here counts in the latency, not in 'svc'

    def discard(self, conn: Conn) -> None:
        conn[1].close()
        self.open -= 1

    async def admit(self) -> tuple[str, float]:
        """One admission: ("", when it was written) when allowed, else (the problem, ...)."""
        conn = await self.acquire()
        reader, writer = conn
        sent_at = asyncio.get_running_loop().time()
        try:
            writer.write(self.request())
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            body = await reader.readexactly(length)
        except BaseException:
            self.discard(conn)
            raise
        if b"connection: close" in head.lower():
            self.discard(conn)
        else:
            self.idle.put_nowait(conn)
        if head[9:12] != b"200":
            return f"HTTP {head[9:12].decode()}", sent_at
        if b'"allowed":true' not in body:
            return f"not allowed: {body[:200]!r}", sent_at
        return "", sent_at

    def close(self) -> None:
        while not self.idle.empty():
            self.discard(self.idle.get_nowait())


@dataclass
class Phase:
    name: str
    rate: int
    seconds: float
    latencies: list[float] = field(default_factory=list)  # from the due time
    service: list[float] = field(default_factory=list)  # from the write on the wire
    errors: dict[str, int] = field(default_factory=dict)
    wall: float = 0.0
    nmo_cpu: float = 0.0
    gen_cpu: float = 0.0
    peak_rss: float = 0.0
    connections: int = 0
    start: float = 0.0
    max_at: float = 0.0  # seconds into the phase of the slowest request
    due_at: list[float] = field(default_factory=list)  # seconds into the phase, per latency
    started_at: float = 0.0  # wall clock (time.time) of the phase's first due time

    @property
    def sent(self) -> int:
        return len(self.latencies) + sum(self.errors.values())

    def pct(self, q: float, *, service: bool = False) -> float:
        values = self.service if service else self.latencies
        if not values:
            return float("nan")
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    def row(self) -> dict[str, Any]:
        return {
            "phase": self.name,
            "rate": self.rate,
            "seconds": self.seconds,
            "sent": self.sent,
            "ok": len(self.latencies),
            "errors": sum(self.errors.values()),
            "error_kinds": self.errors,
            "p50_ms": round(self.pct(0.50), 2),
            "p99_ms": round(self.pct(0.99), 2),
            "p99_service_ms": round(self.pct(0.99, service=True), 2),
            "max_ms": round(max(self.latencies, default=float("nan")) * 1000, 2),
            "max_at_s": round(self.max_at, 2),
            "achieved_per_s": round(len(self.latencies) / self.wall, 1) if self.wall else 0,
            "nmo_cpu_pct": round(100 * self.nmo_cpu / self.wall, 1) if self.wall else 0,
            "generator_cpu_pct": round(100 * self.gen_cpu / self.wall, 1) if self.wall else 0,
            "nmo_peak_rss_mib": round(self.peak_rss, 1),
            "connections_opened": self.connections,
        }


async def run_phase(target: Target, phase: Phase, pid: int) -> Phase:
    loop = asyncio.get_running_loop()
    total = int(phase.rate * phase.seconds)
    pending: set[asyncio.Task[None]] = set()
    opened = target.opened

    async def one(due: float) -> None:
        sent_at = due
        try:
            problem, sent_at = await asyncio.wait_for(target.admit(), TIMEOUT)
        except TimeoutError:
            problem = "timeout"
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError) as exc:
            problem = type(exc).__name__
        if problem:
            phase.errors[problem] = phase.errors.get(problem, 0) + 1
        else:
            done = loop.time()
            if done - due > max(phase.latencies, default=0.0):
                phase.max_at = due - phase.start
            phase.latencies.append(done - due)
            phase.service.append(done - sent_at)
            phase.due_at.append(due - phase.start)

    async def sample_rss() -> None:
        while True:
            phase.peak_rss = max(phase.peak_rss, rss_mib(pid))
            await asyncio.sleep(0.2)

    sampler = asyncio.create_task(sample_rss())
    # No collector pauses in the generator while it keeps time (collected after).
    gc.disable()
    cpu0, gen0 = cpu_seconds(pid), own_cpu_seconds()
    start = phase.start = loop.time() + 0.01
    phase.started_at = time.time() + 0.01
    sent = 0
    while sent < total:
        now = loop.time()
        # Everything that is due goes out now; latency counts from the due time.
        while sent < total and start + sent / phase.rate <= now:
            task = asyncio.create_task(one(start + sent / phase.rate))
            pending.add(task)
            task.add_done_callback(pending.discard)
            sent += 1
        if sent < total:
            await asyncio.sleep(max(0.0, start + sent / phase.rate - loop.time()))
    await asyncio.gather(*pending)
    phase.wall = loop.time() - start
    phase.nmo_cpu = cpu_seconds(pid) - cpu0
    phase.gen_cpu = own_cpu_seconds() - gen0
    phase.connections = target.opened - opened
    sampler.cancel()
    gc.enable()
    gc.collect()
    return phase


async def until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


def print_table(
    phases: list[Phase], idle_rss: float, idle_cpu: float, budget_ms: float, conns: int
) -> None:
    print(
        "\nnmo webhook: dry-run CREATE AdmissionReviews (allowed) over TLS, HTTP/1.1 keep-alive"
        f" (up to {conns} connections), open loop"
    )
    print(
        f"NOTE: the load generator (asyncio, this process), nmo and the sandbox control plane"
        f" share this machine's {os.cpu_count()} CPU cores."
    )
    header = (
        f"{'phase':<7}{'rate/s':>7}{'secs':>6}{'sent':>7}{'errors':>7}{'p50 ms':>8}"
        f"{'p99 ms':>8}{'max ms':>8}{'p99 svc':>8}{'done/s':>8}{'nmo CPU':>9}{'gen CPU':>9}"
        f"{'peak RSS':>10}"
    )
    print(
        "latency counts from each request's due time on the fixed clock (so generator or"
        " server stalls\nare included); 'p99 svc' counts from the moment it was written to"
        " the connection."
    )
    print(header)
    print("-" * len(header))
    for p in phases:
        r = p.row()
        print(
            f"{r['phase']:<7}{r['rate']:>7}{r['seconds']:>6g}{r['sent']:>7}{r['errors']:>7}"
            f"{r['p50_ms']:>8.2f}{r['p99_ms']:>8.2f}{r['max_ms']:>8.1f}"
            f"{r['p99_service_ms']:>8.2f}{r['achieved_per_s']:>8.0f}"
            f"{r['nmo_cpu_pct']:>8.0f}%{r['generator_cpu_pct']:>8.0f}%"
            f"{r['nmo_peak_rss_mib']:>6.1f} MiB"
        )
    best = 0
    for p in (p for p in phases if p.name == "step"):
        if p.errors or not p.pct(0.99) < budget_ms:
            break
        best = p.rate
    peak = max((p.peak_rss for p in phases), default=0.0)
    steps = [p.rate for p in phases if p.name == "step"]
    if not best:
        print(f"\nno step rate kept p99 under {budget_ms:g} ms without errors")
    else:
        note = " (the highest step run; try --steps with higher rates)" if best == steps[-1] else ""
        print(f"\nhighest step rate with p99 < {budget_ms:g} ms and no errors: {best} req/s{note}")
    print(f"nmo RSS: idle {idle_rss:.1f} MiB, peak under load {peak:.1f} MiB")
    print(
        f"nmo CPU when idle: {100 * idle_cpu:.1f}% (so at 200 reviews/s, about"
        f" {1000 * idle_cpu / 200:.2f} ms of each review's 'nmo CPU' is not the review's)"
    )
    errors: dict[str, int] = {}
    for p in phases:
        for kind, count in p.errors.items():
            errors[kind] = errors.get(kind, 0) + count
    if errors:
        print(f"errors by kind: {errors}")


async def main(
    steady: tuple[int, float],
    steps: list[int],
    step_seconds: float,
    max_connections: int,
    keep_log: Path | None,
    nmo_src: Path | None = None,
    samples: Path | None = None,
) -> int:
    with tempfile.TemporaryDirectory(prefix="nmo-webhook-bench-") as tmp:
        async with Sandbox(Path(tmp) / "sandbox", nodes=1) as sb, sb.client() as http:
            resp = await http.post(
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd()
            )
            resp.raise_for_status()
            await until(lambda: _ok(http.get(NM)), 30, "CRD served")
            await sb.create_node(NODE)
            certs = Path(tmp) / "certs"
            sb.issue_serving_cert(certs, ["127.0.0.1"], name="tls")
            probe_port, webhook_port = free_port(), free_port()
            log = Path(tmp) / "nmo.log"
            identity = await apply_chart_identity(  # the chart's ServiceAccount, not the admin
                sb,
                release="nmo-bench",
                namespace="nmo-bench-system",
                fullname="nmo-bench",
                kubeconfig=Path(tmp) / "nmo.kubeconfig",
            )
            args = [
                sys.executable, "-m", "nmo", "run", "--kubeconfig", str(identity.kubeconfig),
                *identity.flags, "--no-leader-elect", "--bind-address", "127.0.0.1",
                "--health-probe-port", str(probe_port), "--metrics-port", str(free_port()),
                "--no-metrics-secure", "--webhook-port", str(webhook_port),
                "--cert-dir", str(certs),
            ]  # fmt: skip
            env = dict(os.environ)
            if nmo_src is not None:
                env["PYTHONPATH"] = os.pathsep.join(
                    p for p in (str(nmo_src), env.get("PYTHONPATH")) if p
                )
            with log.open("wb") as out:
                proc = subprocess.Popen(  # noqa: ASYNC220
                    args, stdout=out, stderr=subprocess.STDOUT, env=env
                )
            target = Target(webhook_port, sb.ca_file, max_connections)
            try:
                async with httpx.AsyncClient() as probe:

                    async def ready() -> bool:
                        if proc.poll() is not None:
                            raise RuntimeError(f"nmo exited:\n{log.read_text()[-3000:]}")
                        try:
                            url = f"http://127.0.0.1:{probe_port}/readyz"
                            return (await probe.get(url)).status_code == 200
                        except httpx.HTTPError:
                            return False

                    await until(ready, 60, "nmo /readyz")
                problem, _ = await target.admit()
                if problem:
                    raise RuntimeError(f"a valid admission was not allowed: {problem}")
                idle_cpu = cpu_seconds(proc.pid)
                await asyncio.sleep(2)
                idle_cpu = (cpu_seconds(proc.pid) - idle_cpu) / 2
                idle_rss = rss_mib(proc.pid)
                await target.prewarm(PREWARM)
                warmup = await run_phase(target, Phase("warmup", 100, 3), proc.pid)
                if warmup.errors:
                    raise RuntimeError(f"errors while warming up: {warmup.errors}")
                phases = [await run_phase(target, Phase("steady", *steady), proc.pid)]
                print(json.dumps(phases[-1].row()), flush=True)
                for rate in steps:
                    await asyncio.sleep(1)  # let the previous step's backlog clear
                    phases.append(
                        await run_phase(target, Phase("step", rate, step_seconds), proc.pid)
                    )
                    print(json.dumps(phases[-1].row()), flush=True)
            finally:
                target.close()
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=20)
                if keep_log is not None:
                    shutil.copyfile(log, keep_log)
    print_table(phases, idle_rss, idle_cpu, 10.0, max_connections)
    if samples is not None:
        with samples.open("w") as dump:
            for p in phases:
                dump.write(f"# {p.name} {p.rate} started at {p.started_at:.3f} (time.time)\n")
                rows = zip(p.due_at, p.latencies, p.service, strict=True)
                for due, latency, service in rows:
                    ms = f"{latency * 1000:.3f} {service * 1000:.3f}"
                    dump.write(f"{p.name} {p.rate} {due:.4f} {ms}\n")
    return 0


async def _ok(coro: Any) -> bool:
    return bool((await coro).status_code == 200)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steady-rate", type=int, default=200)
    parser.add_argument("--steady-seconds", type=float, default=30)
    parser.add_argument("--steps", type=int, nargs="*", default=[200, 400, 600, 800, 1000])
    parser.add_argument("--step-seconds", type=float, default=10)
    parser.add_argument(
        "--max-connections", type=int, default=64, help="keep-alive connections at most"
    )
    parser.add_argument("--keep-log", type=Path, help="copy nmo's log here at the end")
    parser.add_argument(
        "--nmo-src", type=Path, help="run nmo from this src/ tree (another commit's, say)"
    )
    parser.add_argument(
        "--samples",
        type=Path,
        help="write every answered request here: phase, rate, seconds into the phase it was"
        " due, latency ms, service ms (to see when the slow ones came); a '#' line gives"
        " each phase's start on the wall clock",
    )
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    options = parser.parse_args()
    sys.exit(
        asyncio.run(
            main(
                (options.steady_rate, options.steady_seconds),
                options.steps,
                options.step_seconds,
                options.max_connections,
                options.keep_log,
                options.nmo_src and options.nmo_src.resolve(),
                options.samples,
            )
        )
    )
