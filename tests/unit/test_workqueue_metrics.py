"""The work queue's ``workqueue_*`` series with client-go's meaning (issue 11 item 13).

A fake clock drives the durations; values are read from the registry the
way a scrape reads them.
"""

from __future__ import annotations

import pytest

from nmo.kube.workqueue import WorkQueue
from nmo.telemetry.metrics import Metrics

LABELS = {"name": "nodemaintenance", "controller": "nodemaintenance"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def queue(metrics: Metrics, clock: Clock) -> WorkQueue:
    q = WorkQueue(clock=clock)
    q.instrument(metrics)
    return q


def value(metrics: Metrics, name: str, **extra: str) -> float:
    labels = {**LABELS, **extra}
    found = metrics.registry.get_sample_value(name, labels)
    assert found is not None, f"{name}{labels} is not served"
    return found


def depth(metrics: Metrics) -> float:
    return value(metrics, "workqueue_depth", priority="")


async def test_adds_count_keys_becoming_due_and_depth_follows(
    queue: WorkQueue, metrics: Metrics, clock: Clock
) -> None:
    for key in ["a", "b", "a", "a"]:
        queue.add(key)
    assert value(metrics, "workqueue_adds_total") == 2  # deduplicated adds are not adds
    assert depth(metrics) == 2
    clock.now += 1.5
    assert await queue.get() == "a"
    assert depth(metrics) == 1
    assert value(metrics, "workqueue_queue_duration_seconds_count") == 1
    assert value(metrics, "workqueue_queue_duration_seconds_sum") == pytest.approx(1.5)
    # Added again while its pass runs: due (counted, in the depth), not handed out.
    queue.add("a")
    queue.add("a")
    assert value(metrics, "workqueue_adds_total") == 3
    assert depth(metrics) == 2
    clock.now += 2.0
    queue.done("a")
    assert value(metrics, "workqueue_work_duration_seconds_count") == 1
    assert value(metrics, "workqueue_work_duration_seconds_sum") == pytest.approx(2.0)
    assert value(metrics, "workqueue_adds_total") == 3  # done re-queues without a new add
    assert depth(metrics) == 2
    assert {await queue.get(), await queue.get()} == {"a", "b"}
    assert depth(metrics) == 0
    # The 'a' waited from its add during the first pass: 2 s.
    assert value(metrics, "workqueue_queue_duration_seconds_sum") == pytest.approx(1.5 + 2.0 + 3.5)


async def test_unfinished_work_and_longest_processor_are_read_at_scrape_time(
    queue: WorkQueue, metrics: Metrics, clock: Clock
) -> None:
    assert value(metrics, "workqueue_unfinished_work_seconds") == 0
    assert value(metrics, "workqueue_longest_running_processor_seconds") == 0
    queue.add("a")
    queue.add("b")
    await queue.get()
    clock.now += 3
    await queue.get()
    clock.now += 1
    assert value(metrics, "workqueue_unfinished_work_seconds") == pytest.approx(4 + 1)
    assert value(metrics, "workqueue_longest_running_processor_seconds") == pytest.approx(4)
    queue.done("a")
    queue.done("b")
    assert value(metrics, "workqueue_unfinished_work_seconds") == 0
    assert value(metrics, "workqueue_longest_running_processor_seconds") == 0


async def test_retries_count_reconcile_requeues_not_debounces(
    queue: WorkQueue, metrics: Metrics
) -> None:
    queue.add_after("a", 30, retry=True)  # RequeueAfter
    queue.backoff("b")  # an error's rate-limited requeue
    queue.add_after("c", 0.2)  # a debounced pod event: an add, later
    queue.add_after("d", 0, retry=True)
    assert value(metrics, "workqueue_retries_total") == 3
    assert value(metrics, "workqueue_adds_total") == 1  # only d is due yet
    await queue.shutdown()
    queue.add_after("e", 1, retry=True)
    assert value(metrics, "workqueue_retries_total") == 3


async def test_an_uninstrumented_queue_serves_nothing(metrics: Metrics) -> None:
    q = WorkQueue()
    q.add("a")
    assert await q.get() == "a"
    q.done("a")
    labels = {**LABELS, "priority": ""}
    assert metrics.registry.get_sample_value("workqueue_depth", labels) is None
