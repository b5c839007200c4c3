"""The Helm chart against the real sandbox (architecture.md: RBAC is exactly what nmo needs).

* ``helm lint --strict`` and a server-side dry run of ``helm template`` for each
  TLS mode (cert-manager with its real CRDs, Helm-generated, ``webhook.url``).
* ``helm install`` in the out-of-cluster mode (no container runtime here:
  ``deployment.enabled=false``), then ``nmo run`` as a subprocess holding a
  token of the chart's ServiceAccount performs a whole maintenance, admitted
  through the chart's webhook configuration, with no 403 in its log; the same
  account is refused what nmo never does, by RBAC and by the chart's
  ValidatingAdmissionPolicies, on by default where the API server serves
  them: on Nodes (``nodePolicy``) and on the node leases shared with NHC and
  SNR (``leasePolicy``); ``helm upgrade`` and ``helm uninstall`` (which
  keeps only the CRD).
* The webhook shape for Kubernetes before 1.28 (no matchConditions, UPDATE a
  webhook of its own) on the real apiserver: finalizers come off while nmo
  is down, and nmo still refuses a changed nodeName while it is up.

This module must be the only nmo reconciling while it runs: the session's
``operator`` (see operator_fixtures.py) is stopped around the maintenance
test and started again afterwards.
"""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import yaml
from chart_identity import Identity
from cryptography import x509
from objects import NM, Api, pod_spec, usable_namespace
from operator_fixtures import CURRENT, Operator, free_port, wait_for

from nmo.api import constants as c
from nmo.api.constants import Messages
from nmo.controller.leaseholder import FIELD_MANAGER
from nmo.controller.ledger import LEDGER_NAME
from nmo.core.maintenance import nodepatch
from nmo.core.maintenance.lease import format_micro
from nmo_sandbox import Sandbox
from nmo_sandbox.process import run_command

if TYPE_CHECKING:
    from conftest import NodeFactory

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "node-maintenance-operator"
CERT_MANAGER_CRDS = ROOT / "hack" / "cert-manager-crds.sh"
RELEASE = "nmo"
NS = c.OPERATOR_NAMESPACE
SA = c.OPERATOR_SERVICE_ACCOUNT
AS_SA = f"--as=system:serviceaccount:{NS}:{SA}"
LEASE_NS = c.LEASE_NAMESPACE_DEFAULT
VWC = "node-maintenance-operator-validating-webhook-configuration"
VWC_PATH = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{VWC}"
SCRAPER = "metrics-scraper"
UPDATE_WEBHOOK = "vnodemaintenance-update.kb.io"
NODE_POLICY = "node-maintenance-operator-node-changes"
LEASE_POLICY = "node-maintenance-operator-lease-changes"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases"
SNR = "self-node-remediation"  # another holder of the shared leases
# The admin client acting as nmo's ServiceAccount (RBAC and admission see that user).
AS_NMO = {"Impersonate-User": f"system:serviceaccount:{NS}:{SA}"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}

URL_MODE = [
    "--set",
    "webhook.url=https://127.0.0.1:9443" + c.WEBHOOK_PATH,
    "--set",
    "webhook.caBundle=" + base64.b64encode(b"placeholder").decode(),
    "--set",
    "deployment.enabled=false",
]
MODES: dict[str, list[str]] = {
    "cert-manager": [],
    "helm-generated": ["--set", "webhook.certManager.enabled=false"],
    "webhook-url": URL_MODE,
}
EVERYTHING_ON = [
    "--set",
    "metrics.serviceMonitor.enabled=true",
    "--set",
    "prometheusRule.enabled=true",
    "--set",
    "networkPolicy.enabled=true",
    "--set",
    "networkPolicy.apiServer.cidrs={10.0.0.10/32}",
    "--set",
    "networkPolicy.probesFrom={10.0.0.0/16}",
    "--set",
    "nodePolicy.enabled=true",
    "--set",
    "openshift.etcdQuorumGuard=true",
    "--set",
    f"metrics.readers[0].name={SCRAPER}",
    "--set",
    "metrics.readers[0].namespace=monitoring",
    "--set",
    "webhook.certManager.issuerRef.kind=ClusterIssuer",
    "--set",
    "webhook.certManager.issuerRef.name=corporate-ca",
]


# -- helpers -------------------------------------------------------------------


@dataclass
class Helm:
    sandbox: Sandbox
    home: Path
    kube_version: str

    async def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return await self.sandbox.helm(*args, home=self.home, timeout=120)

    async def template(self, *values: str) -> str:
        result = await self(
            "template", RELEASE, str(CHART), "-n", NS, "--include-crds",
            "--kube-version", self.kube_version, *values,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout


def describe(result: subprocess.CompletedProcess[str]) -> str:
    return f"{' '.join(result.args)}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


async def ensure_namespace(sandbox: Sandbox, name: str) -> None:
    async with sandbox.client() as kube:
        await usable_namespace(kube, name)


async def can_i(sandbox: Sandbox, *args: str) -> bool:
    result = await sandbox.kubectl("auth", "can-i", *args, AS_SA)
    assert result.stdout.strip() in ("yes", "no"), describe(result)
    return result.stdout.strip() == "yes"


async def service_account_token(kube: httpx.AsyncClient, namespace: str, name: str) -> str:
    resp = await kube.post(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        json={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )
    assert resp.status_code == 201, resp.text
    return str(resp.json()["status"]["token"])


async def patch_node_as_nmo(
    kube: httpx.AsyncClient, node: str, ops: list[dict[str, Any]], *, dry_run: bool = False
) -> httpx.Response:
    """A JSON patch of a Node sent as nmo's ServiceAccount."""
    return await kube.patch(
        f"/api/v1/nodes/{node}",
        json=ops,
        headers={**AS_NMO, **JSON_PATCH},
        params={"dryRun": "All"} if dry_run else None,
    )


def refused_by_node_policy(resp: httpx.Response) -> bool:
    return resp.status_code == 403 and f"ValidatingAdmissionPolicy '{NODE_POLICY}'" in resp.text


async def node_policy_in_force(kube: httpx.AsyncClient, expected: bool) -> None:
    """Wait until the apiserver applies (or no longer applies) the chart's node policy."""
    foreign = [{"op": "add", "path": "/metadata/labels/nmo-policy-probe", "value": "x"}]

    async def settled() -> bool:
        resp = await patch_node_as_nmo(kube, "node-1", foreign, dry_run=True)
        assert resp.status_code in (200, 403), resp.text
        return refused_by_node_policy(resp) is expected

    await wait_for(settled, timeout=30, what=f"the node policy in force: {expected}")


def not_refused(
    answers: dict[str, httpx.Response], refused: Callable[[httpx.Response], bool]
) -> dict[str, tuple[int, str]]:
    """The answers that are not the expected refusal: their status and the start of their text."""
    return {w: (r.status_code, r.text[:300]) for w, r in answers.items() if not refused(r)}


def refused_by_lease_policy(resp: httpx.Response) -> bool:
    return resp.status_code == 403 and f"ValidatingAdmissionPolicy '{LEASE_POLICY}'" in resp.text


def lease(name: str, holder: str | None, renewed: datetime | None, seconds: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"leaseDurationSeconds": seconds}
    if holder is not None:
        spec["holderIdentity"] = holder
    if renewed is not None:
        spec["renewTime"] = format_micro(renewed)
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": LEASE_NS},
        "spec": spec,
    }


async def lease_policy_in_force(kube: httpx.AsyncClient, expected: bool) -> None:
    """Wait until the apiserver applies (or no longer applies) the chart's lease policy."""
    foreign = lease(f"probe-{uuid.uuid4().hex[:6]}", SNR, datetime.now(UTC), 3600)

    async def settled() -> bool:
        resp = await kube.post(LEASES, json=foreign, headers=AS_NMO, params={"dryRun": "All"})
        assert resp.status_code in (201, 403), resp.text
        return refused_by_lease_policy(resp) is expected

    await wait_for(settled, timeout=30, what=f"the lease policy in force: {expected}")


@asynccontextmanager
async def policy_off(
    helm: Helm,
    kube: httpx.AsyncClient,
    value: str,
    in_force: Callable[[httpx.AsyncClient, bool], Awaitable[None]],
) -> AsyncIterator[None]:
    """The release upgraded with ``<value>.enabled=false``, then back to its default (auto)."""
    off = await helm(
        "upgrade", RELEASE, str(CHART), "-n", NS, "--reuse-values",
        "--set", f"{value}.enabled=false", "--wait",
    )  # fmt: skip
    assert off.returncode == 0, describe(off)
    try:
        await in_force(kube, False)
        yield
    finally:
        on = await helm(
            "upgrade", RELEASE, str(CHART), "-n", NS, "--reuse-values",
            "--set", f"{value}.enabled=auto", "--wait",
        )  # fmt: skip
        assert on.returncode == 0, describe(on)
        await in_force(kube, True)


class ChartOperator(Operator):
    """``nmo run`` as the chart's ServiceAccount, serving the webhook like a replica would."""

    def __init__(
        self, sandbox: Sandbox, log_dir: Path, *, kubeconfig: Path, cert_dir: Path, port: int
    ) -> None:
        flags = ("--leader-election-namespace", NS, "--lease-namespace", LEASE_NS)
        super().__init__(
            sandbox, log_dir, identity=Identity(kubeconfig, AS_NMO["Impersonate-User"], flags)
        )
        self.kubeconfig = kubeconfig
        self.cert_dir = cert_dir
        self.webhook_port = port

    @classmethod
    async def for_release(cls, sandbox: Sandbox, release: Release, log_dir: Path) -> ChartOperator:
        """One serving the release's webhook URL, with a token of the chart's ServiceAccount."""
        kubeconfig = await sandbox.service_account_kubeconfig(NS, SA, log_dir / "kubeconfig")
        return cls(
            sandbox,
            log_dir,
            kubeconfig=kubeconfig,
            cert_dir=release.cert_dir,
            port=release.webhook_port,
        )

    def args(self) -> list[str]:
        return [
            sys.executable, "-m", "nmo", "run",
            "--kubeconfig", str(self.kubeconfig),
            "--leader-elect", "--leader-election-namespace", NS, "--leader-retry-period", "0.5",
            "--lease-namespace", LEASE_NS, "--lease-renew-interval", "1",
            "--status-interval", "0.5",
            "--bind-address", "127.0.0.1",
            "--health-probe-port", str(self.probe_port),
            "--metrics-port", str(self.metrics_port),
            "--webhook-port", str(self.webhook_port),
            "--cert-dir", str(self.cert_dir),
            "--log-format", "json", "--log-level", "debug",
        ]  # fmt: skip


# -- fixtures ------------------------------------------------------------------


@pytest.fixture(scope="module")
async def helm(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    async with sandbox.client() as kube:
        version = (await kube.get("/version")).json()["gitVersion"]
    return Helm(sandbox, tmp_path_factory.mktemp("helm-home"), version)


@dataclass
class Release:
    webhook_port: int
    cert_dir: Path
    created_lease_namespace: bool


@pytest.fixture(scope="module")
async def release(
    sandbox: Sandbox, helm: Helm, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Release]:
    """The chart installed for an nmo outside the cluster; uninstalled at the end."""
    cert_dir = tmp_path_factory.mktemp("chart-webhook-certs")
    serving = sandbox.issue_serving_cert(cert_dir, ["127.0.0.1"], name="apiserver")
    port = free_port()
    values = [
        "--set", "deployment.enabled=false",
        "--set", f"webhook.url=https://127.0.0.1:{port}{c.WEBHOOK_PATH}",
        "--set", "webhook.caBundle=" + base64.b64encode(serving.ca_bundle).decode(),
        "--set", f"metrics.readers[0].name={SCRAPER}",
        "--set", f"metrics.readers[0].namespace={NS}",
        # nodePolicy and leasePolicy left at auto: on, since this apiserver serves them
    ]  # fmt: skip
    lease_ns = await sandbox.kubectl("get", "namespace", LEASE_NS, "--ignore-not-found", "-o=name")
    await ensure_namespace(sandbox, NS)  # an earlier module's may still be going
    result = await helm(
        "install", RELEASE, str(CHART), "-n", NS, "--create-namespace", *values, "--wait"
    )
    assert result.returncode == 0, describe(result)
    try:
        async with sandbox.client() as kube:
            await node_policy_in_force(kube, True)
            await lease_policy_in_force(kube, True)
        yield Release(port, cert_dir, not lease_ns.stdout.strip())
    finally:
        if (await helm("status", RELEASE, "-n", NS)).returncode == 0:
            await helm("uninstall", RELEASE, "-n", NS, "--wait")
        await sandbox.kubectl("delete", "namespace", NS, "--wait=false", "--ignore-not-found")


# -- the installed chart ---------------------------------------------------------


async def test_guide_lease_command_and_least_privilege(sandbox: Sandbox, release: Release) -> None:
    # The troubleshooting guide's own check (section 2.4), verbatim.
    guide = await sandbox.kubectl(
        "auth", "can-i", "update", "leases", "-n", "medik8s-leases",
        "--as=system:serviceaccount:node-maintenance-operator-system:"
        "node-maintenance-operator-controller-manager",
    )  # fmt: skip
    assert guide.stdout.strip() == "yes", describe(guide)

    allowed = [
        ("patch", "nodes"),
        ("watch", "nodes"),
        ("list", "pods", "--all-namespaces"),
        ("create", "pods", "--subresource=eviction", "-n", "default"),
        ("get", "daemonsets.apps", "-n", "kube-system"),
        ("patch", "nodemaintenances.nodemaintenance.medik8s.io"),
        ("patch", "nodemaintenances.nodemaintenance.medik8s.io", "--subresource=status"),
        ("create", "leases.coordination.k8s.io", "-n", LEASE_NS),
        ("delete", "leases.coordination.k8s.io", "-n", LEASE_NS),
        ("get", f"leases.coordination.k8s.io/{c.LEADER_ELECTION_ID}", "-n", NS),
        ("update", f"leases.coordination.k8s.io/{c.LEADER_ELECTION_ID}", "-n", NS),
        ("update", f"leases.coordination.k8s.io/{LEDGER_NAME}", "-n", NS),
        ("create", "leases.coordination.k8s.io", "-n", NS),
        ("create", "events", "-n", "default"),
        ("patch", "events", "-n", "default"),
        ("create", "tokenreviews.authentication.k8s.io"),
        ("create", "subjectaccessreviews.authorization.k8s.io"),
    ]
    refused = [
        ("delete", "nodes"),
        ("update", "nodes"),
        ("create", "nodes"),
        ("get", "secrets", "-n", NS),
        ("list", "secrets", "--all-namespaces"),
        ("get", "configmaps", "-n", "kube-system"),
        ("delete", "pods", "-n", "default"),
        ("create", "pods", "-n", "default"),
        ("update", "leases.coordination.k8s.io", "-n", "kube-node-lease"),
        ("update", "leases.coordination.k8s.io", "-n", "kube-system"),
        ("delete", "leases.coordination.k8s.io", "-n", NS),
        # The leader-election Role names its two Leases (issue 14 item 10).
        ("update", "leases.coordination.k8s.io", "-n", NS),
        ("update", "leases.coordination.k8s.io/someone-elses-lock", "-n", NS),
        ("get", "leases.coordination.k8s.io/someone-elses-lock", "-n", NS),
        ("list", "leases.coordination.k8s.io", "-n", NS),
        # The chart creates the lease namespace (leases.createNamespace).
        ("create", "namespaces"),
        ("create", "events", "-n", "kube-system"),
        ("create", "nodemaintenances.nodemaintenance.medik8s.io"),
        ("update", "daemonsets.apps", "-n", "kube-system"),
        ("delete", "namespaces"),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
        ("get", "oauthclients.oauth.openshift.io"),
        ("impersonate", "serviceaccounts"),
    ]
    answers = await asyncio.gather(
        *(can_i(sandbox, *a) for a in allowed), *(can_i(sandbox, *r) for r in refused)
    )
    wrong_no = [a for a, ok in zip(allowed, answers[: len(allowed)], strict=True) if not ok]
    wrong_yes = [r for r, ok in zip(refused, answers[len(allowed) :], strict=True) if ok]
    assert not wrong_no, f"the chart's ServiceAccount lacks: {wrong_no}"
    assert not wrong_yes, f"the chart's ServiceAccount may do too much: {wrong_yes}"


async def test_maintenance_under_the_charts_service_account(
    sandbox: Sandbox,
    kube: httpx.AsyncClient,
    release: Release,
    sole_operator: None,
    namespace: str,
    node_factory: NodeFactory,
    tmp_path: Path,
) -> None:
    api = Api(kube)
    await api.create(
        f"/api/v1/namespaces/{NS}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SCRAPER}},
    )
    op = await ChartOperator.for_release(sandbox, release, tmp_path)
    CURRENT.append(op)  # its log is attached to a failure report
    try:
        await op.start()
        await _maintain_and_release(sandbox, api, namespace, node_factory)
        await _metrics_are_guarded(kube, op)
    finally:
        op.kill(signal.SIGTERM)
        CURRENT.remove(op)
    log = op.logs()
    # nmo's errors for an RBAC refusal carry the apiserver's "... is forbidden: ..." text.
    denied = [line for line in log.splitlines() if "forbidden" in line.lower()]
    assert not denied, "nmo was refused something under the chart's RBAC:\n" + "\n".join(denied)
    assert '"msg": "lease renewed for node' in log, "the background lease renewal never ran"
    assert "became leader" in log


async def _maintain_and_release(
    sandbox: Sandbox, api: Api, ns: str, node_factory: NodeFactory
) -> None:
    pool = f"chart-{uuid.uuid4().hex[:6]}"
    (node,) = await node_factory(1, labels={"pool": pool})
    # Self Node Remediation held the node's lease once; it has expired. nmo
    # takes it over, under the chart's lease policy (fieldManager: its time).
    stale = lease(f"node-{node}", SNR, datetime.now(UTC) - timedelta(hours=2), 60)
    await api.create(LEASES, stale)
    bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare"}}
    await api.create(f"/api/v1/namespaces/{ns}/pods", {**bare, "spec": pod_spec(node_name=node)})
    await api.create(
        f"/apis/apps/v1/namespaces/{ns}/daemonsets",
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "agent"},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {
                    "metadata": {"labels": {"app": "agent"}},
                    "spec": pod_spec({"pool": pool}),
                },
            },
        },
    )

    async def two_pods() -> bool:
        return len(await api.pods(ns, node=node)) == 2

    await wait_for(two_pods, timeout=30, what="the bare pod and the DaemonSet pod")

    # kubectl create goes through the chart's webhook configuration to this nmo.
    name = f"nm-{node}"
    manifest = {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": name}}
    created = await sandbox.kubectl(
        "create", "-f", "-", input=json.dumps({**manifest, "spec": {"nodeName": node}})
    )
    assert created.returncode == 0, describe(created)
    stray = {**manifest, "metadata": {"name": f"{name}-x"}, "spec": {"nodeName": f"{node}-x"}}
    missing = await sandbox.kubectl("create", "-f", "-", input=json.dumps(stray))
    assert "invalid nodeName, no node with name" in missing.stderr, describe(missing)

    async def succeeded() -> dict[str, Any] | None:
        obj = await api.nm(name)
        return obj if obj and (obj.get("status") or {}).get("phase") == "Succeeded" else None

    await wait_for(succeeded, timeout=60, what=f"{name} to succeed")
    status_node = await api.node(node)
    assert status_node["spec"].get("unschedulable") is True
    assert set(c.MAINTENANCE_TAINT_KEYS) <= {t["key"] for t in status_node["spec"]["taints"]}
    assert status_node["metadata"]["labels"].get(c.EXCLUDE_FROM_REMEDIATION_LABEL) == "true"
    remaining = [p["metadata"]["name"] for p in await api.pods(ns, node=node)]
    assert len(remaining) == 1
    assert remaining[0].startswith("agent-")
    held = await api.lease(node)
    assert held is not None
    assert held["spec"]["holderIdentity"] == c.LEASE_HOLDER
    assert held["spec"]["leaseTransitions"] == 1  # taken over from SNR, not created anew
    first_renew = held["spec"]["renewTime"]

    async def renewed() -> bool:
        again = await api.lease(node)
        return again is not None and again["spec"]["renewTime"] != first_renew

    await wait_for(renewed, timeout=15, what="the node lease to be renewed")
    await api.wait_events(name, "SucceedMaintenance")  # recorded after the status
    events = await api.events(name)
    assert {"BeginMaintenance", "SucceedMaintenance"} <= {e["reason"] for e in events}

    await api.delete(f"{NM}/{name}")

    async def gone() -> bool:
        return await api.nm(name) is None

    await wait_for(gone, timeout=30, what=f"{name} to be removed")
    after = await api.node(node)
    assert not after["spec"].get("unschedulable")
    assert not set(c.MAINTENANCE_TAINT_KEYS) & {t["key"] for t in after["spec"].get("taints", [])}
    assert c.EXCLUDE_FROM_REMEDIATION_LABEL not in after["metadata"]["labels"]
    assert await api.lease(node) is None


async def _metrics_are_guarded(kube: httpx.AsyncClient, op: Operator) -> None:
    """TokenReview + SubjectAccessReview under the chart's RBAC; metrics.readers binds."""
    url = f"https://127.0.0.1:{op.metrics_port}/metrics"
    scraper = await service_account_token(kube, NS, SCRAPER)
    operator = await service_account_token(kube, NS, SA)
    async with httpx.AsyncClient(verify=False, timeout=10) as client:  # self-signed
        ok = await client.get(url, headers={"Authorization": f"Bearer {scraper}"})
        assert ok.status_code == 200, ok.text
        assert "nmo_" in ok.text
        refused = await client.get(url, headers={"Authorization": f"Bearer {operator}"})
        assert refused.status_code == 403, refused.text


async def test_with_nmo_down_creates_fail_closed_but_finalizers_can_be_removed(
    sandbox: Sandbox, kube: httpx.AsyncClient, release: Release, sole_operator: None
) -> None:
    """The chart's matchConditions send only CREATE, nodeName and drain changes to the webhook.

    With no nmo serving the webhook, a new CR is refused (failurePolicy Fail),
    but removing a stuck finalizer (the guide's section 6, ``nmo cleanup``)
    still works, because that UPDATE never reaches the webhook.
    """
    api = Api(kube)
    name = f"nm-stuck-{uuid.uuid4().hex[:6]}"
    body = {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND,
        "metadata": {"name": name, "finalizers": [c.FINALIZER]},
        "spec": {"nodeName": "node-1"},
    }
    # No webhook server is running: CREATE fails closed.
    refused = await kube.post(NM, json=body)
    assert refused.status_code == 500, refused.text
    assert "failed calling webhook" in refused.text
    # Stand in for a CR created while nmo was up: create it under a brief Ignore policy.
    vwc = (
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/"
        "node-maintenance-operator-validating-webhook-configuration"
    )
    patch = [{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}]
    headers = {"Content-Type": "application/json-patch+json"}
    assert (await kube.patch(vwc, json=patch, headers=headers)).status_code == 200
    try:

        async def created() -> bool:
            return (await kube.post(NM, json=body)).status_code in (201, 409)

        await wait_for(created, timeout=30, what="the CR to be created with Ignore")
    finally:
        patch[0]["value"] = "Fail"
        assert (await kube.patch(vwc, json=patch, headers=headers)).status_code == 200

    async def failing_again() -> bool:
        probe = {**body, "metadata": {"name": f"{name}-probe"}}
        resp = await kube.post(NM, json=probe, params={"dryRun": "All"})
        return resp.status_code == 500

    await wait_for(failing_again, timeout=30, what="failurePolicy Fail to be effective again")
    # A change of spec.drain is validated (its podSelector), so it fails closed too.
    drain = {"spec": {"drain": {"timeoutSeconds": 60}}}
    changed = await kube.patch(
        f"{NM}/{name}", json=drain, headers={"Content-Type": "application/merge-patch+json"}
    )
    assert changed.status_code == 500 and "failed calling webhook" in changed.text, changed.text
    await api.delete(f"{NM}/{name}")
    removed = await api.merge(f"{NM}/{name}", {"metadata": {"finalizers": []}})
    assert removed["metadata"]["name"] == name

    async def gone() -> bool:
        return await api.nm(name) is None

    await wait_for(gone, timeout=30, what="the stuck CR to go away once its finalizer is removed")


async def test_node_policy_lets_nmo_change_only_its_marks(
    kube: httpx.AsyncClient, helm: Helm, release: Release, node_factory: NodeFactory
) -> None:
    """The ValidatingAdmissionPolicy (nodePolicy) on the real apiserver, as nmo's account.

    nmo's own enter and leave patches (nmo.core.maintenance.nodepatch) pass; every
    other change of the Node by that account is refused, though RBAC alone
    allows it (shown with the policy off); the admin is never limited.
    """
    api = Api(kube)
    (node,) = await node_factory(1)
    # An admin's marks, which nmo must leave alone.
    await api.merge(
        f"/api/v1/nodes/{node}",
        {
            "metadata": {"labels": {"team": "infra"}, "annotations": {"owner": "ops"}},
            "spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]},
        },
    )
    before = await api.node(node)
    taints = before["spec"]["taints"]
    exclude = c.EXCLUDE_FROM_REMEDIATION_LABEL.replace("/", "~1")
    forbidden: dict[str, list[dict[str, Any]]] = {
        "another label": [{"op": "add", "path": "/metadata/labels/pwned", "value": "yes"}],
        "an admin's label removed": [{"op": "remove", "path": "/metadata/labels/team"}],
        "the exclude label set to false": [
            {"op": "add", "path": f"/metadata/labels/{exclude}", "value": "false"}
        ],
        "an annotation": [{"op": "add", "path": "/metadata/annotations/pwned", "value": "x"}],
        "another taint": [
            {"op": "add", "path": "/spec/taints/-", "value": {"key": "x", "effect": "NoSchedule"}}
        ],
        "an admin's taint removed": [{"op": "replace", "path": "/spec/taints", "value": []}],
        "a maintenance taint key with NoExecute": [
            {
                "op": "add",
                "path": "/spec/taints/-",
                "value": {"key": c.DRAIN_TAINT_KEY, "effect": "NoExecute"},
            }
        ],
        "spec.providerID": [{"op": "add", "path": "/spec/providerID", "value": "kwok://x"}],
        "a finalizer": [{"op": "add", "path": "/metadata/finalizers", "value": ["x.io/hold"]}],
    }
    answers = {what: await patch_node_as_nmo(kube, node, ops) for what, ops in forbidden.items()}
    wrong = not_refused(answers, refused_by_node_policy)
    assert not wrong, f"nmo's ServiceAccount may change Nodes beyond its marks: {wrong}"
    assert "may change only the label" in answers["another label"].text
    assert "only the taints" in answers["another taint"].text
    after = await api.node(node)
    assert after["metadata"]["labels"] == before["metadata"]["labels"]
    assert after["metadata"].get("annotations") == before["metadata"].get("annotations")
    assert after["spec"]["taints"] == taints

    # nmo's real patches: into maintenance (with its prior-state record on the
    # node) and out of it (the record removed), the admin's marks kept.
    entered = await patch_node_as_nmo(
        kube, node, nodepatch.enter_patch(after, record_for="uid-of-the-cr") or []
    )
    assert entered.status_code == 200, entered.text
    inside = entered.json()
    assert nodepatch.in_maintenance(inside)
    prior = nodepatch.prior_for(inside, "uid-of-the-cr")
    assert prior is not None
    undo = nodepatch.leave_patch(inside, prior, forget=True) or []
    left = await patch_node_as_nmo(kube, node, undo)
    assert left.status_code == 200, left.text
    restored = left.json()
    assert restored["spec"]["taints"] == taints
    assert restored["metadata"]["labels"] == before["metadata"]["labels"]
    assert restored["metadata"].get("annotations") == before["metadata"].get("annotations")
    assert not restored["spec"].get("unschedulable")

    # The admin is not limited.
    admin = await kube.patch(
        f"/api/v1/nodes/{node}", json=forbidden["another label"], headers=JSON_PATCH
    )
    assert admin.status_code == 200, admin.text

    # Without the policy, RBAC alone lets nmo's account do it: what the policy adds.
    async with policy_off(helm, kube, "nodePolicy", node_policy_in_force):
        unguarded = await patch_node_as_nmo(kube, node, forbidden["an annotation"])
        assert unguarded.status_code == 200, unguarded.text


async def test_lease_policy_holds_nmo_to_its_own_and_expired_leases(
    kube: httpx.AsyncClient, helm: Helm, release: Release
) -> None:
    """The lease policy (leasePolicy) on the real apiserver, as nmo's account.

    medik8s-leases is shared with NHC and SNR, and RBAC lets nmo's account
    update and delete every Lease there (shown with the policy off). Under the
    policy: refused on a valid lease another holder has, whatever the request
    says (takeover, renewal, deletion, a forged managedFields time); allowed
    on its own, on nobody's, and on an expired one, taken over with a
    fieldManager (the API server's time); never an expired one without it.
    """
    tag = uuid.uuid4().hex[:6]
    now = datetime.now(UTC)
    fm = {"fieldManager": FIELD_MANAGER}
    valid, expired, free, mine = (f"{what}-{tag}" for what in ("valid", "expired", "free", "mine"))
    for body in (
        lease(valid, SNR, now, 3600),
        lease(expired, SNR, now - timedelta(hours=2), 60),
        lease(free, None, None, 60),
    ):
        created = await kube.post(LEASES, json=body)
        assert created.status_code == 201, created.text

    async def current(name: str) -> dict[str, Any]:
        resp = await kube.get(f"{LEASES}/{name}")
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    def held_by_nmo(obj: dict[str, Any], **meta: Any) -> dict[str, Any]:
        spec = {**obj["spec"], "holderIdentity": c.LEASE_HOLDER, "renewTime": format_micro(now)}
        return {**obj, "metadata": {**obj["metadata"], **meta}, "spec": spec}

    theirs = await current(valid)
    forged_time = {
        "manager": FIELD_MANAGER,
        "operation": "Update",
        "apiVersion": "coordination.k8s.io/v1",
        "time": "2999-01-01T00:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:holderIdentity": {}}},
    }
    forged = held_by_nmo(
        theirs, managedFields=[*theirs["metadata"].get("managedFields", []), forged_time]
    )
    renewal = {**theirs, "spec": {**theirs["spec"], "renewTime": format_micro(now)}}
    path = f"{LEASES}/{valid}"
    refused = {
        "a takeover": await kube.put(path, json=held_by_nmo(theirs), headers=AS_NMO, params=fm),
        "a renewal of another's": await kube.put(path, json=renewal, headers=AS_NMO, params=fm),
        "a forged managedFields time": await kube.put(path, json=forged, headers=AS_NMO, params=fm),
        "a deletion": await kube.delete(path, headers=AS_NMO),
        "a create for another holder": await kube.post(
            LEASES, json=lease(f"snr-{tag}", SNR, now, 3600), headers=AS_NMO, params=fm
        ),
    }
    wrong = not_refused(refused, refused_by_lease_policy)
    assert not wrong, f"nmo's ServiceAccount may take another holder's lease: {wrong}"
    assert "may update only a Lease node-maintenance holds" in refused["a takeover"].text
    assert (await current(valid))["spec"]["holderIdentity"] == SNR

    # An expired lease: taken over with a fieldManager (the server's time), not without.
    stale = held_by_nmo(await current(expired))
    blind = await kube.put(f"{LEASES}/{expired}", json=stale, headers=AS_NMO)
    assert refused_by_lease_policy(blind), blind.text
    taken = await kube.put(f"{LEASES}/{expired}", json=stale, headers=AS_NMO, params=fm)
    assert taken.status_code == 200, taken.text
    assert taken.json()["spec"]["holderIdentity"] == c.LEASE_HOLDER

    # Its own: created, renewed, deleted; nobody's: deleted.
    made = await kube.post(
        LEASES, json=lease(mine, c.LEASE_HOLDER, now, 3600), headers=AS_NMO, params=fm
    )
    assert made.status_code == 201, made.text
    later = made.json()
    later["spec"]["renewTime"] = format_micro(now + timedelta(seconds=5))
    again = await kube.put(f"{LEASES}/{mine}", json=later, headers=AS_NMO, params=fm)
    assert again.status_code == 200, again.text
    for name in (mine, expired, free):
        gone = await kube.delete(f"{LEASES}/{name}", headers=AS_NMO)
        assert gone.status_code == 200, (name, gone.text)

    # Without the policy, RBAC alone lets nmo's account take it: what the policy adds.
    try:
        async with policy_off(helm, kube, "leasePolicy", lease_policy_in_force):
            theirs = await current(valid)
            unguarded = await kube.put(
                path, json=held_by_nmo(theirs), headers=AS_NMO, params={**fm, "dryRun": "All"}
            )
            assert unguarded.status_code == 200, unguarded.text
    finally:
        await kube.delete(path)  # the admin is not limited


async def test_before_1_28_finalizers_come_off_while_nmo_is_down(
    sandbox: Sandbox,
    kube: httpx.AsyncClient,
    helm: Helm,
    release: Release,
    sole_operator: None,
    node_factory: NodeFactory,
    tmp_path: Path,
) -> None:
    """The webhook shape the chart renders for Kubernetes 1.23-1.27, on the real apiserver.

    No matchConditions: CREATE fails closed, UPDATE is a webhook of its own
    with failurePolicy Ignore. With nmo up, every UPDATE reaches it: a
    changed nodeName is refused, anything else admitted. With nmo down, the
    guide's section 6 (remove the finalizer, the CR goes) still works, and
    would not with failurePolicy Fail on UPDATE.
    """
    api = Api(kube)
    (node,) = await node_factory(1)
    name = f"nm-legacy-{uuid.uuid4().hex[:6]}"
    path = f"{NM}/{name}"
    body = {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND,
        "metadata": {"name": name, "finalizers": [c.FINALIZER]},
        "spec": {"nodeName": node},
    }

    async def upgrade(*values: str) -> str:
        result = await helm(
            "upgrade", RELEASE, str(CHART), "-n", NS, "--reuse-values", *values, "--wait"
        )
        assert result.returncode == 0, describe(result)
        return result.stdout

    async def label(value: str) -> httpx.Response:
        return await kube.patch(
            path, json={"metadata": {"labels": {"probe": value}}}, headers=MERGE_PATCH
        )

    op = await ChartOperator.for_release(sandbox, release, tmp_path)
    notes = await upgrade("--set", "webhook.matchConditions=false")
    try:
        assert f"UPDATEs go to {UPDATE_WEBHOOK} (failurePolicy Ignore)" in notes, notes
        vwc = (await kube.get(VWC_PATH)).json()
        hooks = {h["name"]: h for h in vwc["webhooks"]}
        assert list(hooks) == [c.WEBHOOK_NAME, UPDATE_WEBHOOK]
        assert [h["rules"][0]["operations"] for h in hooks.values()] == [["CREATE"], ["UPDATE"]]
        assert [h["failurePolicy"] for h in hooks.values()] == ["Fail", "Ignore"]
        assert not any("matchConditions" in h for h in hooks.values())

        # nmo up: the CR is admitted, and every UPDATE now reaches the webhook.
        CURRENT.append(op)
        await op.start()
        created = await sandbox.kubectl("create", "-f", "-", input=json.dumps(body))
        assert created.returncode == 0, describe(created)
        allowed_line = f'"msg": "maintenance UPDATE for node {node} allowed"'

        async def label_went_through_nmo() -> bool:
            resp = await label(uuid.uuid4().hex[:8])
            assert resp.status_code == 200, resp.text
            return allowed_line in op.logs()

        await wait_for(label_went_through_nmo, timeout=30, what="an UPDATE admitted by nmo")
        # The CRD's own rule (CEL) refuses a changed nodeName before any webhook.
        moved = await kube.patch(path, json={"spec": {"nodeName": "node-2"}}, headers=MERGE_PATCH)
        assert moved.status_code == 422, moved.text
        assert Messages.WEBHOOK_NODENAME_CHANGED in moved.text
        op.kill(signal.SIGTERM)

        # nmo down: a new CR fails closed ...
        stray = {**body, "metadata": {"name": f"{name}-x"}}
        refused = await kube.post(NM, json=stray)
        assert refused.status_code == 500 and "failed calling webhook" in refused.text
        # ... UPDATEs are admitted unchecked by nmo (the price of Ignore), but
        # the CRD's rule still keeps nodeName as it was ...
        assert (await label("down")).status_code == 200
        typo = await kube.patch(
            path, json={"spec": {"nodeName": f"{node}-typo"}}, headers=MERGE_PATCH
        )
        assert typo.status_code == 422, typo.text
        assert Messages.WEBHOOK_NODENAME_CHANGED in typo.text

        # ... where UPDATE failing closed would block the guide's section 6:
        await upgrade("--set", "webhook.updateFailurePolicy=Fail")

        async def update_fails_closed() -> bool:
            resp = await label("closed")
            return resp.status_code == 500 and "failed calling webhook" in resp.text

        await wait_for(update_fails_closed, timeout=30, what="UPDATE to fail closed")
        await upgrade("--set", "webhook.updateFailurePolicy=Ignore")

        async def update_admitted() -> bool:
            return (await label("open")).status_code == 200

        await wait_for(update_admitted, timeout=30, what="UPDATE to be admitted again")
        await api.delete(path)
        removed = await api.merge(path, {"metadata": {"finalizers": []}})
        assert removed["metadata"]["name"] == name

        async def gone() -> bool:
            return await api.nm(name) is None

        await wait_for(gone, timeout=30, what="the CR to go once its finalizer is removed")
    finally:
        op.kill(signal.SIGTERM)
        if op in CURRENT:
            CURRENT.remove(op)
        if await api.nm(name) is not None:
            await api.merge(path, {"metadata": {"finalizers": []}})
            await api.delete(path)
        await upgrade(
            "--set", "webhook.matchConditions=auto", "--set", "webhook.updateFailurePolicy=Ignore"
        )


async def test_upgrade_with_changed_values(
    sandbox: Sandbox, kube: httpx.AsyncClient, helm: Helm, release: Release
) -> None:
    result = await helm(
        "upgrade", RELEASE, str(CHART), "-n", NS, "--reuse-values",
        "--set", "webhook.timeoutSeconds=25", "--set", "operator.logLevel=debug", "--wait",
    )  # fmt: skip
    assert result.returncode == 0, describe(result)
    vwc = (await kube.get(VWC_PATH)).json()
    assert vwc["webhooks"][0]["timeoutSeconds"] == 25
    assert vwc["webhooks"][0]["clientConfig"]["url"].endswith(c.WEBHOOK_PATH)
    history = await helm("history", RELEASE, "-n", NS, "-o", "json")
    revisions = json.loads(history.stdout)
    assert [r["status"] for r in revisions][-1] == "deployed"
    assert len(revisions) >= 2


async def test_uninstall_leaves_only_the_crd(
    sandbox: Sandbox, kube: httpx.AsyncClient, helm: Helm, release: Release, tmp_path: Path
) -> None:
    manifest = await helm("get", "manifest", RELEASE, "-n", NS)
    assert manifest.returncode == 0, describe(manifest)
    objects = [d for d in yaml.safe_load_all(manifest.stdout) if d]
    kept = [
        o
        for o in objects
        if (o["metadata"].get("annotations") or {}).get("helm.sh/resource-policy") == "keep"
    ]
    assert [(o["kind"], o["metadata"]["name"]) for o in kept] == (
        [("Namespace", LEASE_NS)] if release.created_lease_namespace else []
    )
    owned = tmp_path / "owned.yaml"
    owned.write_text(yaml.safe_dump_all([o for o in objects if o not in kept]))
    present = await sandbox.kubectl("get", "-f", str(owned), "-o", "name")
    assert present.returncode == 0, describe(present)
    assert len(present.stdout.split()) == len(objects) - len(kept)

    result = await helm("uninstall", RELEASE, "-n", NS, "--wait")
    assert result.returncode == 0, describe(result)

    left = await sandbox.kubectl("get", "-f", str(owned), "-o", "name", "--ignore-not-found")
    assert left.returncode == 0, describe(left)
    assert left.stdout.strip() == "", f"left behind by helm uninstall:\n{left.stdout}"
    labelled = await sandbox.kubectl(
        "get", "all,roles,rolebindings,clusterroles,clusterrolebindings,"
        "validatingwebhookconfigurations,validatingadmissionpolicies,"
        "validatingadmissionpolicybindings,secrets,serviceaccounts,poddisruptionbudgets,"
        "networkpolicies",
        "--all-namespaces", "-l", f"app.kubernetes.io/instance={RELEASE}", "-o", "name",
    )  # fmt: skip
    assert labelled.stdout.strip() == "", labelled.stdout
    assert (
        await kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{c.CRD_NAME}")
    ).status_code == 200
    assert not await can_i(sandbox, "update", "leases", "-n", LEASE_NS)

    async def webhook_gone() -> bool:
        probe = {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": "probe"},
                 "spec": {"nodeName": "no-such-node"}}  # fmt: skip
        resp = await kube.post(NM, params={"dryRun": "All"}, json=probe)
        return resp.status_code == 201

    await wait_for(webhook_gone, timeout=30, what="the apiserver to stop calling the webhook")


async def test_generated_certificate_is_kept_across_upgrades(
    sandbox: Sandbox, kube: httpx.AsyncClient, helm: Helm
) -> None:
    """Helm-generated mode: one CA and serving certificate, reused by later upgrades."""
    name, ns = "nmo-gen", f"nmo-gen-{uuid.uuid4().hex[:6]}"
    values = [
        "--set", f"fullnameOverride={name}",
        "--set", "deployment.enabled=false",
        "--set", "webhook.certManager.enabled=false",
        "--set", "webhook.failurePolicy=Ignore",  # no server behind it in this test
    ]  # fmt: skip
    secret_path = f"/api/v1/namespaces/{ns}/secrets/{name}-webhook-server-cert"
    vwc_path = VWC_PATH.replace(VWC, f"{name}-validating-webhook-configuration")

    async def installed_pki() -> tuple[dict[str, str], str]:
        secret = (await kube.get(secret_path)).json()
        vwc = (await kube.get(vwc_path)).json()
        return secret["data"], vwc["webhooks"][0]["clientConfig"]["caBundle"]

    try:
        first = await helm("install", name, str(CHART), "-n", ns, "--create-namespace", *values)
        assert first.returncode == 0, describe(first)
        data, ca_bundle = await installed_pki()
        assert ca_bundle == data["ca.crt"]
        ca = x509.load_pem_x509_certificate(base64.b64decode(data["ca.crt"]))
        leaf = x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"]))
        leaf.verify_directly_issued_by(ca)
        sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert f"{name}-webhook-service.{ns}.svc" in sans.get_values_for_type(x509.DNSName)

        again = await helm(
            "upgrade", name, str(CHART), "-n", ns, *values, "--set", "webhook.timeoutSeconds=5"
        )
        assert again.returncode == 0, describe(again)
        assert await installed_pki() == (data, ca_bundle)
    finally:
        await helm("uninstall", name, "-n", ns, "--wait")
        await sandbox.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found")


# -- rendering -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "kube_version"),
    [
        *((values, "") for values in MODES.values()),
        (EVERYTHING_ON, ""),
        ([], "1.23.0"),
        (["--set", "webhook.certManager.enabled=false"], "1.27.4"),
    ],
    ids=[*MODES, "everything-on", "kubernetes-1.23", "kubernetes-1.27"],
)
async def test_lint_strict(helm: Helm, values: list[str], kube_version: str) -> None:
    result = await helm(
        "lint", "--strict", str(CHART), "--kube-version", kube_version or helm.kube_version, *values
    )
    assert result.returncode == 0, describe(result)
    assert "[WARNING]" not in result.stdout + result.stderr, describe(result)
    assert "[ERROR]" not in result.stdout + result.stderr, describe(result)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        (["--set", "webhook.url=https://nmo.example:9443/x"], "caBundle"),
        (["--set", "webhook.url=http://nmo.example/x", "--set", "webhook.caBundle=QQ=="], "url"),
        (["--set", "replicas=2"], "replicas"),
        (["--set", "operator.logFormat=xml"], "logFormat"),
    ],
    ids=["url-without-ca", "plain-http", "unknown-key", "bad-enum"],
)
async def test_schema_rejects_bad_values(helm: Helm, values: list[str], complaint: str) -> None:
    result = await helm("lint", "--strict", str(CHART), *values)
    assert result.returncode != 0
    assert complaint in result.stdout + result.stderr, describe(result)


@pytest.fixture(scope="module")
async def cert_manager_crds(sandbox: Sandbox) -> None:
    """cert-manager's CRDs from its Go module (hack/cert-manager-crds.sh caches them)."""
    fetched = await run_command(["bash", str(CERT_MANAGER_CRDS)], timeout=300)
    if fetched.returncode != 0:
        pytest.fail(f"cannot get cert-manager's CRDs:\n{fetched.stderr}", pytrace=False)
    crd_dir = fetched.stdout.strip().splitlines()[-1]
    applied = await sandbox.kubectl("apply", "--server-side", "-f", crd_dir)
    assert applied.returncode == 0, describe(applied)
    established = await sandbox.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "-f", crd_dir
    )
    assert established.returncode == 0, describe(established)


@pytest.mark.parametrize("mode", list(MODES))
async def test_template_accepted_by_the_apiserver(
    sandbox: Sandbox, helm: Helm, cert_manager_crds: None, mode: str
) -> None:
    await ensure_namespace(sandbox, NS)
    await ensure_namespace(sandbox, LEASE_NS)  # shared with NHC/SNR; usually exists
    rendered = await helm.template(*MODES[mode])
    kinds = {d["kind"] for d in yaml.safe_load_all(rendered) if d}
    expected = {
        "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
        "Role", "RoleBinding", "ValidatingWebhookConfiguration",
    }  # fmt: skip
    if mode != "webhook-url":
        expected |= {"Deployment", "Service", "PodDisruptionBudget"}  # no NetworkPolicy: opt-in
    expected |= {"cert-manager": {"Issuer", "Certificate"}, "helm-generated": {"Secret"}}.get(
        mode, set()
    )
    assert expected <= kinds, f"missing {expected - kinds}"
    result = await sandbox.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered)
    assert result.returncode == 0, describe(result)
    assert "(server dry run)" in result.stdout


async def test_network_policy_learns_the_apiservers_addresses(
    sandbox: Sandbox, kube: httpx.AsyncClient, helm: Helm
) -> None:
    """Helm's lookup of EndpointSlice default/kubernetes (``helm install``, or
    ``helm template --dry-run=server``) fills the apiserver's ipBlocks.

    The sandbox's apiserver publishes no endpoints (it listens on loopback),
    so the test writes the EndpointSlice a real apiserver keeps; the policy is
    then checked by the apiserver (server dry run). No CNI here enforces it.
    """
    slice_path = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
    published = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": "kubernetes", "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["192.0.2.10"]}, {"addresses": ["192.0.2.11"]}],
        "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
    }
    if (await kube.get(f"{slice_path}/kubernetes")).status_code == 200:
        pytest.fail("the sandbox's apiserver publishes endpoints now: use them", pytrace=False)
    assert (await kube.post(slice_path, json=published)).status_code == 201
    try:
        result = await helm(
            "template", RELEASE, str(CHART), "-n", NS, "--dry-run=server",
            "--set", "networkPolicy.enabled=true",
            "--show-only", "templates/networkpolicy.yaml",
        )  # fmt: skip
        assert result.returncode == 0, describe(result)
    finally:
        await kube.delete(f"{slice_path}/kubernetes")
    (np,) = [d for d in yaml.safe_load_all(result.stdout) if d]
    cluster_ip = (await kube.get("/api/v1/namespaces/default/services/kubernetes")).json()
    webhook_rule = next(r for r in np["spec"]["ingress"] if r["ports"][0]["port"] == 9443)
    sources = [p["ipBlock"]["cidr"] for p in webhook_rule["from"]]
    assert sources == ["192.0.2.10/32", "192.0.2.11/32"]
    apiserver = np["spec"]["egress"][0]
    assert [p["port"] for p in apiserver["ports"]] == [6443, 443]
    destinations = [p["ipBlock"]["cidr"] for p in apiserver["to"]]
    assert destinations == [*sources, cluster_ip["spec"]["clusterIP"] + "/32"]
    assert "looked up" in np["metadata"]["annotations"]["nmo.medik8s.io/api-server"]
    await ensure_namespace(sandbox, NS)
    checked = await sandbox.kubectl("apply", "--dry-run=server", "-f", "-", input=result.stdout)
    assert checked.returncode == 0, describe(checked)


async def test_deployment_matches_the_guide(helm: Helm) -> None:
    """Names, labels, probes and hardening the guide and the cluster's policies rely on."""
    docs = [d for d in yaml.safe_load_all(await helm.template()) if d]
    dep = next(d for d in docs if d["kind"] == "Deployment")
    pod = dep["spec"]["template"]
    assert dep["metadata"]["namespace"] == NS
    assert dep["spec"]["replicas"] == 2
    assert pod["metadata"]["labels"]["control-plane"] == "controller-manager"
    assert pod["spec"]["serviceAccountName"] == SA
    (ctr,) = pod["spec"]["containers"]
    assert "--leader-elect" in ctr["args"]
    assert ctr["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert ctr["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    assert ports == {"webhook-server": 9443, "https": 8443, "health": 8081}
    mounts = {m["mountPath"] for m in ctr["volumeMounts"]}
    assert c.DEFAULT_CERT_DIR in mounts
    env = {e["name"] for e in ctr["env"]}
    assert {"POD_NAME", "POD_NAMESPACE", "LEASE_NAMESPACE"} <= env
    sec = ctr["securityContext"]
    assert sec["readOnlyRootFilesystem"] is True
    assert sec["allowPrivilegeEscalation"] is False
    assert sec["capabilities"]["drop"] == ["ALL"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    # Every flag the chart passes is one `nmo run` accepts.
    from nmo.cli import build_parser

    build_parser().parse_args(ctr["args"])
    webhook = next(d for d in docs if d["kind"] == "ValidatingWebhookConfiguration")
    (hook,) = webhook["webhooks"]
    assert hook["name"] == c.WEBHOOK_NAME
    assert hook["clientConfig"]["service"]["path"] == c.WEBHOOK_PATH
    assert hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    assert (hook["failurePolicy"], hook["sideEffects"]) == ("Fail", "None")
    assert hook["admissionReviewVersions"] == ["v1"]
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    ports_by_service = {n: s["spec"]["ports"][0]["port"] for n, s in services.items()}
    assert sorted(ports_by_service.values()) == [443, 8443]
