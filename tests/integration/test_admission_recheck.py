"""Decisions taken at admission hold when the maintenance starts (issue 20).

* The etcd-quorum rule (A6 rule 3) runs in the webhook at CREATE; a CR that
  then waits behind the fleet budget or a window can start days later. nmo
  checks it again when a queued maintenance is about to start: refused, it
  stays Pending (condition Queued, reason EtcdQuorum, the Go NMO's quorum
  message) and takes no budget slot; allowed again, it starts.
* ``spec.nodeName`` is immutable in the CRD's schema (CEL ``self ==
  oldSelf``), not only in the webhook, whose UPDATE rule fails open before
  Kubernetes 1.28: with no webhook at all the apiserver refuses the change
  with the Go NMO's message.

No webhook is registered in these sandboxes, so the CREATE passes unchecked
(as it did when the quorum allowed it).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from objects import NM, Api, uid
from operator_fixtures import wait_for
from test_fleet import condition, cr, leader_namespace, replicas
from test_webhook import (
    CRDS,
    OPENSHIFT_CRD,
    PDBS,
    PODS,
    discovery,
    ensure,
    guard_pod,
    install_crd,
    openshift_crd,
    pdb,
    set_guard_conditions,
)

from nmo.api.constants import (
    CONTROL_PLANE_ROLE_LABEL,
    ETCD_GUARD_PDB,
    ETCD_NAMESPACE,
    Messages,
)
from nmo_sandbox import Sandbox

__all__ = ["leader_namespace"]  # the fixture, from test_fleet

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("sole_operator")]


@pytest.fixture
async def api(kube: httpx.AsyncClient) -> Api:
    return Api(kube)


async def _guard_pdb_settles(api: Api, *, healthy: int, allowed: int) -> None:
    async def computed() -> bool:
        obj = await api.get(f"{PDBS}/{ETCD_GUARD_PDB}") or {}
        st = obj.get("status") or {}
        return (
            st.get("observedGeneration") == obj.get("metadata", {}).get("generation")
            and st.get("currentHealthy") == healthy
            and st.get("disruptionsAllowed") == allowed
        )

    await wait_for(computed, what=f"the etcd guard PDB: {healthy} healthy, {allowed} allowed")


async def test_a_queued_control_plane_maintenance_rechecks_quorum_before_it_starts(
    sandbox: Sandbox,
    api: Api,
    kube: httpx.AsyncClient,
    node_factory: Any,
    tmp_path: Path,
    leader_namespace: str,
) -> None:
    a, b = await node_factory(2, labels={CONTROL_PLANE_ROLE_LABEL: ""})
    await install_crd(kube, openshift_crd())
    try:
        await discovery(kube, served=True)
        await ensure(
            kube,
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ETCD_NAMESPACE}},
        )
        for node in (a, b):
            await ensure(kube, PODS, guard_pod(node))
        await ensure(kube, PDBS, pdb(ETCD_GUARD_PDB))  # minAvailable 2 of 2: none allowed
        await _guard_pdb_settles(api, healthy=2, allowed=0)

        # Queued by a closed window (as if admitted when the quorum allowed it).
        now = datetime.now(UTC)
        tomorrow = (now + timedelta(days=1)).strftime("%a")
        window = ["--window-start", "00:00", "--window-end", "23:59"]
        name = f"q-{uid()}"
        closed = replicas(sandbox, tmp_path / "closed", 1, ["--window-days", tomorrow, *window])
        await closed.__anext__()
        try:
            await api.create(NM, cr(name, a))

            async def queued_by_window() -> bool:
                obj = await api.nm(name) or {}
                return condition(obj, "Queued").get("reason") == "OutsideWindow"

            await wait_for(queued_by_window, what="Queued OutsideWindow")
        finally:
            await closed.aclose()

        # The window opens: the quorum is checked again, and refuses.
        today = now.strftime("%a")
        opened = replicas(
            sandbox, tmp_path / "open", 1, ["--window-days", f"{today},{tomorrow}", *window]
        )
        await opened.__anext__()
        try:
            if now.strftime("%H:%M") >= "23:59":
                pytest.fail("the test ran at 23:59 UTC, outside its own window; run it again")

            async def held() -> dict[str, Any] | None:
                obj = await api.nm(name) or {}
                return obj if condition(obj, "Queued").get("reason") == "EtcdQuorum" else None

            obj = await wait_for(held, what="Queued EtcdQuorum")
            assert obj["status"]["phase"] == "Pending"
            assert condition(obj, "Queued")["message"] == Messages.WEBHOOK_QUORUM.format(node=a)
            assert obj["metadata"].get("finalizers") is None, "nothing done, not even the finalizer"
            node = await api.node(a)
            assert not node["spec"].get("unschedulable") and not node["spec"].get("taints")
            assert await api.lease(a) is None

            # Its guard goes NotReady (the node is disrupted already): it starts.
            await set_guard_conditions(kube, a, [{"type": "Ready", "status": "False"}])

            async def started() -> dict[str, Any] | None:
                obj = await api.nm(name) or {}
                begun = (obj.get("status") or {}).get("phase") == "Running"
                return (
                    obj if begun and condition(obj, "Queued").get("reason") == "Admitted" else None
                )

            # (Its drain then waits for the guard pod's own PDB, as the Go NMO's.)
            await wait_for(started, timeout=60, what="started once the quorum allows it")
            assert (await api.node(a))["spec"].get("unschedulable") is True
            await api.delete_nm_and_wait_gone(name)
        finally:
            await opened.aclose()
    finally:
        await kube.delete(f"{CRDS}/{OPENSHIFT_CRD}")
        await kube.delete(f"/api/v1/namespaces/{ETCD_NAMESPACE}")


async def test_node_name_is_immutable_in_the_schema_without_a_webhook(
    api: Api, kube: httpx.AsyncClient, node_factory: Any
) -> None:
    (node,) = await node_factory(1)
    name = f"imm-{uid()}"
    await api.create(NM, cr(name, node))
    try:
        resp = await kube.patch(
            f"{NM}/{name}",
            json={"spec": {"nodeName": "some-random-nodename"}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert resp.status_code == 422, resp.text
        assert Messages.WEBHOOK_NODENAME_CHANGED in resp.json()["message"]
        stored = await api.nm(name)
        assert stored is not None and stored["spec"]["nodeName"] == node
        # Other spec fields still change.
        resp = await kube.patch(
            f"{NM}/{name}",
            json={"spec": {"reason": "moved to next week"}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert resp.status_code == 200, resp.text
    finally:
        await kube.delete(f"{NM}/{name}")
