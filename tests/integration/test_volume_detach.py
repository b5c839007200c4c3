"""Volume-safe completion on the real sandbox (issue 23 part 2).

Real PersistentVolumes and claims, bound by the controller-manager's PV
controller; the VolumeAttachments are created and deleted by its
attach/detach controller (ADC), which manages only nodes annotated
``volumes.kubernetes.io/controller-managed-attach-detach: "true"`` (the
kubelet sets it; these kwok nodes get it from the test). The PVs name a CSI
driver nobody serves, and no CSIDriver or CSINode object is needed: without
a CSIDriver the ADC assumes attach is required. The test plays the external
attacher: it sets ``status.attached`` and holds a finalizer on each
attachment, so a detach (the ADC deletes the attachment once the pod is
gone) waits until the test lets it go, as a slow storage backend would.

nmo runs as the chart's ServiceAccount (chart_identity.py): the chart's RBAC
must let it list VolumeAttachments and read PersistentVolumes. Without the
feature every test here fails: the maintenance succeeds as soon as the last
pod left, with no VolumesDetached condition.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from objects import NM, Api, pod_spec, uid
from operator_fixtures import Operator, wait_for
from test_drain_control import flags

pytestmark = pytest.mark.integration

DRIVER = "volumes.nmo.test"  # served by no one: the test is its attacher
ATTACHER_FINALIZER = "external-attacher/volumes-nmo-test"
MANAGED = "volumes.kubernetes.io/controller-managed-attach-detach"
VA = "/apis/storage.k8s.io/v1/volumeattachments"
PV = "/api/v1/persistentvolumes"


def condition(obj: dict[str, Any] | None, type_: str = "VolumesDetached") -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return {}


class Storage:
    """PVs, claims and pods that use them on one node; the attacher's part."""

    def __init__(self, api: Api, kube: httpx.AsyncClient, namespace: str, node: str) -> None:
        self.api, self.kube, self.ns, self.node = api, kube, namespace, node
        self.pvs: dict[str, str] = {}  # claim -> PV name

    async def claim(self, name: str, mode: str = "ReadWriteOnce") -> str:
        """A PV pre-bound to claim ``name`` and the claim; waits until Bound."""
        pv = f"pv-{uid()}-{name}"
        self.pvs[name] = pv
        await self.api.create(
            PV,
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": pv},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": [mode],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "csi": {"driver": DRIVER, "volumeHandle": pv},
                    "claimRef": {"namespace": self.ns, "name": name},
                },
            },
        )
        await self.api.create(
            f"/api/v1/namespaces/{self.ns}/persistentvolumeclaims",
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": name},
                "spec": {
                    "accessModes": [mode],
                    "resources": {"requests": {"storage": "1Gi"}},
                    "storageClassName": "",
                    "volumeName": pv,
                },
            },
        )

        async def bound() -> bool:
            obj = await self.api.get(f"/api/v1/namespaces/{self.ns}/persistentvolumeclaims/{name}")
            return ((obj or {}).get("status") or {}).get("phase") == "Bound"

        await wait_for(bound, what=f"claim {name} bound", timeout=60)
        return pv

    async def pod(self, name: str, claims: list[str], labels: dict[str, str]) -> None:
        spec = pod_spec(node_name=self.node)
        spec["volumes"] = [
            {"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}}
            for i, c in enumerate(claims)
        ]
        await self.api.create(
            f"/api/v1/namespaces/{self.ns}/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": labels},
                "spec": spec,
            },
        )

    async def attachments(self) -> dict[str, dict[str, Any]]:
        """PV name -> its VolumeAttachment on the node."""
        items = (await self.kube.get(VA)).json()["items"]
        return {
            va["spec"]["source"].get("persistentVolumeName", ""): va
            for va in items
            if va["spec"]["nodeName"] == self.node
        }

    async def attach_all(self, pvs: list[str]) -> None:
        """As the external attacher: hold a finalizer, report attached, and wait
        until the ADC has recorded the attach on the node."""

        async def created() -> dict[str, dict[str, Any]] | None:
            found = await self.attachments()
            return found if all(pv in found for pv in pvs) else None

        found = await wait_for(created, what=f"attachments of {pvs}", timeout=60)
        for pv in pvs:
            name = found[pv]["metadata"]["name"]
            await self.api.merge(f"{VA}/{name}", {"metadata": {"finalizers": [ATTACHER_FINALIZER]}})
            resp = await self.kube.patch(
                f"{VA}/{name}/status",
                json={"status": {"attached": True}},
                headers={"Content-Type": "application/merge-patch+json"},
            )
            resp.raise_for_status()

        async def recorded() -> bool:
            node = await self.api.node(self.node)
            attached = (node.get("status") or {}).get("volumesAttached") or []
            names = " ".join(v["name"] for v in attached)
            return all(pv in names for pv in pvs)

        await wait_for(recorded, what="the ADC recorded the attachments", timeout=60)

    async def detaching(self, pv: str) -> dict[str, Any] | None:
        va = (await self.attachments()).get(pv)
        return va if va is not None and va["metadata"].get("deletionTimestamp") else None

    async def release(self, pv: str) -> None:
        """As the external attacher: the volume is detached, the attachment may go."""
        va = (await self.attachments()).get(pv)
        if va is not None:
            await self.api.merge(f"{VA}/{va['metadata']['name']}", {"metadata": {"finalizers": []}})

    async def cleanup(self) -> None:
        for va in (await self.attachments()).values():
            await self.api.merge(f"{VA}/{va['metadata']['name']}", {"metadata": {"finalizers": []}})
        for pv in self.pvs.values():
            await self.kube.delete(f"{PV}/{pv}")


@pytest.fixture
async def storage(
    kube: httpx.AsyncClient, namespace: str, node_factory: Any
) -> AsyncIterator[Storage]:
    (node,) = await node_factory(1)
    api = Api(kube)
    await api.merge(f"/api/v1/nodes/{node}", {"metadata": {"annotations": {MANAGED: "true"}}})
    s = Storage(api, kube, namespace, node)
    try:
        yield s
    finally:
        await s.cleanup()


async def create_nm(api: Api, node: str, drain: dict[str, Any]) -> str:
    name = f"nm-{uid()}"
    await api.create(
        NM,
        {
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
            "kind": "NodeMaintenance",
            "metadata": {"name": name},
            "spec": {"nodeName": node, "reason": "volume test", "drain": drain},
        },
    )
    return name


async def test_waits_for_the_attachment_and_names_it(operator: Operator, storage: Storage) -> None:
    api = storage.api
    pv = await storage.claim("data")
    await storage.pod("db", ["data"], {"app": "db"})
    await storage.attach_all([pv])
    before = await operator.metric("nmo_volume_detach_wait_seconds_count", outcome="detached")
    name = await create_nm(
        api, storage.node, {"waitForVolumeDetach": {"enabled": True, "timeoutSeconds": 300}}
    )

    async def waiting() -> dict[str, Any] | None:
        obj = await api.nm(name)
        return obj if condition(obj).get("reason") == "Waiting" else None

    obj = await wait_for(waiting, what="VolumesDetached Waiting", timeout=60)
    message = condition(obj)["message"]
    assert condition(obj)["status"] == "False"
    assert f"PersistentVolume {pv}, claim {storage.ns}/data" in message, message
    assert obj["status"]["phase"] == "Running"
    assert obj["status"]["drainProgress"] == 100
    assert await api.pods(storage.ns) == []  # the pod is gone: only its volume holds
    # The ADC deleted the attachment; the attacher's finalizer holds it.
    await wait_for(lambda: storage.detaching(pv), what="attachment being detached")

    async def named_detaching() -> bool:
        return f"{pv}, claim {storage.ns}/data, detaching)" in condition(await api.nm(name)).get(
            "message", ""
        )

    await wait_for(named_detaching, what="the condition says detaching", timeout=30)
    assert await api.phase(name) == "Running"
    await storage.release(pv)

    async def succeeded() -> dict[str, Any] | None:
        obj = await api.nm(name)
        return obj if (obj or {}).get("status", {}).get("phase") == "Succeeded" else None

    done = await wait_for(succeeded, what="Succeeded once detached", timeout=30)
    cond = condition(done)
    assert (cond.get("status"), cond.get("reason")) == ("True", "Detached"), cond
    assert await api.events(name, "VolumeDetachTimedOut") == []
    assert (
        await operator.metric("nmo_volume_detach_wait_seconds_count", outcome="detached")
        == before + 1
    )
    await api.delete_nm_and_wait_gone(name)


async def test_deadline_is_reported_and_the_maintenance_proceeds(
    operator: Operator, storage: Storage
) -> None:
    api = storage.api
    pv = await storage.claim("data")
    await storage.pod("db", ["data"], {"app": "db"})
    await storage.attach_all([pv])
    before = await operator.metric("nmo_volume_detach_wait_seconds_count", outcome="timed_out")
    name = await create_nm(
        api, storage.node, {"waitForVolumeDetach": {"enabled": True, "timeoutSeconds": 4}}
    )

    async def succeeded() -> dict[str, Any] | None:
        obj = await api.nm(name)
        return obj if (obj or {}).get("status", {}).get("phase") == "Succeeded" else None

    done = await wait_for(succeeded, what="Succeeded at the deadline", timeout=60)
    cond = condition(done)
    assert (cond.get("status"), cond.get("reason")) == ("False", "TimedOut"), cond
    assert cond["message"].startswith("volumes not detached within 4s (deadline "), cond
    assert pv in cond["message"] and cond["message"].endswith("the maintenance proceeds")
    # The attachment is still there: nmo did not wait for it past the deadline.
    assert await storage.detaching(pv) is not None
    events = await api.wait_events(name, "VolumeDetachTimedOut", count=1)
    assert events[0]["type"] == "Warning" and pv in events[0]["message"], events
    assert (
        await operator.metric("nmo_volume_detach_wait_seconds_count", outcome="timed_out")
        == before + 1
    )
    await api.delete_nm_and_wait_gone(name)
    assert len(await api.events(name, "VolumeDetachTimedOut")) == 1


async def test_multi_attach_and_staying_volumes_are_not_waited_for(
    operator: Operator, storage: Storage
) -> None:
    """The operator-wide switch (the chart's drain.waitForVolumeDetach), no CR field."""
    async with flags(operator, "--wait-for-volume-detach", "--volume-detach-timeout=300"):
        await _multi_attach_and_staying(storage)


async def _multi_attach_and_staying(storage: Storage) -> None:
    api = storage.api
    rwo = await storage.claim("data")
    rwx = await storage.claim("shared", "ReadWriteMany")
    kept = await storage.claim("agent-state")
    await storage.pod("db", ["data", "shared"], {"app": "db", "drain": "yes"})
    await storage.pod("agent", ["agent-state"], {"app": "agent"})  # not selected: it stays
    await storage.attach_all([rwo, rwx, kept])
    name = await create_nm(
        api,
        storage.node,
        {"podSelector": {"matchLabels": {"drain": "yes"}}},
    )

    async def waiting() -> dict[str, Any] | None:
        obj = await api.nm(name)
        return obj if condition(obj).get("reason") == "Waiting" else None

    obj = await wait_for(waiting, what="VolumesDetached Waiting", timeout=60)
    # Once the RWX volume's attachment is being detached too, only the RWO
    # one is named: the RWX one (multi-attach) and the staying pod's are not.
    await wait_for(lambda: storage.detaching(rwx), what="RWX attachment being detached")
    await wait_for(lambda: storage.detaching(rwo), what="RWO attachment being detached")
    obj = await api.nm(name)
    message = condition(obj)["message"]
    assert message.split(": ", 1)[1].startswith("1 volume(s) still attached"), message
    assert rwo in message and rwx not in message and kept not in message, message
    assert [p["metadata"]["name"] for p in await api.pods(storage.ns)] == ["agent"]
    await storage.release(rwo)

    async def succeeded() -> dict[str, Any] | None:
        obj = await api.nm(name)
        return obj if (obj or {}).get("status", {}).get("phase") == "Succeeded" else None

    done = await wait_for(succeeded, what="Succeeded with the RWX volume still attached")
    assert condition(done)["reason"] == "Detached"
    left = await storage.attachments()
    assert rwx in left and kept in left, sorted(left)
    assert left[kept]["metadata"].get("deletionTimestamp") is None  # the agent keeps it
    await api.delete_nm_and_wait_gone(name)
