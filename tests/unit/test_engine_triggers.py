"""What wakes a maintenance: PDB changes, pod events, node events (no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import respx

from nmo.controller.engine import Engine, EngineSettings
from nmo.core.maintenance.drainstate import REASON_PDB, PodDrainState
from nmo.kube.client import Kube
from nmo.telemetry.metrics import Metrics

SINCE = datetime(2026, 1, 1, tzinfo=UTC)  # a drain state's "since" (any fixed time)


def _engine(kube: Kube) -> Engine:
    engine = Engine(kube, EngineSettings(leader_election=False), Metrics())
    engine.leading = True
    return engine


def _blocked(pdb: str, seconds_ago: int) -> PodDrainState:
    since = datetime(2026, 12, 1, tzinfo=UTC) - timedelta(seconds=seconds_ago)
    return PodDrainState(uid="u", reason=REASON_PDB, pdb=pdb, since=since, next_attempt=1e9)


def _pdb(name: str, allowed: int, namespace: str = "app", healthy: int = 3) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "status": {"disruptionsAllowed": allowed, "currentHealthy": healthy},
    }


async def test_a_pdb_whose_status_changes_wakes_the_maintenances_it_holds(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    engine = _engine(kube)
    held = engine.memories.recall("uid-nm-1", "nm-1", "n1")
    held.drain.update({"app/a": _blocked("web", 10), "app/d": _blocked("db", 40)})
    other = engine.memories.recall("uid-nm-2", "nm-2", "n2")
    other.drain["other/e"] = _blocked("web", 50)  # same PDB name, another namespace
    before = {k: (s.next_attempt, s.reason) for k, s in held.drain.items()}
    engine._on_pdb("MODIFIED", _pdb("web", 0), _pdb("web", 0))
    assert len(engine.queue) == 0, "a PDB whose status did not change wakes nobody"
    engine._on_pdb("MODIFIED", _pdb("web", 0, healthy=2), _pdb("web", 0, healthy=3))
    assert len(engine.queue) == 1, "any change of its status: the planner decides what goes"
    engine._on_pdb("MODIFIED", _pdb("web", 1), _pdb("web", 0))
    assert len(engine.queue) == 1  # nm-1 once; nm-2's pod is in another namespace
    engine._on_pdb("DELETED", _pdb("db", 0), None)
    assert len(engine.queue) == 1, "nm-1 is queued already"
    assert {k: (s.next_attempt, s.reason) for k, s in held.drain.items()} == before, (
        "the engine wakes; it changes no drain state"
    )


async def test_the_last_pod_leaving_wakes_the_maintenance_at_once(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    engine = _engine(kube)
    record = engine.memories.recall("uid-nm-1", "nm-1", "n1")
    record.drain["app/a"] = PodDrainState(uid="u", since=SINCE, evicted=True)
    engine._watch_pods(record)
    assert record.pods is not None
    record.pods.store["app/a"] = {"metadata": {"name": "a", "namespace": "app"}}
    engine._on_pod(record, "MODIFIED", record.pods.store["app/a"])
    assert len(engine.queue) == 0, "pod churn is debounced"
    del record.pods.store["app/a"]
    engine._on_pod(record, "DELETED", {"metadata": {"name": "a", "namespace": "app"}})
    assert len(engine.queue) == 1, "no debounce once nothing is left to evict"
    engine.memories.forget("uid-nm-1")


async def test_node_events_wake_only_its_maintenances(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    engine = _engine(kube)
    for name, node in (("nm-1", "n1"), ("nm-2", "n2")):
        engine.maintenances._apply(
            "ADDED",
            {"metadata": {"name": name, "resourceVersion": "1"}, "spec": {"nodeName": node}},
        )
    engine.queue = type(engine.queue)()
    engine._on_node("MODIFIED", {"metadata": {"name": "n2"}}, None)
    assert len(engine.queue) == 1
    assert await engine.queue.get() == "nm-2"


def _conditioned(node: str, owner: str) -> dict[str, object]:
    """A slim node carrying the lifecycle conditions of ``owner`` (queued)."""
    from nmo.core.maintenance import nodeconditions as nc

    body = nc.patch({}, nc.wanted(owner, nc.Stage.QUEUED), now=SINCE)
    assert body is not None
    return {"metadata": {"name": node}, "status": {"conditions": body["status"]["conditions"]}}


async def test_node_conditions_of_a_gone_cr_are_swept_by_its_name(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    """--node-conditions: a CR deleted without a pass (queued, no finalizer; or
    while nmo was down) is reconciled by name, whose pass removes its node
    conditions: on its DELETED event, on a node event, at the leader's start."""
    from dataclasses import replace

    from nmo.core.maintenance.policy import PlanSettings

    settings = EngineSettings(
        leader_election=False, plan=replace(PlanSettings(), node_conditions=True)
    )
    engine = Engine(kube, settings, Metrics())
    engine.leading = True
    live = {"metadata": {"name": "nm-1", "resourceVersion": "1"}, "spec": {"nodeName": "n1"}}
    engine.maintenances._apply("ADDED", live)
    engine.queue = type(engine.queue)()
    engine._on_node("MODIFIED", _conditioned("n1", "nm-1"), None)
    assert await engine.queue.get() == "nm-1"  # its node's event, as before
    engine.queue = type(engine.queue)()
    engine._on_node("MODIFIED", _conditioned("n2", "nm-gone"), None)
    assert len(engine.queue) == 1
    assert await engine.queue.get() == "nm-gone", "conditions naming a CR the cache lacks"
    engine.queue = type(engine.queue)()
    engine.maintenances._apply("DELETED", live)
    assert await engine.queue.get() == "nm-1", "a deletion is reconciled by name"
    engine.queue = type(engine.queue)()
    engine.leading = False
    engine.nodes.store["n2"] = _conditioned("n2", "nm-gone")
    api_server.post(path="/api/v1/namespaces").respond(201, json={"metadata": {}})
    async with engine.leadership():
        assert len(engine.queue) == 1
        assert await engine.queue.get() == "nm-gone", "the leader sweeps the node cache"


async def test_without_node_conditions_nothing_is_swept(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    engine = _engine(kube)
    engine._on_node("MODIFIED", _conditioned("n2", "nm-gone"), None)
    live = {"metadata": {"name": "nm-1", "resourceVersion": "1"}, "spec": {"nodeName": "n1"}}
    engine.maintenances._apply("ADDED", live)
    engine.queue = type(engine.queue)()
    engine._on_maintenance("DELETED", live, None)
    assert len(engine.queue) == 0, "default flags: no pass for a gone CR, as before"
