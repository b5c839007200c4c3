"""The reconcile workers' controller-runtime series (issue 11 item 13).

The worker loop is the subject; the pass it runs is replaced by one that
answers what each case needs (a result, a conflict, an API error, a crash),
which the sandbox cannot produce on demand. Values are read as a scrape
reads them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import respx

from nmo.controller.engine import Engine, EngineSettings
from nmo.core.maintenance.observed import DONE, Result
from nmo.kube.client import Kube
from nmo.kube.errors import Conflict, Transient
from nmo.telemetry.metrics import Metrics

CTRL = {"controller": "nodemaintenance"}


class Passes:
    """Stands in for the Reconciler: each key answers from ``answers``."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def reconcile(self, key: str) -> Result:
        answer = self.answers[key]
        if answer == "wait":
            self.entered.set()
            await self.gate.wait()
            return DONE
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, Result)
        return answer


def sample(metrics: Metrics, metric: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(metric, {**CTRL, **labels})
    assert value is not None, f"{metric}{labels} is not served"
    return value


@pytest.fixture
def engine(api_server: respx.MockRouter, kube: Kube) -> Engine:
    return Engine(
        kube, EngineSettings(leader_election=False, max_concurrent_reconciles=3), Metrics()
    )


async def test_results_are_labelled_as_controller_runtime_labels_them(engine: Engine) -> None:
    m = engine.metrics
    m.controller_started(engine.settings.max_concurrent_reconciles)
    engine.queue.instrument(m)
    engine.reconciler = Passes(  # type: ignore[assignment]
        {
            "ok": DONE,
            "later": Result(requeue_after=30),
            "raced": Conflict("the object has been modified"),
            "failed": Transient("GET: connection reset"),
            "crashed": RuntimeError("a bug"),
            "sentinel": "wait",
        }
    )
    # Retries come back after a minute, never inside the test: a 0.3 s backoff
    # fired before the assertions on a loaded machine and counted a 7th add.
    engine.queue.base_delay = 60.0
    assert sample(m, "controller_runtime_max_concurrent_reconciles") == 3
    for result in ("success", "error", "requeue", "requeue_after"):
        assert sample(m, "controller_runtime_reconcile_total", result=result) == 0
    worker = asyncio.create_task(engine._worker())  # one worker: passes run in order
    for key in ("ok", "later", "raced", "failed", "crashed", "sentinel"):
        engine.queue.add(key)
    passes = engine.reconciler
    assert isinstance(passes, Passes)
    await asyncio.wait_for(passes.entered.wait(), 5)  # the five before it have ended
    expected = {"success": 1, "requeue_after": 1, "requeue": 1, "error": 2}
    for result, count in expected.items():
        assert sample(m, "controller_runtime_reconcile_total", result=result) == count, result
    assert sample(m, "controller_runtime_reconcile_errors_total") == 2
    assert sample(m, "controller_runtime_terminal_reconcile_errors_total") == 0
    assert sample(m, "controller_runtime_reconcile_panics_total") == 1  # the crash
    # nmo's own series keep their three results.
    nmo = {r: m.registry.get_sample_value("nmo_reconcile_total", {"result": r}) for r in expected}
    assert nmo == {"success": 1, "requeue_after": None, "requeue": 2, "error": 2}
    # Every requeue the results asked for is a workqueue retry.
    assert sample(m, "workqueue_retries_total", name="nodemaintenance") == 4
    assert sample(m, "workqueue_adds_total", name="nodemaintenance") == 6
    passes.gate.set()
    await engine.queue.shutdown()
    await asyncio.wait_for(worker, 5)


async def test_active_workers_counts_the_passes_running_now(engine: Engine) -> None:
    m = engine.metrics
    m.controller_started(engine.settings.max_concurrent_reconciles)
    engine.queue.instrument(m)
    passes = Passes({"slow": "wait"})
    engine.reconciler = passes  # type: ignore[assignment]
    workers = [asyncio.create_task(engine._worker()) for _ in range(3)]
    assert sample(m, "controller_runtime_active_workers") == 0
    engine.queue.add("slow")
    await asyncio.wait_for(passes.entered.wait(), 5)
    assert sample(m, "controller_runtime_active_workers") == 1
    assert sample(m, "workqueue_depth", name="nodemaintenance", priority="") == 0
    engine.queue.add("slow")  # due again while its pass runs
    assert sample(m, "workqueue_depth", name="nodemaintenance", priority="") == 1
    assert sample(m, "workqueue_longest_running_processor_seconds", name="nodemaintenance") > 0
    # Stopping lets the running pass end (its due repeat is dropped): then all is idle.
    passes.gate.set()
    await engine.queue.shutdown()
    await asyncio.wait_for(asyncio.gather(*workers), 5)
    assert sample(m, "controller_runtime_reconcile_time_seconds_count") == 1
    assert sample(m, "controller_runtime_active_workers") == 0
    assert sample(m, "workqueue_depth", name="nodemaintenance", priority="") == 0
    assert sample(m, "workqueue_unfinished_work_seconds", name="nodemaintenance") == 0
    assert sample(m, "workqueue_longest_running_processor_seconds", name="nodemaintenance") == 0


async def test_leader_status_is_zero_until_leading_and_absent_without_election(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    settings = EngineSettings(leader_election=True, leader_election_id="x.io")
    elected = Engine(kube, settings, Metrics())
    read = elected.metrics.registry.get_sample_value
    assert read("leader_election_master_status", {"name": "x.io"}) == 0
    assert read("nmo_leader") == 0
    # The controller's series appear only when it starts, on the leader.
    assert read("controller_runtime_max_concurrent_reconciles", CTRL) is None
    alone = Engine(kube, EngineSettings(leader_election=False), Metrics())
    read = alone.metrics.registry.get_sample_value
    assert read("leader_election_master_status", {"name": "x.io"}) is None
