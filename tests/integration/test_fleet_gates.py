"""The fleet's gates on the real sandbox (issue 23 part 4): the soak after a
node returns, and the kured-style alert gate against a real Prometheus.

nmo runs with the chart's identity (RBAC and ServiceAccount token), its
budget ledger in the release namespace as a chart install has it.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from chart_identity import RELEASE_NAMESPACE, reset_leader_leases
from objects import NM, Api
from operator_fixtures import wait_for
from test_fleet import NodeWatch, condition, cr, replicas

from nmo.controller.ledger import LEDGER_NAME, RETURNED
from nmo_sandbox import Sandbox

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
async def test_the_soak_holds_the_next_maintenance_across_a_restart(
    sandbox: Sandbox, api: Api, node_factory: Any, tmp_path: Path
) -> None:
    """Budget 1, soak 10 s: the second maintenance starts no earlier than 10 s
    after the first node returned, though nmo is killed and restarted during
    the soak (an in-memory timer would start it at once after the restart)."""
    soak = 10
    first_node, second_node = await node_factory(2)
    first, second = f"soak-{node_factory.prefix}-a", f"soak-{node_factory.prefix}-b"
    flags = ["--max-parallel-maintenances", "1", "--fleet-soak-seconds", str(soak)]
    async with sandbox.client() as watch_client:
        watch = NodeWatch(watch_client, node_factory.prefix)
        await watch.start()
        gen = replicas(sandbox, tmp_path, 1, flags)
        (op,) = await gen.__anext__()
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

            op.kill()  # SIGKILL in the middle of the soak: nothing in memory survives
            await op.start()
            assert datetime.now(UTC) < ends - timedelta(seconds=2), (
                "nmo restarted too late to test that a restart keeps the soak"
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
