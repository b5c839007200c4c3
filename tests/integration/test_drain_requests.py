"""What a drain costs the API server (issue 22, parts 2 and 3), read from the
apiserver's audit log and nmo's own counters, never from a fixed sleep.

* Behind a PodDisruptionBudget that allows nothing, nmo sends no eviction
  between the PDB's changes: after the first refusals, the next eviction of
  those pods is one probe, a ``--pdb-recheck-interval`` later; a change of the
  PDB that allows one eviction is acted on at once.
* A drain's status is written at most once per ``--status-interval`` (the
  session's nmo runs with 0.5 s), transitions at once, and drainProgress
  moves on the way (``kubectl get nm -w`` shows it move).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from audit import AuditEvent, AuditWindow, nmo_events, show
from objects import NM, Api, pdb, uid
from operator_fixtures import CURRENT, Operator, wait_for
from workloads import bare_pod, running

from nmo_sandbox import Sandbox

pytestmark = pytest.mark.integration

RECHECK = 8.0  # --pdb-recheck-interval of the test's nmo
AT_ONCE = 4.0  # seconds: "at once", well below RECHECK
STATUS_INTERVAL = 0.5  # the session's nmo (operator_fixtures.Operator.args)
PDBS = "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"


@pytest.fixture
async def api(kube: httpx.AsyncClient) -> Api:
    return Api(kube)


@pytest.fixture
async def rechecking_operator(
    sole_operator: None, sandbox: Sandbox, tmp_path: Path
) -> AsyncIterator[Operator]:
    """nmo alone (its counters are this test's), probing a standing PDB every RECHECK s."""
    op = Operator(sandbox, tmp_path / "nmo", extra=["--pdb-recheck-interval", str(RECHECK)])
    op.log_dir.mkdir(parents=True)
    CURRENT.append(op)  # its log is attached to a failure report
    try:
        await op.start()
        yield op
    finally:
        op.kill(signal.SIGTERM)
        CURRENT.remove(op)


def drained(obj: dict[str, Any] | None) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Drained":
            return dict(cond)
    return {}


def evictions(events: list[AuditEvent], ns: str, pods: list[str]) -> list[AuditEvent]:
    """nmo's eviction requests for these pods, in the order they were received."""
    mine = [
        e
        for e in nmo_events(events)
        if e.on("pods", subresource="eviction") and e.namespace == ns and e.name in pods
    ]
    return sorted(mine, key=lambda e: e.received)


async def test_no_eviction_behind_a_pdb_that_allows_none_until_it_changes(
    rechecking_operator: Operator,
    api: Api,
    namespace: str,
    node_factory: Any,
    sandbox: Sandbox,
) -> None:
    operator, ns = rechecking_operator, namespace
    (node,) = await node_factory(1)
    pods = [f"db-{i}" for i in range(6)]
    for name in pods:
        await bare_pod(api, ns, name, node, labels={"app": "db"})
    await running(api, ns, pods)
    budget = f"{PDBS.format(ns=ns)}/db-pdb"
    await api.create(PDBS.format(ns=ns), pdb("db-pdb", {"app": "db"}, len(pods)))

    async def computed() -> dict[str, Any] | None:
        obj = await api.get(budget)
        st = (obj or {}).get("status") or {}
        done = st.get("currentHealthy") == len(pods) and st.get("disruptionsAllowed") == 0
        return obj if done else None

    await wait_for(computed, what="PDB computed, allowing nothing")
    refused_before = await operator.metric("nmo_evictions_total", outcome="pdb_blocked")
    first = await AuditWindow.open(sandbox)
    name = f"nm-{uid()}"
    await api.create_nm(name, node)
    held = ", ".join(f"{ns}/{p}" for p in pods[:5]) + " and 1 more"
    expected = (
        f"PodDisruptionBudget {ns}/db-pdb needs 6 healthy and has 6 (0 disruptions allowed), "
        f"holding 6 pods: {held}"
    )

    async def all_refused() -> list[AuditEvent] | None:
        obj = await api.nm(name)
        if drained(obj).get("message") != expected:
            return None
        sent = evictions(first.events(), ns, pods)
        refused = {e.name for e in sent if e.code == 429}
        return sent if refused == set(pods) else None

    # The condition's message is what it was before the gate: every pod held.
    wave = await wait_for(all_refused, timeout=60, what="every pod refused once, Blocked")
    pdb_version = (await api.get(budget) or {})["metadata"]["resourceVersion"]
    # The quiet window: from here to the probe, which is waited for (nmo's
    # counter moves by one), no eviction of these pods may be sent.
    quiet = await AuditWindow.open(sandbox)
    refused_wave = len([e for e in wave if e.code == 429])

    async def probed() -> bool:
        count = await operator.metric("nmo_evictions_total", outcome="pdb_blocked")
        return count >= refused_before + refused_wave + 1

    await wait_for(probed, timeout=RECHECK + 30, interval=0.5, what="the safety probe")
    window = await quiet.close()
    everything = evictions(await first.close(), ns, pods)
    assert (await api.get(budget) or {})["metadata"]["resourceVersion"] == pdb_version, (
        "the PDB changed during the quiet window: a probe was due then"
    )
    sent = evictions(window, ns, pods)
    print(
        f"\nfirst wave: {len(wave)} evictions ({refused_wave} refused); then, for "
        f"{(window[-1].received - window[0].received).total_seconds() if window else 0:.1f}"
        f" s, {len(sent)} eviction(s): " + ", ".join(f"{e.name} {e.code}" for e in sent)
    )
    assert len(sent) == 1, "only one probe per PDB per interval:\n" + show(sent)
    (probe,) = sent
    last_refusal = max(e.received for e in wave)
    waited = (probe.received - last_refusal).total_seconds()
    assert waited >= RECHECK - 1.0, f"probed {waited:.1f}s after the last refusal"
    assert probe.code == 429
    # nmo's counter and the audit log agree: the wave, then the probe.
    count = await operator.metric("nmo_evictions_total", outcome="pdb_blocked")
    assert count - refused_before == len([e for e in everything if e.code == 429])
    assert len(everything) == len(pods) + 1, show(everything)

    # The PDB now allows one eviction: it is sent at once, not at the next probe.
    change = await AuditWindow.open(sandbox)
    await api.merge(budget, {"spec": {"minAvailable": len(pods) - 1}})

    async def one_evicted() -> list[AuditEvent] | None:
        events = change.events()
        allowed = [
            e
            for e in events
            if e.on("poddisruptionbudgets", "db-pdb", subresource="status")
            and e.namespace == ns
            and e.is_write
            and e.code == 200
        ]
        done = [e for e in evictions(events, ns, pods) if e.code == 201]
        return [allowed[0], done[0]] if allowed and done else None

    recomputed, evicted = await wait_for(
        one_evicted, timeout=RECHECK + 30, what="one eviction after the PDB allowed it"
    )
    delay = (evicted.received - recomputed.received).total_seconds()
    print(f"PDB status updated -> eviction accepted: {delay:.2f}s")
    assert delay < AT_ONCE, f"evicted {delay:.1f}s after the PDB allowed it (recheck {RECHECK}s)"
    # Relaxed entirely: the drain finishes.
    await api.merge(budget, {"spec": {"minAvailable": 0}})

    async def succeeded() -> bool:
        return await api.phase(name) == "Succeeded"

    await wait_for(succeeded, timeout=60, what=f"{name} Succeeded")
    await change.close()
    await api.delete(f"{NM}/{name}")


async def watch_statuses(
    sandbox: Sandbox, name: str, seen: list[dict[str, Any]], ready: asyncio.Event
) -> None:
    """Every version of the CR's status, from a watch opened before it exists."""
    async with sandbox.client() as client:
        listing = (await client.get(NM)).json()
        params = {
            "watch": "1",
            "resourceVersion": listing["metadata"]["resourceVersion"],
            "fieldSelector": f"metadata.name={name}",
        }
        async with client.stream("GET", NM, params=params, timeout=None) as resp:
            ready.set()
            async for line in resp.aiter_lines():
                if line.strip():
                    seen.append(json.loads(line)["object"].get("status") or {})


def state(st: dict[str, Any]) -> tuple[Any, ...]:
    """What a transition changes: the phase, each condition's status and reason."""
    conditions = sorted((x["type"], x["status"], x["reason"]) for x in st.get("conditions") or [])
    return (st.get("phase"), tuple(conditions))


async def test_a_drain_writes_its_status_at_most_once_per_interval(
    operator: Operator, api: Api, namespace: str, node_factory: Any, sandbox: Sandbox
) -> None:
    (node,) = await node_factory(1)
    pods = [f"web-{i}" for i in range(150)]
    gate = asyncio.Semaphore(10)

    async def make(i: int, pod: str) -> None:
        async with gate:  # graces of 1 to 6 s: the pods leave over several seconds
            await bare_pod(api, namespace, pod, node, labels={"app": "web"}, grace=1 + i % 6)

    await asyncio.gather(*(make(i, p) for i, p in enumerate(pods)))
    await running(api, namespace, pods)
    name = f"nm-{uid()}"
    seen: list[dict[str, Any]] = []
    ready = asyncio.Event()
    watcher = asyncio.create_task(watch_statuses(sandbox, name, seen, ready))
    await asyncio.wait_for(ready.wait(), 30)
    window = await AuditWindow.open(sandbox)
    try:
        await api.create_nm(name, node)

        async def done() -> bool:
            return any(st.get("phase") == "Succeeded" for st in seen)

        await wait_for(done, timeout=120, what=f"{name} Succeeded")
    finally:
        watcher.cancel()
    events = await window.close()
    writes = [
        e
        for e in nmo_events(events)
        if e.on("nodemaintenances", name, subresource="status") and e.is_write
    ]
    ok = sorted((e for e in writes if e.code == 200), key=lambda e: e.received)
    assert ok, show(writes)
    duration = (ok[-1].received - ok[0].received).total_seconds()
    statuses = [st for st in seen if st]
    transitions = sum(
        1 for a, b in zip([{}, *statuses], statuses, strict=False) if state(a) != state(b)
    )
    progress = [st.get("drainProgress", 0) for st in statuses]
    moves = len(set(progress))
    gaps = [(b.received - a.received).total_seconds() for a, b in itertools.pairwise(ok)]
    print(
        f"\n{len(pods)} pods drained in {duration:.1f}s: {len(ok)} status writes "
        f"({len(writes) - len(ok)} refused), {transitions} transitions, drainProgress "
        f"{sorted(set(progress))}; shortest gap {min(gaps, default=0):.2f}s"
    )
    # Each write is a transition or comes an interval after the one before.
    bound = transitions + math.floor(duration / STATUS_INTERVAL) + 1
    assert len(ok) <= bound, f"{len(ok)} writes in {duration:.1f}s:\n" + show(ok)
    short = [g for g in gaps if g < STATUS_INTERVAL * 0.9]
    assert len(short) <= transitions, f"{len(short)} writes within the interval: {gaps}"
    assert moves >= 4, f"drainProgress moved only through {sorted(set(progress))}"
    assert progress[-1] == 100 and statuses[-1].get("phase") == "Succeeded"
    await api.delete(f"{NM}/{name}")
