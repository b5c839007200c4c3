"""Delivering notifications: retries, Retry-After, give-up, overflow and the flush
(respx as the receiver, an injected sleep: waiting is not the subject)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest
import respx

from nmo import __version__
from nmo.controller.notifier import (
    Notifier,
    NotifySettings,
    answered,
    check_url,
    retry_after,
    shown,
)
from nmo.core.maintenance.notifications import Kind, Notification
from nmo.telemetry.metrics import Metrics

URL = "http://receiver.test/hooks/nmo"
NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def note(kind: Kind = Kind.BLOCKED, name: str = "nm-1") -> Notification:
    return Notification(kind, name, "node-2", "Running", "r", "m", NOW, "op-1")


class FakeSleep:
    """Records the delays asked for; returns at once (time is not the subject)."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await asyncio.sleep(0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def count(metrics: Metrics, kind: str, result: str) -> float:
    value = metrics.registry.get_sample_value(
        "nmo_notifications_total", {"kind": kind, "result": result}
    )
    return value or 0.0


def retries(metrics: Metrics, kind: str) -> float:
    value = metrics.registry.get_sample_value("nmo_notification_retries_total", {"kind": kind})
    return value or 0.0


@pytest.fixture
def receiver() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as mock:
        yield mock


@pytest.fixture
def sleep() -> FakeSleep:
    return FakeSleep()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


def notifier(metrics: Metrics, sleep: FakeSleep, **settings: Any) -> Notifier:
    return Notifier(NotifySettings(URL, **settings), metrics=metrics, operator="op-1", sleep=sleep)


@pytest.fixture
async def running() -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks: list[asyncio.Task[None]] = []
    yield tasks
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def delivered_all(n: Notifier, tasks: list[asyncio.Task[None]]) -> None:
    """Run the notifier until it has nothing pending (the outcome is in the metrics)."""
    tasks.append(asyncio.create_task(n.run()))
    async with asyncio.timeout(10):
        await n.join()


async def test_500_then_200_is_retried_and_delivered(
    receiver: respx.MockRouter, metrics: Metrics, sleep: FakeSleep, running: list[Any]
) -> None:
    route = receiver.post(URL).mock(side_effect=[httpx.Response(500), httpx.Response(200)])
    n = notifier(metrics, sleep, backoff_base=2.0)
    n.enqueue(note())
    await delivered_all(n, running)
    assert route.call_count == 2
    assert count(metrics, "blocked", "delivered") == 1
    assert count(metrics, "blocked", "failed") == 0
    assert retries(metrics, "blocked") == 1
    assert len(sleep.delays) == 1 and 1.0 <= sleep.delays[0] <= 2.0  # jittered base
    request = route.calls.last.request
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["User-Agent"] == f"nmo/{__version__}"
    assert json.loads(request.content) == note().document()


@pytest.mark.parametrize("form", ["seconds", "date"])
async def test_429_retry_after_is_honoured(
    receiver: respx.MockRouter,
    metrics: Metrics,
    sleep: FakeSleep,
    running: list[Any],
    form: str,
) -> None:
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    header = "20" if form == "seconds" else later
    route = receiver.post(URL).mock(
        side_effect=[httpx.Response(429, headers={"Retry-After": header}), httpx.Response(204)]
    )
    n = notifier(metrics, sleep, backoff_base=0.01)
    n.enqueue(note(Kind.BEGIN))
    await delivered_all(n, running)
    assert route.call_count == 2
    assert count(metrics, "begin", "delivered") == 1
    (waited,) = sleep.delays
    assert (waited == 20) if form == "seconds" else (25 <= waited <= 30), waited


async def test_retry_after_is_capped(
    receiver: respx.MockRouter, metrics: Metrics, sleep: FakeSleep, running: list[Any]
) -> None:
    receiver.post(URL).mock(
        side_effect=[httpx.Response(503, headers={"Retry-After": "3600"}), httpx.Response(200)]
    )
    n = notifier(metrics, sleep, backoff_cap=60.0)
    n.enqueue(note())
    await delivered_all(n, running)
    assert sleep.delays == [60.0]


async def test_connection_refused_gives_up_after_the_attempts(
    receiver: respx.MockRouter,
    metrics: Metrics,
    sleep: FakeSleep,
    running: list[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    route = receiver.post(URL).mock(side_effect=httpx.ConnectError("Connection refused"))
    n = notifier(metrics, sleep, attempts=5, backoff_base=1.0, backoff_cap=4.0)
    n.enqueue(note(Kind.SUCCEEDED))
    with caplog.at_level(logging.WARNING, logger="nmo.notify"):
        await delivered_all(n, running)
    assert route.call_count == 5
    assert count(metrics, "succeeded", "failed") == 1
    assert count(metrics, "succeeded", "delivered") == 0
    assert retries(metrics, "succeeded") == 4
    # capped exponential growth, jittered into [d/2, d]
    for i, waited in enumerate(sleep.delays):
        ceiling = min(4.0, 2.0**i)
        assert ceiling / 2 <= waited <= ceiling, sleep.delays
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage() == (
        "notification succeeded for maintenance nm-1 not delivered after 5 attempt(s): "
        "ConnectError: Connection refused"
    )


async def test_a_4xx_is_not_retried(
    receiver: respx.MockRouter, metrics: Metrics, sleep: FakeSleep, running: list[Any]
) -> None:
    route = receiver.post(URL).mock(return_value=httpx.Response(404))
    n = notifier(metrics, sleep)
    n.enqueue(note(Kind.REMOVED))
    await delivered_all(n, running)
    assert route.call_count == 1
    assert count(metrics, "removed", "failed") == 1
    assert sleep.delays == []


async def test_max_age_stops_the_retries(
    receiver: respx.MockRouter, metrics: Metrics, running: list[Any]
) -> None:
    route = receiver.post(URL).mock(return_value=httpx.Response(502))
    clock = Clock()

    async def slow_sleep(seconds: float) -> None:
        clock.now += seconds
        await asyncio.sleep(0)

    n = Notifier(
        NotifySettings(URL, attempts=100, max_age=10.0, backoff_base=4.0, backoff_cap=4.0),
        metrics=metrics,
        operator="o",
        clock=clock,
        sleep=slow_sleep,
    )
    n.enqueue(note())
    await delivered_all(n, running)
    assert count(metrics, "blocked", "failed") == 1
    # waits of 2 to 4 s each: at most 5 waits fit in 10 s, so at most 6 attempts
    assert 3 <= route.call_count <= 6, route.call_count
    assert clock.now <= 10.0


async def test_overflow_drops_the_oldest_and_counts(
    receiver: respx.MockRouter,
    metrics: Metrics,
    sleep: FakeSleep,
    running: list[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    route = receiver.post(URL).mock(return_value=httpx.Response(200))
    n = notifier(metrics, sleep, queue_size=3)
    with caplog.at_level(logging.WARNING, logger="nmo.notify"):
        n.enqueue(note(Kind.BEGIN, "nm-1"))
        for i in range(2, 6):
            n.enqueue(note(Kind.BLOCKED, f"nm-{i}"))
    assert n.pending == 3
    assert count(metrics, "begin", "dropped") == 1
    assert count(metrics, "blocked", "dropped") == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "notification queue full (3): dropped the oldest, begin for maintenance nm-1"
    ], "one warning per 10 s, not one per drop"
    await delivered_all(n, running)
    sent = [json.loads(call.request.content)["maintenance"] for call in route.calls]
    assert sent == ["nm-3", "nm-4", "nm-5"]  # the newest, in order
    assert count(metrics, "blocked", "delivered") == 3


async def test_cancelling_flushes_what_is_left_once(
    receiver: respx.MockRouter,
    metrics: Metrics,
    running: list[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers = [httpx.Response(500), httpx.Response(500), httpx.Response(200), httpx.Response(200)]
    route = receiver.post(URL).mock(side_effect=answers)
    parked = asyncio.Event()

    async def park(_seconds: float) -> None:
        parked.set()
        await asyncio.Event().wait()  # the retry wait of the first one never ends

    n = Notifier(NotifySettings(URL), metrics=metrics, operator="o", sleep=park)
    for kind in (Kind.BEGIN, Kind.BLOCKED, Kind.SUCCEEDED):
        n.enqueue(note(kind))
    task = asyncio.create_task(n.run())
    await parked.wait()
    task.cancel()
    with (
        caplog.at_level(logging.WARNING, logger="nmo.notify"),
        pytest.raises(asyncio.CancelledError),
    ):
        await task
    # begin (500), then on the way out, once each: begin (500), blocked, succeeded
    assert route.call_count == 4
    assert count(metrics, "begin", "failed") == 1
    assert count(metrics, "blocked", "delivered") == 1
    assert count(metrics, "succeeded", "delivered") == 1
    assert n.pending == 0
    assert [r.getMessage() for r in caplog.records] == [
        "notification begin for maintenance nm-1 not delivered after 2 attempt(s): HTTP 500"
    ]


async def test_the_flush_has_a_deadline(
    receiver: respx.MockRouter, metrics: Metrics, sleep: FakeSleep
) -> None:
    hung = asyncio.Event()

    async def hang(_request: httpx.Request) -> httpx.Response:
        hung.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    receiver.post(URL).mock(side_effect=hang)
    n = notifier(metrics, sleep, flush_timeout=0.05, timeout=30.0)
    n.enqueue(note(Kind.BEGIN))
    n.enqueue(note(Kind.FAILED))
    task = asyncio.create_task(n.run())
    await hung.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert count(metrics, "begin", "dropped") == 1
    assert count(metrics, "failed", "dropped") == 1
    assert n.pending == 0


# -- the pure helpers ------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("http://receiver:8080/hook", True),
        ("https://hooks.example.com/nmo?token=x", True),
        ("http://[::1]:9000/", True),
        ("ftp://receiver/", False),
        ("receiver:8080", False),
        ("http://", False),
        ("http:/receiver", False),
        ("http://receiver:port/", False),
        ("", False),
    ],
)
def test_check_url(url: str, ok: bool) -> None:
    assert (check_url(url) is None) is ok


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "https://u:secret@hooks.example.com:8443/a/b?token=x",
            "https://hooks.example.com:8443/<redacted>",
        ),
        ("https://hooks.slack.com/services/T0/B0/s3cr3t", "https://hooks.slack.com/<redacted>"),
        ("https://discord.com/api/webhooks/1/s3cr3t", "https://discord.com/<redacted>"),
        ("https://hooks.example.com?sig=s3cr3t", "https://hooks.example.com/<redacted>"),
        ("http://[fd00::1]:8080/", "http://[fd00::1]:8080"),
        ("http://receiver", "http://receiver"),
        # invalid ones, echoed in the start-up error
        ("http://receiver:port/s3cr3t", "http://receiver:port/<redacted>"),
        ("ftp://u:s3cr3t@receiver/", "ftp://receiver"),
        ("http://u@s3cr3t@receiver:1/", "http://receiver:1"),
        ("s3cr3t-token-without-a-scheme", "<redacted>"),
    ],
)
def test_shown_is_the_origin_only(url: str, expected: str) -> None:
    """scheme://host[:port]: the path (Slack, Discord), query and user info may be the secret."""
    assert shown(url) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("7", 7.0),
        (" 1.5 ", 1.5),
        ("-3", 0.0),
        ("soon", None),
        ("Fri, 01 May 2026 12:00:30 GMT", 30.0),
        ("Fri, 01 May 2026 11:00:00 GMT", 0.0),
    ],
)
def test_retry_after(value: str | None, expected: float | None) -> None:
    assert retry_after(value, NOW) == expected


@pytest.mark.parametrize(
    ("status", "delivered", "retry"),
    [
        (200, True, False),
        (202, True, False),
        (204, True, False),
        (301, False, False),
        (400, False, False),
        (401, False, False),
        (404, False, False),
        (408, False, True),
        (429, False, True),
        (500, False, True),
        (502, False, True),
        (503, False, True),
    ],
)
def test_answers(status: int, delivered: bool, retry: bool) -> None:
    outcome = answered(status, httpx.Headers({"Retry-After": "2"}), NOW)
    assert (outcome.delivered, outcome.retry) == (delivered, retry)
    assert outcome.retry_after == (2.0 if retry else None)
