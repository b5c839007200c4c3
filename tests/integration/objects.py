"""Small builders and API helpers for integration tests (admin httpx client)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from operator_fixtures import wait_for

from nmo.api import constants as c
from nmo_sandbox import manifests

NM = "/apis/nodemaintenance.medik8s.io/v1beta1/nodemaintenances"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/medik8s-leases/leases"


def uid() -> str:
    return uuid.uuid4().hex[:6]


def pod_spec(
    node_selector: dict[str, str] | None = None,
    *,
    node_name: str | None = None,
    empty_dir: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "app", "image": "registry.example/app:1"}],
        "tolerations": [
            {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
        ],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    if node_name:
        spec["nodeName"] = node_name
    if empty_dir:
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
        spec["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
    return spec


def deployment(
    name: str, replicas: int, labels: dict[str, str], spec: dict[str, Any]
) -> dict[str, Any]:
    return manifests.deployment(name, replicas, spec, labels)


def pdb(name: str, labels: dict[str, str], min_available: int) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": labels}},
    }


class Api:
    """Thin helpers over the admin client, failing loudly on unexpected answers."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.c = client

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = await self.c.post(path, json=body)
        assert resp.status_code == 201, f"POST {path}: {resp.status_code} {resp.text}"
        return dict(resp.json())

    async def get(self, path: str) -> dict[str, Any] | None:
        resp = await self.c.get(path)
        if resp.status_code == 404:
            return None
        assert resp.status_code == 200, f"GET {path}: {resp.status_code} {resp.text}"
        return dict(resp.json())

    async def merge(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        resp = await self.c.patch(
            path, json=patch, headers={"Content-Type": "application/merge-patch+json"}
        )
        assert resp.status_code == 200, f"PATCH {path}: {resp.status_code} {resp.text}"
        return dict(resp.json())

    async def delete(self, path: str) -> None:
        resp = await self.c.delete(path)
        assert resp.status_code in (200, 202, 404), f"DELETE {path}: {resp.status_code} {resp.text}"

    async def create_nm(
        self, name: str, node: str, reason: str = "integration test"
    ) -> dict[str, Any]:
        return await self.create(
            NM,
            {
                "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
                "kind": "NodeMaintenance",
                "metadata": {"name": name},
                "spec": {"nodeName": node, "reason": reason},
            },
        )

    async def nm(self, name: str) -> dict[str, Any] | None:
        return await self.get(f"{NM}/{name}")

    async def phase(self, name: str) -> str | None:
        obj = await self.nm(name)
        return None if obj is None else (obj.get("status") or {}).get("phase")

    async def node(self, name: str) -> dict[str, Any]:
        obj = await self.get(f"/api/v1/nodes/{name}")
        assert obj is not None, f"node {name} missing"
        return obj

    async def pods(self, namespace: str, *, node: str | None = None) -> list[dict[str, Any]]:
        params = {"fieldSelector": f"spec.nodeName={node}"} if node else {}
        resp = await self.c.get(f"/api/v1/namespaces/{namespace}/pods", params=params)
        assert resp.status_code == 200, resp.text
        return list(resp.json()["items"])

    async def events(self, name: str, reason: str | None = None) -> list[dict[str, Any]]:
        selector = f"involvedObject.name={name}"
        if reason:
            selector += f",reason={reason}"
        resp = await self.c.get(
            "/api/v1/namespaces/default/events", params={"fieldSelector": selector}
        )
        assert resp.status_code == 200, resp.text
        return list(resp.json()["items"])

    async def wait_events(
        self, name: str, reason: str, *, count: int = 1, timeout: float = 15
    ) -> list[dict[str, Any]]:
        """The events of ``reason`` about ``name``, once there are at least ``count``.

        nmo records a pass's events after its writes (status, finalizer, node,
        lease), so the state a test waited for can be seen a few milliseconds
        before its event exists. A caller asserting an exact number compares the
        returned list's length: a surplus is still caught.
        """

        async def recorded() -> list[dict[str, Any]]:
            events = await self.events(name, reason)
            return events if len(events) >= count else []

        return await wait_for(
            recorded, timeout=timeout, what=f"{count} {reason} event(s) about {name}"
        )

    async def lease(self, node: str) -> dict[str, Any] | None:
        return await self.get(f"{LEASES}/node-{node}")

    async def delete_nm_and_wait_gone(self, name: str, timeout: float = 60) -> None:
        """Delete a NodeMaintenance and wait until the API server no longer has it
        (its finalizer removed), so a new CR for the node is not a duplicate."""
        await self.delete(f"{NM}/{name}")

        async def gone() -> bool:
            return await self.nm(name) is None

        await wait_for(gone, timeout=timeout, what=f"NodeMaintenance {name} gone")


NM_KIND = {"group": c.GROUP, "version": c.VERSION, "kind": c.KIND}
NM_RESOURCE = {"group": c.GROUP, "version": c.VERSION, "resource": c.PLURAL}


def create_review(node: str, *, name: str = "review") -> dict[str, Any]:
    """An AdmissionReview of a NodeMaintenance CREATE, as the apiserver posts it."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": NM_KIND,
            "resource": NM_RESOURCE,
            "operation": "CREATE",
            "object": {
                "apiVersion": c.API_VERSION,
                "kind": c.KIND,
                "metadata": {"name": name, "uid": str(uuid.uuid4())},
                "spec": {"nodeName": node},
            },
        },
    }


async def usable_namespace(client: httpx.AsyncClient, name: str, timeout: float = 170) -> None:
    """Namespace ``name``, created when missing, once it is not being deleted.

    Modules of one worker share its sandbox, and some use the same fixed
    namespace (the chart's ``node-maintenance-operator-system``). An earlier
    module's deletion of it may still be running: a pod bound to a node that
    a test deleted goes only when the pod garbage collector takes it (its
    40 s quarantine, then a cycle), and nothing can be created in it before.
    """
    path = f"/api/v1/namespaces/{name}"

    async def usable() -> bool:
        got = await client.get(path)
        if got.status_code == 404:
            created = await client.post(
                "/api/v1/namespaces",
                json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
            )
            assert created.status_code in (201, 409), created.text
            return created.status_code == 201  # 409: someone else's; look at it again
        assert got.status_code == 200, got.text
        return not got.json()["metadata"].get("deletionTimestamp")

    await wait_for(usable, timeout=timeout, interval=0.5, what=f"namespace {name} not terminating")
