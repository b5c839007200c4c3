"""``nmo_drain_blocked_seconds`` is as old as the scrape, not as the last pass.

A pass of a drain with pods pending lasts up to 30 s, and the gauge was only
set when a pass ended: a blocked drain's series appeared up to 30 s late and
grew in 30 s steps, which delayed ``NodeMaintenanceDrainBlocked`` by as much.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from nmo.api import constants as c
from nmo.controller.engine import Engine, EngineSettings
from nmo.kube.client import Kube
from nmo.server.app import create_metrics_app
from nmo.telemetry.metrics import Metrics


def blocked_for(name: str, seconds: float) -> dict[str, Any]:
    since = (datetime.now(UTC) - timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "metadata": {"name": name, "resourceVersion": "7"},
        "spec": {"nodeName": f"node-{name}"},
        "status": {
            "phase": "Running",
            "conditions": [
                {
                    "type": c.CONDITION_DRAINED,
                    "status": "False",
                    "reason": "Blocked",
                    "lastTransitionTime": since,
                },
            ],
        },
    }


def sample(metrics: Metrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(
        "nmo_drain_blocked_seconds", {"maintenance": name, "node": f"node-{name}"}
    )


async def scrape(metrics: Metrics) -> str:
    app = create_metrics_app(metrics=metrics, auth=None)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        answer = await http.get("/metrics")
    assert answer.status_code == 200
    return answer.text


async def test_a_scrape_on_the_leader_reads_the_blocked_time_as_of_now(kube: Kube) -> None:
    metrics = Metrics()
    engine = Engine(kube, EngineSettings(leader_election=False), metrics)
    engine.maintenances.store["held"] = blocked_for("held", 120)
    engine.leading = True
    assert sample(metrics, "held") is None  # no pass has run
    text = await scrape(metrics)
    assert 'nmo_drain_blocked_seconds{maintenance="held",node="node-held"}' in text
    first = sample(metrics, "held")
    assert first is not None and 119 <= first < 180
    engine.maintenances.store["held"] = blocked_for("held", 300)  # as if time went on
    await scrape(metrics)
    assert (sample(metrics, "held") or 0) >= 299


async def test_a_replica_that_does_not_lead_leaves_the_leaders_gauges_alone(
    kube: Kube,
) -> None:
    metrics = Metrics()
    engine = Engine(kube, EngineSettings(leader_election=False), metrics)
    engine.maintenances.store["held"] = blocked_for("held", 120)
    engine.leading = False
    text = await scrape(metrics)
    assert "nmo_drain_blocked_seconds{" not in text
