"""One memory record per maintenance, keyed by the CR's uid, forgotten in one place.

Everything the operator knows about a maintenance beyond what the API
server stores lives in its :class:`Memory`: the node's pod watch, the
per-pod drain states and their eviction tasks, the lease renewer and its
last failure, the DaemonSets seen, the last status written, and what the
executor learnt for the next pass (the answers of the reads a plan asked
for, the lease request or API request a pass ended on). Nothing else keeps
per-maintenance state. A CR deleted and created again under the same name
is another uid, so another record: nothing of the old one carries over.

:meth:`Memories.forget` is the only way a record ends, and it stops every
task the record owns (pod watch, evictions, renewer). It is called when a
pass lets the CR go, when the NodeMaintenance cache loses the CR for any
reason (a DELETE event, or a re-list after a watch gap that no longer
contains it), and for every record when leadership ends. So a CR that
disappears without nmo seeing its deletion leaves no renewer running and
no lease re-created.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from nmo.api.models import NodeMaintenance
from nmo.core.maintenance.drainstate import PodDrainState
from nmo.core.maintenance.observed import LeaseFailure, QuorumFacts, VolumeFacts
from nmo.kube.informer import Informer

log = logging.getLogger("nmo.memory")

Obj = dict[str, Any]


@dataclass
class DeletionRefused:
    """A forced deletion (``onTimeout: Delete``) the API server refused (403).

    While it stands, the maintenance's remaining pods are not deleted (no
    DELETE per pass): it is lifted when the CR's generation changes (its
    spec, e.g. ``spec.drain``), when nmo may delete pods again (``rbac``:
    RBAC said no when it was refused), or after the evictor's slow retry.
    """

    message: str  # shown on the refused pod (lastError, the Drained condition)
    generation: int | None  # the CR's metadata.generation when refused
    at: float  # event loop time of the refusal
    rbac: bool  # a SelfSubjectAccessReview said no when it was refused
    pods: set[str] = field(default_factory=set)  # pod keys that show the message


@dataclass
class Fetched:
    """Answers of the reads a plan asked for: good for the rest of one reconcile
    (its next rounds), read afresh by the next reconcile."""

    node: Obj | None = None  # the node read live (None: not read, or found absent)
    node_read: bool = False  # the node was read live (absent if ``node`` is None)
    node_changed: bool = False  # a patch found it changed: read it live, not from the cache
    confirmed: bool | None = None  # a live read of the CR: True exists, False gone
    quorum: QuorumFacts | None = None  # the etcd-quorum facts for its node
    volumes: VolumeFacts | None = None  # the node's VolumeAttachments (volume-safe completion)


@dataclass
class Memory:
    """What nmo remembers about one maintenance (CR ``uid``: ``name`` on ``node``)."""

    uid: str
    name: str
    node: str
    pods: Informer | None = None  # the node's pods (field selector spec.nodeName=<node>)
    pods_task: asyncio.Task[None] | None = None
    drain: dict[str, PodDrainState] = field(default_factory=dict)
    evictions: set[asyncio.Task[None]] = field(default_factory=set)
    renewer: asyncio.Task[None] | None = None
    renewal: asyncio.Future[Any] | None = None  # the renewal PUT in flight, if any
    renewal_error: str | None = None
    lease_held: bool = False
    daemonsets: dict[str, bool] = field(default_factory=dict)
    last_written: dict[str, Any] | None = None
    last_write_at: float | None = None  # monotonic
    forgotten: bool = False  # set once, by Memories.forget: start nothing more
    deletion_refused: DeletionRefused | None = None  # onTimeout Delete refused (403)
    force_after: dict[str, float] = field(default_factory=dict)  # pod key -> loop time
    fetched: Fetched = field(default_factory=Fetched)  # read for this reconcile's next rounds
    lease_failure: LeaseFailure | None = None  # the last pass's lease request failed
    api_error: str | None = None  # the last pass ended on this API error
    # The CR as last parsed, with its resourceVersion: a pass parses it again
    # only when it changed (its status can list every pod of the node).
    parsed: tuple[str, NodeMaintenance] | None = None

    def parse(self, raw: Obj) -> NodeMaintenance:
        """``raw`` as a model, parsed once per resourceVersion."""
        rv = str(raw["metadata"].get("resourceVersion") or "")
        if rv and self.parsed is not None and self.parsed[0] == rv:
            return self.parsed[1]
        nm = NodeMaintenance.from_api(raw)
        self.parsed = (rv, nm) if rv else None
        return nm

    def planned_failures(self) -> None:
        """A plan that does not only read has taken the recorded failures into account."""
        self.lease_failure, self.api_error = None, None

    @property
    def renewing(self) -> bool:
        return self.renewer is not None and not self.renewer.done()

    def wrote(self, fingerprint: dict[str, Any]) -> None:
        """Remember the status this process just wrote."""
        self.last_written, self.last_write_at = fingerprint, time.monotonic()

    def written_ago(self) -> float | None:
        return None if self.last_write_at is None else time.monotonic() - self.last_write_at

    def pods_synced(self) -> bool:
        return self.pods is not None and self.pods.synced.is_set()

    def stop_drain(self) -> None:
        for task in list(self.evictions):
            task.cancel()
        self.evictions.clear()
        self.drain.clear()
        self.deletion_refused = None
        self.force_after.clear()

    def stop_renewer(self) -> None:
        if self.renewer is not None:
            self.renewer.cancel()
            log.info("lease renewer stopped for node %s", self.node, extra={"node": self.node})
        self.renewer = None
        self.renewal_error = None
        self.lease_held = False

    async def renewal_settled(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) for a renewal PUT still in flight.

        Stopping the renewer never aborts its PUT: cancelled mid-flight, the
        apiserver could still apply it after a release has read the lease,
        and the release's precondition would fail on it.
        """
        if self.renewal is not None and not self.renewal.done():
            await asyncio.wait({self.renewal}, timeout=timeout)

    def stop_pods(self) -> None:
        if self.pods_task is not None:
            self.pods_task.cancel()
            log.info("pod watch stopped for node %s", self.node, extra={"node": self.node})
        self.pods_task = None
        self.pods = None

    def stop(self) -> None:
        """Stop every task of the record (terminal maintenance or forgetting it)."""
        self.stop_drain()
        self.stop_renewer()
        self.stop_pods()


class Memories:
    """The records of every maintenance this leader works on."""

    def __init__(self) -> None:
        self._records: dict[str, Memory] = {}

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[Memory]:
        return iter(list(self._records.values()))

    def get(self, uid: str) -> Memory | None:
        return self._records.get(uid)

    def recall(self, uid: str, name: str, node: str) -> Memory:
        """The record for the CR, created on first use."""
        record = self._records.get(uid)
        if record is not None and record.node != node:  # cannot happen: nodeName is immutable
            self.forget(uid)
            record = None
        if record is None:
            # A CR deleted and created again under its name while the watch was
            # down (a re-list shows it MODIFIED): the old one's work ends here.
            self.forget_name(name)
            record = self._records[uid] = Memory(uid=uid, name=name, node=node)
        return record

    def forget(self, uid: str) -> None:
        record = self._records.pop(uid, None)
        if record is not None:
            record.forgotten = True
            record.stop()
            log.debug("maintenance %s forgotten", record.name, extra={"maintenance": record.name})

    def forget_name(self, name: str) -> None:
        """Forget every record of CRs named ``name`` (the cache lost the CR)."""
        for uid, record in list(self._records.items()):
            if record.name == name:
                self.forget(uid)

    def forget_all(self) -> None:
        for uid in list(self._records):
            self.forget(uid)

    @property
    def tasks(self) -> int:
        """Background tasks alive across every record (for tests and metrics)."""
        alive = 0
        for record in self._records.values():
            alive += sum(1 for t in (record.renewer, record.pods_task) if t and not t.done())
            alive += sum(1 for t in record.evictions if not t.done())
        return alive
