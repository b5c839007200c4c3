"""A real ``nmo run`` with its webhook, abused by a pod's worth of bad traffic
(issue 14, items 1, 2 and 3).

nmo runs as a process (``Operator``) with the webhook enabled on a free
127.0.0.1 port and a certificate from the sandbox CA; a
ValidatingWebhookConfiguration points the sandbox apiserver at it. The test
process plays the attacker, straight to the webhook port:

* a flood of idle TCP sockets and slow-loris TLS connections: nmo's RSS stays
  bounded, ``/healthz`` and ``/readyz`` answer within 1 s, and admission
  reviews (the apiserver's and a direct one) are still answered;
* a forged CREATE review for a node every 2 s: a real ``kubectl create`` of a
  NodeMaintenance for that node still succeeds;
* 3 MiB and deeply nested bodies: refused quickly, probes and leadership
  unaffected.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import ssl
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from operator_fixtures import CURRENT, Operator, free_port, get_local
from operator_fixtures import wait_for as until

from nmo.api import constants as c
from nmo.api.crd import crd
from nmo.sandbox import Sandbox
from nmo.webhooks.lookups import MAINTENANCES_PATH

if TYPE_CHECKING:
    from conftest import NodeFactory

pytestmark = pytest.mark.integration

Json = dict[str, Any]
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
VWC = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
NM_KIND = {"group": c.GROUP, "version": c.VERSION, "kind": c.KIND}
NM_RESOURCE = {"group": c.GROUP, "version": c.VERSION, "resource": c.PLURAL}
RSS_BOUND_MIB = 250
FIGURES = Path(os.environ.get("NMO_TEST_LOGS", "/tmp/nmo-test-logs")) / "webhook-abuse.json"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def nm(name: str, node: str) -> Json:
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND,
        "metadata": {"name": name},
        "spec": {"nodeName": node, "reason": "abuse test"},
    }


def forged_review(node: str, *, claimant: str) -> Json:
    """What a pod can hand-make: a CREATE that never becomes a CR."""
    obj = {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND,
        "metadata": {"name": "forged", "uid": claimant},
        "spec": {"nodeName": node},
    }
    request = {
        "uid": str(uuid.uuid4()),
        "kind": NM_KIND,
        "resource": NM_RESOURCE,
        "operation": "CREATE",
        "object": obj,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@dataclass
class Hooked:
    op: Operator
    port: int
    ca_file: Path

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}{c.WEBHOOK_PATH}"

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))


async def dry_run_missing_node(kube: httpx.AsyncClient) -> httpx.Response:
    return await kube.post(
        MAINTENANCES_PATH, params={"dryRun": "All"}, json=nm(unique("p"), unique("no-node"))
    )


@pytest.fixture(scope="module")
async def hooked(
    sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Hooked]:
    async with sandbox.client() as kube:
        resp = await kube.post(CRDS, json=crd())
        assert resp.status_code in (201, 409), resp.text

        async def served() -> bool:
            return (await kube.get(MAINTENANCES_PATH)).status_code == 200

        await until(served, what="the NodeMaintenance CRD")
        certs = tmp_path_factory.mktemp("abuse-certs")
        serving = sandbox.issue_serving_cert(certs, ["127.0.0.1"], name="apiserver")
        port = free_port()
        op = Operator(
            sandbox,
            tmp_path_factory.mktemp("abuse-logs"),
            extra=["--enable-webhook", "--webhook-port", str(port), "--cert-dir", str(certs)],
        )
        CURRENT.append(op)
        await op.start()
        hook = Hooked(op, port, serving.ca_file)
        name = unique("nmo-abuse")
        webhook = {
            "name": c.WEBHOOK_NAME,
            "clientConfig": {
                "url": hook.url,
                "caBundle": base64.b64encode(serving.ca_bundle).decode(),
            },
            "rules": [
                {
                    "apiGroups": [c.GROUP],
                    "apiVersions": [c.VERSION],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": [c.PLURAL],
                    "scope": "*",
                }
            ],
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
        }
        resp = await kube.post(
            VWC,
            json={
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": name},
                "webhooks": [webhook],
            },
        )
        assert resp.status_code == 201, resp.text

        async def effective() -> bool:
            return (await dry_run_missing_node(kube)).status_code == 403

        await until(effective, what="the apiserver to call nmo's webhook")
        try:
            yield hook
        finally:
            await kube.delete(f"{VWC}/{name}")

            async def gone() -> bool:
                return (await dry_run_missing_node(kube)).status_code == 201

            await until(gone, what="the apiserver to stop calling the webhook")
            op.kill(signal.SIGTERM)
            CURRENT.remove(op)


async def timed_probe(port: int, path: str) -> float:
    started = time.perf_counter()
    status, _ = await asyncio.wait_for(get_local(port, path), 5)
    elapsed = time.perf_counter() - started
    assert status == 200, path
    return elapsed


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def test_a_socket_flood_keeps_memory_bounded_and_probes_answering(
    sandbox: Sandbox, hooked: Hooked
) -> None:
    assert hooked.op.proc is not None
    pid = hooked.op.proc.pid
    baseline = rss_mib(pid)
    writers: list[asyncio.StreamWriter] = []
    stop = asyncio.Event()

    async def idle(n: int) -> None:
        for _ in range(n):
            with contextlib.suppress(OSError):
                _r, w = await asyncio.open_connection("127.0.0.1", hooked.port)
                writers.append(w)

    async def loris() -> None:
        with contextlib.suppress(OSError, asyncio.TimeoutError, ssl.SSLError):
            _r, w = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", hooked.port, ssl=hooked.tls()), 10
            )
            writers.append(w)
            for byte in f"POST {c.WEBHOOK_PATH} HTTP/1.1\r\n".encode():
                if stop.is_set() or w.is_closing():
                    return
                w.write(bytes([byte]))
                await asyncio.sleep(1)

    latencies: list[float] = []
    peak = baseline

    async def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, rss_mib(pid))
            for path in ("/healthz", "/readyz"):
                latencies.append(await timed_probe(hooked.op.probe_port, path))
            await asyncio.sleep(0.1)

    watcher = asyncio.create_task(watch())
    lorises = [asyncio.create_task(loris()) for _ in range(100)]
    await asyncio.gather(*(idle(250) for _ in range(12)))  # 3,000 idle sockets
    opened = len(writers)
    # During the flood: the apiserver's review and a direct one on a new connection.
    async with sandbox.client() as kube:
        denied = await dry_run_missing_node(kube)
    async with httpx.AsyncClient(verify=hooked.tls(), timeout=10) as direct:
        answered = await direct.post(hooked.url, json=forged_review(unique("x"), claimant="d"))
    await asyncio.sleep(15)  # the handshake and header deadlines pass
    stop.set()
    await watcher
    for task in lorises:
        task.cancel()
    for w in writers:
        w.close()
    figures = {
        "sockets": opened,
        "rss_baseline_mib": round(baseline, 1),
        "rss_peak_mib": round(peak, 1),
        "probe_p99_s": round(p99(latencies), 4),
        "probe_max_s": round(max(latencies), 4),
        "probes": len(latencies),
    }
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text(json.dumps(figures, indent=1))
    print(figures)
    assert opened >= 2500
    assert denied.status_code == 403, denied.text
    assert "no node with name" in denied.json()["message"]
    assert answered.status_code == 200
    assert answered.json()["response"]["allowed"] is False  # no such node
    assert peak < RSS_BOUND_MIB, figures
    assert max(latencies) < 1.0, figures


async def test_forged_reviews_every_2s_do_not_block_a_real_create(
    sandbox: Sandbox, hooked: Hooked, node_factory: NodeFactory
) -> None:
    (node,) = await node_factory(1)
    stop = asyncio.Event()
    answers: list[bool] = []

    async def forge() -> None:
        async with httpx.AsyncClient(verify=hooked.tls(), timeout=10) as http:
            i = 0
            while not stop.is_set():
                # the same claimant (a repeat) and fresh ones, alternately
                claimant = "forger" if i % 2 == 0 else unique("forger")
                resp = await http.post(hooked.url, json=forged_review(node, claimant=claimant))
                answers.append(resp.json()["response"]["allowed"])
                i += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 2)

    forger = asyncio.create_task(forge())
    name = unique("nm")
    try:
        await asyncio.sleep(5)  # the forged claim is in place, and re-sent
        started = time.perf_counter()
        result = await sandbox.kubectl("create", "-f", "-", input=json.dumps(nm(name, node)))
        took = time.perf_counter() - started
    finally:
        stop.set()
        await forger
    try:
        assert result.returncode == 0, result.stderr
        assert took < 10
        assert answers and answers[0] is True  # the forgery was admitted: it held a claim
    finally:
        await sandbox.kubectl("delete", "nodemaintenance", name, "--wait=false")


async def test_big_and_nested_bodies_are_refused_quickly(hooked: Hooked) -> None:
    big = b'{"a":"' + b"x" * (3 * 1024 * 1024) + b'"}'
    nested = b"[" * 100_000 + b"]" * 100_000
    latencies: list[float] = []
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            latencies.append(await timed_probe(hooked.op.probe_port, "/readyz"))
            latencies.append(await timed_probe(hooked.op.probe_port, "/leaderz"))
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    async with httpx.AsyncClient(verify=hooked.tls(), timeout=10) as http:

        async def post(body: bytes) -> tuple[int, str, float]:
            started = time.perf_counter()
            resp = await http.post(
                hooked.url, content=body, headers={"Content-Type": "application/json"}
            )
            return resp.status_code, resp.text, time.perf_counter() - started

        answers = await asyncio.gather(*(post(big) for _ in range(10)), post(nested), post(nested))
    stop.set()
    await watcher
    for status, text, took in answers[:10]:
        assert status == 413, text
        assert "exceeds the webhook's limit" in text
        assert took < 2
    for status, text, _ in answers[10:]:
        assert status == 400, text
    assert max(latencies) < 1.0
