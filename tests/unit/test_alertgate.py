"""The alert gate's queries: what each failure of Prometheus becomes (respx for
the error paths a real Prometheus does not produce on demand), the token, the
wake-ups, and the flags that configure it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import certifi
import httpx
import pytest
import respx

from nmo.cli.flags import build_parser
from nmo.cli.settings import alert_gate_settings, budget_settings
from nmo.controller.alertgate import AlertGateSettings, AlertPoller
from nmo.core.maintenance.gates import AlertsSeen
from nmo.telemetry.metrics import Metrics
from nmo_sandbox.pki import generate_pki, issue_serving_cert

URL = "http://prometheus.test:9090"
ENDPOINT = f"{URL}/api/v1/alerts"


def firing(*names: str) -> dict[str, Any]:
    alerts = [{"labels": {"alertname": n}, "state": "firing"} for n in names]
    return {"status": "success", "data": {"alerts": alerts}}


@pytest.fixture
def prometheus() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as mock:
        yield mock


def poller(
    tmp_path: Path, *, token: str | None = None, wakes: list[int] | None = None
) -> AlertPoller:
    token_file = None
    if token is not None:
        token_file = str(tmp_path / "token")
        Path(token_file).write_text(token + "\n")
    settings = AlertGateSettings(URL + "/", pattern="^Blocker$", token_file=token_file)
    calls = wakes if wakes is not None else []
    return AlertPoller(settings, metrics=Metrics(), on_change=lambda: calls.append(1))


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (httpx.Response(500, text="boom"), f"HTTP 500 from {ENDPOINT}"),
        (httpx.Response(401, text="Unauthorized"), f"HTTP 401 from {ENDPOINT}"),
        (httpx.Response(200, text="<html>"), "Expecting value: line 1 column 1 (char 0)"),
        (
            httpx.Response(200, json={"status": "error", "error": "x"}),
            "not a successful Prometheus /api/v1/alerts answer",
        ),
        (httpx.ConnectError("connection refused"), "connection refused"),
        (httpx.ReadTimeout("timed out"), "timed out"),
    ],
)
async def test_a_failed_query_is_an_error_that_holds(
    prometheus: respx.MockRouter, tmp_path: Path, answer: Any, error: str
) -> None:
    route = prometheus.get(ENDPOINT)
    if isinstance(answer, Exception):
        route.mock(side_effect=answer)
    else:
        route.mock(return_value=answer)
    gate = poller(tmp_path)
    async with httpx.AsyncClient() as client:
        seen = await gate.query(client)
    assert seen == AlertsSeen(URL + "/", error=error)
    assert gate.metrics.prometheus_queries.labels(result="failed")._value.get() == 1


async def test_the_token_is_read_for_each_query_and_sent(
    prometheus: respx.MockRouter, tmp_path: Path
) -> None:
    route = prometheus.get(ENDPOINT).mock(return_value=httpx.Response(200, json=firing("X")))
    gate = poller(tmp_path, token="first")
    async with httpx.AsyncClient() as client:
        assert (await gate.query(client)).firing == ("X",)
        (tmp_path / "token").write_text("rotated")
        await gate.query(client)
    sent = [call.request.headers["Authorization"] for call in route.calls]
    assert sent == ["Bearer first", "Bearer rotated"]


async def test_a_missing_token_file_is_an_error(tmp_path: Path) -> None:
    gate = poller(tmp_path, token="t")
    (tmp_path / "token").unlink()
    async with httpx.AsyncClient() as client:
        seen = await gate.query(client)
    assert seen.error is not None and "No such file" in seen.error
    assert not seen.answered


def test_the_queue_wakes_when_what_blocks_changes(tmp_path: Path) -> None:
    wakes: list[int] = []
    gate = poller(tmp_path, wakes=wakes)
    steps = [
        (AlertsSeen(URL, firing=("Other",), answered=True), 1),  # first answer: nothing blocks
        (AlertsSeen(URL, firing=("Other", "Noise"), answered=True), 0),  # no blocker either way
        (AlertsSeen(URL, firing=("Blocker",), answered=True), 1),
        (AlertsSeen(URL, firing=("Blocker", "Noise"), answered=True), 0),
        (AlertsSeen(URL, error="refused"), 1),
        (AlertsSeen(URL, error="refused again"), 0),
        (AlertsSeen(URL, firing=(), answered=True), 1),
    ]
    for seen, woken in steps:
        before = len(wakes)
        gate._update(seen)
        assert len(wakes) - before == woken, seen
    assert gate.seen() == steps[-1][0]


def test_the_gauges_follow_the_last_answer(tmp_path: Path) -> None:
    gate = poller(tmp_path)
    read = gate.metrics.registry.get_sample_value

    def gauges() -> tuple[float | None, float | None]:
        return read("nmo_fleet_prometheus_up"), read("nmo_fleet_blocking_alerts")

    assert gauges() == (0, 0)
    gate._update(AlertsSeen(URL, firing=("Blocker", "Noise"), answered=True))
    assert gauges() == (1, 1)
    gate._update(AlertsSeen(URL, error="refused"))
    assert gauges() == (0, 0)


def args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", *argv])


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--blocking-alerts", "X"], "--blocking-alerts needs --blocking-prometheus-url"),
        (["--blocking-prometheus-url", URL], "--blocking-prometheus-url needs --blocking-alerts"),
        (
            ["--blocking-prometheus-url", "prometheus:9090", "--blocking-alerts", "X"],
            "must be an http(s) URL",
        ),
        (["--blocking-prometheus-url", URL, "--blocking-alerts", "("], "is not valid"),
        (
            [
                *("--blocking-prometheus-url", URL, "--blocking-alerts", "X"),
                *("--blocking-prometheus-interval", "0"),
            ],
            "--blocking-prometheus-interval must be more than 0",
        ),
        (["--fleet-soak-seconds", "-1"], "--fleet-soak-seconds must be 0"),
    ],
)
def test_wrong_flags_say_what_is_wrong(argv: list[str], problem: str) -> None:
    with pytest.raises(ValueError, match=r"--|URL|valid") as info:
        budget_settings(args(*argv))
    assert problem in str(info.value)


def test_the_flags_make_the_settings() -> None:
    assert alert_gate_settings(args()) is None
    assert not budget_settings(args()).enabled, "off by default: the Go NMO's behaviour"
    parsed = args(
        *("--blocking-prometheus-url", URL, "--blocking-alerts", "^Node"),
        *("--blocking-prometheus-token-file", "/t", "--blocking-prometheus-ca-file", "/ca"),
        *("--blocking-prometheus-interval", "5", "--fleet-soak-seconds", "120"),
    )
    assert alert_gate_settings(parsed) == AlertGateSettings(
        url=URL, pattern="^Node", interval=5.0, token_file="/t", ca_file="/ca", timeout=5.0
    )
    budget = budget_settings(parsed)
    assert (budget.soak_seconds, budget.blocking_url, budget.blocking_alerts) == (
        120.0,
        URL,
        "^Node",
    )
    assert budget.enabled


async def _until(check: Any, seconds: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def _serving(*names: str) -> httpx.MockTransport:
    return httpx.MockTransport(lambda _request: httpx.Response(200, json=firing(*names)))


async def test_a_replica_that_stops_leading_forgets_the_answer(tmp_path: Path) -> None:
    """The poller runs on the leader only: once cancelled (leadership lost), the
    last answer is gone, so a pass after the next election cannot admit on an
    'answered, nothing fires' from the previous term before the first query,
    and a follower's gauges do not go on saying Prometheus is up."""
    settings = AlertGateSettings(URL, pattern="^Blocker$", interval=0.01)
    gate = AlertPoller(settings, metrics=Metrics(), transport=_serving("Other"))
    task = asyncio.create_task(gate.run())
    await _until(lambda: gate.seen().answered)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert gate.seen() == AlertsSeen(URL)
    assert gate.metrics.registry.get_sample_value("nmo_fleet_prometheus_up") == 0


async def test_an_unreadable_ca_file_holds_and_is_read_again(tmp_path: Path) -> None:
    """A CA file that is missing or not PEM (a ConfigMap not mounted yet, being
    rotated) is a failed query, fail-closed, not the end of the runnable, which
    would stop the whole process (and every running maintenance with it); it is
    read again at the next query, so a rotated or late CA is taken."""
    ca = tmp_path / "ca.crt"
    settings = AlertGateSettings(URL, pattern="^Blocker$", interval=0.01, ca_file=str(ca))
    gate = AlertPoller(settings, metrics=Metrics(), transport=_serving())
    task = asyncio.create_task(gate.run())
    try:
        await _until(lambda: gate.seen().error is not None or task.done())
        assert not task.done(), task.exception()
        assert str(ca) in (gate.seen().error or "")
        ca.write_text("not a certificate\n")
        await _until(lambda: "No such file" not in (gate.seen().error or "No such file"))
        assert not task.done(), task.exception()
        assert str(ca) in (gate.seen().error or "")
        shutil.copyfile(certifi.where(), ca)
        await _until(lambda: gate.seen().answered or task.done())
        assert not task.done()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_an_https_prometheus_is_verified_with_the_ca_file(tmp_path: Path) -> None:
    """A real TLS server (no mock transport): the CA file verifies it and the
    token goes along; a CA that did not sign it is a failed query (fail-closed)."""
    pki = generate_pki(tmp_path / "pki")
    serving = issue_serving_cert(pki.dir, ["127.0.0.1"], out_dir=tmp_path / "tls", name="prom")
    other = generate_pki(tmp_path / "other")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(serving.cert_file, serving.key_file)
    seen_auth: list[str] = []
    body = json.dumps(firing("Blocker")).encode()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        seen_auth.extend(
            line.split(":", 1)[1].strip()
            for line in head.split("\r\n")
            if line.lower().startswith("authorization:")
        )
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    token = tmp_path / "token"
    token.write_text("sa-token\n")
    url = f"https://127.0.0.1:{port}"
    async with server:
        trusted = await _first_answer(url, token, pki.ca_file)
        untrusted = await _first_answer(url, token, other.ca_file)
    assert trusted == AlertsSeen(url, firing=("Blocker",), answered=True)
    assert not untrusted.answered
    assert "CERTIFICATE_VERIFY_FAILED" in (untrusted.error or ""), untrusted
    assert seen_auth and set(seen_auth) == {"Bearer sa-token"}


async def _first_answer(url: str, token: Path, ca: Path) -> AlertsSeen:
    settings = AlertGateSettings(
        url, pattern="^Blocker$", interval=0.01, token_file=str(token), ca_file=str(ca)
    )
    gate = AlertPoller(settings, metrics=Metrics())
    task = asyncio.create_task(gate.run())
    try:
        await _until(lambda: gate.seen().answered or gate.seen().error is not None)
        return gate.seen()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
