"""The node lifecycle conditions on the Node (issue 23 part 1, --node-conditions).

nmo runs as the chart's ServiceAccount rendered with ``nodeConditions.enabled``
(RBAC: patch on nodes/status), with the chart's node ValidatingAdmissionPolicy
for that ServiceAccount in force (it matches nodes/status and lets nmo change
only its four condition types there). So a missing permission or a policy
that refuses nmo's own writes fails here, as it would in a cluster.

One maintenance is held by a PodDisruptionBudget (DrainInProgress)
while a second waits for the fleet budget (MaintenancePlanned, queued); a
status rewrite that drops the conditions (what a kubelet that replaces the
status would do) is repaired; a restart neither duplicates nor rewrites
them (audit log); the docs' one-liner finds the node under maintenance;
they go when the maintenances end, kubelet's (kwok's) conditions untouched.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from audit import AuditWindow, nmo_events, show
from chart_identity import RELEASE, RELEASE_NAMESPACE, chart_identity, reset_leader_leases
from objects import Api, pdb, uid
from operator_fixtures import CURRENT, Operator, idle, others_stopped, wait_for
from workloads import bare_pod, running

from nmo.api import constants as c
from nmo_sandbox import Sandbox
from nmo_sandbox.identity import apply_manifest

pytestmark = pytest.mark.integration

CHART = Path(__file__).parents[2] / "charts" / "node-maintenance-operator"
VARIANT = "nodecond"
VALUES = ("nodeConditions.enabled=true",)
FULLNAME = f"{RELEASE}-{VARIANT}"
POLICY = f"{FULLNAME}-node-changes"
PL, IP, DIP, DR = c.NODE_CONDITION_TYPES
GUIDE = Path(__file__).parents[2] / "docs" / "troubleshooting.md"


def guide_line(start: str) -> str:
    """The one command of docs/troubleshooting.md that starts with ``start``."""
    (line,) = {ln for ln in GUIDE.read_text().splitlines() if ln.startswith(start)}
    return line


# Section 2.8: every node under maintenance; section 6.2: the conditions removed by hand.
ONE_LINER = guide_line("kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name}")
BY_HAND = guide_line("kubectl patch node <node-name> --subresource=status")


async def shell(sandbox: Sandbox, command: str) -> str:
    """A guide command, verbatim, in a shell with the sandbox's kubectl and kubeconfig."""
    env = {**os.environ, "PATH": f"{sandbox.bin_dir}:{os.environ['PATH']}"}
    env["KUBECONFIG"] = str(sandbox.kubeconfig)
    proc = await asyncio.create_subprocess_shell(
        command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, f"{command}: {err.decode()}"
    return out.decode()


def conditions(node: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {x["type"]: x for x in (node.get("status") or {}).get("conditions") or []}


def lifecycle(node: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """nmo's conditions on the node, as type -> (status, reason)."""
    return {
        t: (x["status"], x["reason"])
        for t, x in conditions(node).items()
        if t in c.NODE_CONDITION_TYPES
    }


async def kube_version(kube: httpx.AsyncClient) -> str:
    info = (await kube.get("/version")).json()
    return str(info["gitVersion"]).lstrip("v").split("-")[0].split("+")[0]


@pytest.fixture
async def node_policy(sandbox: Sandbox, kube: httpx.AsyncClient) -> AsyncIterator[str]:
    """The chart's node policy for the test identity's ServiceAccount, in force."""
    result = await sandbox.helm(
        "template", RELEASE, str(CHART),
        "-n", RELEASE_NAMESPACE, "--set", f"fullnameOverride={FULLNAME}",
        "--set", "nodePolicy.enabled=true", *(a for v in VALUES for a in ("--set", v)),
        "--kube-version", await kube_version(kube),
        "--show-only", "templates/node-policy.yaml",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert [d["kind"] for d in docs] == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    await apply_manifest(sandbox, result.stdout, (RELEASE_NAMESPACE,))
    yield POLICY
    base = "/apis/admissionregistration.k8s.io/v1"
    await kube.delete(f"{base}/validatingadmissionpolicybindings/{POLICY}")
    await kube.delete(f"{base}/validatingadmissionpolicies/{POLICY}")


async def as_nmo_status_patch(
    kube: httpx.AsyncClient, user: str, node: str, body: dict[str, Any]
) -> httpx.Response:
    """A strategic-merge patch of the node's status, as nmo's ServiceAccount (dry run)."""
    return await kube.patch(
        f"/api/v1/nodes/{node}/status",
        json=body,
        params={"dryRun": "All"},
        headers={
            "Impersonate-User": user,
            "Content-Type": "application/strategic-merge-patch+json",
        },
    )


async def test_lifecycle_conditions_follow_the_maintenance_as_the_charts_identity(
    sandbox: Sandbox,
    kube: httpx.AsyncClient,
    namespace: str,
    node_factory: Any,
    node_policy: str,
    tmp_path: Path,
    operator: Operator,  # installs the CRD; stopped for this test (others_stopped)
) -> None:
    api = Api(kube)
    identity = await chart_identity(sandbox, variant=VARIANT, values=VALUES)
    held, queued = await node_factory(2)

    # The policy is in force for this ServiceAccount on nodes/status: another
    # condition is refused (RBAC alone would allow it), one of nmo's is not.
    ready = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "X"}]}}
    mine = {
        "status": {
            "conditions": [{"type": DR, "status": "False", "reason": "NotStarted", "message": "x"}]
        }
    }

    async def refused() -> bool:
        resp = await as_nmo_status_patch(kube, identity.username, held, ready)
        return resp.status_code == 403 and POLICY in resp.text

    await wait_for(refused, timeout=30, what="the node policy refusing a Ready change")
    label = {"metadata": {"labels": {"pwned": "yes"}}}
    resp = await as_nmo_status_patch(kube, identity.username, held, label)
    assert resp.status_code == 403 and POLICY in resp.text, resp.text
    resp = await as_nmo_status_patch(kube, identity.username, held, mine)
    assert resp.status_code == 200, resp.text

    await bare_pod(api, namespace, "db", held, labels={"app": "db"})
    await running(api, namespace, ["db"])
    budgets = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
    await api.create(budgets, pdb("db", {"app": "db"}, 1))

    async def computed() -> bool:
        st = ((await api.get(f"{budgets}/db")) or {}).get("status") or {}
        return st.get("currentHealthy") == 1 and st.get("disruptionsAllowed") == 0

    await wait_for(computed, what="PDB db computed (no disruption allowed)")
    kwok_before = {t for t in conditions(await api.node(held)) if t not in c.NODE_CONDITION_TYPES}
    assert "Ready" in kwok_before

    await reset_leader_leases(sandbox)
    log_dir = tmp_path / "nmo"
    log_dir.mkdir()
    op = Operator(
        sandbox,
        log_dir,
        ["--node-conditions", "--max-parallel-maintenances", "1"],
        identity=identity,
    )
    first, second = f"nm-{uid()}", f"nm-{uid()}"
    async with others_stopped():
        CURRENT.append(op)
        try:
            await op.start()
            await api.create_nm(first, held)

            async def blocked() -> dict[str, tuple[str, str]] | None:
                got = lifecycle(await api.node(held))
                return got if got.get(DIP) == ("True", "Draining") else None

            got = await wait_for(blocked, what="DrainInProgress=True on the held node")
            assert got == {
                PL: ("False", "Started"),
                IP: ("True", "NodeCordoned"),
                DIP: ("True", "Draining"),
                DR: ("False", "Draining"),
            }, got
            node = await api.node(held)
            assert all(
                x["message"].startswith(f"NodeMaintenance {first}: ")
                for t, x in conditions(node).items()
                if t in c.NODE_CONDITION_TYPES
            )
            assert kwok_before <= set(conditions(node)), "kwok's conditions stay"

            await api.create_nm(second, queued)

            async def planned() -> dict[str, tuple[str, str]] | None:
                got = lifecycle(await api.node(queued))
                return got if got.get(PL) == ("True", "BudgetExhausted") else None

            got = await wait_for(planned, what="MaintenancePlanned=True on the queued node")
            assert got[IP] == ("False", "NotStarted"), got

            # The docs' one-liner finds the node under maintenance, not the queued one.
            assert (await shell(sandbox, ONE_LINER)).split() == [held]

            # A status rewrite that drops them (a kubelet replacing the status):
            # nmo writes them again, from the node it observes.
            node = await api.node(held)
            node["status"]["conditions"] = [
                x for x in node["status"]["conditions"] if x["type"] not in c.NODE_CONDITION_TYPES
            ]
            resp = await kube.put(f"/api/v1/nodes/{held}/status", json=node)
            assert resp.status_code == 200, resp.text
            await wait_for(blocked, what="the dropped conditions written again")
            before = conditions(await api.node(held))

            async def cr_blocked() -> bool:
                cr = await api.nm(first) or {}
                conds = (cr.get("status") or {}).get("conditions") or []
                return any(x["type"] == "Drained" and x["reason"] == "Blocked" for x in conds)

            # The CR says Blocked (known from the refused evictions, in memory):
            # the restart below must not flip the node's conditions through it.
            await wait_for(cr_blocked, what="the CR's Drained condition Blocked")
            assert conditions(await api.node(held)) == before

            # A restart (a new leader) derives them from the node: no duplicate,
            # no rewrite, lastTransitionTime kept.
            window = await AuditWindow.open(sandbox)
            await op.restart()
            await idle(op.metrics_port)
            writes = [
                e
                for e in nmo_events(window.events())
                if e.is_write and e.on("nodes", subresource="status")
            ]
            assert writes == [], show(writes)
            after = await api.node(held)
            types = [x["type"] for x in after["status"]["conditions"]]
            assert len(types) == len(set(types)), types
            assert {t: conditions(after)[t] for t in c.NODE_CONDITION_TYPES} == {
                t: before[t] for t in c.NODE_CONDITION_TYPES
            }

            # The PDB lets go: Drained; then the CR goes and so do they; the
            # queued maintenance starts (no pods: drained at once).
            await api.delete(f"{budgets}/db")

            async def drained() -> bool:
                return lifecycle(await api.node(held)).get(DR) == ("True", "Drained")

            await wait_for(drained, what="Drained=True once the pod left")
            assert lifecycle(await api.node(held))[DIP] == ("False", "Drained")
            await api.delete_nm_and_wait_gone(first)

            async def cleared() -> bool:
                return lifecycle(await api.node(held)) == {}

            await wait_for(cleared, what="the conditions removed with the maintenance")
            assert kwok_before <= set(conditions(await api.node(held)))

            async def started() -> bool:
                return lifecycle(await api.node(queued)).get(DR) == ("True", "Drained")

            await wait_for(started, what="the queued maintenance started and drained")
            assert lifecycle(await api.node(queued))[PL] == ("False", "Started")
            await api.delete_nm_and_wait_gone(second)

            async def cleared_too() -> bool:
                return lifecycle(await api.node(queued)) == {}

            await wait_for(cleared_too, what="the second node's conditions removed")
        finally:
            op.kill(signal.SIGTERM)
            CURRENT.remove(op)
            await reset_leader_leases(sandbox)

    # Left behind (nmo was down when the CR went): section 6.2's command
    # removes them and nothing else.
    left = {"status": {"conditions": [before[t] for t in c.NODE_CONDITION_TYPES]}}
    resp = await kube.patch(
        f"/api/v1/nodes/{held}/status",
        json=left,
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )
    assert resp.status_code == 200, resp.text
    assert set(lifecycle(await api.node(held))) == set(c.NODE_CONDITION_TYPES)
    await shell(sandbox, BY_HAND.replace("<node-name>", held))
    node = await api.node(held)
    assert lifecycle(node) == {} and kwok_before <= set(conditions(node))


async def test_conditions_of_a_gone_cr_are_removed_queued_or_deleted_while_nmo_was_down(
    sandbox: Sandbox,
    kube: httpx.AsyncClient,
    node_factory: Any,
    node_policy: str,
    tmp_path: Path,
    operator: Operator,  # installs the CRD; stopped for this test (others_stopped)
) -> None:
    """A queued CR has no finalizer: deleting it gives nmo no pass of its own, and
    its MaintenancePlanned=True stayed on the node for good. nmo now removes
    the conditions of a CR it sees gone, and at its start those naming a CR
    deleted while it was down; a live maintenance's conditions stay."""
    api = Api(kube)
    identity = await chart_identity(sandbox, variant=VARIANT, values=VALUES)
    held, queued = await node_factory(2)
    await reset_leader_leases(sandbox)
    log_dir = tmp_path / "nmo"
    log_dir.mkdir()
    op = Operator(
        sandbox,
        log_dir,
        ["--node-conditions", "--max-parallel-maintenances", "1"],
        identity=identity,
    )
    first, second = f"nm-{uid()}", f"nm-{uid()}"
    async with others_stopped():
        CURRENT.append(op)
        try:
            await op.start()
            await api.create_nm(first, held)

            async def drained() -> bool:
                return lifecycle(await api.node(held)).get(DR) == ("True", "Drained")

            await wait_for(drained, what="the first maintenance drained (it holds the budget)")
            await api.create_nm(second, queued)

            async def planned() -> bool:
                return lifecycle(await api.node(queued)).get(PL) == ("True", "BudgetExhausted")

            await wait_for(planned, what="MaintenancePlanned=True on the queued node")
            cr = await api.nm(second) or {}
            assert c.FINALIZER not in (cr["metadata"].get("finalizers") or []), cr["metadata"]
            await api.delete_nm_and_wait_gone(second)

            async def cleared() -> bool:
                return lifecycle(await api.node(queued)) == {}

            await wait_for(cleared, timeout=30, what="the deleted queued CR's conditions gone")
            assert set(lifecycle(await api.node(held))) == set(c.NODE_CONDITION_TYPES)

            # Deleted while nmo was down (here: conditions naming a CR that does
            # not exist): the new leader's sweep removes them, not the live ones.
            op.kill(signal.SIGTERM)
            gone = f"nm-{uid()}"
            stale = [
                {
                    "type": t,
                    "status": "True",
                    "reason": "Admitted",
                    "message": f"NodeMaintenance {gone}: x",
                }
                for t in c.NODE_CONDITION_TYPES
            ]
            resp = await kube.patch(
                f"/api/v1/nodes/{queued}/status",
                json={"status": {"conditions": stale}},
                headers={"Content-Type": "application/strategic-merge-patch+json"},
            )
            assert resp.status_code == 200, resp.text
            assert set(lifecycle(await api.node(queued))) == set(c.NODE_CONDITION_TYPES)
            await op.start()
            await wait_for(cleared, timeout=30, what="the leader's sweep removing them")
            assert set(lifecycle(await api.node(held))) == set(c.NODE_CONDITION_TYPES)
            assert f"maintenance {gone}: gone; its lifecycle conditions removed" in op.logs()
            await api.delete_nm_and_wait_gone(first)

            async def held_cleared() -> bool:
                return lifecycle(await api.node(held)) == {}

            await wait_for(held_cleared, what="the first maintenance's conditions removed")
        finally:
            op.kill(signal.SIGTERM)
            CURRENT.remove(op)
            await reset_leader_leases(sandbox)


async def test_the_node_policy_keeps_the_rest_of_the_status_from_nmo(
    sandbox: Sandbox,
    kube: httpx.AsyncClient,
    node_factory: Any,
    node_policy: str,
    operator: Operator,  # installs the CRD
) -> None:
    """As nmo's ServiceAccount with nodes/status granted, only the four lifecycle
    conditions change: the node's images (the scheduler's ImageLocality) and
    the fields newer servers have (runtimeHandlers, features, declaredFeatures,
    in the policy as rendered for this server) are refused too. The images were
    let through before. A condition of nmo's still passes: the policy compiles
    on this server with the fields its version has."""
    identity = await chart_identity(sandbox, variant=VARIANT, values=VALUES)
    (node,) = await node_factory(1)
    mine = {
        "status": {
            "conditions": [{"type": DR, "status": "False", "reason": "NotStarted", "message": "x"}]
        }
    }

    async def in_force() -> bool:
        ready = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "X"}]}}
        resp = await as_nmo_status_patch(kube, identity.username, node, ready)
        return resp.status_code == 403 and POLICY in resp.text

    await wait_for(in_force, timeout=30, what="the node policy in force")
    resp = await as_nmo_status_patch(kube, identity.username, node, mine)
    assert resp.status_code == 200, resp.text
    images = {"status": {"images": [{"names": ["evil.example/pwn:latest"], "sizeBytes": 1}]}}
    resp = await as_nmo_status_patch(kube, identity.username, node, images)
    assert resp.status_code == 403 and POLICY in resp.text, resp.text
    handlers = {"status": {"runtimeHandlers": [{"name": "evil"}]}}
    resp = await as_nmo_status_patch(kube, identity.username, node, handlers)
    assert resp.status_code == 403 and POLICY in resp.text, resp.text
