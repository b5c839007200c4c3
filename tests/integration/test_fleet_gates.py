"""The fleet's gates on the real sandbox (issue 23 part 4): the soak after a
node returns, and the kured-style alert gate against a real Prometheus.

nmo runs with the chart's identity (RBAC and ServiceAccount token), its
budget ledger in the release namespace as a chart install has it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from chart_identity import RELEASE_NAMESPACE, reset_leader_leases
from objects import NM, Api
from operator_fixtures import wait_for
from test_fleet import LEADER_FLAGS, NodeWatch, condition, cr, leader_of, replicas

from nmo.controller.ledger import LEDGER_NAME, RETURNED
from nmo_sandbox import Sandbox
from nmo_sandbox.process import free_ports
from nmo_sandbox.prometheus import Prometheus, find_prometheus

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("sole_operator")]

LEDGER = f"/apis/coordination.k8s.io/v1/namespaces/{RELEASE_NAMESPACE}/leases/{LEDGER_NAME}"


@pytest.fixture
async def api(kube: httpx.AsyncClient) -> Api:
    return Api(kube)


@pytest.fixture
async def fresh_ledger(sandbox: Sandbox) -> AsyncIterator[None]:
    """No budget ledger (nor leader Lease) before the test or after it."""
    await reset_leader_leases(sandbox)
    yield
    await reset_leader_leases(sandbox)


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def _queued(api: Api, name: str, reason: str) -> dict[str, Any] | None:
    obj = await api.nm(name)
    return obj if condition(obj or {}, "Queued").get("reason") == reason else None


async def _phase_is(api: Api, name: str, phase: str) -> bool:
    return await api.phase(name) == phase


async def _remove(api: Api, *names: str) -> None:
    for name in names:
        if await api.nm(name) is not None:
            await api.delete_nm_and_wait_gone(name)


@pytest.mark.usefixtures("fresh_ledger")
@pytest.mark.parametrize("interruption", ["restart", "leader change"])
async def test_the_soak_holds_the_next_maintenance_across_a_restart(
    sandbox: Sandbox, api: Api, node_factory: Any, tmp_path: Path, interruption: str
) -> None:
    """Budget 1, soak 15 s: the second maintenance starts no earlier than 15 s
    after the first node returned, though during the soak nmo is killed and
    restarted, or the leader of two replicas is killed and the standby takes
    over (an in-memory timer would start it at once after either)."""
    soak = 15
    first_node, second_node = await node_factory(2)
    first, second = f"soak-{node_factory.prefix}-a", f"soak-{node_factory.prefix}-b"
    flags = ["--max-parallel-maintenances", "1", "--fleet-soak-seconds", str(soak)]
    count = 1
    if interruption == "leader change":
        flags, count = [*LEADER_FLAGS, *flags], 2
    async with sandbox.client() as watch_client:
        watch = NodeWatch(watch_client, node_factory.prefix)
        await watch.start()
        gen = replicas(sandbox, tmp_path, count, flags)
        ops = await gen.__anext__()
        try:
            await api.create(NM, cr(first, first_node))
            await wait_for(lambda: _phase_is(api, first, "Succeeded"), what=f"{first} Succeeded")
            await api.create(NM, cr(second, second_node))
            await wait_for(lambda: _queued(api, second, "BudgetExhausted"), what="budget queue")

            await api.delete_nm_and_wait_gone(first)
            # The durable record of the return: the ledger Lease, written with the release.
            lease = await api.get(LEDGER)
            assert lease is not None
            record = json.loads(lease["metadata"]["annotations"][RETURNED])
            assert (record["maintenance"], record["node"]) == (first, first_node), record
            returned = _time(record["at"])
            ends = returned + timedelta(seconds=soak)

            obj = await wait_for(lambda: _queued(api, second, "Soaking"), what="Queued Soaking")
            message = condition(obj, "Queued")["message"]
            assert message.startswith("position 1 of 1 in the queue: soaking after node "), message
            assert f"node {first_node} returned from maintenance {first} at " in message
            assert f"(--fleet-soak-seconds {soak})" in message

            # SIGKILL in the middle of the soak: nothing in memory survives.
            if interruption == "restart":
                (op,) = ops
                op.kill()
                await op.start()
            else:
                old = await leader_of(ops)
                old.kill()
                op = await leader_of([o for o in ops if o is not old])
            assert datetime.now(UTC) < ends - timedelta(seconds=2), (
                f"the {interruption} came too late to test that it keeps the soak"
            )

            async def soaking_metric() -> float:
                return await op.metric("nmo_fleet_soak_remaining_seconds")

            left = await wait_for(soaking_metric, what="nmo_fleet_soak_remaining_seconds > 0")
            assert 0 < left <= soak, left
            await wait_for(
                lambda: _phase_is(api, second, "Succeeded"), timeout=60, what=f"{second} started"
            )
            back = [t for t, n, on in watch.changes if n == first_node and not on]
            taken = [t for t, n, on in watch.changes if n == second_node and on]
            assert back and taken, watch.changes
            assert taken[0] - back[-1] >= soak - 0.5, (taken[0] - back[-1], watch.changes)
            # The admission's own timestamp says the same (conditions keep whole seconds).
            admitted = condition((await api.nm(second)) or {}, "Queued")
            assert (admitted["status"], admitted["reason"]) == ("False", "Admitted"), admitted
            assert _time(admitted["lastTransitionTime"]).timestamp() >= math.floor(
                ends.timestamp()
            ), (admitted, record)
        finally:
            watch.stop()
            try:
                await _remove(api, first, second)
            finally:
                await gen.aclose()


# -- the alert gate, against a real Prometheus -----------------------------------

BLOCKER = "NodeMaintenanceBlocker"
NOISE = "UnrelatedNoise"


def rule_file(path: Path, *alerts: str) -> Path:
    """Always-firing alerts (``vector(1)``, no ``for``: firing at the first evaluation)."""
    rules = [{"alert": a, "expr": "vector(1)", "labels": {"severity": "warning"}} for a in alerts]
    path.write_text(yaml.safe_dump({"groups": [{"name": "gate-test", "rules": rules}]}))
    return path


class ReloadablePrometheus(Prometheus):
    """The launcher's Prometheus with its lifecycle API (POST /-/reload)."""

    def argv(self) -> list[str]:
        return [*super().argv(), "--web.enable-lifecycle"]

    async def reload(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as http:
            resp = await http.post("/-/reload")
        assert resp.status_code == 200, resp.text


async def _firing(prom: Prometheus) -> set[str]:
    return {a["labels"]["alertname"] for a in await prom.alerts() if a["state"] == "firing"}


@pytest.mark.usefixtures("fresh_ledger")
async def test_a_firing_alert_queues_new_maintenances_until_it_resolves(
    sandbox: Sandbox, api: Api, node_factory: Any, tmp_path: Path
) -> None:
    """An always-firing alert matching --blocking-alerts keeps a new maintenance
    Queued with the alert's name (a non-matching one does not count); once the
    rule is removed and Prometheus reloaded, the alert resolves and it starts."""
    bins = find_prometheus(check=False)
    if not os.access(bins.prometheus, os.X_OK):
        pytest.fail(f"no Prometheus in {bins.bin_dir}: build it with `make prometheus-bin`")
    (node,) = await node_factory(1)
    name = f"gate-{node_factory.prefix}"
    rules = rule_file(tmp_path / "rules.yml", BLOCKER, NOISE)
    prom = ReloadablePrometheus(tmp_path / "prom", rule_files=[rules], binaries=bins)
    await prom.start()
    try:
        await wait_for(lambda: _has(prom, {BLOCKER, NOISE}), what="both alerts firing")
        flags = [
            *("--blocking-prometheus-url", prom.url),
            *("--blocking-alerts", f"^{BLOCKER}$"),
            *("--blocking-prometheus-interval", "1"),
        ]
        gen = replicas(sandbox, tmp_path / "nmo", 1, flags)
        (op,) = await gen.__anext__()
        try:
            await api.create(NM, cr(name, node))
            obj = await wait_for(lambda: _queued(api, name, "AlertFiring"), what="AlertFiring")
            assert obj["status"]["phase"] == "Pending"
            message = condition(obj, "Queued")["message"]
            assert message == (
                f"position 1 of 1 in the queue: alert {BLOCKER} firing on Prometheus "
                f"(--blocking-alerts '^{BLOCKER}$')"
            ), message
            assert list(obj["metadata"].get("finalizers") or []) == []  # nothing done
            n = await api.node(node)
            assert not n["spec"].get("unschedulable") and not n["spec"].get("taints")
            assert await op.metric("nmo_fleet_blocking_alerts") == 1
            assert await op.metric("nmo_fleet_prometheus_up") == 1

            rule_file(rules, NOISE)  # the blocker's rule is gone: its alert resolves
            await prom.reload()
            await wait_for(lambda: _has(prom, {NOISE}), what="only the noise firing")
            await wait_for(lambda: _phase_is(api, name, "Succeeded"), what=f"{name} started")
            admitted = condition((await api.nm(name)) or {}, "Queued")
            assert (admitted["status"], admitted["reason"]) == ("False", "Admitted"), admitted
            assert await op.metric("nmo_fleet_blocking_alerts") == 0
        finally:
            try:
                await _remove(api, name)
            finally:
                await gen.aclose()
    finally:
        prom.stop()


async def _has(prom: Prometheus, names: set[str]) -> bool:
    return await _firing(prom) == names


@pytest.mark.usefixtures("fresh_ledger")
async def test_prometheus_unreachable_holds_new_maintenances(
    sandbox: Sandbox, api: Api, node_factory: Any, tmp_path: Path
) -> None:
    """Fail-closed, as kured: no answer from Prometheus, no new maintenance."""
    (node,) = await node_factory(1)
    name = f"gate-down-{node_factory.prefix}"
    (port,) = free_ports(1)  # nothing listens there
    url = f"http://127.0.0.1:{port}"
    flags = [
        *("--blocking-prometheus-url", url),
        *("--blocking-alerts", ".*"),
        *("--blocking-prometheus-interval", "1"),
    ]
    gen = replicas(sandbox, tmp_path, 1, flags)
    (op,) = await gen.__anext__()
    try:
        await api.create(NM, cr(name, node))
        obj = await wait_for(
            lambda: _queued(api, name, "PrometheusUnavailable"), what="PrometheusUnavailable"
        )
        message = condition(obj, "Queued")["message"]
        assert message.startswith(
            f"position 1 of 1 in the queue: cannot reach Prometheus at {url}: "
        )
        assert message.endswith(
            "new maintenances wait until it answers (fail-closed, --blocking-prometheus-url)"
        ), message
        assert obj["status"]["phase"] == "Pending"
        assert await op.metric("nmo_fleet_prometheus_up") == 0
        assert await op.metric("nmo_fleet_prometheus_queries_total", result="failed") >= 1
    finally:
        try:
            await _remove(api, name)
        finally:
            await gen.aclose()
