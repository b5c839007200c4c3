"""Eviction answers and what the evictor makes of them (behavior.md A4, B2, B9).

The evictor records each answer in the pod's drain state; the pure survey
(:func:`nmo.core.maintenance.drainstate.survey`) then reports it.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import respx

from nmo.controller.evictor import Evictor
from nmo.controller.memory import Memory
from nmo.core.maintenance.disruption import status_key
from nmo.core.maintenance.drainstate import Survey, survey
from nmo.kube.client import Kube
from nmo.telemetry.metrics import Metrics


def pod(name: str, uid: str = "u1") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid}, "spec": {"nodeName": "n1"}}


def eviction(name: str) -> str:
    return f"/api/v1/namespaces/ns/pods/{name}/eviction"


PDB_429 = httpx.Response(
    429,
    headers={"Retry-After": "7"},
    json={
        "reason": "TooManyRequests",
        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
        "details": {
            "causes": [
                {
                    "reason": "DisruptionBudget",
                    "message": "The disruption budget web-pdb needs 2 healthy pods "
                    "and has 2 currently",
                }
            ]
        },
    },
)
NS_403 = httpx.Response(
    403,
    json={
        "reason": "Forbidden",
        "message": 'pods "p" is forbidden: unable to create new content in namespace ns '
        "because it is being terminated",
        "details": {"causes": [{"type": "NamespaceTerminating", "field": "metadata.namespace"}]},
    },
)
MULTI_500 = httpx.Response(
    500, json={"message": "This pod has more than one PodDisruptionBudget, which the eviction "
               "subresource does not support."}
)  # fmt: skip


def look(record: Memory, pods: list[dict[str, Any]]) -> Survey:
    return survey(record.drain, pods, tick=asyncio.get_running_loop().time(), now=datetime.now(UTC))


async def drive(kube: Kube, pods: list[dict[str, Any]]) -> tuple[Memory, list[str], Metrics]:
    """Start every pod's eviction as a pass would, and wait for the answers."""
    changed: list[str] = []
    metrics = Metrics()
    record = Memory(uid="uid-nm-1", name="nm-1", node="n1")
    evictor = Evictor(kube, max_parallel=2, on_change=changed.append, metrics=metrics)
    plan = look(record, pods)
    assert [p["metadata"]["name"] for p in plan.due] == [p["metadata"]["name"] for p in pods]
    evictor.start(record, tuple(plan.due))
    await asyncio.wait_for(asyncio.gather(*record.evictions), 5)
    return record, changed, metrics


@pytest.mark.parametrize(
    ("response", "reason", "pdb", "outcome"),
    [
        (PDB_429, "DisruptionBudget", "web-pdb", "pdb_blocked"),
        (NS_403, "NamespaceTerminating", None, "namespace_terminating"),
        (MULTI_500, "MultiplePDBs", None, "multiple_pdbs"),
        (httpx.Response(422, json={"message": "weird"}), "EvictionError", None, "error"),
        (httpx.Response(201, json={}), "Terminating", None, "evicted"),
        # concurrent evictions behind one PDB race on its status: retried soon
        (
            httpx.Response(409, json={"reason": "Conflict", "message": "object modified"}),
            "Waiting",
            None,
            "conflict",
        ),
    ],
)
async def test_eviction_answers(
    api_server: respx.MockRouter,
    kube: Kube,
    response: httpx.Response,
    reason: str,
    pdb: str | None,
    outcome: str,
) -> None:
    route = api_server.post(eviction("p")).mock(return_value=response)
    record, changed, metrics = await drive(kube, [pod("p")])
    # an eviction wakes the CR through the pod watch; every other answer directly
    assert changed == ([] if outcome == "evicted" else ["nm-1"])
    assert route.call_count == 1  # the evictor owns retries, not the boundary
    again = look(record, [pod("p")])
    assert again.due == [], "due again before its backoff expired"
    report = again.report
    (detail,) = report.details
    assert detail.reason == reason
    assert detail.disruption_budget == pdb
    assert metrics.evictions.labels(outcome=outcome)._value.get() == 1
    if outcome in ("multiple_pdbs", "error", "namespace_terminating"):
        assert report.last_error is not None and "ns" in report.last_error
    if outcome == "pdb_blocked":
        assert report.next_wake is not None and report.next_wake >= 6.5  # Retry-After 7 s
    if outcome == "conflict":
        assert report.next_wake is not None and report.next_wake <= 0.2


async def test_gone_pods_and_replaced_uids_leave_the_pending_list(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    api_server.post(eviction("a")).respond(404, json={"message": "not found"})
    api_server.post(eviction("b")).respond(201, json={})
    record, _, metrics = await drive(kube, [pod("a"), pod("b", uid="old")])
    assert metrics.evictions.labels(outcome="gone")._value.get() == 1
    # a is gone from the cache; b came back with a new UID (a new pod, same name)
    after = look(record, [pod("b", uid="new")])
    assert sorted(after.stale) == ["ns/a", "ns/b"]
    assert [p["metadata"]["uid"] for p in after.due] == ["new"]
    report = after.report
    assert [d.name for d in report.details] == ["b"]
    assert report.details[0].reason != "Terminating"


async def test_parallelism_is_bounded(api_server: respx.MockRouter, kube: Kube) -> None:
    in_flight = 0
    peak = 0
    release = asyncio.Event()

    async def slow(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await release.wait()
        in_flight -= 1
        return httpx.Response(201, json={})

    for i in range(6):
        api_server.post(eviction(f"p{i}")).mock(side_effect=slow)
    record = Memory(uid="uid-nm-1", name="nm-1", node="n1")
    evictor = Evictor(kube, max_parallel=2, on_change=lambda _n: None, metrics=Metrics())
    evictor.start(record, tuple(pod(f"p{i}", uid=f"u{i}") for i in range(6)))
    for _ in range(20):
        await asyncio.sleep(0)
    assert peak == 2
    release.set()
    await asyncio.wait_for(asyncio.gather(*record.evictions), 5)
    assert evictor.evictions_started == 6
    assert all(s.evicted for s in record.drain.values())
    assert peak == 2


@pytest.mark.parametrize(
    ("response", "deleted", "outcome", "reason"),
    [
        (httpx.Response(200, json={"kind": "Pod"}), True, "deleted", "Terminating"),
        (httpx.Response(404, json={"message": "not found"}), False, "gone", "Waiting"),
        # the UID precondition failed: a replacement pod under the same name is left alone
        (
            httpx.Response(409, json={"reason": "Conflict", "message": "Precondition failed"}),
            False,
            "gone",
            "Waiting",
        ),
        (httpx.Response(403, json={"message": "forbidden"}), False, "forbidden", "EvictionError"),
        (httpx.Response(500, json={"message": "etcd timeout"}), False, "error", "EvictionError"),
    ],
)
async def test_forced_deletion_answers(
    api_server: respx.MockRouter,
    kube: Kube,
    response: httpx.Response,
    deleted: bool,
    outcome: str,
    reason: str,
) -> None:
    route = api_server.delete("/api/v1/namespaces/ns/pods/p").mock(return_value=response)
    metrics = Metrics()
    record = Memory(uid="uid-nm-1", name="nm-1", node="n1")
    evictor = Evictor(kube, max_parallel=2, on_change=lambda _n: None, metrics=metrics)
    assert await evictor.force_delete(record, pod("p", uid="u9"), 0) is deleted
    sent = route.calls.last.request
    body = json.loads(sent.content)
    assert body["gracePeriodSeconds"] == 1  # never 0
    assert body["preconditions"] == {"uid": "u9"}
    state = record.drain["ns/p"]
    assert state.forced is deleted and not state.in_flight
    assert state.reason == reason
    assert metrics.forced_deletions.labels(outcome=outcome)._value.get() == 1
    # Once accepted, never deleted twice.
    if deleted:
        assert await evictor.force_delete(record, pod("p", uid="u9"), 30) is False
        assert route.call_count == 1


# -- Retry-After beyond the backoff cap (B2) ---------------------------------------


def throttled(*, header: str | None, body_seconds: int | None) -> httpx.Response:
    """A 429 as an admission webhook on pods/eviction (or a proxy) may answer."""
    status: dict[str, Any] = {"reason": "TooManyRequests", "message": "come back later"}
    if body_seconds is not None:
        status["details"] = {"retryAfterSeconds": body_seconds}
    headers = {} if header is None else {"Retry-After": header}
    return httpx.Response(429, headers=headers, json=status)


@pytest.mark.parametrize(
    ("response", "wait"),
    [
        pytest.param(throttled(header="40", body_seconds=40), 40, id="header and body"),
        pytest.param(throttled(header=None, body_seconds=40), 40, id="body only"),
        pytest.param(throttled(header="25", body_seconds=None), 25, id="header only"),
        pytest.param(throttled(header="30", body_seconds=40), 30, id="header wins"),
        pytest.param(throttled(header=None, body_seconds=100000), 300, id="bounded at 300 s"),
    ],
)
async def test_retry_after_above_the_cap_is_honoured(
    api_server: respx.MockRouter, kube: Kube, response: httpx.Response, wait: float
) -> None:
    """The server's wait holds even beyond the 15 s backoff cap, read from the
    Retry-After header or, without one, from the Status's
    ``details.retryAfterSeconds``.

    The Go NMO's drain (kubectl's helper) retries a 429 after a fixed 5 s;
    client-go honours only the header, and sleeps in the reconcile worker.
    Here the pod is simply not due before the wait is over, and no task waits.
    """
    api_server.post(eviction("p")).mock(return_value=response)
    record, _, _ = await drive(kube, [pod("p")])
    assert not record.evictions  # nothing holds on while the pod waits
    report = look(record, [pod("p")]).report
    assert report.next_wake is not None
    assert wait - 0.5 <= report.next_wake <= wait + 0.01
    assert report.next_wake > 15  # beyond Evictor's max_backoff


async def test_without_retry_after_the_cap_holds(api_server: respx.MockRouter, kube: Kube) -> None:
    api_server.post(eviction("p")).mock(return_value=throttled(header=None, body_seconds=None))
    record, _, _ = await drive(kube, [pod("p")])
    report = look(record, [pod("p")]).report
    assert report.next_wake is not None and report.next_wake <= 15


# -- a refusal is recorded with the PDB's status it was sent against (issue 22) ------


def web_pdb(healthy: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "web-pdb", "namespace": "ns"},
        "status": {"disruptionsAllowed": 0, "currentHealthy": healthy, "desiredHealthy": 2},
    }


async def test_a_pdb_refusal_records_when_and_against_which_status(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    cache: dict[str, dict[str, Any]] = {"ns/web-pdb": web_pdb(2)}
    seen_by_server: list[int] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        # The PDB changes while this eviction is in flight: the refusal stands
        # against the status the eviction was sent with, so the change counts.
        seen_by_server.append(cache["ns/web-pdb"]["status"]["currentHealthy"])
        cache["ns/web-pdb"] = web_pdb(1)
        return PDB_429

    api_server.post(eviction("p")).mock(side_effect=refuse)
    record = Memory(uid="uid-nm-1", name="nm-1", node="n1")
    evictor = Evictor(
        kube, max_parallel=2, on_change=lambda _n: None, metrics=Metrics(), budgets=cache.get
    )
    before = asyncio.get_running_loop().time()
    evictor.start(record, (pod("p"),))
    await asyncio.wait_for(asyncio.gather(*record.evictions), 5)
    state = record.drain["ns/p"]
    assert state.pdb == "web-pdb" and state.refused_at is not None and state.refused_at >= before
    # First attempt: no PDB was named yet, the status is read at the answer.
    assert state.budget_seen == status_key(web_pdb(1))
    # Second attempt: sent against the cached status of the PDB that refused it.
    cache["ns/web-pdb"] = web_pdb(2)
    evictor.start(record, (pod("p"),))
    await asyncio.wait_for(asyncio.gather(*record.evictions), 5)
    assert state.budget_seen == status_key(web_pdb(2)), "the status it was sent against"
    assert status_key(cache["ns/web-pdb"]) != state.budget_seen, "so the change is seen"


async def test_a_conflict_leaves_no_standing_refusal(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    api_server.post(eviction("p")).mock(
        side_effect=[PDB_429, httpx.Response(409, json={"reason": "Conflict", "message": "x"})]
    )
    record = Memory(uid="uid-nm-1", name="nm-1", node="n1")
    evictor = Evictor(kube, max_parallel=2, on_change=lambda _n: None, metrics=Metrics())
    for _ in range(2):
        evictor.start(record, (pod("p"),))
        await asyncio.wait_for(asyncio.gather(*record.evictions), 5)
    state = record.drain["ns/p"]
    assert state.refused_at is None and state.reason == "DisruptionBudget"  # shown as before
    assert state.budget_seen is None, "no PDB cache: nothing to compare, backoff decides"
    assert look(record, [pod("p")]).report.next_wake is not None
