"""Leader election never overruns its lease (issue 14, item 6).

An apiserver that stalls (a route that sleeps far longer than the renew
deadline) must not keep a renewal in flight: leadership is dropped, and the
leader's work stopped, within ``renew_deadline`` (plus a little slack) of
the last successful renewal, always before ``lease_duration`` lets a standby
take the lease. Short durations stand in for the real ones.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
import respx

from nmo.controller.leader import LeaderElector, LeaderSettings, LeadershipLost
from nmo.kube.client import Kube

LEASES = "/apis/coordination.k8s.io/v1/namespaces/nmo/leases"
SETTINGS = LeaderSettings(
    namespace="nmo",
    name="nmo-leader",
    identity="me",
    lease_duration=0.8,
    renew_deadline=0.4,
    retry_period=0.05,
)
SLACK = 0.15


def _lease(rv: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "nmo-leader", "namespace": "nmo", "resourceVersion": str(rv)},
        "spec": {"holderIdentity": "me", "leaseDurationSeconds": 1, "renewTime": f"t{rv}"},
    }


@pytest.mark.parametrize("stalls", ["GET", "PUT"])
async def test_a_stalled_apiserver_drops_leadership_within_the_renew_deadline(
    api_server: respx.MockRouter, kube: Kube, stalls: str
) -> None:
    renewed: list[float] = []  # when each successful renewal was answered
    state = {"rv": 1, "stall": False}

    async def stall() -> httpx.Response:
        await asyncio.sleep(60)
        return httpx.Response(500)

    async def get(_request: httpx.Request) -> httpx.Response:
        if state["stall"] and stalls == "GET":
            return await stall()
        return httpx.Response(200, json=_lease(int(state["rv"])))

    async def put(_request: httpx.Request) -> httpx.Response:
        if state["stall"] and stalls == "PUT":
            return await stall()
        state["rv"] = int(state["rv"]) + 1
        renewed.append(time.monotonic())
        if len(renewed) == 3:
            state["stall"] = True  # the apiserver stops answering from now on
        return httpx.Response(200, json=_lease(int(state["rv"])))

    api_server.get(f"{LEASES}/nmo-leader").mock(side_effect=get)
    api_server.put(f"{LEASES}/nmo-leader").mock(side_effect=put)
    elector = LeaderElector(kube, SETTINGS)
    stopped: list[float] = []

    async def lead() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.append(time.monotonic())

    async with asyncio.timeout(5):  # before the fix: the stalled call held on for 60 s
        with pytest.raises(LeadershipLost):
            await elector.run(lead)
    lost = time.monotonic()
    assert len(renewed) == 3 and stopped  # the work was stopped before run() returned
    assert not elector.is_leader
    since_last = stopped[0] - renewed[-1]
    assert since_last <= SETTINGS.renew_deadline + SLACK
    assert lost - renewed[-1] < SETTINGS.lease_duration
    # The shutdown that follows asks the stalled API nothing: there is no
    # lease left to give up (it hung here on the stalled GET before).
    calls = len(api_server.calls)
    async with asyncio.timeout(1):
        await elector.release()
    assert len(api_server.calls) == calls


async def test_a_release_that_gets_no_answer_gives_up_within_the_renew_deadline(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    """A clean shutdown of a leader whose API server stalls that moment."""
    elector = LeaderElector(kube, SETTINGS)
    elector.held = True

    async def stall(_request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(60)
        return httpx.Response(500)

    api_server.get(f"{LEASES}/nmo-leader").mock(side_effect=stall)
    started = time.monotonic()
    async with asyncio.timeout(5):
        await elector.release()
    assert time.monotonic() - started <= SETTINGS.renew_deadline + SLACK
    assert elector.held  # not released: the lease expires on its own


async def test_each_request_gets_the_deadline_as_its_budget_without_retries(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    """500s are not retried by the boundary inside one attempt: the renew loop
    retries every retry_period, and gives up at the deadline."""
    calls: list[float] = []

    def failing(_request: httpx.Request) -> httpx.Response:
        calls.append(time.monotonic())
        return httpx.Response(500, json={"message": "etcd leader changed"})

    route = api_server.get(f"{LEASES}/nmo-leader").mock(side_effect=failing)
    elector = LeaderElector(kube, SETTINGS)
    async with asyncio.timeout(2):
        assert await elector._attempt(0.2) is False
    assert route.call_count == 1


@pytest.mark.parametrize(
    ("lease", "renew", "retry"),
    [(10.0, 10.0, 2.0), (10.0, 15.0, 2.0), (10.0, 0.0, 2.0), (15, 10, 0)],
)
def test_settings_that_let_two_leaders_overlap_are_refused(
    lease: float, renew: float, retry: float
) -> None:
    with pytest.raises(ValueError, match="leader election"):
        LeaderSettings(
            namespace="n", name="l", identity="me",
            lease_duration=lease, renew_deadline=renew, retry_period=retry,
        )  # fmt: skip
