"""Events aggregate as client-go's recorder aggregates them (issue 11 item 9).

An identical repeat PATCHes the Event that recorded it first (``count`` + 1,
``lastTimestamp`` moved), as the Go operator's recorder does; only a new
event creates an Event object. Seen on the real API server: its Events and
its audit log.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from audit import AuditWindow, nmo_events, show
from chart_identity import chart_identity
from objects import NM, Api, uid
from operator_fixtures import Operator, wait_for

from nmo.api import constants as c
from nmo.controller.recorder import EventRecorder
from nmo.kube.client import Kube
from nmo_sandbox import Sandbox

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(kube: httpx.AsyncClient) -> Api:
    return Api(kube)


@pytest.fixture
async def nmo_kube(sandbox: Sandbox) -> AsyncIterator[Kube]:
    """nmo's own API client (its User-Agent, so the audit log tells its requests),
    as the chart's ServiceAccount."""
    client = await Kube.connect(kubeconfig=str((await chart_identity(sandbox)).kubeconfig))
    yield client
    await client.close()


async def test_a_repeated_warning_raises_count_on_one_event(
    api: Api, nmo_kube: Kube, node_factory: Any, sandbox: Sandbox
) -> None:
    (node,) = await node_factory(1)
    target = await api.node(node) | {"kind": "Node", "apiVersion": "v1"}
    ticks = iter(range(100))  # one emit a second (lastTimestamp has second precision)
    recorder = EventRecorder(
        nmo_kube,
        instance="nmo-test",
        clock=lambda: datetime.now(UTC) + timedelta(seconds=next(ticks)),
    )
    warning = ("ExampleRepeatedWarning", f"the same warning {uid()}")
    window = await AuditWindow.open(sandbox)
    for _ in range(3):
        await recorder.emit(target, warning, warning=True)
    writes = [e for e in nmo_events(await window.close()) if e.on("events") and e.is_write]
    assert [e.verb for e in writes] == ["create", "patch", "patch"], show(writes)

    (only,) = await api.events(node, "ExampleRepeatedWarning")
    assert only["count"] == 3
    assert only["type"] == "Warning"
    assert only["message"] == warning[1]
    assert only["source"] == {"component": c.EVENT_COMPONENT}
    assert only["lastTimestamp"] > only["firstTimestamp"]
    assert {e.name for e in writes} == {only["metadata"]["name"]}

    # Another message is another Event; the first one is left alone.
    await recorder.emit(target, ("ExampleRepeatedWarning", "a different one"), warning=True)
    events = await api.events(node, "ExampleRepeatedWarning")
    assert sorted(e["count"] for e in events) == [1, 3]

    # The Event expired (event TTL) or was deleted: the next repeat creates it
    # again under its name with the count raised, as client-go does.
    await api.delete(f"/api/v1/namespaces/default/events/{only['metadata']['name']}")
    await recorder.emit(target, warning, warning=True)
    again = [e for e in await api.events(node, "ExampleRepeatedWarning") if e["count"] != 1]
    assert [(e["metadata"]["name"], e["count"]) for e in again] == [(only["metadata"]["name"], 4)]


async def test_two_maintenances_of_one_node_share_one_uncordon_event(
    operator: Operator, api: Api, node_factory: Any
) -> None:
    """nmo emits UncordonNode once per maintenance; the second one on the same
    Node is a repeat, so it counts on the first Event (as it does with NMO)."""
    (node,) = await node_factory(1)
    names = []
    for _ in range(2):
        name = f"nm-{uid()}"
        names.append(name)
        await api.create_nm(name, node)

        async def succeeded(name: str = name) -> bool:
            obj = await api.nm(name)
            return bool(obj and (obj.get("status") or {}).get("phase") == "Succeeded")

        await wait_for(succeeded, what=f"{name} Succeeded")
        await api.delete_nm_and_wait_gone(name)

        async def uncordoned() -> bool:
            return not (await api.node(node))["spec"].get("unschedulable")

        await wait_for(uncordoned, what=f"{node} uncordoned after {name}")

    async def counted_twice() -> list[dict[str, Any]] | None:
        events = await api.events(node, "UncordonNode")
        return events if events and events[0].get("count") == 2 else None

    (uncordon,) = await wait_for(counted_twice, timeout=30, what="UncordonNode counted twice")
    assert uncordon["message"] == c.EVENT_UNCORDON[1]
    # Each CR is its own involved object: its events count once.
    for name in names:
        for reason in ("BeginMaintenance", "SucceedMaintenance", "RemovedMaintenance"):
            (event,) = await api.wait_events(name, reason)
            assert event["count"] == 1, (name, reason, event)
    assert await api.get(f"{NM}/{names[0]}") is None
