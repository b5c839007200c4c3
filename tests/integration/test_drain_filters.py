"""kubectl's drain filters for DaemonSet pods, on the real sandbox (behavior.md A4).

kubectl's ``daemonSetFilter`` (k8s.io/kubectl/pkg/drain/filters.go, which the
Go NMO vendors) lets a finished DaemonSet pod (phase Succeeded or Failed) go
before it looks the DaemonSet up, and calls a controller a DaemonSet only
when its ownerReference says kind ``DaemonSet`` and apiVersion ``apps/v1``.

A finished DaemonSet pod does not stay around by itself: the DaemonSet
controller deletes it. A ValidatingAdmissionPolicy refuses that DELETE
(a pod of the test not yet being deleted), so the pod stays finished on the
node. An eviction deletes the pod without a DELETE admission, and kwok's
final DELETE of a pod being deleted is allowed, so the drain is untouched.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from audit import AuditWindow, nmo_events
from objects import NM, Api, deployment, pod_spec, uid
from operator_fixtures import Operator, wait_for

from nmo_sandbox import Sandbox

pytestmark = pytest.mark.integration

ADMISSION = "/apis/admissionregistration.k8s.io/v1"
HOLD = {"example.com/hold": "yes"}


@pytest.fixture
async def api(kube: httpx.AsyncClient) -> Api:
    return Api(kube)


def hold_policy(name: str, namespace: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A policy and binding refusing the DELETE of the namespace's held pods."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["DELETE"],
                        "resources": ["pods"],
                    }
                ],
            },
            "validations": [
                {
                    "expression": (
                        "has(oldObject.metadata.deletionTimestamp)"
                        " || !has(oldObject.metadata.labels)"
                        " || !('example.com/hold' in oldObject.metadata.labels)"
                    ),
                    "message": "held by the test",
                    "reason": "Forbidden",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return policy, binding


def daemonset(name: str, labels: dict[str, str], node_selector: dict[str, str]) -> dict[str, Any]:
    ds = deployment(name, 0, labels, pod_spec(node_selector))
    ds["kind"] = "DaemonSet"
    del ds["spec"]["replicas"]
    return ds


async def test_finished_daemonset_pod_and_non_apps_v1_owner_are_evicted(
    operator: Operator, api: Api, namespace: str, node_factory: Any, sandbox: Sandbox
) -> None:
    """The finished pod of DaemonSet agent and the pod legacy (owner
    ``apps/v1beta2`` DaemonSet) are evicted; the running pod of DaemonSet
    keeper is not.

    Fails on an nmo that skips every pod owned by an existing DaemonSet
    (finished or not) or takes any ``apps/*`` apiVersion for a DaemonSet: the
    maintenance then succeeds with ``evictionPods: 0`` and both pods stay."""
    (target,) = await node_factory(1)
    ns = namespace
    name = f"hold-{uid()}"
    policy, binding = hold_policy(name, ns)
    await api.create(f"{ADMISSION}/validatingadmissionpolicies", policy)
    await api.create(f"{ADMISSION}/validatingadmissionpolicybindings", binding)
    try:
        # The policy is in force once a held pod cannot be deleted.
        await api.create(
            f"/api/v1/namespaces/{ns}/pods",
            {
                "metadata": {"name": "probe", "labels": HOLD},
                "spec": pod_spec({"example.com/no-such-node": "x"}),
            },
        )

        async def enforced() -> bool:
            resp = await api.c.delete(
                f"/api/v1/namespaces/{ns}/pods/probe", params={"dryRun": "All"}
            )
            assert resp.status_code in (200, 403), resp.text
            return "held by the test" in resp.text

        await wait_for(enforced, what="the hold policy to refuse DELETE")
        await api.merge(f"/api/v1/namespaces/{ns}/pods/probe", {"metadata": {"labels": None}})

        await api.create(
            f"/apis/apps/v1/namespaces/{ns}/daemonsets",
            daemonset("agent", {"app": "agent", **HOLD}, {"kubernetes.io/hostname": target}),
        )
        await api.create(
            f"/apis/apps/v1/namespaces/{ns}/daemonsets",
            daemonset("keeper", {"app": "keeper"}, {"kubernetes.io/hostname": target}),
        )
        # A DaemonSet that runs nowhere, named by a pod whose owner is apps/v1beta2.
        old = await api.create(
            f"/apis/apps/v1/namespaces/{ns}/daemonsets",
            daemonset("old", {"app": "old"}, {"example.com/no-such-node": "x"}),
        )
        legacy_ref = {
            "apiVersion": "apps/v1beta2",
            "kind": "DaemonSet",
            "name": "old",
            "uid": old["metadata"]["uid"][:-6] + uid(),  # not the DaemonSet's: not adopted
            "controller": True,
        }
        legacy = await api.create(
            f"/api/v1/namespaces/{ns}/pods",
            {
                "metadata": {"name": "legacy", "ownerReferences": [legacy_ref]},
                "spec": pod_spec(node_name=target),
            },
        )

        async def daemons_running() -> dict[str, dict[str, Any]] | None:
            found: dict[str, dict[str, Any]] = {}
            for p in await api.pods(ns, node=target):
                app = (p["metadata"].get("labels") or {}).get("app")
                if app in ("agent", "keeper") and p["status"].get("phase") == "Running":
                    found[app] = p
            return found if len(found) == 2 else None

        daemons = await wait_for(daemons_running, what="the DaemonSet pods running")
        finished, keeper = daemons["agent"], daemons["keeper"]
        fin_name = finished["metadata"]["name"]
        resp = await api.c.patch(
            f"/api/v1/namespaces/{ns}/pods/{fin_name}/status",
            json={"status": {"phase": "Succeeded"}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert resp.status_code == 200, resp.text
        assert resp.json()["status"]["phase"] == "Succeeded"

        window = await AuditWindow.open(sandbox)
        nm_name = f"nm-{uid()}"
        await api.create_nm(nm_name, target)

        async def succeeded() -> dict[str, Any] | None:
            obj = await api.nm(nm_name)
            done = obj and (obj.get("status") or {}).get("phase") == "Succeeded"
            return obj if done else None

        nm = await wait_for(succeeded, timeout=90, what=f"{nm_name} Succeeded")
        st = nm["status"]
        assert st["evictionPods"] == 2, st  # the finished DaemonSet pod and legacy
        # keeper's pod, and a replacement of agent's the DaemonSet may have started
        assert st["totalpods"] >= 3, st

        async def gone() -> bool:
            names = {p["metadata"]["name"] for p in await api.pods(ns, node=target)}
            return fin_name not in names and "legacy" not in names

        await wait_for(gone, what="the finished DaemonSet pod and legacy to be gone")
        evictions = [
            e
            for e in nmo_events(await window.close())
            if e.on("pods", subresource="eviction") and e.verb == "create"
        ]
        evicted = {e.name for e in evictions}
        assert evicted == {fin_name, "legacy"}, [str(e) for e in evictions]
        running = {p["metadata"]["uid"] for p in await api.pods(ns, node=target)}
        assert keeper["metadata"]["uid"] in running  # a running DaemonSet pod stays
        assert legacy["metadata"]["uid"] not in running
        await api.delete(f"{NM}/{nm_name}")

        async def nm_gone() -> bool:
            return await api.nm(nm_name) is None

        await wait_for(nm_gone, what=f"{nm_name} removed")
    finally:
        await api.delete(f"{ADMISSION}/validatingadmissionpolicybindings/{name}")
        await api.delete(f"{ADMISSION}/validatingadmissionpolicies/{name}")
