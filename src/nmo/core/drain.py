"""Drain fan-out: evictions in parallel, per-pod backoff, no held workers.

A reconcile calls :meth:`Drainer.sync` with the pods that must leave the
node; ``sync`` returns at once. It starts evictions (bounded by one
semaphore across all nodes), remembers per pod why it is still there
(PDB, terminating namespace, multiple PDBs, terminating since when) and when
to try again (Retry-After honoured, capped jittered backoff). When an
eviction finishes, the drainer calls ``on_change(node)`` so the CR is
reconciled again; pod deletions are observed by the pod watch, never polled.

Eviction answers (kubectl's drain helper semantics): 2xx evicted; 404 gone;
429 a PodDisruptionBudget forbids it now; 403 with cause
NamespaceTerminating; 500 "more than one PodDisruptionBudget"; anything
else is reported per pod and retried with backoff.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from nmo.api.models import PendingPodDetail
from nmo.core.errors import Forbidden, KubeError, NotFound, TooManyRequests
from nmo.core.kube import Kube, api_path
from nmo.core.metrics import Metrics
from nmo.core.podselect import pod_key

log = logging.getLogger("nmo.drain")

Pod = dict[str, Any]

REASON_PDB = "DisruptionBudget"
REASON_NS_TERMINATING = "NamespaceTerminating"
REASON_MULTI_PDB = "MultiplePDBs"
REASON_ERROR = "EvictionError"
REASON_TERMINATING = "Terminating"
REASON_WAITING = "Waiting"
REASON_EVICTING = "Evicting"

_PDB_NAME = re.compile(r"disruption budget ([A-Za-z0-9.\-]+)")


@dataclass
class PodDrainState:
    uid: str
    reason: str = REASON_WAITING
    message: str = ""
    pdb: str | None = None
    since: datetime = field(default_factory=lambda: datetime.now(UTC))
    next_attempt: float = 0.0
    attempts: int = 0
    in_flight: bool = False
    evicted: bool = False


MAX_DETAILS = 100  # pendingPodsDetails is capped; pendingPods always lists every pod
_DETAIL_ORDER = {
    REASON_PDB: 0,
    REASON_MULTI_PDB: 0,
    REASON_NS_TERMINATING: 0,
    REASON_ERROR: 0,
    REASON_TERMINATING: 1,
    REASON_EVICTING: 2,
    REASON_WAITING: 2,
}


@dataclass
class DrainReport:
    pending: list[tuple[str, str]]  # (namespace, name) of every pod still on the node
    details: list[PendingPodDetail]  # why, blocked pods first, at most MAX_DETAILS
    next_wake: float | None  # seconds until a blocked pod is retried
    last_error: str | None


def pdb_from_error(exc: KubeError) -> str | None:
    for cause in exc.causes:
        match = _PDB_NAME.search(str(cause.get("message", "")))
        if match:
            return match.group(1)
    match = _PDB_NAME.search(exc.message)
    return match.group(1) if match else None


def terminating_since(pod: Pod) -> datetime | None:
    meta = pod.get("metadata") or {}
    stamp = meta.get("deletionTimestamp")
    if not stamp:
        return None
    deadline = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    return deadline - timedelta(seconds=int(meta.get("deletionGracePeriodSeconds") or 0))


class Drainer:
    def __init__(
        self,
        kube: Kube,
        *,
        max_parallel: int,
        on_change: Callable[[str], None],
        metrics: Metrics,
        base_backoff: float = 1.0,
        max_backoff: float = 15.0,
    ) -> None:
        self.kube = kube
        self.on_change = on_change
        self.metrics = metrics
        self.base_backoff = base_backoff
        self.max_backoff = max_backoff
        self._slots = asyncio.Semaphore(max_parallel)
        self._nodes: dict[str, dict[str, PodDrainState]] = {}
        self._tasks: dict[str, set[asyncio.Task[None]]] = {}
        self.evictions_started = 0
        self.evicted_recheck = 60.0

    def sync(self, node: str, pods: list[Pod]) -> DrainReport:
        """Drive the node's drain one step; never waits on the API."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        states = self._nodes.setdefault(node, {})
        present = {pod_key(p): p for p in pods}
        for key in list(states):
            pod = present.get(key)
            if pod is None or pod["metadata"].get("uid") != states[key].uid:
                del states[key]  # gone: NotFound or replaced (UID changed)
        pending: list[tuple[str, str]] = []
        why: list[tuple[Pod, PodDrainState]] = []
        wake: float | None = None
        errors: list[str] = []
        for key, pod in present.items():
            uid = str(pod["metadata"].get("uid", ""))
            state = states.get(key)
            if state is None:
                state = states[key] = PodDrainState(uid=uid)
            since = terminating_since(pod)
            if since is not None and not state.in_flight:
                if state.reason != REASON_TERMINATING:
                    state.reason, state.since = REASON_TERMINATING, since
                    state.message = f"pod is terminating since {since.isoformat()}"
                    state.pdb = None
            elif not state.in_flight and now >= state.next_attempt:
                self._start(node, key, pod, state)
            elif not state.in_flight:
                remaining = state.next_attempt - now
                wake = remaining if wake is None else min(wake, remaining)
            if state.reason in (REASON_MULTI_PDB, REASON_ERROR, REASON_NS_TERMINATING):
                errors.append(state.message)
            pending.append(
                (str(pod["metadata"].get("namespace", "")), str(pod["metadata"]["name"]))
            )
            why.append((pod, state))
        why.sort(key=lambda item: _DETAIL_ORDER.get(item[1].reason, 3))
        details = [
            PendingPodDetail(
                namespace=str(pod["metadata"].get("namespace", "")),
                name=str(pod["metadata"]["name"]),
                reason=state.reason,
                message=state.message,
                disruption_budget=state.pdb,
                since=state.since,
            )
            for pod, state in why[:MAX_DETAILS]
        ]
        return DrainReport(
            pending=pending,
            details=details,
            next_wake=wake,
            last_error=errors[0] if errors else None,
        )

    def forget(self, node: str) -> None:
        """Stop the node's drain (maintenance ended or failed)."""
        self._nodes.pop(node, None)
        for task in self._tasks.pop(node, set()):
            task.cancel()

    @property
    def in_flight(self) -> int:
        return sum(len(t) for t in self._tasks.values())

    def _start(self, node: str, key: str, pod: Pod, state: PodDrainState) -> None:
        state.in_flight = True
        if state.reason == REASON_WAITING:
            state.reason = REASON_EVICTING
        task = asyncio.get_running_loop().create_task(
            self._evict(node, key, pod, state), name=f"evict:{key}"
        )
        tasks = self._tasks.setdefault(node, set())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def _backoff(self, state: PodDrainState, retry_after: float | None) -> None:
        delay = min(self.max_backoff, self.base_backoff * 2 ** min(state.attempts, 10))
        delay = random.uniform(delay / 2, delay)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.max_backoff))
        state.next_attempt = asyncio.get_running_loop().time() + delay

    def _blocked(
        self, state: PodDrainState, reason: str, message: str, pdb: str | None = None
    ) -> None:
        if state.reason != reason:
            state.since = datetime.now(UTC)
        state.reason, state.message, state.pdb = reason, message, pdb

    async def _evict(self, node: str, key: str, pod: Pod, state: PodDrainState) -> None:
        ns, name = str(pod["metadata"]["namespace"]), str(pod["metadata"]["name"])
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
            "deleteOptions": {"preconditions": {"uid": state.uid}},
        }
        outcome = "error"
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
            # The watch reports the deletion; re-evict only if nothing happens for long.
            state.next_attempt = asyncio.get_running_loop().time() + self.evicted_recheck
            self._blocked(state, REASON_TERMINATING, "evicted, waiting for the pod to terminate")
            log.info(
                "drain: evicted pod %s from node %s", key, node, extra={"node": node, "pod": key}
            )
        except NotFound:
            outcome = "gone"
        except TooManyRequests as exc:
            outcome = "pdb_blocked"
            pdb = pdb_from_error(exc)
            detail = "; ".join(str(c.get("message", "")) for c in exc.causes if c.get("message"))
            msg = f"{exc.message} {detail}".strip()
            self._blocked(state, REASON_PDB, msg, pdb)
            self._backoff(state, exc.retry_after)
        except Forbidden as exc:
            if exc.has_cause("NamespaceTerminating"):
                outcome = "namespace_terminating"
                self._blocked(
                    state, REASON_NS_TERMINATING, f"namespace {ns} is terminating: {exc.message}"
                )
            else:
                self._blocked(
                    state, REASON_ERROR, f"error when evicting pods/{name} -n {ns}: {exc.message}"
                )
            self._backoff(state, exc.retry_after)
        except KubeError as exc:
            if "more than one PodDisruptionBudget" in exc.message:
                outcome = "multiple_pdbs"
                self._blocked(
                    state,
                    REASON_MULTI_PDB,
                    f"error when evicting pods/{name} -n {ns}: {exc.message}",
                )
            else:
                self._blocked(
                    state, REASON_ERROR, f"error when evicting pods/{name} -n {ns}: {exc.message}"
                )
            self._backoff(state, exc.retry_after)
        finally:
            state.in_flight = False
        self.metrics.evictions.labels(outcome=outcome).inc()
        if outcome not in ("evicted", "gone"):
            log.info(
                "drain: pod %s still pending on node %s: %s",
                key,
                node,
                state.message,
                extra={"node": node, "pod": key, "reason": state.reason},
            )
        self.on_change(node)
