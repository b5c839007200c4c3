"""Notifications wired in: the reconciler queues them at the end of a pass and never
waits on the receiver; the engine runs the notifier; the CLI validates the URL."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import respx

from nmo import cli
from nmo.api import constants as c
from nmo.api.models import NodeMaintenance
from nmo.controller.engine import Engine, EngineSettings
from nmo.controller.notifier import Notifier, NotifySettings
from nmo.core.maintenance.notifications import for_pass
from nmo.core.maintenance.observed import Emit, Observed, Plan, Recall, Step
from nmo.kube.client import Kube
from nmo.telemetry.metrics import Metrics

URL = "http://receiver.test/hooks/nmo"
NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def count(metrics: Metrics, kind: str, result: str) -> float:
    value = metrics.registry.get_sample_value(
        "nmo_notifications_total", {"kind": kind, "result": result}
    )
    return value or 0.0


# -- a pass never waits on the receiver ------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []

    async def emit(self, _obj: Any, event: tuple[str, str], *, warning: bool = False) -> None:
        self.events.append(event[0])


async def test_a_pass_queues_and_never_awaits_delivery(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    metrics = Metrics()
    arrived = asyncio.Event()
    release = asyncio.Event()

    async def slow_receiver(request: httpx.Request) -> httpx.Response:
        arrived.set()
        await release.wait()
        return httpx.Response(200)

    settings = EngineSettings(leader_election=False, identity="nmo-0", notify=NotifySettings(URL))
    engine = Engine(kube, settings, metrics)
    assert [r.name for r in engine.runnables() if r.name == "notifier"] == ["notifier"]
    assert engine.notifier is not None and engine.reconciler.ports.notifier is engine.notifier
    n = Notifier(
        NotifySettings(URL),
        metrics=metrics,
        operator="nmo-0",
        transport=httpx.MockTransport(slow_receiver),
    )
    assert engine.reconciler.settings.notify_operator == "nmo-0"
    recorder = Recorder()
    engine.reconciler.ports = replace(engine.reconciler.ports, notifier=n, recorder=recorder)  # type: ignore[arg-type]
    raw = {"metadata": {"name": "nm-1"}, "spec": {"nodeName": "node-2", "reason": "r"}}
    obs = Observed(
        nm=NodeMaintenance.from_api(raw),
        others=(),
        node=None,
        pods=None,
        daemonsets={},
        drain={},
        recall=Recall(),
        now=NOW,
        tick=0.0,
    )
    record = engine.memories.recall("uid-nm-1", "nm-1", "node-2")
    task = asyncio.create_task(n.run())
    try:
        begun = (Emit(c.EVENT_BEGIN),)
        first = Plan(
            events=begun,
            notifications=tuple(
                (Step.END, n) for n in for_pass(obs.nm, None, begun, now=NOW, operator="nmo-0")
            ),
        )
        await engine.reconciler._finish(raw, obs, first, record)
        await arrived.wait()  # the receiver holds the first delivery
        # A second pass, with the receiver still holding the first: it returns at once.
        blocked = raw | {
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": "Drained", "status": "False", "reason": "Blocked", "message": "pdb"}
                ],
            }
        }
        notes = for_pass(obs.nm, blocked["status"], (), now=NOW, operator="nmo-0")
        late = tuple((Step.END, n) for n in notes)
        await engine.reconciler._finish(blocked, obs, Plan(notifications=late), record)
        assert not release.is_set() and n.pending == 2  # one in flight, one queued
        assert recorder.events == [c.EVENT_BEGIN[0]]
        release.set()
        async with asyncio.timeout(10):
            await n.join()
        assert count(metrics, "begin", "delivered") == 1
        assert count(metrics, "blocked", "delivered") == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        engine.memories.forget_all()


def test_without_a_url_there_is_no_notifier(kube: Kube) -> None:
    engine = Engine(kube, EngineSettings(leader_election=False), Metrics())
    assert engine.notifier is None and engine.reconciler.ports.notifier is None
    assert "notifier" not in [r.name for r in engine.runnables()]


# -- the CLI ---------------------------------------------------------------------


def test_notify_flags_reach_the_engine_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NMO_NOTIFY_URL", raising=False)
    monkeypatch.delenv("NMO_NOTIFY_TIMEOUT", raising=False)
    args = cli.build_parser().parse_args(["run"])
    assert cli.settings_from(args).engine.notify is None
    args = cli.build_parser().parse_args(
        ["run", "--notify-url", "https://hooks.example.com/nmo", "--notify-timeout", "2.5"]
    )
    assert cli.settings_from(args).engine.notify == NotifySettings(
        "https://hooks.example.com/nmo", timeout=2.5
    )
    monkeypatch.setenv("NMO_NOTIFY_URL", "http://receiver:8080/")
    monkeypatch.setenv("NMO_NOTIFY_TIMEOUT", "1")
    notify = cli.settings_from(cli.build_parser().parse_args(["run"])).engine.notify
    assert notify == NotifySettings("http://receiver:8080/", timeout=1.0)


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (
            ["--notify-url", "ftp://receiver/"],
            "--notify-url must be an http:// or https:// URL with a host (got 'ftp://receiver')",
        ),
        (
            ["--notify-url", "http://receiver:port/"],
            "--notify-url not a valid URL: Invalid port: 'port' (got 'http://receiver:port')",
        ),
        # The path, query and user info may be the secret: never echoed.
        (
            ["--notify-url", "hxxps://hooks.slack.com/services/T0/B0/s3cr3t"],
            "--notify-url must be an http:// or https:// URL with a host "
            "(got 'hxxps://hooks.slack.com/<redacted>')",
        ),
        (
            ["--notify-url", "https://u:s3cr3t@hooks.example.com:x/?sig=s3cr3t"],
            "--notify-url not a valid URL: Invalid port: 'x' "
            "(got 'https://hooks.example.com:x/<redacted>')",
        ),
        (
            ["--notify-url", "http://receiver/", "--notify-timeout", "0"],
            "--notify-timeout must be more than 0 (got 0)",
        ),
    ],
)
async def test_a_bad_notify_flag_exits_2_before_connecting(
    flags: list[str], error: str, caplog: pytest.LogCaptureFixture
) -> None:
    args = cli.build_parser().parse_args(["run", "--kubeconfig", "/nonexistent", *flags])
    with caplog.at_level(logging.ERROR, logger="nmo.cli"):
        assert await cli.run(args) == 2
    assert [r.getMessage() for r in caplog.records] == [error]
