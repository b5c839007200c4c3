"""Eviction fan-out: the executor of a plan's evictions, no held workers.

A pass hands :meth:`Evictor.start` the pods its plan says are due; ``start``
returns at once. Each eviction runs as its own task (bounded by one
semaphore across all nodes), records the answer in the pod's
:class:`~nmo.core.maintenance.drainstate.PodDrainState` in the
maintenance's memory record, sets when to try again (capped jittered
backoff; a server's Retry-After, header or ``details.retryAfterSeconds``, is
honoured even beyond the cap, up to ``max_retry_after``, since no worker waits
for it) and wakes the CR. Pod deletions are observed by the
node's pod watch, never polled; a pod held by a PodDisruptionBudget is
retried as soon as the PDB allows a disruption again (the engine watches
PDBs and calls :meth:`Evictor.unblock`), the backoff being only a fallback.

Eviction answers (kubectl's drain helper semantics): 2xx evicted; 404 gone;
429 a PodDisruptionBudget forbids it now; 409 the PDB's status changed under
a concurrent eviction (retried quickly); 403 with cause
NamespaceTerminating; 500 "more than one PodDisruptionBudget"; anything
else is reported per pod and retried with backoff.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from nmo.core import backoff
from nmo.core.errors import Conflict, Forbidden, KubeError, NotFound, TooManyRequests
from nmo.core.kube import Kube, api_path
from nmo.core.maintenance.drainstate import (
    REASON_ERROR,
    REASON_EVICTING,
    REASON_MULTI_PDB,
    REASON_NS_TERMINATING,
    REASON_PDB,
    REASON_TERMINATING,
    REASON_WAITING,
    PodDrainState,
)
from nmo.core.maintenance.pods import pod_key
from nmo.core.memory import Memory
from nmo.core.metrics import Metrics

log = logging.getLogger("nmo.drain")

Pod = dict[str, Any]

# A server's Retry-After is honoured up to this long; beyond it, a broken or
# hostile answer must not park a pod for hours (a PDB that allows a
# disruption again still wakes it at once).
MAX_RETRY_AFTER = 300.0

_PDB_NAME = re.compile(r"disruption budget ([A-Za-z0-9.\-]+)")


def pdb_from_error(exc: KubeError) -> str | None:
    for cause in exc.causes:
        match = _PDB_NAME.search(str(cause.get("message", "")))
        if match:
            return match.group(1)
    match = _PDB_NAME.search(exc.message)
    return match.group(1) if match else None


class Evictor:
    def __init__(
        self,
        kube: Kube,
        *,
        max_parallel: int,
        on_change: Callable[[str], None],
        metrics: Metrics,
        base_backoff: float = 1.0,
        max_backoff: float = 15.0,
        conflict_backoff: float = 0.1,
        evicted_recheck: float = 60.0,
        max_retry_after: float = MAX_RETRY_AFTER,
    ) -> None:
        self.kube = kube
        self.on_change = on_change  # called with the CR name after every answer
        self.metrics = metrics
        self.base_backoff = base_backoff
        self.max_backoff = max_backoff
        self.conflict_backoff = conflict_backoff
        self.evicted_recheck = evicted_recheck
        self.max_retry_after = max_retry_after
        self._slots = asyncio.Semaphore(max_parallel)
        self.evictions_started = 0

    def start(self, record: Memory, pods: tuple[Pod, ...]) -> None:
        """Start one eviction task per pod (the plan says they are due)."""
        loop = asyncio.get_running_loop()
        for pod in pods:
            key = pod_key(pod)
            uid = str(pod["metadata"].get("uid", ""))
            state = record.drain.get(key)
            if state is None or state.uid != uid:
                state = record.drain[key] = PodDrainState(uid=uid)
            if state.in_flight:
                continue
            state.in_flight = True
            if state.reason == REASON_WAITING:
                state.reason = REASON_EVICTING
            task = loop.create_task(self._evict(record, key, pod, state), name=f"evict:{key}")
            record.evictions.add(task)
            task.add_done_callback(record.evictions.discard)

    async def force_delete(self, record: Memory, pod: Pod, grace: int) -> bool:
        """Delete a pod past the drain deadline (onTimeout Delete), bypassing PDBs.

        The pod's own grace period (at least 1 s) and a UID precondition: a
        replacement pod under the same name is never touched. True when the
        deletion was accepted; a pod already gone counts as not deleted by us.
        """
        ns, name = str(pod["metadata"]["namespace"]), str(pod["metadata"]["name"])
        key, uid = pod_key(pod), str(pod["metadata"].get("uid", ""))
        state = record.drain.get(key)
        if state is None or state.uid != uid:
            state = record.drain[key] = PodDrainState(uid=uid)
        if state.in_flight or state.forced:
            return False
        state.in_flight = True
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": max(1, grace),
            "preconditions": {"uid": uid},
        }
        outcome = "error"
        try:
            async with self._slots:
                await self.kube.request(
                    "DELETE", api_path("v1", "pods", namespace=ns, name=name), body=body
                )
            outcome = "deleted"
            state.forced = True
            self._blocked(state, REASON_TERMINATING, "deleted at the drain deadline")
            log.warning(
                "drain: deadline reached, deleted pod %s from node %s (grace %ss)",
                key,
                record.node,
                max(1, grace),
                extra={"node": record.node, "pod": key},
            )
        except (NotFound, Conflict):
            outcome = "gone"  # gone, or replaced (the UID precondition failed)
        except KubeError as exc:
            self._blocked(state, REASON_ERROR, f"deleting pods/{name} -n {ns}: {exc.message}")
            self._backoff(state, exc.retry_after, self.base_backoff)
            log.warning(
                "drain: could not delete pod %s at the drain deadline: %s",
                key,
                exc.message,
                extra={"node": record.node, "pod": key},
            )
        finally:
            state.in_flight = False
        self.metrics.forced_deletions.labels(outcome=outcome).inc()
        return outcome == "deleted"

    def unblock(self, record: Memory, keys: list[str]) -> None:
        """The PDB now allows disruptions: make these pods due at once."""
        for key in keys:
            state = record.drain.get(key)
            if state is not None:
                state.next_attempt = 0.0

    def _backoff(self, state: PodDrainState, retry_after: float | None, base: float) -> None:
        wait = backoff.delay(
            state.attempts,
            base=base,
            cap=self.max_backoff,
            retry_after=retry_after,
            retry_after_limit=self.max_retry_after,
        )
        state.next_attempt = asyncio.get_running_loop().time() + wait

    @staticmethod
    def _blocked(state: PodDrainState, reason: str, message: str, pdb: str | None = None) -> None:
        if state.reason != reason:
            state.since = datetime.now(UTC)
        state.reason, state.message, state.pdb = reason, message, pdb

    async def _evict(self, record: Memory, key: str, pod: Pod, state: PodDrainState) -> None:
        ns, name = str(pod["metadata"]["namespace"]), str(pod["metadata"]["name"])
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
            "deleteOptions": {"preconditions": {"uid": state.uid}},
        }
        outcome = "error"
        where = f"error when evicting pods/{name} -n {ns}"
        try:
            async with self._slots:
                self.evictions_started += 1
                state.attempts += 1
                await self.kube.request(
                    "POST",
                    api_path("v1", "pods", namespace=ns, name=name, subresource="eviction"),
                    body=body,
                    retry=False,
                )
            outcome = "evicted"
            state.evicted = True
            # The pod watch reports the deletion; re-evict only if nothing happens for long.
            state.next_attempt = asyncio.get_running_loop().time() + self.evicted_recheck
            self._blocked(state, REASON_TERMINATING, "evicted, waiting for the pod to terminate")
            log.info(
                "drain: evicted pod %s from node %s",
                key,
                record.node,
                extra={"node": record.node, "pod": key},
            )
        except NotFound:
            outcome = "gone"
        except TooManyRequests as exc:
            outcome = "pdb_blocked"
            detail = "; ".join(str(c.get("message", "")) for c in exc.causes if c.get("message"))
            self._blocked(state, REASON_PDB, f"{exc.message} {detail}".strip(), pdb_from_error(exc))
            self._backoff(state, exc.retry_after, self.base_backoff)
        except Conflict as exc:
            # Concurrent evictions behind one PDB race on its status: try again soon.
            outcome = "conflict"
            if state.reason != REASON_PDB:
                self._blocked(state, REASON_WAITING, f"{where}: {exc.message}")
            self._backoff(state, None, self.conflict_backoff)
        except Forbidden as exc:
            if exc.has_cause("NamespaceTerminating"):
                outcome = "namespace_terminating"
                message = f"namespace {ns} is terminating: {exc.message}"
                self._blocked(state, REASON_NS_TERMINATING, message)
            else:
                self._blocked(state, REASON_ERROR, f"{where}: {exc.message}")
            self._backoff(state, exc.retry_after, self.base_backoff)
        except KubeError as exc:
            if "more than one PodDisruptionBudget" in exc.message:
                outcome = "multiple_pdbs"
                self._blocked(state, REASON_MULTI_PDB, f"{where}: {exc.message}")
            else:
                self._blocked(state, REASON_ERROR, f"{where}: {exc.message}")
            self._backoff(state, exc.retry_after, self.base_backoff)
        finally:
            state.in_flight = False
        self.metrics.evictions.labels(outcome=outcome).inc()
        if outcome not in ("evicted", "gone", "conflict"):
            log.info(
                "drain: pod %s still pending on node %s: %s",
                key,
                record.node,
                state.message,
                extra={"node": record.node, "pod": key, "reason": state.reason},
            )
        if outcome != "evicted":
            self.on_change(record.name)  # an evicted pod wakes the CR through the pod watch
