"""One memory per maintenance: forgetting it stops everything it owns.

The leak these tests pin: a lease renewer that outlived a CR whose deletion
nmo did not see, and could re-create a released lease. Now the record owns
the renewer, the pod watch and the evictions; the NodeMaintenance cache
forgets the record however the CR disappears (DELETE event or a re-list
after a watch gap), and a renewal never creates a lease.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import respx

from nmo.api import constants as c
from nmo.controller.engine import Engine, EngineSettings
from nmo.controller.leaseholder import LeaseClient, LeaseLost
from nmo.controller.memory import Memories
from nmo.core.maintenance.lease import build_lease
from nmo.kube.client import Kube
from nmo.telemetry.metrics import Metrics

NM_LIST = f"/apis/{c.API_VERSION}/{c.PLURAL}"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/medik8s-leases/leases"


def nm(name: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": "5", "finalizers": [c.FINALIZER]},
        "spec": {"nodeName": node},
    }


async def forever() -> None:
    await asyncio.Event().wait()


async def test_forget_stops_every_task_of_the_record() -> None:
    memories = Memories()
    record = memories.recall("uid-nm-1", "nm-1", "n1")
    loop = asyncio.get_running_loop()
    record.renewer = loop.create_task(forever())
    record.pods_task = loop.create_task(forever())
    eviction = loop.create_task(forever())
    record.evictions.add(eviction)
    assert memories.tasks == 3
    memories.forget("uid-nm-1")
    await asyncio.sleep(0)
    assert memories.tasks == 0 and len(memories) == 0
    assert record.forgotten
    assert record.renewer is None and record.pods_task is None
    assert eviction.cancelled()


@pytest.mark.parametrize("how", ["delete-event", "relist-after-gap"])
async def test_a_cr_gone_unseen_leaves_no_task_running(
    api_server: respx.MockRouter, kube: Kube, how: str
) -> None:
    engine = Engine(kube, EngineSettings(leader_election=False), Metrics())
    engine.leading = True
    api_server.get(NM_LIST).mock(
        side_effect=[
            httpx.Response(
                200, json={"metadata": {"resourceVersion": "1"}, "items": [nm("a", "n1")]}
            ),
            httpx.Response(200, json={"metadata": {"resourceVersion": "9"}, "items": []}),
        ]
    )
    await engine.maintenances._relist()
    record = engine.memories.recall("uid-a", "a", "n1")
    record.renewer = asyncio.get_running_loop().create_task(forever())
    record.lease_held = True
    if how == "delete-event":
        engine.maintenances._apply("DELETED", nm("a", "n1"))
    else:
        # finalizer stripped and CR deleted during a watch gap: the re-list lacks it
        await engine.maintenances._relist()
    await asyncio.sleep(0)
    assert engine.memories.get("uid-a") is None
    assert engine.memories.tasks == 0
    assert record.renewer is None and record.forgotten
    # a late start (a pass still in flight) cannot revive it
    engine.renewers.start(record, {"metadata": {"uid": "u"}})
    engine._watch_pods(record)
    assert record.renewer is None and record.pods_task is None


async def test_a_renewal_never_recreates_a_released_lease(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    api_server.get(f"{LEASES}/node-n1").respond(404, json={"reason": "NotFound", "message": "x"})
    create = api_server.post(LEASES).respond(201, json={})
    leases = LeaseClient(kube, "medik8s-leases")
    node = {"metadata": {"name": "n1", "uid": "u1"}}
    with pytest.raises(LeaseLost, match="node-n1 no longer exists"):
        await leases.request(node, force=True, renew_only=True)
    assert create.call_count == 0


async def test_a_failed_renewal_is_recorded_and_wakes_the_cr(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    api_server.get(f"{LEASES}/node-n1").respond(404, json={"reason": "NotFound", "message": "x"})
    woken: list[str] = []
    engine = Engine(kube, EngineSettings(leader_election=False), Metrics())
    engine.renewers.interval = 0.0
    engine.renewers.on_failure = woken.append
    record = engine.memories.recall("uid-nm-1", "nm-1", "n1")
    engine.renewers.start(record, {"metadata": {"uid": "u1"}})
    assert record.lease_held
    task = record.renewer
    assert task is not None
    await asyncio.wait_for(task, 5)
    assert woken == ["nm-1"]
    assert record.renewal_error is not None and "no longer exists" in record.renewal_error
    assert not record.lease_held and record.renewer is None


async def test_a_stop_lets_the_renewal_in_flight_finish_before_the_release(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    """A renewal cancelled mid-PUT could still be applied after the release has
    read the lease (its delete precondition would then fail): a stop lets the
    PUT finish, counted, and the leave waits for it before releasing."""
    now = datetime.now(UTC)
    held = build_lease({"metadata": {"name": "n1", "uid": "u1"}}, "medik8s-leases", now)
    held["metadata"] |= {"uid": "l1", "resourceVersion": "7"}
    api_server.get(f"{LEASES}/node-n1").respond(200, json=held)
    entered, answer = asyncio.Event(), asyncio.Event()

    async def slow_put(request: httpx.Request) -> httpx.Response:
        entered.set()
        await answer.wait()
        return httpx.Response(
            200, json=held | {"metadata": held["metadata"] | {"resourceVersion": "8"}}
        )

    put = api_server.put(f"{LEASES}/node-n1").mock(side_effect=slow_put)
    metrics = Metrics()
    engine = Engine(kube, EngineSettings(leader_election=False), metrics)
    engine.renewers.interval = 0.0
    record = engine.memories.recall("uid-nm-1", "nm-1", "n1")
    engine.renewers.start(record, {"metadata": {"name": "n1", "uid": "u1"}})
    await asyncio.wait_for(entered.wait(), 5)
    record.stop()
    settled = asyncio.ensure_future(record.renewal_settled(5))
    for _ in range(5):  # let it run: only the PUT's answer can end it now
        await asyncio.sleep(0)
    assert not settled.done(), "the leave did not wait for the renewal in flight"
    answer.set()
    await asyncio.wait_for(settled, 5)
    assert put.call_count == 1
    assert record.renewal is not None and record.renewal.done()
    assert record.renewal.exception() is None
    # counted, though the renewer stopped
    assert metrics.registry.get_sample_value("nmo_lease_renewals_total") == 1
    assert record.renewer is None and not record.lease_held


def test_a_cr_created_again_under_its_name_ends_the_old_ones_record() -> None:
    """Deleted and created again while the watch was down: the re-list shows it
    MODIFIED, and the first pass over the new uid forgets the old one's work."""
    memories = Memories()
    old = memories.recall("uid-old", "nm-1", "n1")
    new = memories.recall("uid-new", "nm-1", "n1")
    assert old.forgotten and not new.forgotten
    assert memories.get("uid-old") is None and memories.get("uid-new") is new
