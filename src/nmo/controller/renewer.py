"""Background lease renewal for every active maintenance (B3).

The Go NMO renews the node lease only when a reconcile happens to run, so a
maintenance that sits quietly for an hour lets the lease lapse and a
remediation operator may take the node. nmo keeps one named task per
maintenance, owned by its memory record (so forgetting the record stops it),
that renews the lease every ``interval`` seconds. A renewal never creates a
lease: one that vanished (released, or deleted by someone) is a failure
like any other. A failed renewal is stored on the record and wakes the CR,
whose next pass applies the counting rules of A5.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from nmo.controller.leaseholder import LeaseClient, LeaseHeldError, LeaseLost
from nmo.controller.memory import Memory
from nmo.kube.errors import KubeError
from nmo.telemetry.metrics import Metrics

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

    def start(self, record: Memory, node: dict[str, Any]) -> None:
        """Hold the lease from now on (the pass has just obtained it)."""
        if record.forgotten:
            return
        record.lease_held = True
        record.renewal_error = None
        if record.renewing:
            return
        record.renewer = asyncio.get_running_loop().create_task(
            self._run(record, {"metadata": {"name": record.node, "uid": node["metadata"]["uid"]}}),
            name=f"lease-renewer:{record.node}",
        )
        log.info("lease renewer started for node %s", record.node, extra={"node": record.node})

    def _renew(self, record: Memory, node: dict[str, Any]) -> asyncio.Future[Any]:
        """One renewal PUT, as its own task: a stop of the renewer lets it finish
        (see :meth:`Memory.renewal_settled`), and it is counted when it does."""
        put = asyncio.ensure_future(self.leases.request(node, force=True, renew_only=True))

        def ended(done: asyncio.Future[Any]) -> None:
            if not done.cancelled() and done.exception() is None:
                self.metrics.lease_renewals.inc()
                log.debug("lease renewed for node %s", record.node, extra={"node": record.node})
            # A failure is the renewer's to handle; after a stop nobody needs it.

        put.add_done_callback(ended)
        record.renewal = put
        return put

    async def _run(self, record: Memory, node: dict[str, Any]) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await asyncio.shield(self._renew(record, node))
            except (LeaseHeldError, LeaseLost, KubeError) as exc:
                self.metrics.lease_errors.labels(kind="renewal").inc()
                log.warning(
                    "lease renewal failed for node %s: %s",
                    record.node,
                    exc,
                    extra={"node": record.node},
                )
                record.renewal_error = str(exc)
                record.lease_held = False
                record.renewer = None
                self.on_failure(record.name)
                return
