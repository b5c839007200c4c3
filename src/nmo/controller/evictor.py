"""Eviction fan-out: the executor of a plan's evictions, no held workers.

A pass hands :meth:`Evictor.start` the pods its plan says are due; ``start``
returns at once. Each eviction runs as its own task (bounded by one
semaphore across all nodes), records the answer in the pod's
:class:`~nmo.core.maintenance.drainstate.PodDrainState` in the
maintenance's memory record, sets when to try again (capped jittered
backoff; a server's Retry-After, header or ``details.retryAfterSeconds``, is
honoured even beyond the cap, up to ``max_retry_after``, since no worker waits
for it) and wakes the CR. Pod deletions are observed by the
node's pod watch, never polled. A 429 from a PodDisruptionBudget is recorded
with the time and that PDB's status as the PDB cache showed it when the
eviction was sent (``refused_at``, ``budget_seen``): the planner holds the
pod while that status stands (:mod:`nmo.core.maintenance.pdbgate`) and the
engine wakes the maintenance when the PDB changes; the backoff is only the
fallback for a PDB the cache does not have.

Eviction answers (kubectl's drain helper semantics): 2xx evicted; 404 gone;
429 a PodDisruptionBudget forbids it now; 409 the PDB's status changed under
a concurrent eviction (retried quickly); 403 with cause
NamespaceTerminating; 500 "more than one PodDisruptionBudget"; anything
else is reported per pod and retried with backoff.

Deletions at the drain deadline (``onTimeout: Delete``, :meth:`Evictor.force`)
need ``delete`` on pods, which the chart grants only with
``drain.allowPodDeletion``. A pass sends one DELETE first and the others
only if it was not refused. A 403 is recorded once on the maintenance
(:class:`~nmo.controller.memory.DeletionRefused`): the refused pod shows the
Forbidden message, naming the chart value, in lastError and the Drained
condition, and no DELETE is sent for that maintenance again until its
generation changes, nmo may delete pods (a SelfSubjectAccessReview, cached,
asked only when RBAC was what refused), or :data:`FORBIDDEN_RETRY` has
passed. Any other failed DELETE is tried again after its backoff, not on
every pass.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from nmo.controller.memory import DeletionRefused, Memory
from nmo.core.maintenance.disruption import status_key
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
from nmo.core.maintenance.podselect import pod_key
from nmo.kube import backoff
from nmo.kube.access import POD_DELETION_VALUE, Access
from nmo.kube.client import Kube, api_path
from nmo.kube.errors import Conflict, Forbidden, KubeError, NotFound, TooManyRequests
from nmo.telemetry.metrics import Metrics

log = logging.getLogger("nmo.drain")

Pod = dict[str, Any]

# A server's Retry-After is honoured up to this long; beyond it, a broken or
# hostile answer must not park a pod for hours (a PDB that allows a
# disruption again still wakes it at once).
MAX_RETRY_AFTER = 300.0
# A forced deletion refused with 403 is tried again this late at the
# earliest, unless the NodeMaintenance or nmo's permissions change first.
FORBIDDEN_RETRY = 600.0

_PDB_NAME = re.compile(r"disruption budget ([A-Za-z0-9.\-]+)")


def refusal_message(exc: KubeError, *, allowed: bool | None, retry: float) -> str:
    """What a maintenance shows for a refused deletion at the deadline; ``allowed``:
    what a SelfSubjectAccessReview said about deleting pods then."""
    again = f"tried again when the NodeMaintenance changes or in {retry:g}s"
    if allowed is True:  # RBAC allows it: an admission webhook or policy refused
        return f"onTimeout Delete: a pod deletion was refused: {exc.message}; {again}"
    return (
        f"onTimeout Delete: nmo may not delete pods: {exc.message}; set the chart value "
        f"{POD_DELETION_VALUE} (or grant nmo's ServiceAccount delete on pods), or change "
        f"spec.drain.onTimeout; {again}, or as soon as nmo may delete pods"
    )


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
        access: Access | None = None,
        forbidden_retry: float = FORBIDDEN_RETRY,
        budgets: Callable[[str], Pod | None] | None = None,
    ) -> None:
        self.kube = kube
        self.budgets = budgets  # the PDB cache: "namespace/name" -> slim PDB
        self.access = access  # may nmo delete pods (lifts a refused deletion)
        self.forbidden_retry = forbidden_retry
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
                state = record.drain[key] = PodDrainState(uid=uid, since=datetime.now(UTC))
            if state.in_flight:
                continue
            state.in_flight = True
            if state.reason == REASON_WAITING:
                state.reason = REASON_EVICTING
            task = loop.create_task(self._evict(record, key, pod, state), name=f"evict:{key}")
            record.evictions.add(task)
            task.add_done_callback(record.evictions.discard)

    async def force(
        self, record: Memory, pods: tuple[tuple[Pod, int], ...], *, generation: int | None = None
    ) -> tuple[bool, ...]:
        """Delete the pods a pass names at the deadline (onTimeout Delete).

        One DELETE first; the others, at once, only if it was not refused.
        While a refusal stands (see the module docstring), none is sent.
        True for each pod whose deletion was accepted.
        """
        if not pods or not await self._may_force(record, generation):
            self._show_refusal(record, pods)
            return tuple(False for _ in pods)
        (pod, grace), rest = pods[0], pods[1:]
        first = await self.force_delete(record, pod, grace, generation=generation)
        if record.deletion_refused is not None:
            return (first, *(False for _ in rest))
        others = await asyncio.gather(
            *(self.force_delete(record, p, g, generation=generation) for p, g in rest)
        )
        return (first, *others)

    async def force_delete(
        self, record: Memory, pod: Pod, grace: int, *, generation: int | None = None
    ) -> bool:
        """Delete a pod past the drain deadline (onTimeout Delete), bypassing PDBs.

        The pod's own grace period (at least 1 s) and a UID precondition: a
        replacement pod under the same name is never touched. True when the
        deletion was accepted; a pod already gone counts as not deleted by us.
        Nothing is sent while a refusal stands or the pod's last failed
        deletion is backing off.
        """
        ns, name = str(pod["metadata"]["namespace"]), str(pod["metadata"]["name"])
        key, uid = pod_key(pod), str(pod["metadata"].get("uid", ""))
        state = record.drain.get(key)
        if state is None or state.uid != uid:
            state = record.drain[key] = PodDrainState(uid=uid, since=datetime.now(UTC))
        now = asyncio.get_running_loop().time()
        if state.in_flight or state.forced or record.deletion_refused is not None:
            return False
        if now < record.force_after.get(key, 0.0):
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
            record.force_after.pop(key, None)
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
        except Forbidden as exc:
            outcome = "forbidden"
            await self._refused(record, key, state, exc, generation)
        except KubeError as exc:
            self._blocked(state, REASON_ERROR, f"deleting pods/{name} -n {ns}: {exc.message}")
            record.force_after[key] = now + backoff.delay(
                state.attempts,
                base=self.base_backoff,
                cap=self.max_backoff,
                retry_after=exc.retry_after,
                retry_after_limit=self.max_retry_after,
            )
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

    async def _refused(
        self,
        record: Memory,
        key: str,
        state: PodDrainState,
        exc: Forbidden,
        generation: int | None,
    ) -> None:
        """Record a 403 on a forced deletion once, on the maintenance and the pod."""
        ns = key.split("/", 1)[0]
        allowed = None if self.access is None else await self.access.may_delete_pods(ns)
        message = refusal_message(exc, allowed=allowed, retry=self.forbidden_retry)
        record.deletion_refused = DeletionRefused(
            message=message,
            generation=generation,
            at=asyncio.get_running_loop().time(),
            rbac=allowed is not True,
            pods={key},
        )
        self._blocked(state, REASON_ERROR, message)
        log.warning(
            "drain: maintenance %s may not delete pods at its deadline, not retrying: %s",
            record.name,
            message,
            extra={"node": record.node, "pod": key},
        )
        self.on_change(record.name)  # the status says so with the next pass

    async def _may_force(self, record: Memory, generation: int | None) -> bool:
        """Whether no refusal stands (lifting one whose reason has passed)."""
        refusal = record.deletion_refused
        if refusal is None:
            return True
        why = ""
        if generation is not None and generation != refusal.generation:
            why = "the NodeMaintenance changed"
        elif asyncio.get_running_loop().time() - refusal.at >= self.forbidden_retry:
            why = f"{self.forbidden_retry:g}s passed"
        elif refusal.rbac and self.access is not None:
            namespaces = {k.split("/", 1)[0] for k in refusal.pods} or {""}
            answers = [await self.access.may_delete_pods(ns) for ns in sorted(namespaces)]
            if all(a is True for a in answers):
                why = "nmo may delete pods now"
        if not why:
            return False
        log.info(
            "drain: deleting the pods of maintenance %s at its deadline again: %s",
            record.name,
            why,
            extra={"node": record.node},
        )
        record.deletion_refused = None
        return True

    def _show_refusal(self, record: Memory, pods: tuple[tuple[Pod, int], ...]) -> None:
        """Keep a standing refusal on one pending pod (the one refused may have left)."""
        refusal = record.deletion_refused
        if refusal is None or not pods or any(k in record.drain for k in refusal.pods):
            return
        pod = pods[0][0]
        key, uid = pod_key(pod), str(pod["metadata"].get("uid", ""))
        state = record.drain.get(key)
        if state is None or state.uid != uid:
            state = record.drain[key] = PodDrainState(uid=uid, since=datetime.now(UTC))
        refusal.pods.add(key)
        self._blocked(state, REASON_ERROR, refusal.message)

    def _budget_status(
        self, namespace: str, name: str | None
    ) -> tuple[tuple[str, str], ...] | None:
        """The PDB's status as the cache shows it now (None: unnamed, or not cached)."""
        if name is None or self.budgets is None:
            return None
        pdb = self.budgets(f"{namespace}/{name}")
        return None if pdb is None else status_key(pdb)

    def _backoff(self, state: PodDrainState, retry_after: float | None, base: float) -> None:
        wait = backoff.delay(
            state.attempts,
            base=base,
            cap=self.max_backoff,
            retry_after=retry_after,
            retry_after_limit=self.max_retry_after,
        )
        state.next_attempt = asyncio.get_running_loop().time() + wait

    @classmethod
    def _note(
        cls,
        record: Memory,
        key: str,
        state: PodDrainState,
        reason: str,
        message: str,
        pdb: str | None = None,
    ) -> None:
        """An eviction's answer, unless the pod shows a standing deletion refusal."""
        refusal = record.deletion_refused
        if refusal is not None and key in refusal.pods:
            return  # lastError and the condition keep saying what to do
        cls._blocked(state, reason, message, pdb)

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
        # What the eviction is sent against: the status of the PDB that refused
        # the pod last time, as the cache shows it now.
        asked, seen = state.pdb, self._budget_status(ns, state.pdb)
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
            pdb = pdb_from_error(exc)
            self._note(record, key, state, REASON_PDB, f"{exc.message} {detail}".strip(), pdb)
            state.refused_at = asyncio.get_running_loop().time()
            state.budget_seen = (
                seen if pdb == asked and seen is not None else self._budget_status(ns, pdb)
            )
            self._backoff(state, exc.retry_after, self.base_backoff)
        except Conflict as exc:
            # Concurrent evictions behind one PDB race on its status: try again soon.
            outcome = "conflict"
            state.refused_at = None  # no refusal stands: retried after its backoff
            if state.reason != REASON_PDB:
                self._note(record, key, state, REASON_WAITING, f"{where}: {exc.message}")
            self._backoff(state, None, self.conflict_backoff)
        except Forbidden as exc:
            if exc.has_cause("NamespaceTerminating"):
                outcome = "namespace_terminating"
                message = f"namespace {ns} is terminating: {exc.message}"
                self._note(record, key, state, REASON_NS_TERMINATING, message)
            else:
                self._note(record, key, state, REASON_ERROR, f"{where}: {exc.message}")
            self._backoff(state, exc.retry_after, self.base_backoff)
        except KubeError as exc:
            if "more than one PodDisruptionBudget" in exc.message:
                outcome = "multiple_pdbs"
                self._note(record, key, state, REASON_MULTI_PDB, f"{where}: {exc.message}")
            else:
                self._note(record, key, state, REASON_ERROR, f"{where}: {exc.message}")
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
