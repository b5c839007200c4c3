"""LeaseClient against a scripted apiserver: the error paths around the lease."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial

import httpx
import pytest
import respx

import builders
from nmo.controller.leaseholder import FIELD_MANAGER, LeaseClient, LeaseHeldError
from nmo.core.maintenance.lease import Action
from nmo.kube.client import Kube

LEASES = "/apis/coordination.k8s.io/v1/namespaces/medik8s-leases/leases"
NODE = {"metadata": {"name": "n1", "uid": "u1"}}
NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
held = partial(builders.lease, uid="l1", resource_version="5", duration=3600)  # node-n1


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
    decision = await LeaseClient(kube, "medik8s-leases", clock=lambda: NOW).request(NODE)
    assert decision.action is Action.CREATE
    assert ns.call_count == 1
    assert create.call_count == 2


async def test_foreign_lease_raises_with_the_guide_message(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    api_server.get(f"{LEASES}/node-n1").respond(
        200,
        json=held("node-healthcheck", NOW, acquired=None),
    )
    with pytest.raises(LeaseHeldError) as info:
        await LeaseClient(kube, "medik8s-leases", clock=lambda: NOW).request(NODE)
    assert str(info.value) == (
        "can't update or invalidate the lease because it is held by different owner: "
        "node-healthcheck"
    )


async def test_release_leaves_a_foreign_lease_alone(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    api_server.get(f"{LEASES}/node-n1").respond(
        200,
        json=builders.lease("self-node-remediation"),
    )
    delete = api_server.delete(f"{LEASES}/node-n1").respond(200, json={})
    assert await LeaseClient(kube, "medik8s-leases").release("n1") is False
    assert delete.call_count == 0


async def test_renew_conflict_rereads_once(api_server: respx.MockRouter, kube: Kube) -> None:
    mine = held("node-maintenance", datetime(2026, 11, 30, 10, tzinfo=UTC))
    api_server.get(f"{LEASES}/node-n1").respond(200, json=mine)
    put = api_server.put(f"{LEASES}/node-n1").mock(
        side_effect=[
            httpx.Response(409, json={"reason": "Conflict", "message": "modified"}),
            httpx.Response(200, json=mine),
        ]
    )
    decision = await LeaseClient(kube, "medik8s-leases", clock=lambda: NOW).request(NODE)
    assert decision.action is Action.RENEW
    assert put.call_count == 2


def _foreign(renewed: datetime) -> dict[str, object]:
    return held("node-healthcheck", renewed, acquired=renewed - timedelta(hours=5))


async def test_a_renewal_landing_during_the_read_is_not_taken_over(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    """The lease had lapsed when the pass began; NHC renewed it while nmo's GET
    was in flight. Decided with a ``now`` from before the read, the renewal
    looked like the future and the lease was taken."""
    clock = [NOW]

    def answer(request: httpx.Request) -> httpx.Response:
        clock[0] = NOW + timedelta(milliseconds=500)  # the read took half a second
        return httpx.Response(200, json=_foreign(NOW + timedelta(milliseconds=500)))

    api_server.get(f"{LEASES}/node-n1").mock(side_effect=answer)
    put = api_server.put(f"{LEASES}/node-n1").respond(200, json={})
    leases = LeaseClient(kube, "medik8s-leases", clock=lambda: clock[0])
    with pytest.raises(LeaseHeldError):
        await leases.request(NODE)
    assert put.call_count == 0


async def test_a_foreign_lease_is_expired_only_past_the_skew(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    lease = _foreign(NOW - timedelta(seconds=3601))  # 1 s past renewTime + duration
    api_server.get(f"{LEASES}/node-n1").respond(200, json=lease)
    put = api_server.put(f"{LEASES}/node-n1").respond(200, json={})
    with pytest.raises(LeaseHeldError):
        await LeaseClient(kube, "medik8s-leases", clock=lambda: NOW).request(NODE)
    later = LeaseClient(kube, "medik8s-leases", clock=lambda: NOW + timedelta(seconds=2))
    assert (await later.request(NODE)).action is Action.TAKE_OVER
    assert put.call_count == 1


@pytest.mark.parametrize(("spec", "deleted"), [({}, True), ({"holderIdentity": ""}, False)])
async def test_release_deletes_a_lease_without_holder_as_common_does(
    api_server: respx.MockRouter, kube: Kube, spec: dict[str, str], deleted: bool
) -> None:
    api_server.get(f"{LEASES}/node-n1").respond(
        200,
        json={"metadata": {"name": "node-n1", "uid": "l1", "resourceVersion": "3"}, "spec": spec},
    )
    delete = api_server.delete(f"{LEASES}/node-n1").respond(200, json={})
    assert await LeaseClient(kube, "medik8s-leases").release("n1") is deleted
    assert delete.call_count == (1 if deleted else 0)


async def test_every_write_names_nmos_field_manager(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    """The chart's lease policy reads the API server's time from that manager's
    managedFields entry: a takeover without it is refused (templates/lease-policy.yaml)."""
    expired = _foreign(NOW - timedelta(hours=2))
    api_server.get(f"{LEASES}/node-n1").respond(200, json=expired)
    put = api_server.put(f"{LEASES}/node-n1").respond(200, json={})
    leases = LeaseClient(kube, "medik8s-leases", clock=lambda: NOW)
    assert (await leases.request(NODE)).action is Action.TAKE_OVER
    api_server.get(f"{LEASES}/node-n2").respond(404, json={"reason": "NotFound", "message": "x"})
    post = api_server.post(LEASES).respond(201, json={})
    n2 = {"metadata": {"name": "n2", "uid": "u2"}}
    assert (await leases.request(n2)).action is Action.CREATE
    for route in (put, post):
        assert route.calls.last.request.url.params["fieldManager"] == FIELD_MANAGER == "nmo"
