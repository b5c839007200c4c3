"""The fleet budget's ledger: which maintenances are admitted, race-free.

The ledger is one coordination Lease, ``nmo-maintenance-budget`` in the
leader election namespace (RBAC the chart already grants), whose
annotation ``nodemaintenance.medik8s.io/admitted`` holds the admitted CRs
as JSON (name -> uid and node).

This module only reads and writes it; the decisions are the planner's
(:func:`nmo.core.maintenance.planner.plan`). :meth:`FleetLedger.view` is
the ledger as this process last read or wrote it, a frozen snapshot for a
pass to observe; :meth:`FleetLedger.read` reads it afresh (a plan asks for
that when there is no view, or when an entry's CR is missing from the cache:
then a live GET tells whether that CR is gone, and its slot is pruned);
:meth:`FleetLedger.write` writes a plan's new entries with the
resourceVersion they were decided on (compare-and-swap). A conflict means
someone else wrote in between (another pass, another replica, an old
leader still finishing a pass): the view is dropped and the pass ends, so
the next one reads and decides again on what they wrote. So the budget
holds whatever the timing, across replicas and leader changes.

With ``--fleet-soak-seconds``, the write that frees a slot also records
when that node returned, in the annotation
``nodemaintenance.medik8s.io/last-returned`` of the same Lease (JSON: the
maintenance, its node, the time): the soak is decided on it, so it holds
across restarts and leader changes and after the CR is gone.

A maintenance leaves the ledger when its CR is let go (deleted) or fails
(a Failed maintenance has its node restored); an entry whose CR vanished
without that (force-deleted while nmo was down) or failed is pruned at the
next admission.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from nmo.api.models import NodeMaintenance, Phase
from nmo.core.maintenance import admission, gates
from nmo.core.maintenance.admission import Fleet
from nmo.core.maintenance.observed import Ledger, LedgerWrite
from nmo.kube.client import Kube, api_path, nm_path
from nmo.kube.errors import Conflict, Forbidden, KubeError, NotFound
from nmo.kube.informer import Informer

log = logging.getLogger("nmo.budget")

LEDGER_NAME = "nmo-maintenance-budget"
ANNOTATION = "nodemaintenance.medik8s.io/admitted"
RETURNED = "nodemaintenance.medik8s.io/last-returned"  # the soak's start (gates.Returned)
Obj = dict[str, Any]


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


class FleetLedger:
    def __init__(
        self,
        kube: Kube,
        *,
        namespace: str,
        maintenances: Informer,
        nodes: Informer,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.maintenances = maintenances
        self.nodes = nodes
        self._entries: dict[str, dict[str, str]] | None = None  # as last read or written
        self._lease: Obj | None = None  # the Lease they were read from (its resourceVersion)
        self._gone: frozenset[str] = frozenset()  # entries a live read found gone
        self._checked: frozenset[str] = frozenset()  # entries read live (gone or not)

    @property
    def path(self) -> str:
        return api_path(
            "coordination.k8s.io/v1", "leases", namespace=self.namespace, name=LEDGER_NAME
        )

    # -- observe: the caches only -----------------------------------------
    def view(self) -> Ledger | None:
        """The ledger as last read or written (None: not read yet, or dropped)."""
        if self._entries is None:
            return None
        gone = set(self._gone)
        fresh = True
        for name in self._entries:
            cached = self.maintenances.get(name)
            if cached is None:
                fresh = fresh and name in self._checked
            elif (cached.get("status") or {}).get("phase") == Phase.FAILED.value:
                gone.add(name)
        version = None if self._lease is None else _version(self._lease)
        return Ledger(
            entries=self._entries,
            gone=frozenset(gone),
            fresh=fresh,
            version=version,
            returned=self.returned(),
        )

    def returned(self) -> gates.Returned | None:
        """The last node back from a maintenance, as last read or written."""
        if self._lease is None:
            return None
        annotations = (self._lease.get("metadata") or {}).get("annotations") or {}
        return gates.decode_returned(annotations.get(RETURNED))

    def fleet(self) -> Fleet:
        """The cluster as the budget sees it: running CRs, the queue, the nodes."""
        running: dict[str, str] = {}
        queue: list[NodeMaintenance] = []
        nodes = self.nodes.store
        for obj in self.maintenances.store.values():
            nm = NodeMaintenance.from_api(obj)
            if nm.status.begun and nm.status.phase is not Phase.FAILED:
                running[nm.metadata.name] = nm.spec.node_name
            if admission.awaits_start(nm, node_exists=nm.spec.node_name in nodes):
                queue.append(nm)
        return admission.fleet(running, queue, nodes)

    def queued_names(self) -> list[str]:
        """The queued CRs, head first (admitted ones whose status lags are not queued)."""
        admitted = self._entries or {}
        nodes = self.nodes.store
        waiting = []
        for obj in self.maintenances.store.values():
            nm = NodeMaintenance.from_api(obj)
            if nm.metadata.name in admitted:
                continue
            if admission.awaits_start(nm, node_exists=nm.spec.node_name in nodes):
                waiting.append(nm)
        return [nm.metadata.name for nm in sorted(waiting, key=admission.queue_order)]

    # -- reads and writes a plan asks for ------------------------------------
    async def read(self) -> None:
        """Read the ledger afresh, and whether the CRs of entries missing from
        the cache still exist (a live GET each)."""
        try:
            lease = await self.kube.get(self.path)
        except NotFound:
            lease = None
        except KubeError as exc:
            raise explain(exc, method="GET", namespace=self.namespace) from exc
        entries: dict[str, dict[str, str]] = {}
        if lease is not None:
            annotations = (lease.get("metadata") or {}).get("annotations") or {}
            raw = annotations.get(ANNOTATION) or "{}"
            try:
                parsed = json.loads(raw)
            except ValueError:
                log.error(
                    "budget ledger %s/%s is not JSON: starting it afresh", self.namespace, raw
                )
                parsed = {}
            entries = {str(k): dict(v) for k, v in parsed.items() if isinstance(v, dict)}
        gone, checked = set(), set()
        for name, entry in entries.items():
            if self.maintenances.get(name) is not None:
                continue
            checked.add(name)
            try:
                live = await self.kube.get(nm_path(name))
            except NotFound:
                live = None
            if live is None or live["metadata"].get("uid") != entry.get("uid"):
                log.info("budget: %s is gone, its slot is free again", name)
                gone.add(name)
        if self._lease is not None and lease is not None and _newer(self._lease, lease):
            return  # a write of ours landed meanwhile: keep the view it left
        self._entries, self._lease = entries, lease
        self._gone, self._checked = frozenset(gone), frozenset(checked)

    async def write(self, change: LedgerWrite) -> None:
        """Write the plan's entries with the resourceVersion of the view it was
        decided on (whatever was written since); a conflict drops the view and
        ends the pass (409)."""
        lease = None
        if change.version is not None:
            template = self._lease or {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": LEDGER_NAME, "namespace": self.namespace},
                "spec": {},
            }
            meta = {**template["metadata"], "resourceVersion": change.version}
            lease = {**template, "metadata": meta}
        entries = {k: dict(v) for k, v in change.entries.items()}
        try:
            written = await self._put(entries, lease, change.returned)
        except Conflict:
            self._entries = self._lease = None  # decided on a stale ledger: read it again
            raise
        except KubeError as exc:
            method = "POST" if lease is None else "PUT"
            raise explain(exc, method=method, namespace=self.namespace) from exc
        self._entries, self._lease = entries, written
        self._gone &= frozenset(entries)
        if change.admitted is not None:
            log.info(
                "budget: maintenance %s admitted (%d in the ledger)",
                change.admitted,
                len(entries),
                extra={"maintenance": change.admitted},
            )
        if change.released is not None:
            log.info(
                "budget: maintenance %s left the ledger",
                change.released,
                extra={"maintenance": change.released},
            )

    async def _put(
        self,
        entries: Mapping[str, Mapping[str, str]],
        lease: Obj | None,
        returned: gates.Returned | None,
    ) -> Obj:
        annotations = {ANNOTATION: json.dumps(dict(sorted(entries.items())), sort_keys=True)}
        if returned is not None:
            annotations[RETURNED] = gates.encode_returned(returned)
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
            return await self.kube.request(
                "POST",
                api_path("coordination.k8s.io/v1", "leases", namespace=self.namespace),
                body=body,
            )
        meta = dict(lease["metadata"])
        meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
        # PUT with the resourceVersion read: the compare-and-swap.
        return await self.kube.request("PUT", self.path, body={**lease, "metadata": meta})


def _version(lease: Obj) -> str | None:
    rv = (lease.get("metadata") or {}).get("resourceVersion")
    return str(rv) if rv else None


def _newer(held: Obj, read: Obj) -> bool:
    """Whether the Lease held is newer than the one just read (etcd's numeric RVs)."""
    try:
        return int(_version(held) or 0) > int(_version(read) or 0)
    except ValueError:
        return False
