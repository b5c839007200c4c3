"""The ``nmo run`` process as users run it (behavior.md A7, issue 3 item 5).

Leader election between real processes (failover timed), curl-able probes,
``/metrics`` behind TokenReview + SubjectAccessReview, the webhook served by
the same process, and a process without certificates that keeps reconciling
while ``/readyz`` says why the webhook is off.

The session's nmo (``operator``) is paused for these tests so that only the
processes started here reconcile. Each process runs as the chart's
ServiceAccount (chart_identity.py), its leader Lease in the chart's release
namespace.
"""

from __future__ import annotations

import asyncio
import base64
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from audit import AuditEvent, AuditWindow, nmo_events, show
from chart_identity import RELEASE_NAMESPACE, Identity, chart_identity, reset_leader_leases
from objects import NM, Api, uid
from operator_fixtures import Operator, free_port, probe_leading, probe_synced, wait_for
from prometheus_client.parser import text_string_to_metric_families

from nmo.api import constants as c
from nmo_sandbox import Sandbox

pytestmark = pytest.mark.integration


class Proc:
    """One ``nmo run`` subprocess with its own ports and log file."""

    def __init__(
        self,
        sandbox: Sandbox,
        log_dir: Path,
        name: str,
        *extra: str,
        identity: Identity,
    ) -> None:
        self.name = name
        self.probe_port = free_port()
        self.metrics_port = free_port()
        self.webhook_port = free_port()
        self.log = log_dir / f"{name}.log"
        args = [
            sys.executable, "-m", "nmo", "run", "--kubeconfig", str(identity.kubeconfig),
            *identity.flags,
            "--bind-address", "127.0.0.1", "--identity", name,
            "--health-probe-port", str(self.probe_port),
            "--metrics-port", str(self.metrics_port),
            "--webhook-port", str(self.webhook_port),
            "--status-interval", "0.5", *extra,
        ]  # fmt: skip
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text()

    async def leading(self) -> bool:
        """``/leaderz``: this replica runs the maintenance workers."""
        return await probe_leading(self.probe_port)

    async def synced(self) -> bool:
        """``/readyz/informers``: this replica's caches have synced."""
        assert self.proc.poll() is None, f"{self.name} exited:\n{self.text()[-3000:]}"
        return await probe_synced(self.probe_port)

    async def started(self) -> bool:
        assert self.proc.poll() is None, f"{self.name} exited:\n{self.text()[-3000:]}"
        return await self.leading()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
async def procs(sandbox: Sandbox, tmp_path: Path, operator: Operator) -> AsyncIterator[Any]:
    """Factory of nmo processes (the chart's identity unless given another); pauses
    the session operator (which installed the CRD). No leader Lease is left over
    from an earlier test, nor from this one."""
    session = operator if operator.proc is not None else None
    if session is not None:
        session.kill(signal.SIGTERM)
    chart = await chart_identity(sandbox)
    await reset_leader_leases(sandbox)
    started: list[Proc] = []

    def start(name: str, *extra: str, identity: Identity | None = None) -> Proc:
        p = Proc(sandbox, tmp_path, name, *extra, identity=identity or chart)
        started.append(p)
        return p

    try:
        yield start
    finally:
        for p in started:
            p.stop(signal.SIGKILL)
        await reset_leader_leases(sandbox)
        if session is not None:
            await session.start()


async def curl(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "-w", "\n%{http_code}", *extra, url,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    return subprocess.CompletedProcess(
        ["curl", url], proc.returncode or 0, out.decode(), err.decode()
    )


def leader_args() -> list[str]:
    """Leader election (in the chart's release namespace, the identity's flag), fast."""
    return [
        "--leader-elect",
        "--leader-lease-duration", "4", "--leader-renew-deadline", "3",
        "--leader-retry-period", "0.5", "--no-enable-webhook", "--no-metrics-secure",
    ]  # fmt: skip


@pytest.mark.solo
async def test_leader_election_failover(
    procs: Any,
    sandbox: Sandbox,
    kube: httpx.AsyncClient,
    node_factory: Any,
) -> None:
    api = Api(kube)
    a = procs("nmo-a", *leader_args())
    await wait_for(a.started, timeout=30, what="the first replica to lead")
    # b holds a ServiceAccount of its own (the chart's RBAC, rendered for a second
    # release), so the audit log tells its requests from a's.
    b_identity = await chart_identity(sandbox, variant="b")
    b_user = b_identity.username
    b = procs("nmo-b", *leader_args(), identity=b_identity)
    await wait_for(b.synced, timeout=30, what="b's caches")
    # The standby keeps asking for the leader lease and keeps being refused:
    # several of its attempts (retry period 0.5 s) are in the audit log, none
    # of them a write, and /leaderz on b says "not leading" all along.
    window = await AuditWindow.open(sandbox)

    def b_on_leader_lease() -> list[AuditEvent]:
        return [
            e
            for e in nmo_events(window.events())
            if e.username == b_user and e.on("leases", c.LEADER_ELECTION_ID)
        ]

    answers: list[bool] = []

    async def refused_often() -> bool:
        answers.append(await b.leading())
        return len(b_on_leader_lease()) >= 6

    await wait_for(refused_often, timeout=20, what="b to ask for the leader lease 6 times")
    answers.append(await b.leading())
    events = await window.close()
    b_leases = [e for e in nmo_events(events) if e.username == b_user and e.on("leases")]
    assert not any(answers), "two replicas reconcile at once"
    assert not [e for e in b_leases if e.is_write], show(b_leases)
    assert b.proc.poll() is None
    lease_path = (
        f"/apis/coordination.k8s.io/v1/namespaces/{RELEASE_NAMESPACE}/leases/{c.LEADER_ELECTION_ID}"
    )
    lease = await api.get(lease_path)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "nmo-a"

    (node1, node2, node3) = await node_factory(3)
    first = f"nm-{uid()}"
    await api.create_nm(first, node1)
    await wait_for(lambda: _phase(api, first, "Succeeded"), what="the leader's maintenance")

    # Crash: the standby waits out the lease (4 s) and takes over.
    killed = time.monotonic()
    a.stop(signal.SIGKILL)
    await wait_for(b.started, timeout=20, interval=0.05, what="b to take over")
    crash_failover = time.monotonic() - killed
    second = f"nm-{uid()}"
    await api.create_nm(second, node2)
    await wait_for(lambda: _phase(api, second, "Succeeded"), what="the new leader's maintenance")

    # Clean shutdown: the leader releases the lease, the standby takes over at once.
    c3 = procs("nmo-c", *leader_args())
    await wait_for(c3.synced, timeout=30, what="c's caches")
    assert not await c3.leading()
    stopped = time.monotonic()
    b.stop(signal.SIGTERM)
    await wait_for(c3.started, timeout=20, interval=0.05, what="c to take over")
    clean_failover = time.monotonic() - stopped
    third = f"nm-{uid()}"
    await api.create_nm(third, node3)
    await wait_for(lambda: _phase(api, third, "Succeeded"), what="the third leader's maintenance")
    print(
        f"\nleader failover: {crash_failover:.1f}s after SIGKILL (lease 4 s), "
        f"{clean_failover:.1f}s after SIGTERM (lease released)"
    )
    assert crash_failover < 4 + 3
    assert clean_failover < 3
    for name in (first, second, third):
        await api.delete(f"{NM}/{name}")
    for name in (first, second, third):
        await wait_for(lambda n=name: _gone(api, n), what=f"{name} removed")


async def test_probes_metrics_and_webhook_in_one_process(
    procs: Any, sandbox: Sandbox, kube: httpx.AsyncClient, namespace: str, tmp_path: Path
) -> None:
    api = Api(kube)
    certs = tmp_path / "certs"
    serving = sandbox.issue_serving_cert(certs, ["127.0.0.1"], name="apiserver")
    p = procs("nmo-surface", "--no-leader-elect", "--cert-dir", str(certs))
    await wait_for(p.started, timeout=30, what="nmo to start")

    async def ready() -> bool:
        return (await curl(f"http://127.0.0.1:{p.probe_port}/readyz", "-f")).returncode == 0

    await wait_for(ready, timeout=30, what="/readyz ok")
    healthz = await curl(f"http://127.0.0.1:{p.probe_port}/healthz", "-f")
    assert healthz.stdout.splitlines()[0] == "ok"
    verbose = await curl(f"http://127.0.0.1:{p.probe_port}/readyz?verbose", "-f")
    for check in ("informers", "leader-election", "webhook"):
        assert check in verbose.stdout

    # /metrics: 401 without a token, 403 for an unauthorised account, 200 when bound.
    metrics_url = f"https://127.0.0.1:{p.metrics_port}/metrics"
    assert (await curl(metrics_url, "-k")).stdout.splitlines()[-1] == "401"
    for sa in ("reader", "stranger"):
        await api.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": sa}}
        )
    role = f"nmo-metrics-{uid()}"
    await api.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        {
            "metadata": {"name": role},
            "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
        },
    )
    await api.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "metadata": {"name": role},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )
    try:
        tokens = {}
        for sa in ("reader", "stranger"):
            resp = await kube.post(
                f"/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token",
                json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
            )
            assert resp.status_code == 201, resp.text
            tokens[sa] = resp.json()["status"]["token"]
        denied = await curl(metrics_url, "-k", "-H", f"Authorization: Bearer {tokens['stranger']}")
        assert denied.stdout.splitlines()[-1] == "403"
        allowed = await curl(metrics_url, "-k", "-H", f"Authorization: Bearer {tokens['reader']}")
        assert allowed.stdout.splitlines()[-1] == "200"
        # Values, not names: the one replica leads, idle; the two scrapes with a
        # token cost a TokenReview and a SubjectAccessReview each (POST, 201).
        body = allowed.stdout.rsplit("\n", 1)[0]
        served = {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(body)
            for s in family.samples
        }
        assert served[("nmo_leader", frozenset())] == 1
        ctrl = frozenset({("controller", "nodemaintenance")})
        assert served[("controller_runtime_max_concurrent_reconciles", ctrl)] == 10
        assert served[("controller_runtime_active_workers", ctrl)] == 0
        host = sandbox.server.removeprefix("https://")
        created = frozenset({("code", "201"), ("method", "POST"), ("host", host)})
        assert served[("rest_client_requests_total", created)] >= 4
    finally:
        await api.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{role}")
        await api.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role}")

    # The webhook is served by the same process.
    vwc = f"nmo-process-{uid()}"
    body = {
        "metadata": {"name": vwc},
        "webhooks": [
            {
                "name": c.WEBHOOK_NAME,
                "clientConfig": {
                    "url": f"https://127.0.0.1:{p.webhook_port}{c.WEBHOOK_PATH}",
                    "caBundle": base64.b64encode(serving.ca_bundle).decode(),
                },
                "rules": [
                    {
                        "apiGroups": [c.GROUP],
                        "apiVersions": [c.VERSION],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": [c.PLURAL],
                    }
                ],
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
            }
        ],
    }
    path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    await api.create(path, body)
    missing = f"missing-{uid()}"
    manifest = (
        f"apiVersion: {c.API_VERSION}\nkind: {c.KIND}\nmetadata:\n  name: nm-{uid()}\n"
        f"spec:\n  nodeName: {missing}\n"
    )
    expected = (
        f'admission webhook "{c.WEBHOOK_NAME}" denied the request: '
        f"invalid nodeName, no node with name {missing} found"
    )
    try:

        async def refused() -> bool:
            out = await sandbox.kubectl("create", "--dry-run=server", "-f", "-", input=manifest)
            return out.returncode != 0 and expected in out.stderr

        await wait_for(refused, timeout=30, what="the webhook in nmo run to refuse the CR")
        out = await sandbox.kubectl("create", "-f", "-", input=manifest)
        assert out.returncode != 0
        assert expected in out.stderr
    finally:
        await api.delete(f"{path}/{vwc}")

        async def not_called() -> bool:
            out = await sandbox.kubectl("create", "--dry-run=server", "-f", "-", input=manifest)
            return out.returncode == 0

        await wait_for(not_called, timeout=30, what="the apiserver to stop calling the webhook")


async def test_without_certificates_it_reconciles_and_readyz_says_why(
    procs: Any, kube: httpx.AsyncClient, node_factory: Any, tmp_path: Path
) -> None:
    api = Api(kube)
    empty = tmp_path / "no-certs"
    empty.mkdir()
    p = procs("nmo-nocert", "--no-leader-elect", "--no-metrics-secure", "--cert-dir", str(empty))
    await wait_for(p.started, timeout=30, what="nmo to start")
    ready = await curl(f"http://127.0.0.1:{p.probe_port}/readyz?verbose")
    assert ready.stdout.splitlines()[-1] != "200"
    assert "webhook" in ready.stdout
    assert "webhook" in p.text().lower() and str(empty) in p.text()
    (node,) = await node_factory(1)
    name = f"nm-{uid()}"
    await api.create_nm(name, node)
    await wait_for(lambda: _phase(api, name, "Succeeded"), what="a maintenance without a webhook")
    await api.delete(f"{NM}/{name}")
    await wait_for(lambda: _gone(api, name), what="removal")


async def _phase(api: Api, name: str, phase: str) -> bool:
    return await api.phase(name) == phase


async def _gone(api: Api, name: str) -> bool:
    return await api.nm(name) is None
