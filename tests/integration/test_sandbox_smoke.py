"""The sandbox is a real cluster: kwok nodes, scheduling, eviction, PDBs, grace periods.

These are the behaviours nmo's drain relies on, checked directly against the
apiserver with the admin httpx client, so a broken sandbox fails here before it
makes an operator test fail for the wrong reason.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from operator_fixtures import wait_for as until

from nmo_sandbox import Sandbox, manifests

if TYPE_CHECKING:
    from conftest import NodeFactory

pytestmark = pytest.mark.integration

Json = dict[str, Any]


async def get_json(kube: httpx.AsyncClient, path: str, **params: str) -> Json:
    resp = await kube.get(path, params=params)
    resp.raise_for_status()
    data: Json = resp.json()
    return data


async def create(kube: httpx.AsyncClient, path: str, body: Json) -> Json:
    resp = await kube.post(path, json=body)
    assert resp.status_code == 201, resp.text
    data: Json = resp.json()
    return data


async def pods(kube: httpx.AsyncClient, ns: str, selector: str) -> list[Json]:
    items: list[Json] = (
        await get_json(kube, f"/api/v1/namespaces/{ns}/pods", labelSelector=selector)
    )["items"]
    return items


def is_running(pod: Json) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    return (
        pod["status"].get("phase") == "Running"
        and ready
        and "deletionTimestamp" not in pod["metadata"]
    )


def deployment(name: str, replicas: int, node_selector: dict[str, str] | None = None) -> Json:
    return manifests.deployment(name, replicas, manifests.pod_spec(node_selector=node_selector))


async def running_pods(
    kube: httpx.AsyncClient, ns: str, app: str, count: int, *, timeout: float = 30.0
) -> list[Json]:
    async def probe() -> list[Json] | None:
        found = [p for p in await pods(kube, ns, f"app={app}") if is_running(p)]
        return found if len(found) == count else None

    return await until(probe, timeout=timeout, what=f"{count} running pods of {app}")


async def evict(kube: httpx.AsyncClient, ns: str, pod: str) -> httpx.Response:
    return await kube.post(
        f"/api/v1/namespaces/{ns}/pods/{pod}/eviction",
        json={
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": ns},
        },
    )


async def test_sandbox_nodes_are_ready_kwok_nodes(
    sandbox: Sandbox, kube: httpx.AsyncClient
) -> None:
    nodes = {
        n["metadata"]["name"]: n
        for n in (await get_json(kube, "/api/v1/nodes", labelSelector="type=kwok"))["items"]
    }
    assert set(sandbox.node_names) <= set(nodes)
    for name in sandbox.node_names:
        node = nodes[name]
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready[0]["status"] == "True"
        # The apiserver canonicalises quantities: 1000 is stored as "1k".
        assert node["status"]["allocatable"]["pods"] in ("1000", "1k")
        assert node["status"]["allocatable"]["cpu"] == "32"
    assert sandbox.timings["ready"] < sandbox.timeout
    assert sandbox.check_alive() is None


async def test_node_factory_nodes_become_ready(
    node_factory: NodeFactory, kube: httpx.AsyncClient
) -> None:
    names = await node_factory(2, labels={"purpose": "smoke"})
    assert names == [f"{node_factory.prefix}-1", f"{node_factory.prefix}-2"]
    for name in names:
        node = await get_json(kube, f"/api/v1/nodes/{name}")
        assert node["metadata"]["labels"]["purpose"] == "smoke"
        assert node["metadata"]["labels"]["kubernetes.io/hostname"] == name


async def test_deployment_pods_run_on_kwok_nodes(kube: httpx.AsyncClient, namespace: str) -> None:
    await create(kube, f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment("web", 3))
    running = await running_pods(kube, namespace, "web", 3)
    kwok_nodes = {
        n["metadata"]["name"]
        for n in (await get_json(kube, "/api/v1/nodes", labelSelector="type=kwok"))["items"]
    }
    for pod in running:
        assert pod["spec"]["nodeName"] in kwok_nodes
        assert pod["status"]["podIP"].startswith("10.244.")


async def test_eviction_moves_pod_off_a_cordoned_node(
    kube: httpx.AsyncClient, namespace: str, node_factory: NodeFactory
) -> None:
    label = {"smoke-evict": uuid.uuid4().hex[:8]}
    (first,) = await node_factory(1, labels=label)
    await create(
        kube,
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        deployment("evictme", 2, node_selector=label),
    )
    before = await running_pods(kube, namespace, "evictme", 2)
    assert {p["spec"]["nodeName"] for p in before} == {first}

    (second,) = await node_factory(1, labels=label)
    resp = await kube.patch(
        f"/api/v1/nodes/{first}",
        json={"spec": {"unschedulable": True}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    resp.raise_for_status()

    victim = before[0]["metadata"]["name"]
    resp = await evict(kube, namespace, victim)
    assert resp.status_code == 201, resp.text

    async def replaced() -> list[Json] | None:
        current = await pods(kube, namespace, "app=evictme")
        names = {p["metadata"]["name"] for p in current}
        running = [p for p in current if is_running(p)]
        return running if victim not in names and len(running) == 2 else None

    after = await until(replaced, what="the evicted pod to be gone and replaced")
    new = [p for p in after if p["metadata"]["name"] != before[1]["metadata"]["name"]]
    assert [p["spec"]["nodeName"] for p in new] == [second]


async def test_pdb_blocks_eviction_with_429(
    kube: httpx.AsyncClient, namespace: str, node_factory: NodeFactory
) -> None:
    label = {"smoke-pdb": uuid.uuid4().hex[:8]}
    await node_factory(1, labels=label)
    await create(
        kube,
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        deployment("guarded", 2, node_selector=label),
    )
    running = await running_pods(kube, namespace, "guarded", 2)
    await create(
        kube,
        f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets",
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "guarded"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "guarded"}}},
        },
    )

    async def computed() -> Json | None:
        pdb = await get_json(
            kube, f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/guarded"
        )
        status = pdb.get("status", {})
        done = status.get("observedGeneration") == pdb["metadata"]["generation"]
        return status if done and status.get("currentHealthy") == 2 else None

    status = await until(computed, what="the disruption controller to compute the PDB")
    assert status["disruptionsAllowed"] == 0

    resp = await evict(kube, namespace, running[0]["metadata"]["name"])
    assert resp.status_code == 429, resp.text
    assert "disruption budget" in resp.text


async def test_kwok_finishes_terminating_pod_after_its_grace_period(
    kube: httpx.AsyncClient, namespace: str, node_factory: NodeFactory
) -> None:
    (node,) = await node_factory(1)
    base = f"/api/v1/namespaces/{namespace}/pods"
    for name, grace in (("slow", 5), ("quick", 0)):
        await create(
            kube,
            base,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": {"app": name}},
                "spec": {
                    "nodeName": node,
                    "terminationGracePeriodSeconds": grace,
                    "containers": [{"name": "app", "image": "registry.invalid/app:1"}],
                },
            },
        )
        await running_pods(kube, namespace, name, 1)

    t0 = time.monotonic()
    resp = await kube.delete(f"{base}/slow")
    assert resp.status_code == 200, resp.text
    assert resp.json()["metadata"]["deletionGracePeriodSeconds"] == 5
    resp = await kube.delete(f"{base}/quick")
    assert resp.status_code == 200, resp.text

    async def gone(name: str) -> bool:
        return (await kube.get(f"{base}/{name}")).status_code == 404

    await until(lambda: gone("quick"), timeout=3, what="the grace-0 pod to be deleted")
    # Watched closely from the start, the slow pod's deletion is seen within a
    # poll of when it happens; deletionTimestamp has second resolution, so
    # allow up to a second early.
    await until(
        lambda: gone("slow"), timeout=10, interval=0.05, what="kwok to finish the terminating pod"
    )
    took = time.monotonic() - t0
    assert took >= 3.9, f"kwok deleted the pod {took:.1f}s into its 5 s grace period"


async def test_audit_log_records_each_request_with_its_user_agent(sandbox: Sandbox) -> None:
    agent = f"smoke-{uuid.uuid4().hex[:8]}"
    async with sandbox.client(user_agent=agent) as client:
        for _ in range(3):
            (await client.get("/api/v1/namespaces/default")).raise_for_status()

    def mine() -> list[Json]:
        lines = sandbox.audit_log.read_text().splitlines()
        return [e for e in map(json.loads, lines) if e.get("userAgent") == agent]

    events = await until(lambda: asyncio.sleep(0, mine()), what="audit events")
    assert len(events) == 3
    assert {e["user"]["username"] for e in events} == {"nmo-admin"}
    assert {e["verb"] for e in events} == {"get"}


async def test_apiserver_restart_keeps_the_cluster_working(
    sandbox: Sandbox, kube: httpx.AsyncClient, namespace: str
) -> None:
    old_pid = sandbox.pids["kube-apiserver"]
    port = sandbox.ports.apiserver
    await sandbox.restart_apiserver()
    assert sandbox.pids["kube-apiserver"] != old_pid
    assert sandbox.ports.apiserver == port
    sandbox.check_alive()
    # Scheduler, controller-manager and kwok reconnect on their own.
    await create(kube, f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment("after", 2))
    # Controllers reconnect with client-go's backoff, which grows across restarts.
    await running_pods(kube, namespace, "after", 2, timeout=120.0)
    await sandbox.wait_nodes_ready(sandbox.node_names, timeout=30)
