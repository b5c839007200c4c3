"""Workload manifests for the sandbox's users (demo, tests, benchmarks).

kwok runs no containers, so the images are placeholders; what matters is the
shape the scheduler, the ReplicaSet controller and the disruption controller
see.
"""

from __future__ import annotations

from typing import Any


def pod_spec(
    *,
    grace: int = 1,
    node_selector: dict[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A one-container pod spec with a short grace period (kwok honours it)."""
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": grace,
        "containers": [{"name": "app", "image": "registry.example/app:1"}],
        **extra,
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    return spec


def deployment(
    name: str, replicas: int, spec: dict[str, Any], labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """An apps/v1 Deployment of ``replicas`` pods with ``spec``, selected by ``labels``."""
    labels = labels or {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }


def prefer_node(node: str) -> dict[str, Any]:
    """Affinity that prefers ``node`` (pods start there, replacements go elsewhere)."""
    return {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "preference": {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
                        ]
                    },
                }
            ]
        }
    }
