"""A leader whose API server stops answering steps down before its lease
can expire (issue 14, item 6).

kube-apiserver is paused (SIGSTOP): connections open, nothing answers, the
way a stalled or partitioned control plane looks. The leader (lease 4 s,
renew deadline 3 s) must stop its workers, and exit, within the renew
deadline of its last renewal, well before the lease lets a standby take over;
before the fix one renewal waited out a 30 s request timeout, with retries.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest
from operator_fixtures import wait_for
from test_process import leader_args, procs  # noqa: F401  (the fixture)

from nmo_sandbox import Sandbox

pytestmark = pytest.mark.integration

LEASE_DURATION = 4.0  # leader_args
RENEW_DEADLINE = 3.0


@pytest.mark.solo
async def test_a_stalled_apiserver_stops_the_leader_before_its_lease_expires(
    procs: Any,  # noqa: F811
    sandbox: Sandbox,
) -> None:
    leader = procs("nmo-stall", *leader_args())
    await wait_for(leader.started, timeout=30, what="the replica to lead")
    await asyncio.sleep(1.0)  # a renewal or two (retry period 0.5 s)
    apiserver = sandbox.pids["kube-apiserver"]
    paused = time.monotonic()
    os.kill(apiserver, signal.SIGSTOP)
    try:

        async def stepped_down() -> bool:
            return leader.proc.poll() is not None or not await leader.leading()

        await wait_for(
            stepped_down, timeout=LEASE_DURATION + 10, interval=0.05, what="the leader to step down"
        )
        down = time.monotonic() - paused

        async def exited() -> bool:
            return leader.proc.poll() is not None

        await wait_for(
            exited, timeout=LEASE_DURATION + 10, interval=0.05, what="the leader to exit"
        )
        gone = time.monotonic() - paused
    finally:
        os.kill(apiserver, signal.SIGCONT)
    print(f"\nleader stepped down {down:.2f}s and exited {gone:.2f}s after the apiserver stalled")
    # The last successful renewal was at most one retry period before the stall.
    assert down <= RENEW_DEADLINE + 0.5, leader.text()[-3000:]
    assert down < LEASE_DURATION, leader.text()[-3000:]
    assert "could not renew leader lease" in leader.text()
