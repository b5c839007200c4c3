"""Bare pods on a chosen node, and waiting for them (shared by the drain tests)."""

from __future__ import annotations

from typing import Any

from objects import Api, pod_spec
from operator_fixtures import wait_for


async def bare_pod(
    api: Api,
    ns: str,
    name: str,
    node: str,
    labels: dict[str, str] | None = None,
    *,
    annotations: dict[str, str] | None = None,
    grace: int = 1,
    priority_class: str | None = None,
) -> dict[str, Any]:
    """A pod bound to ``node`` directly (no controller), kwok runs it at once."""
    spec = pod_spec(node_name=node)
    spec["terminationGracePeriodSeconds"] = grace
    if priority_class:
        spec["priorityClassName"] = priority_class
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "spec": spec,
    }
    return await api.create(f"/api/v1/namespaces/{ns}/pods", body)


async def running(api: Api, ns: str, names: list[str]) -> None:
    async def check() -> bool:
        pods = {p["metadata"]["name"]: p for p in await api.pods(ns)}
        return all((pods.get(n) or {}).get("status", {}).get("phase") == "Running" for n in names)

    await wait_for(check, what=f"pods {names} running")
