"""Volume-safe completion: what a finished drain still waits for (pure, opt-in).

Kubernetes force-detaches a volume still attached to a node that went down
only after about six minutes; a pod rescheduled meanwhile meets Multi-Attach
errors. Cluster API (``nodeVolumeDetachTimeout``) and Karpenter (the
``VolumesDetached`` condition) therefore wait for the node's
VolumeAttachments to go before they call it drained; with
``--wait-for-volume-detach`` or ``spec.drain.waitForVolumeDetach`` nmo does
too (issue 23).

When the last pod to evict has left, :func:`gate` decides from
:class:`VolumeFacts` (read by the executor, ``ReadKind.VOLUMES``) whether the
maintenance succeeds now or waits:

* waited for: every VolumeAttachment naming the node, except those of
  multi-attach volumes (ReadWriteMany, ReadOnlyMany: the next pod attaches
  them anyway) and those of volumes a pod still on the node uses (a
  DaemonSet's, a pod the drain does not evict: they stay attached). So the
  attachments of the drained pods' volumes, and nothing that would never go;
* while any is left the maintenance stays Running with the condition
  ``VolumesDetached`` False (reason Waiting) naming them, and looks again
  every ``volume_poll`` seconds;
* the wait's deadline starts when that condition turned False (so it is kept
  across restarts); at the deadline nmo reports (condition reason TimedOut,
  a Warning event VolumeDetachTimedOut) and proceeds, as Cluster API does
  after ``nodeVolumeDetachTimeout``: the maintenance succeeds;
* when none is left: ``VolumesDetached`` True, and the maintenance succeeds;
* a wait the CR turns off (``enabled: false``) ends at once: reason TurnedOff;
* a drain that has pods to evict again drops a False condition
  (:func:`reopened`): its next end waits afresh.

A read that failed (RBAC, the API) is shown in the condition (reason
ReadFailed) and retried; the deadline holds for it too: never a silent hang.

Inline volumes: CSI ephemeral volumes (``pod.spec.volumes[].csi``) are never
attached, so there is nothing to wait for. An attachment of a migrated
in-tree inline volume (``spec.source.inlineVolumeSpec``) is waited for
unless multi-attach; it cannot be told apart from a staying pod's without
translating the pod's in-tree volume, so a staying pod's such volume is
waited for until the deadline.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from nmo.api import constants as c
from nmo.api.models import ConditionStatus, NodeMaintenance, NodeMaintenanceStatus, Phase
from nmo.core.maintenance import podselect, transitions
from nmo.core.maintenance.observed import (
    Emit,
    Observed,
    Plan,
    Read,
    ReadKind,
    Result,
    VolumeFacts,
)
from nmo.core.maintenance.policy import PlanSettings, reading, status_write

Obj = dict[str, Any]

MULTI_ATTACH = frozenset({"ReadWriteMany", "ReadOnlyMany"})
REASON_WAITING = "Waiting"
REASON_DETACHED = "Detached"
REASON_TIMED_OUT = "TimedOut"
REASON_READ_FAILED = "ReadFailed"
REASON_TURNED_OFF = "TurnedOff"  # spec.drain.waitForVolumeDetach.enabled false mid-wait
MAX_NAMED = 10  # attachments named in the condition's message


@dataclass(frozen=True)
class Attached:
    """One VolumeAttachment the maintenance waits for."""

    name: str
    volume: str  # "PersistentVolume <name>" or "inline volume <handle>"
    claim: str | None  # "namespace/name" of the PV's claim, if bound
    detaching: bool  # deleted, held by its finalizer until the driver detached it

    def describe(self) -> str:
        claim = f", claim {self.claim}" if self.claim else ""
        state = ", detaching" if self.detaching else ""
        return f"{self.name} ({self.volume}{claim}{state})"


def wanted(nm: NodeMaintenance, settings: PlanSettings) -> bool:
    """Whether this maintenance waits for volumes (its spec, else the operator's flag)."""
    spec = nm.spec.drain.wait_for_volume_detach if nm.spec.drain is not None else None
    if spec is not None and spec.enabled is not None:
        return spec.enabled
    return settings.volume_detach


def timeout_of(nm: NodeMaintenance, settings: PlanSettings) -> int:
    """The wait's length: the CR's, else the flag's; at most a day, whatever got
    past the API (a CR stored without the webhook): a deadline past year 9999
    cannot be computed, and the pass would crash on every look."""
    spec = nm.spec.drain.wait_for_volume_detach if nm.spec.drain is not None else None
    if spec is not None and spec.timeout_seconds:
        return min(spec.timeout_seconds, c.VOLUME_DETACH_TIMEOUT_MAX)
    return settings.volume_detach_timeout


def timeout_error(value: object) -> str | None:
    """What is wrong with a ``waitForVolumeDetach.timeoutSeconds`` (the webhook says it)."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        return "spec.drain.waitForVolumeDetach.timeoutSeconds must be a whole number of seconds"
    if not 1 <= value <= c.VOLUME_DETACH_TIMEOUT_MAX:
        return (
            f"spec.drain.waitForVolumeDetach.timeoutSeconds must be between 1 and "
            f"{c.VOLUME_DETACH_TIMEOUT_MAX} seconds (got {value}): nmo never waits for "
            "volumes without a deadline; leave it out for the operator's default"
        )
    return None


def _claims_in_use(pods: tuple[Obj, ...]) -> frozenset[str]:
    """The "namespace/claim" of every PVC a pod still on the node mounts."""
    out: set[str] = set()
    for pod in pods:
        ns = podselect.pod_namespace(pod)
        for vol in (pod.get("spec") or {}).get("volumes") or ():
            claim = (vol.get("persistentVolumeClaim") or {}).get("claimName")
            if claim:
                out.add(f"{ns}/{claim}")
            eph = vol.get("ephemeral")
            if eph is not None:  # generic ephemeral volume: its PVC is "<pod>-<volume>"
                out.add(f"{ns}/{podselect.pod_name(pod)}-{vol.get('name')}")
    return frozenset(out)


def waited_for(facts: VolumeFacts, pods: tuple[Obj, ...]) -> tuple[Attached, ...]:
    """The attachments on the node the maintenance waits for (see the module)."""
    staying = _claims_in_use(pods)
    out: list[Attached] = []
    for va in facts.attachments:
        meta, spec = va.get("metadata") or {}, va.get("spec") or {}
        source = spec.get("source") or {}
        pv_name = source.get("persistentVolumeName")
        claim: str | None = None
        if pv_name:
            pv = facts.volumes.get(str(pv_name))
            pv_spec = (pv or {}).get("spec") or {}
            ref = pv_spec.get("claimRef") or {}
            if ref.get("name"):
                claim = f"{ref.get('namespace', '')}/{ref['name']}"
            if MULTI_ATTACH & set(pv_spec.get("accessModes") or ()):
                continue
            if claim is not None and claim in staying:
                continue
            volume = f"PersistentVolume {pv_name}"
        else:
            inline = source.get("inlineVolumeSpec") or {}
            if MULTI_ATTACH & set(inline.get("accessModes") or ()):
                continue
            handle = (inline.get("csi") or {}).get("volumeHandle") or "?"
            volume = f"inline volume {handle}"
        out.append(
            Attached(
                name=str(meta.get("name", "")),
                volume=volume,
                claim=claim,
                detaching=meta.get("deletionTimestamp") is not None,
            )
        )
    return tuple(sorted(out, key=lambda a: a.name))


def _named(attached: tuple[Attached, ...]) -> str:
    shown = ", ".join(a.describe() for a in attached[:MAX_NAMED])
    more = len(attached) - MAX_NAMED
    return shown + (f" and {more} more" if more > 0 else "")


@dataclass(frozen=True)
class Gate:
    """The volume step of a pass whose drain has no pod left.

    ``wait``: the plan of a pass that reads or keeps waiting (nothing else of
    the pass happens); else the maintenance succeeds with ``status`` (its
    VolumesDetached condition set, if the step ran), ``events`` and
    ``notes`` added, and ``waited`` for the metric.
    """

    status: NodeMaintenanceStatus
    wait: Plan | None = None
    events: tuple[Emit, ...] = ()
    notes: tuple[str, ...] = ()
    waited: tuple[str, float] | None = None  # (outcome, seconds) when a wait just ended


def gate(obs: Observed, st: NodeMaintenanceStatus, base: Plan, settings: PlanSettings) -> Gate:
    """Whether a drain with no pod left succeeds now or waits for volumes."""
    nm, now = obs.nm, obs.now
    if st.phase is Phase.SUCCEEDED:
        return Gate(status=st)
    if not wanted(nm, settings):
        return _turned_off(nm, st, now)
    if obs.volumes is None:
        return Gate(status=st, wait=reading((Read(ReadKind.VOLUMES, nm.spec.node_name),)))
    node, name = nm.spec.node_name, nm.metadata.name
    before = transitions.condition(st, c.CONDITION_VOLUMES_DETACHED)
    started = (
        before.last_transition_time
        if before is not None and before.status is not ConditionStatus.TRUE
        else None
    ) or now
    timeout = timeout_of(nm, settings)
    deadline = started + timedelta(seconds=timeout)
    facts = obs.volumes
    attached = () if facts.error is not None else waited_for(facts, obs.pods or ())
    waited = (now - started).total_seconds()

    def set_condition(state: ConditionStatus, reason: str, message: str) -> NodeMaintenanceStatus:
        return transitions.with_condition(
            st,
            type_=c.CONDITION_VOLUMES_DETACHED,
            state=state,
            reason=reason,
            message=message,
            now=started if state is ConditionStatus.FALSE else now,
            generation=nm.metadata.generation or None,
        )

    if facts.error is None and not attached:
        message = f"no VolumeAttachment of a drained pod's volume is left on node {node}"
        ended = ("detached", waited) if before is not None else None
        note = (
            f"maintenance {name}: volumes of node {node} detached after {waited:.0f}s"
            if before is not None
            else None
        )
        return Gate(
            status=set_condition(ConditionStatus.TRUE, REASON_DETACHED, message),
            notes=(note,) if note else (),
            waited=ended,
        )
    what = (
        f"could not read the VolumeAttachments of node {node}: {facts.error}"
        if facts.error is not None
        else f"{len(attached)} volume(s) still attached to node {node}: {_named(attached)}"
    )
    if now >= deadline:
        message = (
            f"volumes not detached within {timeout}s (deadline {_stamp(deadline)}): {what}; "
            "the maintenance proceeds"
        )
        return Gate(
            status=set_condition(ConditionStatus.FALSE, REASON_TIMED_OUT, message),
            events=(Emit((c.EVENT_VOLUME_DETACH_TIMED_OUT, message), warning=True),),
            notes=(f"maintenance {name}: {message}",),
            waited=("timed_out", waited),
        )
    reason = REASON_READ_FAILED if facts.error is not None else REASON_WAITING
    message = f"waiting until {_stamp(deadline)}: {what}"
    # Drained, not done: the status says so as Succeeded would (no pod left,
    # 100 %), but the phase stays Running (lastUpdate: the planner's heartbeat).
    new = set_condition(ConditionStatus.FALSE, reason, message).model_copy(
        update={
            "phase": Phase.RUNNING,
            "drain_progress": 100,
            "pending_pods": [],
            "pending_pods_refs": [],
            "pending_pods_details": [],
            "last_error": None,
        }
    )
    left = (deadline - now).total_seconds()
    notes = base.notes
    if before is None or before.status is ConditionStatus.TRUE:
        notes = (*notes, f"maintenance {name}: drain complete, {what}")
    waiting = replace(
        base,
        status=status_write(obs, new, settings),
        drop=tuple(obs.drain),
        notes=notes,
        result=Result(requeue_after=max(0.05, min(settings.volume_poll, left))),
        drain_pending=0,
    )
    return Gate(status=new, wait=waiting)


def reopened(st: NodeMaintenanceStatus) -> NodeMaintenanceStatus:
    """The status of a drain that has pods to evict again (a pod bound to the
    node by name during the wait): a wait that had begun (or ended False)
    belongs to the drain's previous end, and goes. Kept, it said
    WaitingForVolumeDetach on the node while pods were evicted, and the next
    wait's deadline counted from the first one (TimedOut at once, without
    waiting for the new pod's volumes)."""
    before = transitions.condition(st, c.CONDITION_VOLUMES_DETACHED)
    if before is None or before.status is ConditionStatus.TRUE:
        return st
    kept = [x for x in st.conditions or [] if x.type != c.CONDITION_VOLUMES_DETACHED]
    return st.model_copy(update={"conditions": kept})


def _turned_off(nm: NodeMaintenance, st: NodeMaintenanceStatus, now: datetime) -> Gate:
    """No wait: a wait the CR's spec turned off meanwhile ends, and says so."""
    before = transitions.condition(st, c.CONDITION_VOLUMES_DETACHED)
    if before is None or before.status is ConditionStatus.TRUE:
        return Gate(status=st)
    message = "the wait for volumes was turned off; the maintenance proceeds"
    new = transitions.with_condition(
        st,
        type_=c.CONDITION_VOLUMES_DETACHED,
        state=ConditionStatus.FALSE,
        reason=REASON_TURNED_OFF,
        message=message,
        now=now,
        generation=nm.metadata.generation or None,
    )
    since = before.last_transition_time or now
    return Gate(
        status=new,
        notes=(f"maintenance {nm.metadata.name}: {message}",),
        waited=("turned_off", (now - since).total_seconds()),
    )


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")
