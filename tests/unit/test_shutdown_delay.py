"""The shutdown delay (``--shutdown-delay-seconds``): its default, its
refusals, the chart's value, and the responses that close their connection
once a shutdown drains. The process side (lease released for good, answers
during the delay, exit after it) is in tests/integration/test_run_startup.py."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from test_chart_alerts import helm_env, manager_args, render, template
from test_chart_run_args import _settings

from nmo.cli import main
from nmo.cli.defaults import IN_POD_SHUTDOWN_DELAY, shutdown_delay
from nmo.server.servers import closing_while

__all__ = ["helm_env"]  # the fixture, shared


@pytest.mark.parametrize(
    ("flag", "environ", "want"),
    [
        (None, {}, 0.0),  # a process outside the cluster stops at once
        (None, {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, IN_POD_SHUTDOWN_DELAY),
        (0.0, {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, 0.0),
        (2.5, {}, 2.5),
    ],
)
def test_the_default_drains_only_in_a_pod(
    flag: float | None, environ: dict[str, str], want: float
) -> None:
    assert shutdown_delay(flag, environ) == want


@pytest.mark.parametrize("flag", [-1.0, float("nan")])
def test_a_negative_or_nan_delay_is_refused(flag: float) -> None:
    with pytest.raises(ValueError, match="--shutdown-delay-seconds must be 0 or more"):
        shutdown_delay(flag, {})


def test_nmo_run_refuses_it_by_name_before_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--kubeconfig=/nonexistent", "--shutdown-delay-seconds=-1"])
    assert code == 2
    assert "--shutdown-delay-seconds must be 0 or more (got -1)" in capsys.readouterr().err


def test_the_chart_drains_five_seconds_of_its_thirty(helm_env: dict[str, str]) -> None:
    assert _settings(manager_args(render(helm_env))).servers.shutdown_delay_seconds == 5.0
    off = render(helm_env, "--set", "deployment.shutdownDelaySeconds=0")
    assert _settings(manager_args(off)).servers.shutdown_delay_seconds == 0.0


@pytest.mark.parametrize(
    ("values", "said"),
    [
        (["deployment.shutdownDelaySeconds=30"], "must be less than"),
        (
            ["deployment.shutdownDelaySeconds=10", "deployment.terminationGracePeriodSeconds=5"],
            "deployment.shutdownDelaySeconds (10) must be less than "
            "deployment.terminationGracePeriodSeconds (5)",
        ),
        (["deployment.shutdownDelaySeconds=-1"], "/deployment/shutdownDelaySeconds"),
    ],
)
def test_the_chart_refuses_a_delay_the_grace_period_cannot_hold(
    helm_env: dict[str, str], values: list[str], said: str
) -> None:
    result = template(helm_env, *[a for v in values for a in ("--set", v)])
    assert result.returncode != 0, f"{values} was accepted"
    assert said in result.stderr, result.stderr


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/answer")
    async def answer() -> dict[str, Any]:
        return {"ok": True}

    @app.get("/keep")
    async def keep() -> Any:
        from fastapi.responses import JSONResponse

        return JSONResponse({"ok": True}, headers={"Connection": "keep-alive"})

    return app


async def test_responses_say_connection_close_only_while_draining() -> None:
    draining = asyncio.Event()
    transport = httpx.ASGITransport(app=closing_while(_app(), draining))  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://nmo") as http:
        before = await http.get("/answer")
        assert "connection" not in before.headers
        draining.set()
        during = await http.get("/answer")
        # an app's own Connection header is replaced, not doubled
        kept = await http.get("/keep")
    assert during.status_code == 200 and during.json() == {"ok": True}
    assert during.headers["connection"] == "close"
    assert kept.headers.get_list("connection") == ["close"]
