"""The troubleshooting guide's commands, verbatim, against an installed release.

The troubleshooting guide (the original; docs/troubleshooting.md is its
English version, same section numbers) tells operators to run ``kubectl``
commands against the Helm release in sections 2 to 6. Here each of them runs
unchanged (only its ``<placeholders>`` filled in) through ``bash -c`` with
the sandbox's kubectl on PATH, and its output must show what the guide says.

The release is the chart with its Deployment (2 replicas, default
scheduling), whose pods kwok runs as simulated pods. Simulated pods cannot
serve the webhook, so the release uses ``webhook.url`` (the chart's
out-of-cluster mode; a release has one webhook mode) pointing at a real
``nmo run``. Two real ``nmo run`` processes stand in for the two pods: each
runs with the pod's container arguments from the live Deployment, its
``POD_NAME``/``POD_NAMESPACE``/``LEASE_NAMESPACE``, and a token of the chart's
ServiceAccount. The first also serves the webhook.

Sections 2.6 (``kubectl exec`` into a pod) and 3 (``kubectl logs`` of the
pods) need the real pods: tests/e2e/test_in_cluster.py runs them verbatim
against the chart installed in-cluster on a real node.
The session's nmo is stopped for the module and started again afterwards.
Section 2.7 and the ``oc adm must-gather`` of section 5 are OpenShift-only.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from chart_identity import Identity
from objects import NM, Api, pdb, pod_spec
from operator_fixtures import (
    CURRENT,
    Operator,
    free_port,
    probe_synced,
    wait_for,
    wait_until_up,
)

from nmo.api import constants as c
from nmo_sandbox import Sandbox
from nmo_sandbox.process import run_command

if TYPE_CHECKING:
    from conftest import NodeFactory

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "node-maintenance-operator"
RELEASE = "nmo"
NS = c.OPERATOR_NAMESPACE
LEASE_NS = c.LEASE_NAMESPACE_DEFAULT
SELECTOR = "control-plane=controller-manager"
CONTAINER = "manager"
VWC = "node-maintenance-operator-validating-webhook-configuration"

# -- the original guide's commands, verbatim ------------------------------------
# (docs/troubleshooting.md adds -n default, --tail=-1 and a loop over the pods)

G21_NODES = "kubectl get nodes"
G21_DELETE = "kubectl delete nm <name>"
G22_LIST = "kubectl get nm"
G22_DELETE = "kubectl delete nm <existing-name>"
G23_LEASES = "kubectl get lease -n medik8s-leases"
G23_DESCRIBE = "kubectl describe lease node-<nodename> -n medik8s-leases"
G24_NAMESPACE = "kubectl get namespace medik8s-leases"
G24_CAN_I = """\
kubectl auth can-i update leases -n medik8s-leases \\
  --as=system:serviceaccount:node-maintenance-operator-system:node-maintenance-operator-controller-manager"""
G25_POD = "kubectl get pods -n <namespace> <pod-name>"
G25_PDBS = "kubectl get pdb -A"
G25_DESCRIBE = "kubectl describe pdb <name> -n <namespace>"
G25_FORCE = "kubectl delete pod <pod-name> -n <namespace> --force --grace-period=0"
G4_EVENTS = "kubectl get events --field-selector reason={reason}"
G4_DESCRIBE = "kubectl describe nm <name>"
G5_GATHER = "must-gather/collection-scripts/gather"
G6_UNCORDON = "kubectl uncordon <node-name>"
G6_UNTAINT_DRAIN = "kubectl taint node <node-name> medik8s.io/drain:NoSchedule-"
G6_UNTAINT_UNSCHEDULABLE = (
    "kubectl taint node <node-name> node.kubernetes.io/unschedulable:NoSchedule-"
)
G6_UNLABEL = "kubectl label node <node-name> medik8s.io/exclude-from-remediation-"
G6_PATCH = """kubectl patch nm <name> -p '{"metadata":{"finalizers":[]}}' --type=merge"""
G6_DELETE = "kubectl delete nm <name>"
# docs/troubleshooting.md only (the English guide's additions used on the way)
DOC_IGNORE = """\
kubectl patch validatingwebhookconfiguration node-maintenance-operator-validating-webhook-configuration \\
  --type=json -p '[{"op":"replace","path":"/webhooks/0/failurePolicy","value":"Ignore"}]'"""  # noqa: E501 (verbatim)
DOC_RESTORE = (
    "helm upgrade nmo charts/node-maintenance-operator -n node-maintenance-operator-system "
    "--reuse-values"
)
DOC_PODS = (
    "kubectl get pods -n node-maintenance-operator-system -l control-plane=controller-manager"
)
DOC_DELETE_LEASE = "kubectl delete lease node-<nodename> -n medik8s-leases"


# -- running commands ----------------------------------------------------------------


@dataclass
class Shell:
    """``bash -c`` in the repository root, with the sandbox's kubectl and helm.

    Every command and its output is appended to ``transcript``.
    """

    env: dict[str, str]
    transcript: Path

    async def __call__(
        self, command: str, timeout: float = 60, **placeholders: str
    ) -> subprocess.CompletedProcess[str]:
        line = fill(command, **placeholders)
        result = await run_command(["bash", "-c", line], cwd=ROOT, env=self.env, timeout=timeout)
        with self.transcript.open("a") as fh:
            fh.write(describe(result) + "\n")
        return result

    async def ok(
        self, command: str, timeout: float = 60, **placeholders: str
    ) -> subprocess.CompletedProcess[str]:
        result = await self(command, timeout, **placeholders)
        assert result.returncode == 0, describe(result)
        return result


def fill(command: str, **placeholders: str) -> str:
    for key, value in placeholders.items():
        command = command.replace(f"<{key.replace('_', '-')}>", value)
    left = re.findall(r"<[a-z-]+>", command)
    assert not left, f"unfilled placeholders {left} in {command!r}"
    return command


def describe(result: subprocess.CompletedProcess[str]) -> str:
    return f"$ {result.args}\n(exit {result.returncode})\n{result.stdout}\nstderr:\n{result.stderr}"


# -- the pods' stand-ins -----------------------------------------------------------


class PodOperator(Operator):
    """A real ``nmo run`` standing in for one simulated pod of the Deployment.

    Its output goes to its own log file (for failure reports).
    """

    def __init__(
        self,
        sandbox: Sandbox,
        log_dir: Path,
        *,
        pod: str,
        container_args: list[str],
        kubeconfig: Path,
        cert_dir: Path | None,
        webhook_port: int | None,
    ) -> None:
        user = f"system:serviceaccount:{NS}:{c.OPERATOR_SERVICE_ACCOUNT}"
        super().__init__(sandbox, log_dir, identity=Identity(kubeconfig, user, ()))
        self.pod = pod
        self.container_args = container_args
        self.kubeconfig = kubeconfig
        self.cert_dir = cert_dir
        self.webhook_port = webhook_port

    def args(self) -> list[str]:
        """The pod's container arguments, for a process outside the cluster."""
        out = [sys.executable, "-m", "nmo"]
        for arg in self.container_args:
            if arg == "--in-cluster":
                out += ["--kubeconfig", str(self.kubeconfig)]
            elif arg.startswith("--health-probe-port="):
                out.append(f"--health-probe-port={self.probe_port}")
            elif arg.startswith("--metrics-port="):
                out.append(f"--metrics-port={self.metrics_port}")
            elif arg == "--no-enable-webhook" and self.webhook_port is not None:
                out += [f"--webhook-port={self.webhook_port}", f"--cert-dir={self.cert_dir}"]
            else:
                out.append(arg)
        return [*out, "--bind-address=127.0.0.1", "--leader-retry-period=0.5"]

    def env(self, deployment_env: list[dict[str, Any]]) -> dict[str, str]:
        fields = {"metadata.name": self.pod, "metadata.namespace": NS}
        env = dict(os.environ)
        for var in deployment_env:
            if "value" in var:
                env[var["name"]] = var["value"]
            else:
                env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
        return env

    async def start_with(self, env: dict[str, str], *, leader: bool) -> None:
        """Start; return once it leads (``leader``) or, as a standby, its caches synced."""
        self.starts += 1
        with self.log_file.open("wb") as out:
            self.proc = subprocess.Popen(  # noqa: ASYNC220
                self.args(), stdout=out, stderr=subprocess.STDOUT, env=env
            )
        if leader:
            await wait_until_up(self.proc, self.leading, log=self.logs, what="leading")
        else:
            await wait_until_up(
                self.proc, lambda: probe_synced(self.probe_port), log=self.logs, what="synced"
            )
            assert not await self.leading(), f"the standby {self.pod} leads"

    def kill(self, sig: int = signal.SIGTERM) -> None:
        super().kill(sig)


# -- the installed release ------------------------------------------------------------


@dataclass
class Guide:
    sandbox: Sandbox
    sh: Shell
    api: Api
    pods: list[str]
    operators: list[PodOperator]
    deployment_env: list[dict[str, Any]]
    cert_dir: Path
    created: list[str] = field(default_factory=list)  # NodeMaintenances to clean up

    async def stop_operators(self) -> None:
        for op in reversed(self.operators):
            op.kill(signal.SIGTERM)

    async def start_operators(self) -> None:
        leader, standby = self.operators
        await leader.start_with(self.env(leader), leader=True)
        await standby.start_with(self.env(standby), leader=False)

    def env(self, op: PodOperator) -> dict[str, str]:
        return op.env(self.deployment_env)

    async def create_nm(self, name: str, node: str) -> subprocess.CompletedProcess[str]:
        """``kubectl create`` of a NodeMaintenance (through the webhook)."""
        manifest = {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND,
            "metadata": {"name": name},
            "spec": {"nodeName": node, "reason": "troubleshooting guide"},
        }
        self.created.append(name)
        return await self.sh(f"kubectl create -f - <<'YAML'\n{json.dumps(manifest)}\nYAML")

    async def status(self, name: str) -> dict[str, Any]:
        obj = await self.api.nm(name)
        return dict((obj or {}).get("status") or {})

    async def wait_phase(self, name: str, phase: str, timeout: float = 30) -> dict[str, Any]:
        async def reached() -> dict[str, Any] | None:
            status = await self.status(name)
            return status if status.get("phase") == phase else None

        return await wait_for(reached, timeout=timeout, what=f"{name} to be {phase}")

    async def wait_gone(self, name: str, timeout: float = 30) -> None:
        async def gone() -> bool:
            return await self.api.nm(name) is None

        await wait_for(gone, timeout=timeout, what=f"{name} to be deleted")


@pytest.fixture(scope="module")
async def guide(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Guide]:
    # Only this module's nmo may reconcile (test_chart.py's sole_operator, module-wide).
    paused = [op for op in CURRENT if op.proc is not None and op.proc.poll() is None]
    for op in paused:
        op.kill(signal.SIGTERM)
    base = tmp_path_factory.mktemp("guide")
    env = {
        **os.environ,
        "KUBECONFIG": str(sandbox.kubeconfig),
        "PATH": f"{sandbox.bin_dir}:{os.environ.get('PATH', os.defpath)}",
        "HELM_CACHE_HOME": str(base / "helm" / "cache"),
        "HELM_CONFIG_HOME": str(base / "helm" / "config"),
        "HELM_DATA_HOME": str(base / "helm" / "data"),
    }
    env.pop("KUBECTL_NAMESPACE", None)
    sh = Shell(env, base / "transcript.txt")
    async with sandbox.client(user_agent="nmo-guide-tests") as kube:
        api = Api(kube)
        lease_ns_existed = (await api.get(f"/api/v1/namespaces/{LEASE_NS}")) is not None
        operators: list[PodOperator] = []
        guide: Guide | None = None
        try:
            # An earlier module's release namespace may still be terminating:
            # a pod bound to a node that a test deleted goes only when the pod
            # garbage collector takes it (its 40 s quarantine, then a cycle).
            # Or be left by one (test_ops.py's tests create it): it goes too,
            # so that the guide's install starts from a fresh namespace.
            await sh(f"kubectl delete namespace {NS} --ignore-not-found --wait=false")
            gone = await sh(f"kubectl wait --for=delete namespace/{NS} --timeout=150s", 170)
            assert gone.returncode == 0 or "not found" in gone.stderr, describe(gone) + describe(
                await sh(f"kubectl get namespace {NS} -o yaml; kubectl get pods -n {NS} -o wide")
            )
            # The real nmo's certificates, laid out like the chart's Secret
            # (tls.crt, tls.key, ca.crt).
            cert_dir = base / "certificates"
            serving = sandbox.issue_serving_cert(cert_dir, ["127.0.0.1"], name="tls")
            shutil.copyfile(serving.ca_file, cert_dir / "ca.crt")
            webhook_port = free_port()
            installed = await sh.ok(
                f"helm install {RELEASE} {CHART} -n {NS} --create-namespace --wait --timeout 60s"
                f" --set webhook.url=https://127.0.0.1:{webhook_port}{c.WEBHOOK_PATH}"
                f" --set webhook.caBundle={base64.b64encode(serving.ca_bundle).decode()}",
                timeout=90,
            )
            assert "STATUS: deployed" in installed.stdout, describe(installed)

            # The Deployment's pods, scheduled onto kwok nodes and Running.
            pods = await _running_pods(sh)
            deployment = await api.get(
                f"/apis/apps/v1/namespaces/{NS}/deployments/{c.OPERATOR_SERVICE_ACCOUNT}"
            )
            assert deployment is not None
            (ctr,) = deployment["spec"]["template"]["spec"]["containers"]
            assert ctr["name"] == CONTAINER
            assert "--no-enable-webhook" in ctr["args"]  # webhook.url mode

            sa_kubeconfig = await sandbox.service_account_kubeconfig(
                NS, c.OPERATOR_SERVICE_ACCOUNT, base / "sa-kubeconfig"
            )
            for i, pod in enumerate(pods):
                log_dir = base / f"nmo-{pod}"
                log_dir.mkdir()
                operators.append(
                    PodOperator(
                        sandbox,
                        log_dir,
                        pod=pod,
                        container_args=list(ctr["args"]),
                        kubeconfig=sa_kubeconfig,
                        cert_dir=cert_dir if i == 0 else None,
                        webhook_port=webhook_port if i == 0 else None,
                    )
                )
            CURRENT.extend(operators)  # their logs go into failure reports
            guide = Guide(sandbox, sh, api, pods, operators, ctr["env"], cert_dir)
            await guide.start_operators()
            yield guide
        finally:
            for op in reversed(operators):
                op.kill(signal.SIGTERM)
                with contextlib.suppress(ValueError):
                    CURRENT.remove(op)
            for name in guide.created if guide else []:
                with contextlib.suppress(AssertionError):
                    await api.merge(f"{NM}/{name}", {"metadata": {"finalizers": []}})
                await api.delete(f"{NM}/{name}")
            if (await sh(f"helm status {RELEASE} -n {NS}")).returncode == 0:
                await sh(f"helm uninstall {RELEASE} -n {NS} --wait --timeout 60s", timeout=90)
            # The pods' 30 s grace period would hold the namespace up.
            await sh(f"kubectl delete pods -n {NS} --all --force --grace-period=0")
            await sh(f"kubectl delete namespace {NS} --ignore-not-found --wait=false")
            if not lease_ns_existed:
                await sh(f"kubectl delete namespace {LEASE_NS} --ignore-not-found --wait=false")
            await sh(
                f"kubectl wait --for=delete namespace/{NS} namespace/{LEASE_NS} --timeout=60s"
                if not lease_ns_existed
                else f"kubectl wait --for=delete namespace/{NS} --timeout=60s",
                timeout=90,
            )
            for op in paused:
                await op.start()


async def _running_pods(sh: Shell) -> list[str]:
    async def running() -> list[dict[str, Any]] | None:
        result = await sh(f"kubectl get pods -n {NS} -l {SELECTOR} -o json")
        items = json.loads(result.stdout or '{"items": []}')["items"]
        up = [
            p
            for p in items
            if p["status"].get("phase") == "Running"
            and "deletionTimestamp" not in p["metadata"]
            and any(
                cond["type"] == "Ready" and cond["status"] == "True"
                for cond in p["status"].get("conditions") or []
            )
        ]
        return up if len(up) == 2 and len(items) == 2 else None

    pods = await wait_for(running, timeout=30, what="both operator pods Running")
    listing = await sh.ok(DOC_PODS)
    for pod in pods:
        pod_name = pod["metadata"]["name"]
        assert re.search(rf"{pod_name}\s+1/1\s+Running", listing.stdout), describe(listing)
    return sorted(p["metadata"]["name"] for p in pods)


# -- 2.4 (first: nothing else has run yet) -------------------------------------------------


async def test_2_4_lease_namespace_and_rbac(guide: Guide) -> None:
    ns = await guide.sh.ok(G24_NAMESPACE)
    assert re.search(r"^medik8s-leases\s+Active\s", ns.stdout, re.M), describe(ns)
    can_i = await guide.sh.ok(G24_CAN_I)
    assert can_i.stdout.strip() == "yes", describe(can_i)


# -- 2.2 and 2.3: a maintenance, its duplicate and its lease ---------------------------------


async def test_2_2_duplicate_and_2_3_lease(guide: Guide, node_factory: NodeFactory) -> None:
    (node,) = await node_factory(1)
    name = f"nm-{node}"
    created = await guide.create_nm(name, node)
    assert created.returncode == 0, describe(created)
    await guide.wait_phase(name, "Succeeded")

    duplicate = await guide.create_nm(f"{name}-again", node)
    assert duplicate.returncode != 0
    assert (
        f'admission webhook "{c.WEBHOOK_NAME}" denied the request: '
        f"invalid nodeName, a NodeMaintenance for node {node} already exists"
    ) in duplicate.stderr, describe(duplicate)

    listing = await guide.sh.ok(G22_LIST)
    assert re.search(rf"^{name}\s+{node}\s+Succeeded\s", listing.stdout, re.M), describe(listing)
    assert f"{name}-again" not in listing.stdout

    leases = await guide.sh.ok(G23_LEASES)
    assert re.search(rf"^node-{node}\s+{c.LEASE_HOLDER}\s", leases.stdout, re.M), describe(leases)
    lease = await guide.sh.ok(G23_DESCRIBE, nodename=node)
    assert re.search(rf"Holder Identity:\s+{c.LEASE_HOLDER}$", lease.stdout, re.M), describe(lease)
    assert "Lease Duration Seconds:  3600" in lease.stdout, describe(lease)

    deleted = await guide.sh.ok(G22_DELETE, existing_name=name)
    assert f'"{name}" deleted' in deleted.stdout, describe(deleted)
    await guide.wait_gone(name)
    restored = await guide.api.node(node)
    assert not restored["spec"].get("unschedulable"), restored["spec"]


# -- 2.5: a drain held by a PodDisruptionBudget -------------------------------------------------


async def test_2_5_stuck_drain_and_4_events(
    guide: Guide, node_factory: NodeFactory, namespace: str
) -> None:
    (node,) = await node_factory(1)
    labels = {"app": "guarded"}
    pod = "guarded-0"
    await guide.api.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, "labels": labels},
            "spec": pod_spec(node_name=node),
        },
    )
    budget = "guarded-pdb"
    await guide.api.create(
        f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets", pdb(budget, labels, 1)
    )

    async def budget_counted() -> bool:
        got = await guide.api.get(
            f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/{budget}"
        )
        return bool(got) and (got.get("status") or {}).get("currentHealthy") == 1

    await wait_for(budget_counted, timeout=30, what="the PDB to count the pod")

    name = f"nm-{node}"
    assert (await guide.create_nm(name, node)).returncode == 0

    async def blocked() -> dict[str, Any] | None:
        status = await guide.status(name)
        details = status.get("pendingPodsDetails") or []
        return status if details and details[0].get("reason") == "DisruptionBudget" else None

    status = await wait_for(blocked, timeout=30, what="the drain to be held by the PDB")
    assert status["phase"] == "Running" and status["pendingPods"] == [pod], status

    got_pod = await guide.sh.ok(G25_POD, namespace=namespace, pod_name=pod)
    assert re.search(rf"^{pod}\s+1/1\s+Running\s", got_pod.stdout, re.M), describe(got_pod)
    pdbs = await guide.sh.ok(G25_PDBS)
    # NAMESPACE NAME MIN AVAILABLE MAX UNAVAILABLE ALLOWED DISRUPTIONS AGE
    assert re.search(rf"^{namespace}\s+{budget}\s+1\s+N/A\s+0\s", pdbs.stdout, re.M), describe(pdbs)
    described = await guide.sh.ok(G25_DESCRIBE, name=budget, namespace=namespace)
    assert re.search(r"^Min available:\s+1$", described.stdout, re.M), describe(described)
    assert re.search(r"^\s*Allowed disruptions:\s+0$", described.stdout, re.M), describe(described)

    forced = await guide.sh.ok(G25_FORCE, pod_name=pod, namespace=namespace)
    assert f'pod "{pod}" force deleted' in forced.stdout, describe(forced)
    assert "Immediate deletion does not wait for confirmation" in forced.stderr, describe(forced)
    await guide.wait_phase(name, "Succeeded")
    await guide.api.wait_events(name, "SucceedMaintenance")  # recorded after the status

    # Section 4: the events, verbatim (the kubeconfig's namespace is "default").
    context_ns = await guide.sh.ok("kubectl config view --minify -o jsonpath='{..namespace}'")
    assert context_ns.stdout.strip() in ("", "default"), describe(context_ns)
    for reason in ("BeginMaintenance", "SucceedMaintenance"):
        events = await guide.sh.ok(G4_EVENTS.format(reason=reason))
        assert re.search(rf"\sNormal\s+{reason}\s+nodemaintenance/{name}\s", events.stdout), (
            describe(events)
        )
    nm = await guide.sh.ok(G4_DESCRIBE, name=name)
    assert re.search(r"^Events:", nm.stdout, re.M), describe(nm)
    for reason, message in (c.EVENT_BEGIN, c.EVENT_SUCCEEDED):
        assert re.search(rf"Normal\s+{reason}\s+.*{message}", nm.stdout), describe(nm)
    assert re.search(r"Phase:\s+Succeeded", nm.stdout), describe(nm)

    await guide.sh.ok(G21_DELETE, name=name)
    await guide.wait_gone(name)


# -- 6 and 2.1: the operator is down ------------------------------------------------------


async def test_6_manual_cleanup_and_2_1_node_not_found(
    guide: Guide, node_factory: NodeFactory
) -> None:
    (node,) = await node_factory(1)
    name = f"nm-{node}"
    assert (await guide.create_nm(name, node)).returncode == 0
    await guide.wait_phase(name, "Succeeded")
    held = await guide.api.node(node)
    assert held["spec"].get("unschedulable") is True
    assert held["metadata"]["labels"].get(c.EXCLUDE_FROM_REMEDIATION_LABEL) == "true"

    await guide.stop_operators()
    ghost = f"ghost-{uuid.uuid4().hex[:6]}"
    ghost_nm = f"nm-{ghost}"
    refused = await guide.create_nm(ghost_nm, ghost)
    assert f'failed calling webhook "{c.WEBHOOK_NAME}"' in refused.stderr, describe(refused)

    # Section 6, verbatim, on a node left in maintenance by a stopped operator.
    uncordoned = await guide.sh.ok(G6_UNCORDON, node_name=node)
    assert f"node/{node} uncordoned" in uncordoned.stdout, describe(uncordoned)
    untainted = await guide.sh.ok(G6_UNTAINT_DRAIN, node_name=node)
    assert f"node/{node} untainted" in untainted.stdout, describe(untainted)
    # The node controller drops this taint itself on uncordon: "not found" is a race it won.
    unschedulable = await guide.sh(G6_UNTAINT_UNSCHEDULABLE, node_name=node)
    assert (unschedulable.returncode == 0 and "untainted" in unschedulable.stdout) or (
        unschedulable.returncode == 1
        and 'taint "node.kubernetes.io/unschedulable:NoSchedule" not found' in unschedulable.stderr
    ), describe(unschedulable)
    # The guide's label key is not the one medik8s sets: a no-op that says so.
    unlabelled = await guide.sh.ok(G6_UNLABEL, node_name=node)
    said = unlabelled.stdout + unlabelled.stderr
    assert 'label "medik8s.io/exclude-from-remediation" not found' in said, describe(unlabelled)
    assert f"node/{node} not labeled" in said, describe(unlabelled)
    patched = await guide.sh.ok(G6_PATCH, name=name)
    assert f"nodemaintenance.nodemaintenance.medik8s.io/{name} patched" in patched.stdout
    deleted = await guide.sh.ok(G6_DELETE, name=name)
    assert f'"{name}" deleted' in deleted.stdout, describe(deleted)
    await guide.wait_gone(name)

    after = await guide.api.node(node)
    assert not after["spec"].get("unschedulable"), after["spec"]
    assert not {t["key"] for t in after["spec"].get("taints") or []} & set(c.MAINTENANCE_TAINT_KEYS)
    # ... but the real label stays: remediation remains disabled for the node.
    assert after["metadata"]["labels"].get(c.EXCLUDE_FROM_REMEDIATION_LABEL) == "true"
    # ... and so does nmo's lease (the English guide releases it).
    lease = await guide.api.lease(node)
    assert lease and lease["spec"]["holderIdentity"] == c.LEASE_HOLDER
    await guide.sh.ok(DOC_DELETE_LEASE, nodename=node)

    # 2.1: a CR for a missing node gets past a webhook relaxed to Ignore.
    await guide.sh.ok(DOC_IGNORE)

    async def admitted() -> bool:
        result = await guide.create_nm(ghost_nm, ghost)
        return result.returncode == 0

    await wait_for(admitted, timeout=20, what="the create to pass under failurePolicy Ignore")
    restored = await guide.sh.ok(DOC_RESTORE, timeout=90)
    assert "has been upgraded" in restored.stdout, describe(restored)
    vwc = await guide.api.get(
        f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{VWC}"
    )
    assert vwc and vwc["webhooks"][0]["failurePolicy"] == "Fail"

    await guide.start_operators()
    status = await guide.wait_phase(ghost_nm, "Failed")
    assert status["lastError"] == f'nodes "{ghost}" not found', status
    nodes = await guide.sh.ok(G21_NODES)
    assert re.search(rf"^{node}\s+Ready\s", nodes.stdout, re.M), describe(nodes)
    assert ghost not in nodes.stdout, describe(nodes)
    failed = await guide.sh.ok(G4_EVENTS.format(reason="FailedMaintenance"))
    assert re.search(
        rf"\sWarning\s+FailedMaintenance\s+nodemaintenance/{ghost_nm}\s", failed.stdout
    ), describe(failed)
    deleted = await guide.sh.ok(G21_DELETE, name=ghost_nm)
    assert f'"{ghost_nm}" deleted' in deleted.stdout, describe(deleted)
    await guide.wait_gone(ghost_nm)
    # With the webhook up again, the same CR is refused at once.
    again = await guide.create_nm(ghost_nm, ghost)
    assert f"invalid nodeName, no node with name {ghost} found" in again.stderr, describe(again)


# -- 5: OpenShift's must-gather ------------------------------------------------------------


def test_5_must_gather_script_exists() -> None:
    """``oc adm must-gather`` needs OpenShift; the image's entrypoint is in the repository."""
    gather = ROOT / G5_GATHER
    assert gather.is_file() and os.access(gather, os.X_OK)
