"""LeaseClient against a scripted apiserver: the error paths around the lease."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest
import respx

from nmo.core.kube import Kube
from nmo.core.lease import LeaseClient, LeaseHeldError
from nmo.core.maintenance.lease import Action, format_micro

LEASES = "/apis/coordination.k8s.io/v1/namespaces/medik8s-leases/leases"
NODE = {"metadata": {"name": "n1", "uid": "u1"}}
NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)


async def test_a_deleted_lease_namespace_is_recreated(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    api_server.get(f"{LEASES}/node-n1").respond(404, json={"reason": "NotFound", "message": "x"})
    create = api_server.post(LEASES).mock(
        side_effect=[
            httpx.Response(
                404, json={"reason": "NotFound", "message": 'namespaces "medik8s-leases" not found'}
            ),
            httpx.Response(201, json={}),
        ]
    )
    ns = api_server.post("/api/v1/namespaces").respond(201, json={})
    decision = await LeaseClient(kube, "medik8s-leases").request(NODE, NOW)
    assert decision.action is Action.CREATE
    assert ns.call_count == 1
    assert create.call_count == 2


async def test_foreign_lease_raises_with_the_guide_message(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    api_server.get(f"{LEASES}/node-n1").respond(
        200,
        json={
            "metadata": {"name": "node-n1", "resourceVersion": "5", "uid": "l1"},
            "spec": {
                "holderIdentity": "node-healthcheck",
                "leaseDurationSeconds": 3600,
                "renewTime": format_micro(NOW),
            },
        },
    )
    with pytest.raises(LeaseHeldError) as info:
        await LeaseClient(kube, "medik8s-leases").request(NODE, NOW)
    assert str(info.value) == (
        "can't update or invalidate the lease because it is held by different owner: "
        "node-healthcheck"
    )


async def test_release_leaves_a_foreign_lease_alone(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    api_server.get(f"{LEASES}/node-n1").respond(
        200,
        json={"metadata": {"name": "node-n1"}, "spec": {"holderIdentity": "self-node-remediation"}},
    )
    delete = api_server.delete(f"{LEASES}/node-n1").respond(200, json={})
    assert await LeaseClient(kube, "medik8s-leases").release("n1") is False
    assert delete.call_count == 0


async def test_renew_conflict_rereads_once(api_server: respx.MockRouter, kube: Kube) -> None:
    mine = {
        "metadata": {"name": "node-n1", "resourceVersion": "5", "uid": "l1"},
        "spec": {
            "holderIdentity": "node-maintenance",
            "leaseDurationSeconds": 3600,
            "renewTime": "2026-11-30T10:00:00.000000Z",
            "acquireTime": "2026-11-30T10:00:00.000000Z",
        },
    }
    api_server.get(f"{LEASES}/node-n1").respond(200, json=mine)
    put = api_server.put(f"{LEASES}/node-n1").mock(
        side_effect=[
            httpx.Response(409, json={"reason": "Conflict", "message": "modified"}),
            httpx.Response(200, json=mine),
        ]
    )
    decision = await LeaseClient(kube, "medik8s-leases").request(NODE, NOW)
    assert decision.action is Action.RENEW
    assert put.call_count == 2
