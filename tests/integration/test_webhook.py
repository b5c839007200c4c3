"""The validating webhook, called by a real kube-apiserver over TLS (behavior.md A6, B8).

nmo's webhook server runs in this test process on a free 127.0.0.1 port with a
certificate signed by the sandbox CA; a ValidatingWebhookConfiguration points
the sandbox's apiserver at it by URL. Everything the user sees is checked
through real ``kubectl`` or real API requests.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from operator_fixtures import wait_for as until
from webhook_replica import WebhookReplica

from nmo.api.constants import (
    CONTROL_PLANE_ROLE_LABEL,
    ETCD_GUARD_PDB,
    ETCD_GUARD_PDB_OLD,
    ETCD_NAMESPACE,
    WEBHOOK_NAME,
    Messages,
)
from nmo.api.crd import crd
from nmo.kube.client import Kube
from nmo.kube.informer import Informer
from nmo.webhooks.lookups import MAINTENANCES_PATH, NODES_PATH, LookupSettings, build_lookups
from nmo.webhooks.validators import POD_DELETION_WARNING, validate_create
from nmo_sandbox import Sandbox

if TYPE_CHECKING:
    from pathlib import Path

    from conftest import NodeFactory

pytestmark = pytest.mark.integration

Json = dict[str, Any]
NM = MAINTENANCES_PATH
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
VWC = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
OPENSHIFT_CRD = "clusterversions.config.openshift.io"
DENIED = f'admission webhook "{WEBHOOK_NAME}" denied the request: '


def nm(name: str, node: str) -> Json:
    return {
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "reason": "webhook test"},
    }


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def ensure(kube: httpx.AsyncClient, path: str, body: Json) -> None:
    resp = await kube.post(path, json=body)
    assert resp.status_code in (201, 409), resp.text


async def install_crd(kube: httpx.AsyncClient, body: Json) -> None:
    await ensure(kube, CRDS, body)
    name = body["metadata"]["name"]

    async def established() -> bool:
        status = (await kube.get(f"{CRDS}/{name}")).json().get("status") or {}
        conds = status.get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    await until(established, what=f"CRD {name} to be established")


Webhook = WebhookReplica


async def dry_run_missing_node(kube: httpx.AsyncClient) -> httpx.Response:
    return await kube.post(
        NM, params={"dryRun": "All"}, json=nm(unique("probe"), unique("no-such-node"))
    )


@pytest.fixture(scope="module")
async def webhook(
    sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Webhook]:
    """nmo's webhook server, registered with the sandbox apiserver for this module."""
    async with sandbox.client() as kube:
        await install_crd(kube, crd())
        certs = tmp_path_factory.mktemp("webhook-certs")
        serving = sandbox.issue_serving_cert(certs, ["127.0.0.1"], name="apiserver")
        # openshift_ttl=0: the quorum test flips discovery on and off.
        hook = await WebhookReplica.start(
            sandbox, certs, settings=LookupSettings(openshift_ttl=0.0)
        )
        name = unique("nmo-test")
        await ensure(
            kube,
            VWC,
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": name},
                "webhooks": [
                    {
                        "name": WEBHOOK_NAME,
                        "clientConfig": {
                            "url": hook.url,
                            "caBundle": base64.b64encode(serving.ca_bundle).decode(),
                        },
                        "rules": [
                            {
                                "apiGroups": ["nodemaintenance.medik8s.io"],
                                "apiVersions": ["v1beta1"],
                                "operations": ["CREATE", "UPDATE"],
                                "resources": ["nodemaintenances"],
                                "scope": "*",
                            }
                        ],
                        "failurePolicy": "Fail",
                        "sideEffects": "None",
                        "admissionReviewVersions": ["v1"],
                        "timeoutSeconds": 10,
                    }
                ],
            },
        )

        async def effective() -> bool:
            return (await dry_run_missing_node(kube)).status_code == 403

        await until(effective, what="the apiserver to call the webhook")
        try:
            yield hook
        finally:
            await kube.delete(f"{VWC}/{name}")

            async def gone() -> bool:
                return (await dry_run_missing_node(kube)).status_code == 201

            # A stale Fail-policy webhook would refuse every later test's CRs.
            await until(gone, what="the apiserver to stop calling the webhook")
            await hook.stop()


async def kubectl_create(sandbox: Sandbox, obj: Json) -> tuple[int, str]:
    result = await sandbox.kubectl("create", "-f", "-", input=json.dumps(obj))
    return result.returncode, result.stderr.strip()


async def test_missing_node_is_refused_by_kubectl(sandbox: Sandbox, webhook: Webhook) -> None:
    def served() -> dict[str, float]:
        read = webhook.metrics.registry.get_sample_value
        out = {
            result: read("nmo_webhook_admissions_total", {"operation": "CREATE", "result": result})
            or 0.0
            for result in ("allowed", "denied", "error")
        }
        out["answered"] = read("nmo_webhook_admission_duration_seconds_count") or 0.0
        return out

    before = served()
    node = unique("missing")
    code, stderr = await kubectl_create(sandbox, nm(unique("nm"), node))
    assert code != 0
    assert DENIED + Messages.WEBHOOK_NO_NODE.format(node=node) in stderr
    after = served()
    # One review, one denial: the API server asked once and was told no.
    assert {k: after[k] - before[k] for k in after} == {
        "allowed": 0,
        "denied": 1,
        "error": 0,
        "answered": 1,
    }


async def test_duplicate_and_node_name_change_are_refused(
    sandbox: Sandbox, kube: httpx.AsyncClient, webhook: Webhook, node_factory: NodeFactory
) -> None:
    node, other = await node_factory(2)
    first = unique("first")
    code, stderr = await kubectl_create(sandbox, nm(first, node))
    assert code == 0, stderr
    try:
        code, stderr = await kubectl_create(sandbox, nm(unique("second"), node))
        assert code != 0
        assert DENIED + Messages.WEBHOOK_DUPLICATE.format(node=node) in stderr

        patch = json.dumps({"spec": {"nodeName": other}})
        result = await sandbox.kubectl("patch", "nm", first, "--type=merge", "-p", patch)
        assert result.returncode != 0
        # The CRD's own rule (CEL) answers before the webhook, with the same
        # words the Go NMO's suite and scripts look for.
        refused = f'spec.nodeName: Invalid value: "{other}": {Messages.WEBHOOK_NODENAME_CHANGED}'
        assert refused in result.stderr, result.stderr

        reason = json.dumps({"spec": {"reason": "still allowed"}})
        result = await sandbox.kubectl("patch", "nm", first, "--type=merge", "-p", reason)
        assert result.returncode == 0, result.stderr
    finally:
        await kube.delete(f"{NM}/{first}")


async def test_cr_being_deleted_still_counts(
    sandbox: Sandbox, kube: httpx.AsyncClient, webhook: Webhook, node_factory: NodeFactory
) -> None:
    (node,) = await node_factory(1)
    held = unique("held")
    body = nm(held, node)
    body["metadata"]["finalizers"] = ["test.nmo/hold"]
    assert (await kube.post(NM, json=body)).status_code == 201
    try:
        await kube.delete(f"{NM}/{held}")

        async def terminating() -> bool:
            obj = (await kube.get(f"{NM}/{held}")).json()
            return bool(obj.get("metadata", {}).get("deletionTimestamp"))

        await until(terminating, what="the CR to be terminating")
        code, stderr = await kubectl_create(sandbox, nm(unique("next"), node))
        assert code != 0
        assert DENIED + Messages.WEBHOOK_DUPLICATE.format(node=node) in stderr
    finally:
        await kube.patch(
            f"{NM}/{held}",
            json={"metadata": {"finalizers": None}},
            headers={"Content-Type": "application/merge-patch+json"},
        )


async def test_server_dry_run_does_not_hold_the_node(
    sandbox: Sandbox, kube: httpx.AsyncClient, webhook: Webhook, node_factory: NodeFactory
) -> None:
    (node,) = await node_factory(1)
    dry = await sandbox.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(nm("dry", node))
    )
    assert dry.returncode == 0, dry.stderr
    name = unique("real")
    code, stderr = await kubectl_create(sandbox, nm(name, node))
    assert code == 0, stderr
    await kube.delete(f"{NM}/{name}")


async def test_delete_at_the_deadline_warns_that_nmo_may_not_delete_pods(
    sandbox: Sandbox, kube: httpx.AsyncClient, webhook: Webhook, node_factory: NodeFactory
) -> None:
    """The webhook runs as the chart's ServiceAccount (default values: no delete on
    pods): a CR asking for onTimeout Delete is admitted, with a warning naming the
    chart value, on CREATE and on an UPDATE that turns to Delete; Abort is not."""
    (node,) = await node_factory(1)
    warning = f"Warning: {POD_DELETION_WARNING}"
    delete = {"timeoutSeconds": 600, "onTimeout": "Delete"}
    asks = nm(unique("deleting"), node) | {"spec": {"nodeName": node, "drain": delete}}
    dry = await sandbox.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(asks))
    assert dry.returncode == 0, dry.stderr
    assert warning in dry.stderr, dry.stderr
    assert "drain.allowPodDeletion=true" in dry.stderr
    aborts = nm(unique("aborting"), node) | {
        "spec": {"nodeName": node, "drain": {"timeoutSeconds": 600, "onTimeout": "Abort"}}
    }
    quiet = await sandbox.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(aborts))
    assert quiet.returncode == 0 and "allowPodDeletion" not in quiet.stderr, quiet.stderr
    name = unique("turning")
    code, stderr = await kubectl_create(sandbox, nm(name, node))
    assert code == 0 and "allowPodDeletion" not in stderr, stderr
    try:
        patch = json.dumps({"spec": {"drain": delete}})
        turned = await sandbox.kubectl(
            "patch", "nm", name, "--type=merge", "-p", patch, "--dry-run=server"
        )
        assert turned.returncode == 0, turned.stderr
        assert warning in turned.stderr, turned.stderr
    finally:
        await kube.delete(f"{NM}/{name}")


async def test_a_volume_detach_wait_without_a_deadline_is_refused_clearly(
    sandbox: Sandbox, webhook: Webhook, node_factory: NodeFactory
) -> None:
    """spec.drain.waitForVolumeDetach.timeoutSeconds: 1 s to a day; 0 would wait
    forever (the schema lets it through, the webhook says why not); past a day
    the CRD's schema refuses it before the webhook is asked (without the
    webhook, a huge value crashed every pass)."""
    (node,) = await node_factory(1)

    def asking(timeout: int) -> Json:
        wait = {"waitForVolumeDetach": {"enabled": True, "timeoutSeconds": timeout}}
        return nm(unique("volumes"), node) | {"spec": {"nodeName": node, "drain": wait}}

    dry = await sandbox.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(asking(0))
    )
    assert dry.returncode != 0
    assert (
        DENIED + "spec.drain.waitForVolumeDetach.timeoutSeconds must be between 1 and "
        "86400 seconds (got 0): nmo never waits for volumes without a deadline"
    ) in dry.stderr, dry.stderr
    dry = await sandbox.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(asking(86401))
    )
    assert dry.returncode != 0
    assert (
        "spec.drain.waitForVolumeDetach.timeoutSeconds: Invalid value: 86401: "
        "spec.drain.waitForVolumeDetach.timeoutSeconds in body should be less than or "
        "equal to 86400"
    ) in dry.stderr, dry.stderr
    good = await sandbox.kubectl(
        "create", "--dry-run=server", "-f", "-", input=json.dumps(asking(600))
    )
    assert good.returncode == 0, good.stderr


async def test_fifty_concurrent_creates_admit_exactly_one(
    kube: httpx.AsyncClient, webhook: Webhook, node_factory: NodeFactory
) -> None:
    (node,) = await node_factory(1)
    names = [unique(f"race{i}") for i in range(50)]
    answers = await asyncio.gather(*(kube.post(NM, json=nm(n, node)) for n in names))
    created = [n for n, r in zip(names, answers, strict=True) if r.status_code == 201]
    try:
        assert len(created) == 1, [r.status_code for r in answers]
        refused = [r for r in answers if r.status_code != 201]
        assert all(r.status_code == 403 for r in refused)
        duplicate = Messages.WEBHOOK_DUPLICATE.format(node=node)
        assert all(duplicate in r.json()["message"] for r in refused)
        listed = (await kube.get(NM)).json()["items"]
        assert [o["metadata"]["name"] for o in listed if o["spec"]["nodeName"] == node] == created
    finally:
        for name in created:
            await kube.delete(f"{NM}/{name}")


async def test_a_failed_node_lookup_reads_as_the_go_nmo_with_the_api_error(
    sandbox: Sandbox, namespace: str, node_factory: NodeFactory, tmp_path: Path
) -> None:
    """The Go NMO wraps the client's error twice: ``could not get node for
    validating spec.NodeName, please try again: could not get node: <err>``,
    ``<err>`` being the API server's Status message. A ServiceAccount that may
    not read Nodes gets exactly that from the real API server."""
    (node,) = await node_factory(1)
    kubeconfig = await sandbox.service_account_kubeconfig(
        namespace, "default", tmp_path / "sa.kubeconfig"
    )
    client = await Kube.connect(kubeconfig=str(kubeconfig))
    try:
        # The caches never sync without RBAC: the node is looked up with a GET.
        lookups = build_lookups(
            client,
            nodes=Informer(client, NODES_PATH, name="nodes"),
            maintenances=Informer(client, MAINTENANCES_PATH, name="nodemaintenances"),
        )
        decision = await validate_create(nm(unique("nm"), node), lookups, claimant="test")
    finally:
        await client.close()
    user = f"system:serviceaccount:{namespace}:default"
    assert not decision.allowed
    assert decision.result == "error"
    assert decision.message == (
        "could not get node for validating spec.NodeName, please try again: "
        f'could not get node: nodes "{node}" is forbidden: User "{user}" '
        'cannot get resource "nodes" in API group "" at the cluster scope'
    )


# -- OpenShift etcd quorum ----------------------------------------------------------

PDBS = f"/apis/policy/v1/namespaces/{ETCD_NAMESPACE}/poddisruptionbudgets"
PODS = f"/api/v1/namespaces/{ETCD_NAMESPACE}/pods"
GUARD = {"app": "guard", "test": uuid.uuid4().hex[:6]}


def openshift_crd() -> Json:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": OPENSHIFT_CRD},
        "spec": {
            "group": "config.openshift.io",
            "names": {"kind": "ClusterVersion", "plural": "clusterversions"},
            "scope": "Cluster",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


def pdb(name: str) -> Json:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": GUARD}},
    }


def guard_pod(node: str) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"guard-{node}", "labels": GUARD},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "guard", "image": "registry.invalid/etcd-guard:1"}],
            "tolerations": [{"operator": "Exists"}],
        },
    }


async def discovery(kube: httpx.AsyncClient, *, served: bool) -> None:
    async def matches() -> bool:
        code = (await kube.get("/apis/config.openshift.io/v1")).status_code
        return (code == 200) is served

    await until(matches, what=f"config.openshift.io/v1 discovery served={served}")


async def disruptions(kube: httpx.AsyncClient, *, healthy: int, allowed: int) -> None:
    async def computed() -> bool:
        obj = (await kube.get(f"{PDBS}/{ETCD_GUARD_PDB}")).json()
        status = obj.get("status") or {}
        return (
            status.get("observedGeneration") == obj["metadata"]["generation"]
            and status.get("currentHealthy") == healthy
            and status.get("disruptionsAllowed") == allowed
        )

    await until(computed, what=f"the PDB to show {healthy} healthy, {allowed} allowed")


async def set_guard_conditions(kube: httpx.AsyncClient, node: str, conditions: list[Json]) -> None:
    """Replace the guard pod's conditions (a merge patch replaces the whole list)."""
    resp = await kube.patch(
        f"{PODS}/guard-{node}/status",
        json={"status": {"conditions": conditions}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert resp.status_code == 200, resp.text
    stored = [(c["type"], c["status"]) for c in resp.json()["status"]["conditions"]]
    assert stored == [(c["type"], c["status"]) for c in conditions]


async def admitted(kube: httpx.AsyncClient, node: str) -> str:
    """A dry-run create of a CR for the node: "" when admitted, else the refusal.

    Dry run: the webhook answers as for a real create, and no CR is stored, so
    the next question about the same node never meets this one in the
    webhook's cache (a real create and delete would, until the informer sees
    the deletion).
    """
    name = unique("q")
    resp = await kube.post(NM, json=nm(name, node), params={"dryRun": "All"})
    if resp.status_code == 201:
        return ""
    assert resp.status_code == 403, resp.text
    message: str = resp.json()["message"]
    return message


async def test_openshift_quorum_matrix(
    kube: httpx.AsyncClient, webhook: Webhook, node_factory: NodeFactory
) -> None:
    cp = {CONTROL_PLANE_ROLE_LABEL: ""}
    a, b, c = await node_factory(3, labels=cp)
    (unguarded,) = await node_factory(1, labels=cp)
    (worker,) = await node_factory(1)
    refused = {n: DENIED + Messages.WEBHOOK_QUORUM.format(node=n) for n in (a, b, c)}
    await install_crd(kube, openshift_crd())
    try:
        await discovery(kube, served=True)
        await ensure(
            kube,
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ETCD_NAMESPACE}},
        )

        async def sa() -> bool:
            url = f"/api/v1/namespaces/{ETCD_NAMESPACE}/serviceaccounts/default"
            return (await kube.get(url)).status_code == 200

        await until(sa, what="the default ServiceAccount in openshift-etcd")

        # No PDB at all: the quorum cannot be assessed, control-plane refused.
        assert await admitted(kube, a) == refused[a]
        assert await admitted(kube, worker) == ""

        for node in (a, b, c):
            await ensure(kube, PODS, guard_pod(node))
        await ensure(kube, PDBS, pdb(ETCD_GUARD_PDB))
        await disruptions(kube, healthy=3, allowed=1)
        assert await admitted(kube, b) == ""  # one disruption allowed

        # Guard on a goes NotReady: no disruption left, but a is already disrupted.
        resp = await kube.patch(
            f"{PODS}/guard-{a}/status",
            json={"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )
        assert resp.status_code == 200, resp.text
        await disruptions(kube, healthy=2, allowed=0)
        assert await admitted(kube, a) == ""  # its guard is not Ready
        assert await admitted(kube, b) == refused[b]  # guard Ready, 0 allowed

        # medik8s/common reads a guard pod without any Ready condition as not
        # Ready (allowed), and a Ready condition Unknown as Ready (refused).
        await set_guard_conditions(kube, a, [{"type": "PodScheduled", "status": "True"}])
        assert await admitted(kube, a) == ""
        await set_guard_conditions(kube, a, [{"type": "Ready", "status": "Unknown"}])
        assert await admitted(kube, a) == refused[a]
        await set_guard_conditions(kube, a, [{"type": "Ready", "status": "False"}])
        assert await admitted(kube, unguarded) == ""  # no guard pod on the node
        assert await admitted(kube, worker) == ""  # not a control-plane node

        # Two PDBs (the pre-4.11 name as well): refused even for a disrupted node.
        await ensure(kube, PDBS, pdb(ETCD_GUARD_PDB_OLD))
        assert await admitted(kube, a) == refused[a]
        await kube.delete(f"{PDBS}/{ETCD_GUARD_PDB_OLD}")
        assert await admitted(kube, a) == ""

        # Not OpenShift any more: no quorum check at all.
        await kube.delete(f"{PDBS}/{ETCD_GUARD_PDB}")
        assert await admitted(kube, b) == refused[b]  # no PDB
        await kube.delete(f"{CRDS}/{OPENSHIFT_CRD}")
        await discovery(kube, served=False)
        assert await admitted(kube, b) == ""
    finally:
        await kube.delete(f"{CRDS}/{OPENSHIFT_CRD}")
        await kube.delete(f"/api/v1/namespaces/{ETCD_NAMESPACE}")
