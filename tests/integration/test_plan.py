"""``nmo plan`` and the webhook's PDB warnings on the real sandbox (issue 13, items 3 and 5).

A node whose pods a PodDisruptionBudget never lets go (minAvailable equal to
the pods it selects) is planned as blocked, with the PDB's live figures;
relaxing the PDB unblocks it. The webhook test registers nmo's webhook with
the sandbox's apiserver (the module fixture of ``test_webhook.py``) and reads
the warning the way a user does: on real ``kubectl create``'s stderr.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import httpx
import pytest
from objects import NM, Api, pdb, uid
from operator_fixtures import wait_for
from test_webhook import webhook  # noqa: F401 - the module fixture, used by name
from workloads import bare_pod, running

from nmo_sandbox import Sandbox

pytestmark = pytest.mark.integration

RULE = "nodemaintenance.medik8s.io/drain"
ORDER = "nodemaintenance.medik8s.io/drain-order"
PDBS = "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"


@pytest.fixture
async def api(kube: httpx.AsyncClient) -> Api:
    return Api(kube)


async def nmo(sandbox: Sandbox, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m nmo ARGS --kubeconfig <sandbox>``, stdin closed."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "LEASE_NAMESPACE")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "nmo",
        *args,
        "--kubeconfig",
        str(sandbox.kubeconfig),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return subprocess.CompletedProcess(args, proc.returncode or 0, out.decode(), err.decode())


async def budget_settles(api: Api, ns: str, name: str, *, healthy: int, allowed: int) -> None:
    """Wait until the disruption controller has computed the PDB's status."""

    async def computed() -> bool:
        obj = await api.get(f"{PDBS.format(ns=ns)}/{name}")
        st = (obj or {}).get("status") or {}
        return (
            st.get("observedGeneration") == (obj or {}).get("metadata", {}).get("generation")
            and st.get("currentHealthy") == healthy
            and st.get("disruptionsAllowed") == allowed
        )

    await wait_for(computed, what=f"PDB {name}: {healthy} healthy, {allowed} allowed")


async def blocked_node(api: Api, ns: str, node_factory: Any) -> str:
    """A node with two web pods under a never-allowing PDB, plus one pod per drain rule."""
    (node,) = await node_factory(1)
    await bare_pod(api, ns, "web-1", node, labels={"app": "web"})
    await bare_pod(api, ns, "web-2", node, labels={"app": "web"})
    await bare_pod(api, ns, "cache", node, labels={RULE: "skip"})
    await bare_pod(api, ns, "job", node, labels={RULE: "wait-completed"})
    await bare_pod(api, ns, "db", node, labels={"app": "db"}, annotations={ORDER: "1"})
    await running(api, ns, ["web-1", "web-2", "cache", "job", "db"])
    await api.create(PDBS.format(ns=ns), pdb("web-pdb", {"app": "web"}, 2))
    await budget_settles(api, ns, "web-pdb", healthy=2, allowed=0)
    return node


async def test_plan_blocked_by_a_pdb_then_relaxed(
    sandbox: Sandbox, api: Api, namespace: str, node_factory: Any
) -> None:
    node = await blocked_node(api, namespace, node_factory)
    ns = namespace
    verdict = (
        f"{node}: 3 pods to evict, 1 waited on, 1 skipped; BLOCKED now by PodDisruptionBudget "
        f"{ns}/web-pdb needs 2 healthy and has 2 (0 disruptions allowed), covering 2 pods on "
        f"this node: {ns}/web-1, {ns}/web-2"
    )

    # As the Go NMO, an operator with default flags honours no pod's own rules:
    # so does the preflight. With the namespace allowed, both do.
    default = await nmo(sandbox, "plan", node)
    assert default.stdout.splitlines()[-1].startswith(
        f"{node}: 5 pods to evict, 0 waited on, 0 skipped; BLOCKED now"
    ), default.stdout
    assert "ignoring the drain rules of Pods in namespaces not allowed" in default.stdout
    rules = ("--pod-drain-rules-namespaces", ns)
    text = await nmo(sandbox, "plan", node, *rules)
    print(f"nmo plan {node}:\n{text.stdout}")
    assert text.returncode == 3, text.stderr
    lines = text.stdout.splitlines()
    assert lines[-1] == verdict
    assert "  TO EVICT (3)" in lines
    assert "  WAITED ON (1)" in lines
    assert "  SKIPPED (1)" in lines
    assert f"    1. order 0: {ns}/job, {ns}/web-1, {ns}/web-2" in lines
    assert f"    2. order 1: {ns}/db" in lines
    budget_row = next(line for line in lines if line.startswith(f"    {ns}/web-pdb "))
    figures = ["2", "2", "0", "2", "0", "BLOCKS"]
    assert budget_row.split() == [f"{ns}/web-pdb", *figures, f"{ns}/web-1,", f"{ns}/web-2"]

    doc = await nmo(sandbox, "plan", node, *rules, "-o", "json")
    assert doc.returncode == 3, doc.stderr
    out = json.loads(doc.stdout)
    assert (out["schema"], out["blocked"], out["errors"]) == ("nmo.plan/v1", True, [])
    (item,) = out["items"]
    assert item["verdict"] == verdict
    assert item["counts"] == {"evict": 3, "waited": 1, "skipped": 1}
    assert [(p["name"], p["reason"]) for p in item["skipped"]] == [("cache", "DrainRuleSkip")]
    assert [(p["name"], p["reason"]) for p in item["waited"]] == [("job", "WaitingForCompletion")]
    (budget,) = item["disruptionBudgets"]
    assert budget == {
        "namespace": ns,
        "name": "web-pdb",
        "desiredHealthy": 2,
        "currentHealthy": 2,
        "disruptionsAllowed": 0,
        "expectedPods": 2,
        "observed": True,
        "evictionsAtOnce": 0,
        "blocking": True,
        "pods": [f"{ns}/web-1", f"{ns}/web-2"],
        "unhealthyPodsLetGo": [],
    }

    # --pod-selector leaves every other pod alone (the job too): nothing blocks.
    selected = await nmo(sandbox, "plan", node, *rules, "--pod-selector", "app=db")
    assert selected.returncode == 0, selected.stdout + selected.stderr
    assert selected.stdout.splitlines()[-1] == (
        f"{node}: 1 pod to evict, 0 waited on, 4 skipped; nothing blocks now"
    )

    # One disruption allowed: not blocked, but one eviction at a time.
    await api.merge(f"{PDBS.format(ns=ns)}/web-pdb", {"spec": {"minAvailable": 1}})
    await budget_settles(api, ns, "web-pdb", healthy=2, allowed=1)
    relaxed = await nmo(sandbox, "plan", node, *rules)
    assert relaxed.returncode == 0, relaxed.stdout + relaxed.stderr
    assert relaxed.stdout.splitlines()[-1] == (
        f"{node}: 3 pods to evict, 1 waited on, 1 skipped; nothing blocks now "
        f"({ns}/web-pdb allows 1 eviction at once for 2 pods)"
    )
    # Nothing was changed on the node or its pods.
    assert not (await api.node(node)).get("spec", {}).get("unschedulable")
    assert len(await api.pods(ns, node=node)) == 5


async def test_plan_missing_node(sandbox: Sandbox) -> None:
    missing = f"no-such-node-{uid()}"
    result = await nmo(sandbox, "plan", missing)
    assert result.returncode == 1
    assert f'node "{missing}" not found' in result.stderr
    doc = await nmo(sandbox, "plan", missing, "-o", "json")
    assert doc.returncode == 1
    assert json.loads(doc.stdout)["errors"] == [
        {"node": missing, "message": f'node "{missing}" not found'}
    ]


def nm_body(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "reason": "plan test"},
    }


@pytest.mark.usefixtures("webhook")
async def test_webhook_warns_about_a_blocking_pdb(
    sandbox: Sandbox, api: Api, namespace: str, node_factory: Any
) -> None:
    node = await blocked_node(api, namespace, node_factory)
    warning = (
        f"Warning: PodDisruptionBudget {namespace}/web-pdb allows no disruption now "
        f"(needs 2 healthy, has 2): the drain of {node} will wait for it"
    )
    dry = await sandbox.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(nm_body("dry", node))
    )
    assert dry.returncode == 0, dry.stderr
    assert warning in dry.stderr.splitlines(), dry.stderr
    name = f"nm-{uid()}"
    created = await sandbox.kubectl("create", "-f", "-", input=json.dumps(nm_body(name, node)))
    try:
        print(f"kubectl create's stderr:\n{created.stderr}")
        assert created.returncode == 0, created.stderr
        assert warning in created.stderr.splitlines(), created.stderr
        assert f"nodemaintenance.nodemaintenance.medik8s.io/{name} created" in created.stdout
    finally:
        await api.delete(f"{NM}/{name}")
    # A node whose PDBs allow disruptions: no warning.
    (quiet,) = await node_factory(1)
    await bare_pod(api, namespace, "free", quiet, labels={"app": "free"})
    calm = await sandbox.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(nm_body("calm", quiet))
    )
    assert calm.returncode == 0, calm.stderr
    assert "Warning" not in calm.stderr, calm.stderr
