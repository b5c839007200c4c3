"""Run the real ``nmo run`` process against the sandbox, and helpers to watch it.

The operator is a subprocess (exactly what users run), logging JSON to a
file that is printed when a test fails. ``Operator.restart`` and ``kill``
let tests interrupt it mid-drain.
"""

from __future__ import annotations

import asyncio
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

from nmo.sandbox import Sandbox

T = TypeVar("T")
NM = "/apis/nodemaintenance.medik8s.io/v1beta1/nodemaintenances"


CURRENT: list[Operator] = []  # for the failure report hook in conftest.py


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Operator:
    def __init__(self, sandbox: Sandbox, log_dir: Path, extra: list[str] | None = None) -> None:
        self.sandbox = sandbox
        self.log_dir = log_dir
        self.extra = extra or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.probe_port = free_port()
        self.metrics_port = free_port()

    @property
    def log_file(self) -> Path:
        return self.log_dir / f"nmo-{self.starts}.log"

    def args(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "nmo",
            "run",
            "--kubeconfig",
            str(self.sandbox.kubeconfig),
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

    async def start(self) -> None:
        self.starts += 1
        with self.log_file.open("wb") as out:
            self.proc = subprocess.Popen(self.args(), stdout=out, stderr=subprocess.STDOUT)  # noqa: ASYNC220
        deadline = time.monotonic() + 30
        while "maintenance workers starting" not in self.log_file.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"nmo did not start:\n{self.log_file.read_text()[-3000:]}")
            await asyncio.sleep(0.1)

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
    log_dir = Path(os.environ.get("NMO_TEST_LOGS", "/tmp/nmo-test-logs")) / time.strftime(
        "%Y%m%d-%H%M%S"
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
