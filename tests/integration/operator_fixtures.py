"""Run the real ``nmo run`` process against the sandbox, and helpers to watch it.

The operator is a subprocess (exactly what users run), logging JSON to a
file that is printed when a test fails. ``Operator.restart`` and ``kill``
let tests interrupt it mid-drain. Its state is read from its endpoints, never
from its log: ``/leaderz`` (it runs the maintenance workers),
``/readyz/informers`` (its caches synced) and ``/metrics`` (counters).

It runs as the chart's ServiceAccount with the chart's RBAC and namespace
flags (chart_identity.py), never as the sandbox admin, unless its test
passes ``identity=Identity.admin(sandbox, why=...)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from chart_identity import Identity, chart_identity
from prometheus_client.parser import text_string_to_metric_families

from nmo_sandbox import Sandbox

T = TypeVar("T")
NM = "/apis/nodemaintenance.medik8s.io/v1beta1/nodemaintenances"


CURRENT: list[Operator] = []  # for the failure report hook in conftest.py


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def get_local(port: int, path: str) -> tuple[int, str]:
    """``GET http://127.0.0.1:<port><path>``: (status, body), (0, why) when nothing answers."""
    async with httpx.AsyncClient(timeout=5) as http:
        try:
            resp = await http.get(f"http://127.0.0.1:{port}{path}")
        except httpx.TransportError as exc:
            return 0, f"{type(exc).__name__}: {exc}"
    return resp.status_code, resp.text


async def probe_leading(probe_port: int) -> bool:
    """Whether the nmo serving probes on ``probe_port`` runs the maintenance workers."""
    status, body = await get_local(probe_port, "/leaderz")
    assert status in (0, 200, 503), f"/leaderz answered {status}: {body}"
    return status == 200


async def probe_synced(probe_port: int) -> bool:
    """Whether that nmo's informers have synced (``/readyz/informers``)."""
    return (await get_local(probe_port, "/readyz/informers"))[0] == 200


async def wait_until_up(
    proc: subprocess.Popen[bytes],
    check: Callable[[], Awaitable[bool]],
    *,
    log: Callable[[], str],
    what: str,
    timeout: float = 30,
) -> None:
    """Poll ``check`` until true; fail early, with the log's tail, if the process exits."""
    deadline = time.monotonic() + timeout
    while not await check():
        if proc.poll() is not None or time.monotonic() > deadline:
            state = "exited" if proc.poll() is not None else f"not {what} after {timeout:g}s"
            pytest.fail(f"nmo {state}:\n{log()[-3000:]}")
        await asyncio.sleep(0.1)


async def scrape(metrics_port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a plain-HTTP ``/metrics``, keyed by (name, labels)."""
    status, text = await get_local(metrics_port, "/metrics")
    assert status == 200, f"/metrics answered {status}: {text[:500]}"
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], series: str, /, **labels: str
) -> float:
    """The sum of ``series``'s samples whose labels include ``labels`` (``name`` among them)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == series and want <= ls)


class Operator:
    def __init__(
        self,
        sandbox: Sandbox,
        log_dir: Path,
        extra: list[str] | None = None,
        *,
        identity: Identity | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.log_dir = log_dir
        self.extra = extra or []
        self.identity = identity  # None: the chart's (chart_identity), found at start
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.probe_port = free_port()
        self.metrics_port = free_port()

    @property
    def log_file(self) -> Path:
        return self.log_dir / f"nmo-{self.starts}.log"

    def args(self) -> list[str]:
        assert self.identity is not None, "start() finds the identity"
        return [
            sys.executable,
            "-m",
            "nmo",
            "run",
            "--kubeconfig",
            str(self.identity.kubeconfig),
            *self.identity.flags,
            "--no-leader-elect",
            "--lease-renew-interval",
            "2",
            "--status-interval",
            "0.5",
            "--bind-address",
            "127.0.0.1",
            "--health-probe-port",
            str(self.probe_port),
            "--metrics-port",
            str(self.metrics_port),
            "--no-metrics-secure",
            "--no-enable-webhook",
            "--log-format",
            "json",
            *self.extra,
        ]

    async def ensure_identity(self) -> Identity:
        """The identity to run as: the chart's unless the test gave another."""
        if self.identity is None:
            self.identity = await chart_identity(self.sandbox)
        return self.identity

    async def start(self) -> None:
        await self.ensure_identity()
        self.starts += 1
        with self.log_file.open("wb") as out:
            self.proc = subprocess.Popen(self.args(), stdout=out, stderr=subprocess.STDOUT)  # noqa: ASYNC220
        await wait_until_up(self.proc, self.leading, log=self.log_file.read_text, what="leading")

    async def leading(self) -> bool:
        """``/leaderz``: this process runs the maintenance workers."""
        return await probe_leading(self.probe_port)

    async def metric(self, series: str, /, **labels: str) -> float:
        """One metric of this process (summed over the labels not given)."""
        return metric(await scrape(self.metrics_port), series, **labels)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=20)
        self.proc = None

    async def restart(self) -> None:
        self.kill()
        await self.start()

    def logs(self) -> str:
        return "".join(p.read_text() for p in sorted(self.log_dir.glob("nmo-*.log")))


@pytest.fixture(scope="session")
async def operator(
    sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Operator]:
    """One nmo process for the session (CRD installed first)."""
    from nmo.api.crd import crd

    async with sandbox.client() as client:
        resp = await client.post(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd()
        )
        assert resp.status_code in (201, 409), resp.text
        await wait_for(lambda: _crd_served(client), timeout=30, what="CRD served")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")  # one sandbox per worker
    log_dir = Path(os.environ.get("NMO_TEST_LOGS", "/tmp/nmo-test-logs")) / (
        time.strftime("%Y%m%d-%H%M%S") + f"-{worker}"
    )
    log_dir.mkdir(parents=True, exist_ok=True)
    op = Operator(sandbox, log_dir)
    CURRENT.append(op)
    await op.start()
    yield op
    op.kill(signal.SIGTERM)


async def _crd_served(client: httpx.AsyncClient) -> bool:
    return (await client.get(NM)).status_code == 200


async def wait_for(
    check: Callable[[], Awaitable[T]], *, timeout: float = 60, interval: float = 0.2, what: str = ""
) -> T:
    """Poll ``check`` until it returns something truthy; fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(interval)
    pytest.fail(f"timed out after {timeout}s waiting for {what or check}; last value: {last!r}")


async def idle(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """A scrape of ``/metrics`` taken when no pass runs and no key waits
    (waited for, never slept): every pass before it is counted in it."""
    queue = {"name": "nodemaintenance", "controller": "nodemaintenance"}

    async def check() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
        s = await scrape(port)
        quiet = (
            metric(s, "workqueue_depth", **queue) == 0
            and metric(s, "controller_runtime_active_workers", controller="nodemaintenance") == 0
            and metric(s, "workqueue_unfinished_work_seconds", **queue) == 0
        )
        return s if quiet else None

    return await wait_for(check, timeout=30, what="nmo idle (depth 0, no active worker)")


@contextlib.asynccontextmanager
async def others_stopped() -> AsyncIterator[None]:
    """Stop every nmo of the session (restarted after), so only the test's own reconciles."""
    running = [op for op in CURRENT if op.proc is not None and op.proc.poll() is None]
    for op in running:
        op.kill(signal.SIGTERM)
    try:
        yield
    finally:
        for op in running:
            await op.start()


@pytest.fixture
async def sole_operator(operator: Operator) -> AsyncIterator[None]:
    """For one test, the session's nmo is stopped (it installed the CRD first)."""
    async with others_stopped():
        yield
