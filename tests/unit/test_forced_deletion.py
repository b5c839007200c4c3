"""onTimeout Delete without the right to delete pods (issue 19 item 1).

The chart grants ``delete`` on pods only with ``drain.allowPodDeletion``.
Without it, the API server answers every forced DELETE with 403: the
evictor must say so once (the refused pod shows the Forbidden message,
naming the chart value, so lastError and the Drained condition carry it)
and stop sending DELETEs for that maintenance until its spec changes, nmo
may delete pods, or the slow retry interval has passed. Other failed
DELETEs back off instead of being re-sent on every pass.
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
from nmo.core.maintenance.drainstate import survey
from nmo.kube.access import REVIEWS_PATH, Access
from nmo.kube.client import Kube
from nmo.telemetry.metrics import Metrics

FORBIDDEN = httpx.Response(
    403,
    json={
        "kind": "Status",
        "reason": "Forbidden",
        "message": 'pods "db-0" is forbidden: User "system:serviceaccount:nmo:nmo" cannot '
        'delete resource "pods" in API group "" in the namespace "ns"',
    },
)
PDB_429 = httpx.Response(
    429,
    json={"reason": "TooManyRequests", "message": "Cannot evict pod as it would violate the "
          "pod's disruption budget."},
)  # fmt: skip


def pod(name: str, uid: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid or f"u-{name}"}}


def deletion(name: str) -> str:
    return f"/api/v1/namespaces/ns/pods/{name}"


def answer(allowed: bool) -> httpx.Response:
    return httpx.Response(201, json={"status": {"allowed": allowed}})


def evictor(kube: Kube, changed: list[str] | None = None, **kw: Any) -> Evictor:
    sink = changed if changed is not None else []
    return Evictor(
        kube,
        max_parallel=4,
        on_change=sink.append,
        metrics=Metrics(),
        access=Access(kube, ttl=kw.pop("ttl", 0.0)),
        **kw,
    )


def last_error(record: Memory, pods: list[dict[str, Any]]) -> str | None:
    tick = asyncio.get_running_loop().time()
    return survey(record.drain, pods, tick=tick, now=datetime.now(UTC)).report.last_error


async def test_a_403_is_reported_once_and_no_delete_follows(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    routes = {n: api_server.delete(deletion(n)).mock(return_value=FORBIDDEN) for n in ("a", "b")}
    review = api_server.post(REVIEWS_PATH).mock(return_value=answer(False))
    changed: list[str] = []
    ev = evictor(kube, changed)
    record = Memory(uid="uid-nm-1", name="nm-1", node="n1")
    pods = (pod("a"), pod("b"))
    force = tuple((p, 30) for p in pods)
    assert await ev.force(record, force, generation=1) == (False, False)
    # One DELETE, refused: the second pod's is never sent.
    assert (routes["a"].call_count, routes["b"].call_count) == (1, 0)
    assert ev.metrics.forced_deletions.labels(outcome="forbidden")._value.get() == 1
    assert changed == ["nm-1"]  # the status says so at once
    refusal = record.deletion_refused
    assert refusal is not None and refusal.rbac and refusal.pods == {"ns/a"}
    error = last_error(record, list(pods))
    assert error is not None
    assert error.startswith('onTimeout Delete: nmo may not delete pods: pods "db-0" is forbidden')
    assert "set the chart value drain.allowPodDeletion=true" in error
    # Pass after pass (same spec, still not allowed): nothing is sent.
    for _ in range(5):
        assert await ev.force(record, force, generation=1) == (False, False)
    assert (routes["a"].call_count, routes["b"].call_count) == (1, 0)
    assert last_error(record, list(pods)) == error
    assert review.call_count == 6  # ttl 0 here: one review per pass, never a DELETE


async def test_eviction_answers_do_not_hide_the_refusal(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    api_server.delete(deletion("a")).mock(return_value=FORBIDDEN)
    api_server.post(REVIEWS_PATH).mock(return_value=answer(False))
    api_server.post(deletion("a") + "/eviction").mock(return_value=PDB_429)
    ev = evictor(kube)
    record = Memory(uid="uid-nm-1", name="nm-1", node="n1")
    await ev.force(record, ((pod("a"), 1),), generation=1)
    error = last_error(record, [pod("a")])
    ev.start(record, (pod("a"),))  # the eviction goes on behind its PDB
    await asyncio.wait_for(asyncio.gather(*record.evictions), 5)
    assert ev.metrics.evictions.labels(outcome="pdb_blocked")._value.get() == 1
    assert last_error(record, [pod("a")]) == error


@pytest.mark.parametrize("lift", ["spec", "permission", "interval"])
async def test_the_refusal_is_lifted(api_server: respx.MockRouter, kube: Kube, lift: str) -> None:
    route = api_server.delete(deletion("a")).mock(
        side_effect=[FORBIDDEN, httpx.Response(200, json={"kind": "Pod"})]
    )
    reviews = api_server.post(REVIEWS_PATH).mock(
        side_effect=[answer(False), answer(lift == "permission")]
    )
    ev = evictor(kube, forbidden_retry=0.0 if lift == "interval" else 600.0)
    record = Memory(uid="uid-nm-1", name="nm-1", node="n1")
    force = ((pod("a"), 1),)
    assert await ev.force(record, force, generation=1) == (False,)
    generation = 2 if lift == "spec" else 1
    assert await ev.force(record, force, generation=generation) == (True,)
    assert route.call_count == 2
    assert record.deletion_refused is None
    assert record.drain["ns/a"].forced
    assert reviews.call_count == (2 if lift == "permission" else 1)


async def test_a_refusal_by_admission_is_not_lifted_by_rbac(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    """RBAC allows it (a webhook or policy refused): no review says when to retry."""
    api_server.delete(deletion("a")).mock(
        return_value=httpx.Response(403, json={"reason": "Forbidden", "message": "admission "
                                    'webhook "hold.example.com" denied the request: held'})
    )  # fmt: skip
    reviews = api_server.post(REVIEWS_PATH).mock(return_value=answer(True))
    ev = evictor(kube)
    record = Memory(uid="uid-nm-1", name="nm-1", node="n1")
    for _ in range(3):
        assert await ev.force(record, ((pod("a"), 1),), generation=1) == (False,)
    assert reviews.call_count == 1  # asked once, when refused
    error = last_error(record, [pod("a")])
    assert error is not None and "denied the request: held" in error
    assert "drain.allowPodDeletion" not in error  # the chart value would not help


async def test_the_refusal_moves_to_a_pod_still_there(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    api_server.delete(deletion("a")).mock(return_value=FORBIDDEN)
    api_server.post(REVIEWS_PATH).mock(return_value=answer(False))
    ev = evictor(kube)
    record = Memory(uid="uid-nm-1", name="nm-1", node="n1")
    await ev.force(record, ((pod("a"), 1), (pod("b"), 1)), generation=1)
    del record.drain["ns/a"]  # a left (evicted once its PDB allowed it): its state is dropped
    await ev.force(record, ((pod("b"), 1),), generation=1)
    error = last_error(record, [pod("b")])
    assert error is not None and "drain.allowPodDeletion=true" in error


async def test_other_failures_back_off_instead_of_every_pass(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    route = api_server.delete(deletion("a")).mock(
        return_value=httpx.Response(500, json={"message": "etcdserver: request timed out"})
    )
    ev = evictor(kube, base_backoff=60.0, max_backoff=60.0)
    record = Memory(uid="uid-nm-1", name="nm-1", node="n1")
    assert await ev.force(record, ((pod("a"), 1),), generation=1) == (False,)
    sent = route.call_count  # the boundary retries a 500 a few times within one attempt
    for _ in range(3):
        assert await ev.force(record, ((pod("a"), 1),), generation=1) == (False,)
    assert route.call_count == sent
    assert record.deletion_refused is None
    assert ev.metrics.forced_deletions.labels(outcome="error")._value.get() == 1
    record.force_after["ns/a"] = 0.0  # the backoff is over
    await ev.force(record, ((pod("a"), 1),), generation=1)
    assert route.call_count == 2 * sent
    sent = json.loads(route.calls.last.request.content)
    assert sent["preconditions"] == {"uid": "u-a"}


async def test_stopping_the_drain_forgets_the_refusal(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    api_server.delete(deletion("a")).mock(return_value=FORBIDDEN)
    api_server.post(REVIEWS_PATH).mock(return_value=answer(False))
    record = Memory(uid="uid-nm-1", name="nm-1", node="n1")
    await evictor(kube).force(record, ((pod("a"), 1),), generation=1)
    assert record.deletion_refused is not None
    record.stop_drain()
    assert record.deletion_refused is None and record.force_after == {}
