"""What ``/metrics`` says during a real maintenance, by value (issue 11 item 13).

nmo's own series (maintenances by phase, drain duration and blocked time,
evictions by outcome, lease errors, reconciles) and the ones the Go
operator's controller-runtime served (``controller_runtime_*``,
``workqueue_*``, ``rest_client_requests_total``, ``leader_election_master_status``,
``process_*``) are read from running nmo processes and checked against what
happened: the API server's audit log, the CR's own timestamps, and the
leader-election Lease.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from audit import AuditWindow, nmo_events, show
from objects import LEASES, NM, Api, uid
from operator_fixtures import Operator, idle, scrape, wait_for
from test_drain_control import blocked_node, remove_nm, wait_phase
from test_maintenance import reconciled_again
from test_process import leader_args, procs  # noqa: F401  (the fixture)

from nmo.api import constants as c
from nmo_sandbox import Sandbox

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
CTRL = {"controller": "nodemaintenance"}
QUEUE = {"name": "nodemaintenance", "controller": "nodemaintenance"}
PHASES = ("Pending", "Running", "Succeeded", "Failed")
METHODS = {"create": "POST", "patch": "PATCH", "update": "PUT", "delete": "DELETE"}


@pytest.fixture
async def api(kube: httpx.AsyncClient) -> Api:
    return Api(kube)


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def metric(samples: Samples, series: str, **labels: str) -> float:
    """The sum of ``series``' samples whose labels include ``labels`` (0 when absent)."""
    want = set(labels.items())
    return sum(v for (n, got), v in samples.items() if n == series and want <= got)


def delta(after: Samples, before: Samples, series: str, **labels: str) -> float:
    return metric(after, series, **labels) - metric(before, series, **labels)


def phases(samples: Samples) -> dict[str, float]:
    return {p: metric(samples, "nmo_maintenances", phase=p) for p in PHASES}


def writes(samples: Samples, host: str) -> Counter[tuple[str, str]]:
    """rest_client_requests_total of the write methods, by (code, method)."""
    out: Counter[tuple[str, str]] = Counter()
    for (name, labels), value in samples.items():
        got = dict(labels)
        wanted = got.get("host") == host and got.get("method") in METHODS.values()
        if name == "rest_client_requests_total" and wanted:
            out[(got["code"], got["method"])] += int(value)
    return out


async def test_a_blocked_then_finished_maintenance_by_the_numbers(
    operator: Operator, api: Api, namespace: str, node_factory: Any, sandbox: Sandbox
) -> None:
    listed = await api.get(NM)
    others = [o["metadata"]["name"] for o in (listed or {}).get("items", [])]
    # The counters are per process: they speak of this CR only if it is alone.
    assert others == [], f"NodeMaintenances left behind by earlier tests: {others}"
    node, pods = await blocked_node(api, namespace, node_factory)  # 2 pods, PDB allows 0
    port = operator.metrics_port
    before = await idle(port)
    window = await AuditWindow.open(sandbox)
    name = f"nm-{uid()}"
    await api.create_nm(name, node)

    async def blocked() -> Samples | None:
        s = await scrape(port)
        held = metric(s, "nmo_drain_blocked_seconds", maintenance=name, node=node)
        refused = delta(s, before, "nmo_evictions_total", outcome="pdb_blocked")
        return s if held > 0 and refused >= 2 else None

    during = await wait_for(blocked, what="the drain Blocked in the metrics")
    assert phases(during) == {"Pending": 0, "Running": 1, "Succeeded": 0, "Failed": 0}
    assert delta(during, before, "nmo_evictions_total", outcome="evicted") == 0

    await api.merge(
        f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/db-pdb",
        {"spec": {"minAvailable": 0}},
    )
    done = await wait_phase(api, name, "Succeeded")
    after = await idle(port)
    assert phases(after) == {"Pending": 0, "Running": 0, "Succeeded": 1, "Failed": 0}
    assert delta(after, before, "nmo_evictions_total", outcome="evicted") == len(pods)
    for outcome in ("gone", "conflict", "namespace_terminating", "multiple_pdbs", "error"):
        assert delta(after, before, "nmo_evictions_total", outcome=outcome) == 0, outcome
    assert metric(after, "nmo_drain_blocked_seconds", maintenance=name) == 0  # series gone
    assert not [k for k in after if k[0] == "nmo_drain_blocked_seconds"]
    assert delta(after, before, "nmo_lease_errors_total") == 0
    # The drain duration is observed once: from the CR's creation to Succeeded.
    assert delta(after, before, "nmo_drain_duration_seconds_count") == 1
    (succeeded,) = await api.wait_events(name, "SucceedMaintenance")
    took = (
        ts(succeeded["firstTimestamp"]) - ts(done["metadata"]["creationTimestamp"])
    ).total_seconds()
    observed = delta(after, before, "nmo_drain_duration_seconds_sum")
    assert took - 1.5 <= observed <= took + 1.5, (observed, took)

    # Reconciles as controller-runtime counts them, the same passes nmo counts.
    passes = delta(after, before, "nmo_reconcile_total")
    assert passes >= 2
    cr = {
        r: delta(after, before, "controller_runtime_reconcile_total", result=r, **CTRL)
        for r in ("success", "error", "requeue", "requeue_after")
    }
    assert sum(cr.values()) == passes, cr
    assert cr["error"] == delta(after, before, "controller_runtime_reconcile_errors_total", **CTRL)
    assert cr["error"] == delta(after, before, "nmo_reconcile_errors_total")
    assert delta(after, before, "nmo_reconcile_duration_seconds_count") == passes
    assert metric(after, "nmo_workqueue_depth") == 0
    assert cr["requeue_after"] >= 1, cr  # the blocked drain asked to be looked at again
    assert delta(after, before, "controller_runtime_reconcile_time_seconds_count", **CTRL) == passes
    # Each pass was handed out once by the queue, after being added once.
    for series in (
        "workqueue_queue_duration_seconds_count",
        "workqueue_work_duration_seconds_count",
    ):
        assert delta(after, before, series, **QUEUE) == passes, series
    assert delta(after, before, "workqueue_adds_total", **QUEUE) == passes
    assert delta(after, before, "workqueue_retries_total", **QUEUE) >= cr["requeue_after"]
    assert metric(after, "controller_runtime_max_concurrent_reconciles", **CTRL) == 10

    # Three more passes over the Succeeded CR: each one a success, counted once.
    # Only a write to its Node (kwok's heartbeat) can cause another pass meanwhile.
    pokes = await AuditWindow.open(sandbox)
    quiet = await idle(port)
    await reconciled_again(operator, api, name, times=3)
    again = await idle(port)
    heartbeats = [
        e
        for e in await pokes.close()
        if not e.is_nmo and e.is_write and e.on("nodes", node, subresource=None)
    ]
    more = delta(again, quiet, "controller_runtime_reconcile_total", **CTRL)
    print(
        f"\npasses: {passes:g} for the maintenance ({cr}), {more:g} for 3 pokes "
        f"({len(heartbeats)} node writes meanwhile); "
        f"drain {observed:.2f}s observed, {took:.0f}s by the timestamps"
    )
    assert 3 <= more <= 3 + len(heartbeats), show(heartbeats)
    assert (
        delta(again, quiet, "controller_runtime_reconcile_total", result="success", **CTRL) == more
    )
    assert delta(again, quiet, "nmo_reconcile_total", result="success") == more
    assert delta(again, quiet, "workqueue_adds_total", **QUEUE) == more
    assert delta(again, quiet, "workqueue_work_duration_seconds_count", **QUEUE) == more
    assert delta(again, quiet, "workqueue_retries_total", **QUEUE) == 0

    # Removed: no CR left, so every phase counts 0 (no pass follows a deletion).
    await remove_nm(api, name)

    async def recounted() -> Samples | None:
        s = await scrape(port)
        return s if sum(phases(s).values()) == 0 else None

    await wait_for(recounted, timeout=30, what="nmo_maintenances back to 0")

    # The lease is released and nothing runs any more: nmo is idle at both ends
    # of the window, so its writes in the audit log are exactly what it counted.
    final = await idle(port)
    logged = [e for e in nmo_events(await window.close()) if e.verb in METHODS]
    host = urlsplit(sandbox.server).netloc
    audited = Counter((str(e.code), METHODS[e.verb]) for e in logged)
    assert audited[("201", "POST")] >= len(pods) + 2  # evictions, lease, events
    counted = writes(final, host)
    counted.subtract(writes(before, host))
    assert +counted == audited, (
        f"rest_client_requests_total {dict(counted)} != audit log {dict(audited)}"
    )


async def test_leader_and_standby_report_their_roles(
    procs: Any,  # noqa: F811
    sandbox: Sandbox,
) -> None:
    started = time.time()
    lease = {"name": c.LEADER_ELECTION_ID}
    a = procs("nmo-metrics-a", *leader_args())
    await wait_for(a.started, timeout=30, what="a to lead")
    b = procs("nmo-metrics-b", *leader_args())
    await wait_for(b.synced, timeout=30, what="b's caches")
    leader, standby = await scrape(a.metrics_port), await scrape(b.metrics_port)
    assert metric(leader, "leader_election_master_status", **lease) == 1
    assert metric(leader, "nmo_leader") == 1
    assert metric(standby, "leader_election_master_status", **lease) == 0
    assert metric(standby, "nmo_leader") == 0
    # The controller starts on the leader only, as controller-runtime's does.
    assert metric(leader, "controller_runtime_max_concurrent_reconciles", **CTRL) == 10
    assert ("controller_runtime_active_workers", frozenset(CTRL.items())) in leader
    assert not [k for k in standby if k[0].startswith(("controller_runtime_", "workqueue_"))]
    host = urlsplit(sandbox.server).netloc
    for samples in (leader, standby):
        # Both replicas list and watch (their caches serve the webhook).
        assert (
            metric(samples, "rest_client_requests_total", code="200", method="GET", host=host) > 0
        )
        assert metric(samples, "process_resident_memory_bytes") > 10e6
        assert started - 60 <= metric(samples, "process_start_time_seconds") <= time.time()
        assert metric(samples, "process_open_fds") > 0
        assert metric(samples, "process_cpu_seconds_total") > 0

    # The leader goes: the standby takes over and says so.
    a.stop(signal.SIGTERM)
    await wait_for(b.started, timeout=20, what="b to take over")

    async def b_leads() -> Samples | None:
        s = await scrape(b.metrics_port)
        return s if metric(s, "leader_election_master_status", **lease) == 1 else None

    took_over = await wait_for(b_leads, timeout=10, what="b's leader status 1")
    assert metric(took_over, "nmo_leader") == 1
    assert metric(took_over, "controller_runtime_max_concurrent_reconciles", **CTRL) == 10
    assert ("workqueue_depth", frozenset({**QUEUE, "priority": ""}.items())) in took_over


async def test_lease_renewals_and_a_vanished_lease_are_counted(
    operator: Operator, api: Api, node_factory: Any
) -> None:
    (node,) = await node_factory(1)
    name = f"nm-{uid()}"
    port = operator.metrics_port
    await api.create_nm(name, node)
    await wait_phase(api, name, "Succeeded")
    before = await scrape(port)
    # The session's nmo renews every 2 s: each new renewTime is one renewal.
    seen: set[str] = set()

    async def renewed_twice() -> bool:
        lease = await api.lease(node)
        assert lease is not None, f"the lease of node {node} is gone"
        seen.add(lease["spec"]["renewTime"])
        return len(seen) >= 3

    await wait_for(renewed_twice, timeout=30, what="two renewals of the node lease")

    # nmo counts a renewal once it has read the PUT's answer, a moment after
    # the apiserver shows the new renewTime.
    async def counted() -> Samples | None:
        s = await scrape(port)
        return s if delta(s, before, "nmo_lease_renewals_total") >= len(seen) - 1 else None

    after = await wait_for(counted, timeout=10, what=f"{len(seen) - 1} renewals counted")
    assert delta(after, before, "nmo_lease_errors_total") == 0

    # Someone deletes the lease: the next renewal fails, once, as a renewal error.
    await api.delete(f"{LEASES}/node-{node}")

    async def failed() -> Samples | None:
        s = await scrape(port)
        return s if delta(s, after, "nmo_lease_errors_total", kind="renewal") > 0 else None

    lost = await wait_for(failed, timeout=30, what="a failed renewal counted")
    assert delta(lost, after, "nmo_lease_errors_total", kind="renewal") == 1
    assert delta(lost, after, "nmo_lease_errors_total", kind="foreign") == 0
    assert delta(lost, after, "nmo_lease_errors_total", kind="api") == 0
    await remove_nm(api, name)
