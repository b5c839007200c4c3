"""How ``nmo run`` starts, as the Go NMO's Deployment and a new user start it
(issue 11 items 1 and 2), and how it stops.

* ``/manager`` (``python -m nmo.cli.gomanager``, what the image installs as
  ``/manager``) with the Go CSV's exact arguments and environment leads
  through the Lease in ``$OPERATOR_NAMESPACE``, reconciles a CR, and answers
  its probes on ``:8081`` (every interface), its TLS metrics on ``:8443``
  and its webhook with the certificate where the Go kustomize Deployment
  mounts it.
* The kube-rbac-proxy layout of Go releases up to 0.20
  (``--metrics-bind-address=127.0.0.1:<port>``) serves plain ``/metrics`` on
  loopback, for the sidecar.
* ``nmo run`` with default flags outside a cluster (no leader election
  namespace anywhere) reconciles a CR, and creates no leader Lease: before
  issue 11 it waited for leader election in a namespace that did not exist,
  forever, and reconciled nothing.
* ``--leader-elect`` with a namespace that does not exist says so within
  seconds, with the fix, fails ``/readyz`` with that reason while it keeps
  retrying, and leads once the namespace is created.
* On SIGTERM with ``--shutdown-delay-seconds`` it gives the leader Lease up
  at once and for good, and keeps answering admission for the delay, with
  ``/readyz`` failing and ``Connection: close`` on every response, so that
  the apiserver never sends a review on a connection nmo is closing (a
  rollout of the chart failed one admission that way in CI); a second
  signal ends the delay.

The session's nmo is paused (``procs`` of test_process.py's kind) so that
only the processes started here reconcile. They run as the chart's
ServiceAccount (chart_identity.py), their leader Lease in the chart's
release namespace, unless a test says why not.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from chart_identity import RELEASE_NAMESPACE, Identity, chart_identity, reset_leader_leases
from objects import NM, Api, create_review, uid
from operator_fixtures import Operator, free_port, get_local, wait_for

from nmo.api import constants as c
from nmo_sandbox import Sandbox

pytestmark = pytest.mark.integration

# The Go NMO's CSV and config/default/manager_ports_patch.yaml, verbatim.
GO_CSV_ARGS = [
    "--health-probe-bind-address=:8081",
    "--metrics-bind-address=:8443",
    "--leader-elect",
    "--enable-http2=false",
]
LEASES = "/apis/coordination.k8s.io/v1"
IPV6_LOOPBACK = Path("/proc/net/if_inet6").exists() and bool(Path("/proc/net/if_inet6").read_text())


class Started:
    """One operator process with its log (JSON lines) in a file."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.started = time.monotonic()
        with log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)

    def text(self) -> str:
        return self.log.read_text()

    def messages(self) -> list[str]:
        out = []
        for line in self.text().splitlines():
            try:
                out.append(str(json.loads(line).get("msg", "")))
            except json.JSONDecodeError:
                out.append(line)
        return out

    def alive(self) -> None:
        assert self.proc.poll() is None, f"nmo exited:\n{self.text()[-3000:]}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
async def launch(
    sandbox: Sandbox, tmp_path: Path, operator: Operator
) -> AsyncIterator[Callable[..., Started]]:
    """``launch(argv, identity=None, **env)``: a process whose KUBECONFIG holds the
    chart's ServiceAccount (or ``identity``) and nothing of the chart's
    environment (no POD_NAMESPACE, no POD_NAME). No leader Lease is left over
    in the chart's release namespace from an earlier test, nor from this one."""
    session = operator if operator.proc is not None else None
    if session is not None:
        session.kill(signal.SIGTERM)
    chart = await chart_identity(sandbox)
    await reset_leader_leases(sandbox)
    started: list[Started] = []

    def start(argv: list[str], identity: Identity | None = None, **extra_env: str) -> Started:
        env = {k: v for k, v in os.environ.items() if k not in ("POD_NAMESPACE", "POD_NAME")}
        env.update(KUBECONFIG=str((identity or chart).kubeconfig), **extra_env)
        p = Started(argv, env, tmp_path / f"nmo-{len(started)}.log")
        started.append(p)
        return p

    try:
        yield start
    finally:
        for p in started:
            p.stop()
        await reset_leader_leases(sandbox)
        if session is not None:
            await session.start()


async def _phase(api: Api, name: str, want: str) -> bool:
    return await api.phase(name) == want


async def _reconciles(api: Api, node: str) -> None:
    name = f"nm-{uid()}"
    await api.create_nm(name, node)
    await wait_for(lambda: _phase(api, name, "Succeeded"), what=f"{name} Succeeded")
    await api.delete(f"{NM}/{name}")
    await wait_for(lambda: _gone(api, name), what=f"{name} removed")


async def _gone(api: Api, name: str) -> bool:
    return await api.nm(name) is None


async def _leader_leases(api: Api, identity: str) -> list[str]:
    """Every leader Lease in the cluster that ``identity`` holds or held."""
    found = await api.get(f"{LEASES}/leases")
    assert found is not None
    return [
        f"{lease['metadata']['namespace']}/{lease['metadata']['name']}"
        for lease in found["items"]
        if lease["metadata"]["name"] == c.LEADER_ELECTION_ID
        and (lease.get("spec") or {}).get("holderIdentity") == identity
    ]


async def test_the_go_csv_args_through_manager_lead_reconcile_and_answer_on_their_addresses(
    launch: Any, sandbox: Sandbox, kube: httpx.AsyncClient, node_factory: Any, tmp_path: Path
) -> None:
    api = Api(kube)
    namespace = RELEASE_NAMESPACE  # the pod's: where the chart's RBAC lets it lead
    tmpdir = tmp_path / "tmp"
    certs = tmpdir / "k8s-webhook-server" / "serving-certs"  # the kustomize Secret's mount
    sandbox.issue_serving_cert(certs, ["127.0.0.1"], name="tls")
    p = launch(
        [sys.executable, "-m", "nmo.cli.gomanager", *GO_CSV_ARGS],
        OPERATOR_NAMESPACE=namespace,  # the Go Deployment: fieldRef metadata.namespace
        TMPDIR=str(tmpdir),
    )

    async def leading() -> bool:
        p.alive()
        return (await get_local(8081, "/leaderz"))[0] == 200

    await wait_for(leading, timeout=60, what="/manager to lead (probes on :8081)")
    holder = await api.get(
        f"{LEASES}/namespaces/{namespace}/leases/{c.LEADER_ELECTION_ID}"
    )  # in $OPERATOR_NAMESPACE, as controller-runtime puts it in the pod's namespace
    assert holder is not None and holder["spec"]["holderIdentity"], holder

    async def ready() -> bool:
        p.alive()
        return (await get_local(8081, "/readyz"))[0] == 200

    await wait_for(ready, timeout=30, what="/readyz (webhook certificate from TMPDIR)")
    # ":8081" is every interface: IPv6 too, where the machine has it.
    if socket.has_dualstack_ipv6() and IPV6_LOOPBACK:
        async with httpx.AsyncClient(timeout=5) as http:
            assert (await http.get("http://[::1]:8081/healthz")).status_code == 200
    async with httpx.AsyncClient(timeout=5, verify=False) as tls:
        # metrics: TLS behind TokenReview/SubjectAccessReview, as the Go NMO's
        metrics = await tls.get("https://127.0.0.1:8443/metrics")
        # the webhook: TLS on :9443 with the certificate found in TMPDIR
        webhook = await tls.get("https://127.0.0.1:9443/healthz")
    assert metrics.status_code == 401, metrics.text
    assert webhook.status_code < 500, webhook.text
    (node,) = await node_factory(1)
    await _reconciles(api, node)
    p.alive()
    assert any("leader election on" in m for m in p.messages())


async def test_the_kube_rbac_proxy_layout_serves_plain_metrics_on_loopback(
    launch: Any, kube: httpx.AsyncClient
) -> None:
    """Go releases up to 0.20: a sidecar proxies http://127.0.0.1:8080/."""
    probes, metrics = free_port(), free_port()
    p = launch(
        [
            sys.executable, "-m", "nmo.cli.gomanager",
            f"--health-probe-bind-address=127.0.0.1:{probes}",
            f"--metrics-bind-address=127.0.0.1:{metrics}",
            "-leader-elect=false", "--no-enable-webhook", "--zap-encoder=json",
            "--zap-log-level=info",
        ]
    )  # fmt: skip

    async def answered() -> bool:
        p.alive()
        return (await get_local(probes, "/leaderz"))[0] == 200

    await wait_for(answered, timeout=60, what="nmo to lead without leader election")
    status, body = await get_local(metrics, "/metrics")
    assert status == 200, body[:300]
    assert "nmo_" in body


async def test_default_flags_out_of_cluster_reconcile_without_a_leader_lease(
    launch: Any, kube: httpx.AsyncClient, node_factory: Any
) -> None:
    """A new user: ``KUBECONFIG=... nmo run`` (free ports only, so that
    parallel sessions on this machine do not collide)."""
    api = Api(kube)
    probes = free_port()
    identity = f"newuser-{uid()}"
    p = launch(
        [
            sys.executable, "-m", "nmo", "run", "--log-format=json",
            f"--health-probe-port={probes}", f"--metrics-port={free_port()}",
            f"--webhook-port={free_port()}", "--identity", identity,
        ]
    )  # fmt: skip

    async def leading() -> bool:
        p.alive()
        return (await get_local(probes, "/leaderz"))[0] == 200

    await wait_for(leading, timeout=60, what="a new user's nmo run to reconcile")
    (node,) = await node_factory(1)
    await _reconciles(api, node)
    assert await _leader_leases(api, identity) == []
    assert any("leader election off" in m for m in p.messages())


async def test_leader_elect_with_a_missing_namespace_says_why_fails_readiness_and_recovers(
    launch: Any, sandbox: Sandbox, kube: httpx.AsyncClient
) -> None:
    api = Api(kube)
    admin = Identity.admin(
        sandbox,
        why="only an identity that may create Leases in any namespace hears that one does "
        "not exist; the chart's is refused there (403) before the API server looks",
    )
    missing = f"t-{uuid.uuid4().hex[:8]}-le"
    probes = free_port()
    identity = f"le-{uid()}"
    p = launch(
        [
            sys.executable, "-m", "nmo", "run", "--log-format=json", "--leader-elect",
            f"--leader-election-namespace={missing}", "--identity", identity,
            f"--health-probe-port={probes}", f"--metrics-port={free_port()}",
            "--no-enable-webhook",
        ],
        identity=admin,
    )  # fmt: skip
    expected = f'leader election cannot work: namespace "{missing}" does not exist'

    async def said() -> bool:
        p.alive()
        return any(m.startswith(expected) for m in p.messages())

    await wait_for(said, timeout=30, interval=0.05, what="the missing namespace in the log")
    said_after = time.monotonic() - p.started
    message = next(m for m in p.messages() if m.startswith(expected))
    assert f"kubectl create namespace {missing}" in message
    assert "--leader-election-namespace" in message

    async def unready() -> tuple[int, str] | None:
        status, body = await get_local(probes, "/readyz")
        return (status, body) if status == 500 and expected in body else None

    _, body = await wait_for(unready, timeout=10, what="/readyz to fail with the reason")
    assert f"[-]leader-election failed: {expected}" in body
    assert (await get_local(probes, "/leaderz"))[0] == 503
    try:
        await api.create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": missing}},
        )
        created = time.monotonic()

        async def recovered() -> bool:
            p.alive()
            return (await get_local(probes, "/readyz/leader-election"))[0] == 200 and (
                await get_local(probes, "/leaderz")
            )[0] == 200

        await wait_for(recovered, timeout=30, interval=0.1, what="leadership after the fix")
        recovered_after = time.monotonic() - created
        assert await _leader_leases(api, identity) == [f"{missing}/{c.LEADER_ELECTION_ID}"]
        assert any(m.startswith("leader election works again") for m in p.messages())
        # retried all along, but said it once (the repeat is every 30 s)
        assert sum(m.startswith(expected) for m in p.messages()) <= 2
    finally:
        await api.delete(f"/api/v1/namespaces/{missing}")
    print(
        f"\nmissing namespace named {said_after:.1f}s after start; "
        f"leading {recovered_after:.1f}s after the namespace was created"
    )
    assert said_after < 15, p.text()[-2000:]


async def test_sigterm_releases_the_lease_and_keeps_answering_for_the_shutdown_delay(
    launch: Any, sandbox: Sandbox, kube: httpx.AsyncClient, tmp_path: Path
) -> None:
    api = Api(kube)
    namespace = RELEASE_NAMESPACE  # as the chart passes it
    certs = tmp_path / "certs"
    sandbox.issue_serving_cert(certs, ["127.0.0.1"], name="tls")
    probes, webhook, delay = free_port(), free_port(), 4.0
    identity = f"drain-{uid()}"
    p = launch(
        [
            sys.executable, "-m", "nmo", "run", "--log-format=json", "--leader-elect",
            f"--leader-election-namespace={namespace}", "--identity", identity,
            f"--health-probe-port={probes}", f"--metrics-port={free_port()}",
            f"--webhook-port={webhook}", f"--cert-dir={certs}",
            f"--shutdown-delay-seconds={delay:g}",
        ]
    )  # fmt: skip
    lease_path = f"{LEASES}/namespaces/{namespace}/leases/{c.LEADER_ELECTION_ID}"

    async def ready() -> bool:
        p.alive()
        return (await get_local(probes, "/readyz"))[0] == 200 and (
            await get_local(probes, "/leaderz")
        )[0] == 200

    await wait_for(ready, timeout=60, what="nmo to lead and be ready")
    held = await api.get(lease_path)
    assert held is not None and held["spec"]["holderIdentity"] == identity, held
    missing = f"missing-{uid()}"
    expected = c.Messages.WEBHOOK_NO_NODE.format(node=missing)
    url = f"https://127.0.0.1:{webhook}{c.WEBHOOK_PATH}"
    # One kept-alive connection, as the apiserver pools them.
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(verify=False, timeout=10, limits=limits) as client:

        async def review() -> httpx.Response:
            resp = await client.post(url, json=create_review(missing))
            assert resp.status_code == 200, resp.text
            answer = resp.json()["response"]
            assert answer["allowed"] is False and answer["status"]["message"] == expected
            return resp

        before = await review()
        assert before.headers.get("connection", "keep-alive").lower() != "close"
        p.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()

        async def released() -> dict[str, Any] | None:
            lease = await api.get(lease_path)
            assert lease is not None
            return lease if lease["spec"].get("holderIdentity") == "" else None

        await wait_for(released, timeout=10, interval=0.05, what="the leader lease released")

        async def unready() -> str | None:
            status, body = await get_local(probes, "/readyz")
            return body if status == 500 else None

        body = await wait_for(unready, timeout=5, interval=0.05, what="/readyz to fail")
        assert "[-]shutdown failed: shutting down" in body, body
        during = await review()  # on the kept connection, mid-delay
        answered_after = time.monotonic() - signalled
        assert p.proc.poll() is None
        assert during.headers.get("connection", "").lower() == "close", during.headers
    code = await asyncio.to_thread(p.proc.wait, 30)
    exited_after = time.monotonic() - signalled
    assert code == 0, p.text()[-2000:]
    assert answered_after < delay < exited_after < delay + 10, (answered_after, exited_after)
    # Released for good: nothing renewed or re-acquired it during the delay.
    final = await api.get(lease_path)
    assert final is not None
    assert final["spec"].get("holderIdentity") == "", final["spec"]
    assert final["spec"].get("leaseTransitions") == held["spec"].get("leaseTransitions")
    assert any("still answering for 4s" in m for m in p.messages()), p.messages()[-10:]
    print(
        f"\nSIGTERM: lease released, a review answered with Connection: close "
        f"{answered_after:.2f}s later, exit {exited_after:.1f}s after it (delay {delay:g}s)"
    )


async def test_a_second_signal_ends_the_shutdown_delay(launch: Any) -> None:
    probes = free_port()
    p = launch(
        [
            sys.executable, "-m", "nmo", "run", "--log-format=json", "--no-enable-webhook",
            f"--health-probe-port={probes}", f"--metrics-port={free_port()}",
            "--shutdown-delay-seconds=120",
        ]
    )  # fmt: skip

    async def ready() -> bool:
        p.alive()
        return (await get_local(probes, "/readyz"))[0] == 200

    await wait_for(ready, timeout=60, what="nmo to be ready")
    p.proc.send_signal(signal.SIGTERM)

    async def draining() -> bool:
        assert p.proc.poll() is None, p.text()[-2000:]
        return (await get_local(probes, "/readyz"))[0] == 500

    await wait_for(draining, timeout=10, interval=0.05, what="the shutdown delay to start")
    second = time.monotonic()
    p.proc.send_signal(signal.SIGINT)
    code = await asyncio.to_thread(p.proc.wait, 30)
    assert code == 0, p.text()[-2000:]
    assert time.monotonic() - second < 10
