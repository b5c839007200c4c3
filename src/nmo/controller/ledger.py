"""The fleet budget's ledger: which maintenances are admitted, race-free.

The ledger is one coordination Lease, ``nmo-maintenance-budget`` in the
leader election namespace (RBAC the chart already grants), whose
annotation ``nodemaintenance.medik8s.io/admitted`` holds the admitted CRs
as JSON (name -> uid and node). Every admission reads it afresh and
writes it back with its resourceVersion (compare-and-swap); a conflict
means someone else wrote in between (another pass of this process is
excluded by a lock, so: another replica, e.g. an old leader still
finishing a pass), and the decision is taken again on what they wrote. So
the budget holds whatever the timing, across replicas and leader changes.

A maintenance leaves the ledger when its CR is let go (deleted) or fails
(a Failed maintenance has its node restored). An entry whose CR vanished
without that (force-deleted while nmo was down) is pruned at the next
admission, once a live GET confirms the CR is gone.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from nmo.api.models import NodeMaintenance, Phase
from nmo.core.maintenance import admission
from nmo.core.maintenance.admission import Admission, BudgetSettings
from nmo.kube.client import Kube, api_path, nm_path
from nmo.kube.errors import Conflict, Forbidden, KubeError, NotFound
from nmo.kube.informer import Informer

log = logging.getLogger("nmo.budget")

LEDGER_NAME = "nmo-maintenance-budget"
ANNOTATION = "nodemaintenance.medik8s.io/admitted"
Obj = dict[str, Any]


class LedgerContention(KubeError):
    """The ledger kept changing under us: retry the pass."""


class LedgerUnavailable(KubeError):
    """The ledger cannot be written where it is configured: the message says why
    and what to pass (it reaches the CR's ``lastError`` and the log)."""


_VERBS = {"GET": "get", "POST": "create", "PUT": "update"}


def explain(exc: KubeError, *, method: str, namespace: str) -> KubeError:
    """A ledger request's failure as the user must act on it; other errors as they are."""
    ledger = f"the fleet budget's ledger, Lease {namespace}/{LEDGER_NAME}"
    elsewhere = "or pass --budget-namespace=<namespace> (default: the leader election namespace)"
    if method == "POST" and isinstance(exc, NotFound):
        message = (
            f'namespace "{namespace}" does not exist, so {ledger}, cannot be created: '
            f"create it (kubectl create namespace {namespace}) {elsewhere}"
        )
    elif isinstance(exc, Forbidden) and exc.has_cause("NamespaceTerminating"):
        message = (
            f'namespace "{namespace}" is being deleted, so {ledger}, cannot be created: '
            f"wait until it is gone and create it again {elsewhere}"
        )
    elif isinstance(exc, Forbidden):
        verb = _VERBS.get(method, method.lower())
        message = (
            f"not allowed to {verb} {ledger}: {exc.message}; grant get, create and update on "
            f'leases.coordination.k8s.io in namespace "{namespace}" (the chart\'s '
            f"leader-election Role does) {elsewhere}"
        )
    else:
        return exc
    return LedgerUnavailable(message, status_code=exc.status_code, reason=exc.reason, body=exc.body)


class Budget:
    def __init__(
        self,
        kube: Kube,
        *,
        namespace: str,
        settings: BudgetSettings,
        maintenances: Informer,
        nodes: Informer,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.settings = settings
        self.maintenances = maintenances
        self.nodes = nodes
        self.clock = clock
        self._lock = asyncio.Lock()
        self._seen: dict[str, dict[str, str]] | None = None  # the ledger as last read or written
        self.admitted_count = 0  # for metrics: entries after the last read or write

    @property
    def path(self) -> str:
        return api_path(
            "coordination.k8s.io/v1", "leases", namespace=self.namespace, name=LEDGER_NAME
        )

    async def _read(self) -> tuple[dict[str, dict[str, str]], Obj | None]:
        try:
            lease = await self.kube.get(self.path)
        except NotFound:
            return {}, None
        except KubeError as exc:
            raise explain(exc, method="GET", namespace=self.namespace) from exc
        raw = ((lease.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION) or "{}"
        try:
            entries = json.loads(raw)
        except ValueError:
            log.error("budget ledger %s/%s is not JSON: starting it afresh", self.namespace, raw)
            entries = {}
        out = {str(k): dict(v) for k, v in entries.items() if isinstance(v, dict)}
        self._seen = dict(out)
        return out, lease

    async def _write(self, entries: Mapping[str, Mapping[str, str]], lease: Obj | None) -> None:
        try:
            await self._put(entries, lease)
        except Conflict:
            raise
        except KubeError as exc:
            method = "POST" if lease is None else "PUT"
            raise explain(exc, method=method, namespace=self.namespace) from exc
        self._seen = {k: dict(v) for k, v in entries.items()}
        self.admitted_count = len(entries)

    async def _put(self, entries: Mapping[str, Mapping[str, str]], lease: Obj | None) -> None:
        annotations = {ANNOTATION: json.dumps(dict(sorted(entries.items())), sort_keys=True)}
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": LEDGER_NAME,
                    "namespace": self.namespace,
                    "annotations": annotations,
                },
                "spec": {},
            }
            await self.kube.request(
                "POST",
                api_path("coordination.k8s.io/v1", "leases", namespace=self.namespace),
                body=body,
            )
        else:
            meta = dict(lease["metadata"])
            meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
            # PUT with the resourceVersion read: the compare-and-swap.
            await self.kube.request("PUT", self.path, body={**lease, "metadata": meta})

    def _running(self) -> dict[str, str]:
        """CRs the cache shows begun and not failed (adopted ones count too)."""
        out: dict[str, str] = {}
        for obj in self.maintenances.store.values():
            nm = NodeMaintenance.from_api(obj)
            if nm.status.begun and nm.status.phase is not Phase.FAILED:
                out[nm.metadata.name] = nm.spec.node_name
        return out

    def _queue(self) -> list[NodeMaintenance]:
        out = []
        for obj in self.maintenances.store.values():
            nm = NodeMaintenance.from_api(obj)
            if admission.awaits_start(nm, node_exists=nm.spec.node_name in self.nodes.store):
                out.append(nm)
        return out

    def queued_names(self) -> list[str]:
        """The queued CRs, head first (admitted ones whose status lags are not queued)."""
        admitted = self._seen or {}
        waiting = [nm for nm in self._queue() if nm.metadata.name not in admitted]
        return [nm.metadata.name for nm in sorted(waiting, key=admission.queue_order)]

    def _decide(self, nm: NodeMaintenance, entries: Mapping[str, Mapping[str, str]]) -> Admission:
        admitted = {**self._running(), **{k: v["node"] for k, v in entries.items()}}
        admitted.pop(nm.metadata.name, None)
        seen = admission.fleet(admitted, self._queue(), self.nodes.store)
        return admission.decide(nm, seen, self.settings, self.clock())

    def _quick(self, nm: NodeMaintenance) -> Admission | None:
        """A refusal decided on the ledger as last seen, without a request.

        Refusing on a stale ledger is harmless (the CR is looked at again);
        admitting never is: that needs the fresh read and the swap. Entries
        whose CR the cache lacks may be stale slots, so they send the CR to
        the fresh path, where they are pruned.
        """
        if self._seen is None or nm.metadata.name in self._seen:
            return None
        if any(self.maintenances.get(name) is None for name in self._seen):
            return None
        decision = self._decide(nm, self._seen)
        return None if decision.admit else decision

    async def _prune(self, entries: dict[str, dict[str, str]]) -> bool:
        """Drop entries whose CR failed or is confirmed gone; True if any was dropped."""
        dropped = False
        for name, entry in list(entries.items()):
            cached = self.maintenances.get(name)
            if cached is not None:
                if (cached.get("status") or {}).get("phase") == Phase.FAILED.value:
                    entries.pop(name)
                    dropped = True
                continue
            try:
                live = await self.kube.get(nm_path(name))
            except NotFound:
                live = None
            if live is None or live["metadata"].get("uid") != entry.get("uid"):
                log.info("budget: %s is gone, its slot is free again", name)
                entries.pop(name)
                dropped = True
        return dropped

    async def admit(self, nm: NodeMaintenance) -> Admission:
        """Admit ``nm`` if the budget and the window allow it, persisting the admission."""
        name = nm.metadata.name
        if (refused := self._quick(nm)) is not None:
            return refused
        async with self._lock:
            for _ in range(10):
                entries, lease = await self._read()
                if name in entries:
                    return Admission(True, admission.REASON_ADMITTED, "admitted")
                pruned = await self._prune(entries)
                decision = self._decide(nm, entries)
                if decision.admit:
                    entries[name] = {"uid": nm.metadata.uid, "node": nm.spec.node_name}
                elif not pruned:
                    self.admitted_count = len(entries)
                    return decision
                try:
                    await self._write(entries, lease)
                except Conflict:  # someone wrote in between: decide again on what they wrote
                    continue
                if decision.admit:
                    log.info(
                        "budget: maintenance %s admitted (%d in the ledger)",
                        name,
                        len(entries),
                        extra={"maintenance": name},
                    )
                return decision
        raise LedgerContention(f"the budget ledger {LEDGER_NAME} kept changing; retrying")

    async def release(self, name: str) -> bool:
        """Free the maintenance's slot; True if it held one."""
        async with self._lock:
            for _ in range(10):
                entries, lease = await self._read()
                if name not in entries:
                    return False
                entries.pop(name)
                try:
                    await self._write(entries, lease)
                except Conflict:
                    continue
                log.info(
                    "budget: maintenance %s left the ledger", name, extra={"maintenance": name}
                )
                return True
        raise LedgerContention(f"the budget ledger {LEDGER_NAME} kept changing; retrying")
