"""Background lease renewal for every active maintenance (B3).

NMO renews the node lease only when a reconcile happens to run, so a
maintenance that sits quietly for an hour lets the lease lapse and a
remediation operator may take the node. nmo keeps one named task per node
that renews the lease every ``interval`` seconds while the maintenance is
active; a failed renewal wakes the CR's reconcile, which applies the
counting rules of A5.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from nmo.core.errors import KubeError
from nmo.core.lease import LeaseClient, LeaseHeldError
from nmo.core.metrics import Metrics

log = logging.getLogger("nmo.lease")


class LeaseRenewers:
    def __init__(
        self,
        leases: LeaseClient,
        *,
        interval: float,
        on_failure: Callable[[str], None],
        metrics: Metrics,
    ) -> None:
        self.leases = leases
        self.interval = interval
        self.on_failure = on_failure
        self.metrics = metrics
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.failed: dict[str, str] = {}

    def active(self, node_name: str) -> bool:
        task = self._tasks.get(node_name)
        return task is not None and not task.done()

    def start(self, node: dict[str, Any], cr_name: str) -> None:
        name = str(node["metadata"]["name"])
        if self.active(name):
            return
        self.failed.pop(name, None)
        self._tasks[name] = asyncio.get_running_loop().create_task(
            self._run(node, cr_name), name=f"lease-renewer:{name}"
        )
        log.info("lease renewer started for node %s", name, extra={"node": name})

    def stop(self, node_name: str) -> None:
        task = self._tasks.pop(node_name, None)
        self.failed.pop(node_name, None)
        if task is not None:
            task.cancel()
            log.info("lease renewer stopped for node %s", node_name, extra={"node": node_name})

    def stop_all(self) -> None:
        for name in list(self._tasks):
            self.stop(name)

    async def _run(self, node: dict[str, Any], cr_name: str) -> None:
        name = str(node["metadata"]["name"])
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.leases.request(node, datetime.now(UTC), force=True)
                self.metrics.lease_renewals.inc()
                log.debug("lease renewed for node %s", name, extra={"node": name})
            except (LeaseHeldError, KubeError) as exc:
                self.metrics.lease_errors.labels(kind="renewal").inc()
                log.warning("lease renewal failed for node %s: %s", name, exc, extra={"node": name})
                self.failed[name] = str(exc)
                self.on_failure(cr_name)
                return
