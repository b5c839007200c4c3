"""The operations toolkit on the real sandbox: gather, cleanup (B11) and status.

Every command runs as ``python -m nmo ...``, exactly as an operator on call
would run it.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import tarfile
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from objects import LEASES, NM, Api, pdb, pod_spec, uid, usable_namespace
from operator_fixtures import CURRENT, Operator, wait_for

from nmo.kube.client import Kube
from nmo.kube.errors import Conflict
from nmo.ops import cleanup
from nmo_sandbox import Sandbox

pytestmark = pytest.mark.integration

OPERATOR_NS = "node-maintenance-operator-system"
LEADER_LEASE = "135b1886.medik8s.io"
FINALIZER = "foregroundDeleteNodeMaintenance"
LABEL = "remediation.medik8s.io/exclude-from-remediation"
GUIDE_LABEL = "medik8s.io/exclude-from-remediation"
OUR_TAINTS = [
    {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
    {"key": "medik8s.io/drain", "effect": "NoSchedule"},
]
FOREIGN_TAINT = {"key": "example.com/keep-me", "value": "yes", "effect": "NoSchedule"}


@pytest.fixture
async def api(kube: httpx.AsyncClient) -> Api:
    return Api(kube)


async def nmo(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``python -m nmo`` with stdin closed (not a terminal)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LEASE_NAMESPACE", "KUBECONFIG")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nmo",
        *args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**env, "COLUMNS": "200"},
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return subprocess.CompletedProcess(args, proc.returncode or 0, out.decode(), err.decode())


async def ensure_namespace(api: Api, name: str) -> None:
    await usable_namespace(api.c, name)


@pytest.fixture(scope="module", autouse=True)
async def _leaves_no_operator_namespace(sandbox: Sandbox) -> AsyncIterator[None]:
    """The chart's namespace, which tests here create, goes with the module:
    a later module installs the chart into a fresh one."""
    yield
    await sandbox.kubectl("delete", "namespace", OPERATOR_NS, "--wait=false", "--ignore-not-found")


def write_text(path: Path, text: str) -> None:
    path.write_text(text)


def read_text(path: Path, *, binary: bool = False) -> str:
    return str(path.read_bytes()[:10]) if binary else path.read_text()


def micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def wait_phase(api: Api, name: str, phase: str, timeout: float = 90) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        obj = await api.nm(name)
        return obj if obj and (obj.get("status") or {}).get("phase") == phase else None

    return await wait_for(check, timeout=timeout, what=f"{name} phase {phase}")


async def remove_nm(api: Api, name: str) -> None:
    await api.delete(f"{NM}/{name}")

    async def gone() -> bool:
        return await api.nm(name) is None

    await wait_for(gone, timeout=60, what=f"{name} deleted")


# -- gather --------------------------------------------------------------------


async def test_gather_bundle(
    sandbox: Sandbox,
    operator: Operator,
    api: Api,
    namespace: str,
    node_factory: Any,
    tmp_path: Path,
) -> None:
    marker = f"do-not-leak-{uid()}"
    await ensure_namespace(api, OPERATOR_NS)
    await api.create(
        f"/api/v1/namespaces/{OPERATOR_NS}/secrets",
        {"metadata": {"name": f"gather-{uid()}"}, "stringData": {"token": marker}},
    )
    deploy_name = f"gather-op-{uid()}"
    labels = {"control-plane": "controller-manager", "gather-test": deploy_name}
    spec = pod_spec()
    spec["containers"][0]["env"] = [{"name": "API_TOKEN", "value": marker}]
    await api.create(
        f"/apis/apps/v1/namespaces/{OPERATOR_NS}/deployments",
        {
            "metadata": {"name": deploy_name, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": spec},
            },
        },
    )
    vwc = f"gather-{uid()}"
    await api.create(
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
        {
            "metadata": {"name": vwc},
            "webhooks": [
                {
                    "name": "vnodemaintenance.kb.io",
                    "clientConfig": {"url": "https://127.0.0.1:1/validate"},
                    "rules": [
                        {
                            "apiGroups": ["example.com"],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["nothingatall"],
                        }
                    ],
                    "failurePolicy": "Ignore",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                }
            ],
        },
    )
    (target,) = await node_factory(1)
    # A bare pod guarded by a PDB keeps the drain Running: the PDB must be in the bundle.
    await api.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {"metadata": {"name": "guarded", "labels": {"app": "guarded"}},
         "spec": pod_spec(node_name=target)},
    )  # fmt: skip
    await api.create(
        f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets",
        pdb("guard", {"app": "guarded"}, 1),
    )
    name = f"gather-{uid()}"
    await api.create_nm(name, target)
    try:
        await wait_phase(api, name, "Running")

        async def pod_listed() -> bool:
            resp = await api.c.get(
                f"/api/v1/namespaces/{OPERATOR_NS}/pods",
                params={"labelSelector": f"gather-test={deploy_name}"},
            )
            return bool(resp.json()["items"])

        await wait_for(pod_listed, what="operator-like pod")
        result = await nmo(
            "gather", "--kubeconfig", str(sandbox.kubeconfig), "--dest", str(tmp_path)
        )
        assert result.returncode == 0, result.stderr
        directory, archive = (Path(p) for p in result.stdout.split())
        assert directory.is_dir() and archive.name == directory.name + ".tar.gz"
        assert "nodes" in result.stderr and "events" in result.stderr  # progress lines
        files = {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()}
        assert {
            "summary.json",
            "SUMMARY.txt",
            "cluster/nodes.yaml",
            "cluster/crd-nodemaintenances.yaml",
            "nodemaintenances.yaml",
            "leases/medik8s-leases.yaml",
            "events.yaml",
            "operator/pods.yaml",
            "operator/deployments.yaml",
            "operator/validatingwebhookconfigurations.yaml",
            "pdbs.yaml",
        } <= files
        assert {"metrics/nodes.yaml", "metrics/NOT-SERVED.txt"} & files

        def read(rel: str) -> str:
            return (directory / rel).read_text()

        assert target in read("cluster/nodes.yaml")
        assert name in read("nodemaintenances.yaml")
        assert f"node-{target}" in read("leases/medik8s-leases.yaml")
        assert "BeginMaintenance" in read("events.yaml")
        assert deploy_name in read("operator/pods.yaml")
        assert deploy_name in read("operator/deployments.yaml")
        assert vwc in read("operator/validatingwebhookconfigurations.yaml")
        assert "guard" in read("pdbs.yaml") and f"{namespace}/guarded" in read("pdbs.yaml")
        summary = json.loads(read("summary.json"))
        names = {i["name"] for i in summary["items"]}
        assert {"nodes", "events", "operator pods", "disruption budgets", "node metrics"} <= names
        assert any(n.startswith(f"logs {deploy_name}") for n in names)
        # No secret, no secret value, anywhere in the bundle or the archive.
        for rel in files:
            text = read(rel)
            assert marker not in text, rel
            assert "kind: Secret\n" not in text, rel
        with tarfile.open(archive) as tar:
            members = set(tar.getnames())
            assert f"{directory.name}/summary.json" in members
            assert f"{directory.name}/pdbs.yaml" in members
    finally:
        await remove_nm(api, name)
        await api.delete(f"/apis/apps/v1/namespaces/{OPERATOR_NS}/deployments/{deploy_name}")
        await api.delete(
            f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{vwc}"
        )


PEM_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj"


async def test_gather_bundle_carries_no_workload_secret_and_is_private(
    sandbox: Sandbox,
    operator: Operator,
    api: Api,
    namespace: str,
    node_factory: Any,
    tmp_path: Path,
) -> None:
    """Issue 14 item 5: a pod on a maintained node with a secret in every shape
    (env DB_PASS, a URL password and a PEM key in annotations, ``--token``
    in args) leaves none of them in the bundle; every file is 0600."""
    mark = uid()
    secrets = {
        "env": f"dbpass{mark}value",
        "url": f"urlpw{mark}",
        "args": f"abc123secret{mark}",
        "pem": PEM_BODY,
    }
    (target,) = await node_factory(1)
    spec = pod_spec(node_name=target)
    spec["containers"][0]["env"] = [{"name": "DB_PASS", "value": secrets["env"]}]
    spec["containers"][0]["args"] = ["--token", secrets["args"]]
    pem = f"-----BEGIN PRIVATE KEY-----\n{PEM_BODY}\n-----END PRIVATE KEY-----\n"
    annotations = {
        "example.com/db": f"postgres://app:{secrets['url']}@db.internal:5432/app",
        "example.com/tls-key": pem,
    }
    pod = "leaky"
    await api.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "metadata": {
                "name": pod,
                "annotations": annotations,
            },
            "spec": spec,
        },
    )
    name = f"gather-{uid()}"
    # The CR's podSelector (the admin's) leaves the pod alone, so it is still
    # on the node when gathered.
    await api.create(
        NM,
        {
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
            "kind": "NodeMaintenance",
            "metadata": {"name": name},
            "spec": {
                "nodeName": target,
                "drain": {"podSelector": {"matchLabels": {"example.com/drained": "yes"}}},
            },
        },
    )
    try:
        await wait_phase(api, name, "Succeeded")
        result = await nmo(
            "gather", "--kubeconfig", str(sandbox.kubeconfig), "--dest", str(tmp_path)
        )
        assert result.returncode == 0, result.stderr
        directory, archive = (Path(p) for p in result.stdout.split())
        files = [p for p in directory.rglob("*") if p.is_file()]
        listed = (directory / "pods-on-maintained-nodes.yaml").read_text()
        assert f"name: {pod}" in listed  # the pod is there, its secrets are not
        leaks = {
            str(path.relative_to(directory)): leaked
            for path in files
            if (leaked := [k for k, v in secrets.items() if v in path.read_text()])
        }
        assert not leaks, f"secrets in the bundle: {leaks}"
        wide = {str(p.relative_to(directory)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
        assert set(wide.values()) == {"0o600"}, wide
        for sub in [directory, *(p for p in directory.rglob("*") if p.is_dir())]:
            assert stat.S_IMODE(sub.stat().st_mode) == 0o700, sub
        assert stat.S_IMODE(archive.stat().st_mode) == 0o600
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                assert member.mode & 0o077 == 0, member.name
                data = tar.extractfile(member) if member.isfile() else None
                if data is not None:
                    text = data.read().decode()
                    leaked = [k for k, v in secrets.items() if v in text]
                    assert not leaked, f"{leaked} in {member.name} (archive)"
    finally:
        await remove_nm(api, name)


async def restricted_kubeconfig(sandbox: Sandbox, api: Api, namespace: str, path: Path) -> str:
    """A kubeconfig for a ServiceAccount that may only read nodes; returns the role name."""
    sa = "gather-restricted"
    role = f"nmo-gather-restricted-{uid()}"
    await api.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": sa}})
    await api.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        {
            "metadata": {"name": role},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}],
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
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
        },
    )
    token = await api.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 600},
        },
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "sb",
                "cluster": {
                    "server": sandbox.server,
                    "certificate-authority": str(sandbox.ca_file),
                },
            }
        ],
        "users": [{"name": sa, "user": {"token": token["status"]["token"]}}],
        "contexts": [{"name": "sb", "context": {"cluster": "sb", "user": sa}}],
        "current-context": "sb",
    }
    write_text(path, json.dumps(config))
    return role


async def test_gather_records_forbidden_items(
    sandbox: Sandbox, api: Api, namespace: str, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "restricted.kubeconfig"
    role = await restricted_kubeconfig(sandbox, api, namespace, kubeconfig)
    try:
        bundle_dir = tmp_path / "out"
        result = await nmo("gather", "--kubeconfig", str(kubeconfig), "--dest", str(bundle_dir))
        assert result.returncode == 0, result.stderr
        directory = Path(result.stdout.split()[0])
        summary = json.loads(read_text(directory / "summary.json"))
        status = {i["name"]: i["status"] for i in summary["items"]}
        assert status["nodes"] == "ok"
        assert status["nodemaintenances"] == "forbidden"
        assert status["operator pods"] == "forbidden"
        assert {p["name"] for p in summary["problems"]} >= {"nodemaintenances", "operator pods"}
        assert "forbidden" in read_text(directory / "SUMMARY.txt")
        assert read_text(Path(str(directory) + ".tar.gz"), binary=True)
    finally:
        await api.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{role}")
        await api.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role}")


async def test_must_gather_entrypoint(sandbox: Sandbox, operator: Operator, tmp_path: Path) -> None:
    """must-gather/collection-scripts/gather is `nmo gather` under oc's conventions."""
    script = Path(__file__).parents[2] / "must-gather" / "collection-scripts" / "gather"
    env = {k: v for k, v in os.environ.items() if k != "LEASE_NAMESPACE"}
    env.update(
        BASE_COLLECTION_PATH=str(tmp_path / "must-gather"),
        KUBECONFIG=str(sandbox.kubeconfig),
        MUST_GATHER_SINCE="2h",
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
    )
    proc = await asyncio.create_subprocess_exec(
        "sh", str(script), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    directory = Path(out.decode().split()[0])
    assert directory.parent == tmp_path / "must-gather"
    summary = json.loads(read_text(directory / "summary.json"))
    assert summary["since"] == 7200


# -- cleanup -------------------------------------------------------------------


async def make_mess(api: Api, node: str, *, foreign: bool = True) -> None:
    """What a killed operator leaves behind: cordon, taints, both labels, our lease."""
    taints = [*OUR_TAINTS, FOREIGN_TAINT] if foreign else list(OUR_TAINTS)
    await api.merge(
        f"/api/v1/nodes/{node}",
        {
            "metadata": {"labels": {LABEL: "true", GUIDE_LABEL: "true"}},
            "spec": {"unschedulable": True, "taints": taints},
        },
    )
    now = micro_now()
    await api.create(
        LEASES,
        {
            "metadata": {"name": f"node-{node}"},
            "spec": {
                "holderIdentity": "node-maintenance",
                "leaseDurationSeconds": 3600,
                "acquireTime": now,
                "renewTime": now,
            },
        },
    )


async def test_cleanup_after_the_operator_died(
    operator: Operator, sandbox: Sandbox, api: Api, node_factory: Any
) -> None:
    (target,) = await node_factory(1)
    CURRENT[-1].kill()
    try:
        name = f"stuck-{uid()}"
        await api.create(
            NM,
            {
                "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
                "kind": "NodeMaintenance",
                "metadata": {"name": name, "finalizers": [FINALIZER]},
                "spec": {"nodeName": target},
            },
        )
        await make_mess(api, target)
        await api.delete(f"{NM}/{name}")  # stuck: nobody removes the finalizer
        stuck = await api.nm(name)
        assert stuck is not None and stuck["metadata"].get("deletionTimestamp")

        kc = str(sandbox.kubeconfig)
        refused = await nmo("cleanup", target, "--kubeconfig", kc)
        assert refused.returncode == 1 and "--yes" in refused.stderr
        assert (await api.node(target))["spec"].get("unschedulable") is True

        result = await nmo("cleanup", target, "--yes", "--kubeconfig", kc)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "bypassing the operator" in result.stdout
        assert f"done: node/{target}: uncordon" in result.stdout
        assert "example.com/keep-me" in result.stdout  # reported as kept

        node = await api.node(target)
        assert not node["spec"].get("unschedulable")
        assert node["spec"].get("taints") == [FOREIGN_TAINT]
        labels = node["metadata"].get("labels") or {}
        assert LABEL not in labels and GUIDE_LABEL not in labels
        assert await api.lease(target) is None

        async def gone() -> bool:
            return await api.nm(name) is None

        await wait_for(gone, timeout=20, what="stuck CR removed")

        again = await nmo("cleanup", target, "--yes", "--kubeconfig", kc)
        assert again.returncode == 0, again.stderr
        assert "Nothing to do" in again.stdout and "done:" not in again.stdout
    finally:
        await CURRENT[-1].start()


async def test_cleanup_keeps_an_admins_exclude_label(
    operator: Operator, sandbox: Sandbox, api: Api, node_factory: Any
) -> None:
    """A label with no sign that a maintenance set it (no record, no drain taint,
    no lease of ours) is an admin's decision to keep remediation away."""
    (target,) = await node_factory(1)
    CURRENT[-1].kill()
    name = f"stuck-{uid()}"
    try:
        await api.merge(f"/api/v1/nodes/{target}", {"metadata": {"labels": {LABEL: "true"}}})
        await api.create(
            NM,
            {
                "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
                "kind": "NodeMaintenance",
                "metadata": {"name": name, "finalizers": [FINALIZER]},
                "spec": {"nodeName": target},
            },
        )
        kc = str(sandbox.kubeconfig)
        result = await nmo("cleanup", target, "--yes", "--force", "--kubeconfig", kc)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"label {LABEL} shows no sign that a maintenance set it" in result.stdout
        assert (await api.node(target))["metadata"]["labels"].get(LABEL) == "true"
    finally:
        await api.merge(f"/api/v1/nodes/{target}", {"metadata": {"labels": {LABEL: None}}})
        await remove_nm(api, name)
        await CURRENT[-1].start()


async def test_cleanup_never_deletes_a_cr_recreated_under_the_same_name(
    operator: Operator, sandbox: Sandbox, api: Api, node_factory: Any
) -> None:
    """The plan the user confirmed names one object; a DELETE by name alone would
    remove whatever carries that name by the time it runs."""
    (target,) = await node_factory(1)
    CURRENT[-1].kill()
    name = f"recreated-{uid()}"
    body = {
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": name},
        "spec": {"nodeName": target},
    }
    kube = await Kube.connect(kubeconfig=str(sandbox.kubeconfig))
    try:
        first = await api.create(NM, body)
        seen = await cleanup.observe(
            kube, target, lease_namespace="medik8s-leases", operator_namespace=OPERATOR_NS
        )
        plan = cleanup.plan_cleanup(
            target,
            node=seen.node,
            maintenances=seen.maintenances,
            lease=seen.lease,
            lease_namespace="medik8s-leases",
            delete_maintenances=True,
        )
        assert plan.deletions == ((name, first["metadata"]["uid"]),)
        await remove_nm(api, name)
        second = await api.create(NM, body)
        with pytest.raises(Conflict):
            await cleanup.execute(kube, plan, lease_namespace="medik8s-leases")
        still = await api.nm(name)
        assert still is not None and still["metadata"]["uid"] == second["metadata"]["uid"]
    finally:
        await kube.close()
        await remove_nm(api, name)
        await CURRENT[-1].start()


async def test_cleanup_judges_the_leader_by_its_renewals_not_by_clocks(
    operator: Operator, sandbox: Sandbox, api: Api, node_factory: Any
) -> None:
    """A leader renewing with a clock far behind is alive; a dead one whose clock ran
    ahead is not (comparing renewTime with this machine's clock got both wrong)."""
    (target,) = await node_factory(1)
    await api.merge(f"/api/v1/nodes/{target}", {"spec": {"taints": [OUR_TAINTS[1]]}})
    await ensure_namespace(api, OPERATOR_NS)
    leader_path = f"/apis/coordination.k8s.io/v1/namespaces/{OPERATOR_NS}/leases"
    await api.delete(f"{leader_path}/{LEADER_LEASE}")
    behind = "2000-01-01T00:00:00.000000Z"
    await api.create(
        leader_path,
        {
            "metadata": {"name": LEADER_LEASE},
            "spec": {"holderIdentity": "nmo-elsewhere", "leaseDurationSeconds": 15,
                     "acquireTime": behind, "renewTime": behind},
        },
    )  # fmt: skip
    renewals = 0

    async def renew_with_a_slow_clock() -> None:
        nonlocal renewals
        while True:
            await api.merge(
                f"{leader_path}/{LEADER_LEASE}", {"spec": {"leaseTransitions": renewals}}
            )
            renewals += 1
            await asyncio.sleep(1)

    kc = str(sandbox.kubeconfig)
    renewer = asyncio.create_task(renew_with_a_slow_clock())
    try:
        refused = await nmo("cleanup", target, "--yes", "--kubeconfig", kc)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "nmo-elsewhere" in refused.stderr and "Delete the NodeMaintenance" in refused.stderr
        assert (await api.node(target))["spec"].get("taints") == [OUR_TAINTS[1]]
        assert renewals >= 1
    finally:
        renewer.cancel()
    try:
        ahead = "2099-01-01T00:00:00.000000Z"  # the leader died; its clock was ahead
        await api.merge(f"{leader_path}/{LEADER_LEASE}", {"spec": {"renewTime": ahead}})
        result = await nmo("cleanup", target, "--yes", "--kubeconfig", kc)
        assert result.returncode == 0, result.stdout + result.stderr
        assert not (await api.node(target))["spec"].get("taints")
    finally:
        await api.delete(f"{leader_path}/{LEADER_LEASE}")


async def test_cleanup_unknown_node_still_offers_stuck_lease(
    operator: Operator, sandbox: Sandbox, api: Api
) -> None:
    ghost = f"ghost-{uid()}"
    now = micro_now()
    await api.create(
        LEASES,
        {
            "metadata": {"name": f"node-{ghost}"},
            "spec": {"holderIdentity": "node-maintenance", "leaseDurationSeconds": 3600,
                     "renewTime": now, "acquireTime": now},
        },
    )  # fmt: skip
    result = await nmo("cleanup", ghost, "--yes", "--kubeconfig", str(sandbox.kubeconfig))
    assert result.returncode == 1
    assert f'node "{ghost}" not found' in result.stderr
    assert "release" in result.stdout
    assert await api.lease(ghost) is None


# -- status --------------------------------------------------------------------


async def test_status_json_for_a_succeeded_maintenance(
    operator: Operator, sandbox: Sandbox, api: Api, node_factory: Any
) -> None:
    (target,) = await node_factory(1)
    name = f"status-{uid()}"
    reason = "[/] [link=https://evil.example/]see[/link]"  # a CR author's text, not markup
    await api.create_nm(name, target, reason=reason)
    kc = str(sandbox.kubeconfig)
    try:
        await wait_phase(api, name, "Succeeded")

        async def succeeded_event() -> bool:
            return bool(await api.events(name, "SucceedMaintenance"))

        await wait_for(succeeded_event, what="SucceedMaintenance event")
        result = await nmo("status", name, "-o", "json", "--kubeconfig", kc)
        assert result.returncode == 0, result.stderr
        doc = json.loads(result.stdout)
        assert doc["schema"] == "nmo.status/v1"
        (item,) = doc["items"]
        assert item["name"] == name and item["node"] == target
        assert item["phase"] == "Succeeded" and item["drainProgress"] == 100
        assert item["pendingPods"] == [] and item["lastError"] is None
        assert item["lease"]["holder"] == "node-maintenance" and item["lease"]["valid"] is True
        reasons = {e["reason"] for e in item["events"]}
        assert {"BeginMaintenance", "SucceedMaintenance"} <= reasons

        by_node = await nmo("status", "--node", target, "-o", "json", "--kubeconfig", kc)
        assert json.loads(by_node.stdout)["items"][0]["name"] == name

        text = await nmo("status", name, "--kubeconfig", kc)
        assert text.returncode == 0, text.stderr
        assert "Succeeded" in text.stdout and "100%" in text.stdout
        assert reason in text.stdout

        missing = await nmo("status", f"missing-{uid()}", "--kubeconfig", kc)
        assert missing.returncode == 1 and "not found" in missing.stderr
    finally:
        await remove_nm(api, name)


async def test_status_watch_shows_progress_of_a_pdb_slowed_drain(
    operator: Operator, sandbox: Sandbox, api: Api, namespace: str, node_factory: Any
) -> None:
    """``nmo status --watch -o json`` prints every change, including partial progress.

    Two pods are held by a PDB and a third is free to go, so the drain sits at
    33 % until the PDB is relaxed.
    """
    (target,) = await node_factory(1)
    labels = {"app": "held"}
    await api.create(
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "held"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": pod_spec({"kubernetes.io/hostname": target}),
                },
            },
        },
    )
    budget_path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
    await api.create(budget_path, pdb("held", labels, 2))
    await api.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {"metadata": {"name": "free"}, "spec": pod_spec(node_name=target)},
    )

    async def ready() -> bool:
        got = await api.get(f"{budget_path}/held")
        running = [
            p
            for p in await api.pods(namespace, node=target)
            if p["status"].get("phase") == "Running"
        ]
        return (got or {}).get("status", {}).get("currentHealthy") == 2 and len(running) == 3

    await wait_for(ready, what="3 running pods, 2 held by the PDB")
    name = f"status-{uid()}"
    await api.create_nm(name, target)
    env = {k: v for k, v in os.environ.items() if k not in ("LEASE_NAMESPACE", "KUBECONFIG")}
    watcher = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "nmo", "status", name, "--watch", "-o", "json",
        "--kubeconfig", str(sandbox.kubeconfig),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    assert watcher.stdout is not None
    seen: list[tuple[str | None, int | None]] = []
    relaxed = False
    try:
        async with asyncio.timeout(120):
            while True:
                line = await watcher.stdout.readline()
                if not line:
                    break
                items = json.loads(line)["items"]
                if not items:
                    continue
                phase, progress = items[0]["phase"], items[0]["drainProgress"]
                seen.append((phase, progress))
                if phase == "Running" and progress and 0 < progress < 100 and not relaxed:
                    await api.merge(f"{budget_path}/held", {"spec": {"minAvailable": 0}})
                    relaxed = True
                if phase == "Succeeded":
                    break
    finally:
        if watcher.returncode is None:
            watcher.kill()
        await watcher.wait()
        await remove_nm(api, name)
    assert relaxed, f"no intermediate progress state was shown: {seen}"
    assert seen[-1] == ("Succeeded", 100), seen
