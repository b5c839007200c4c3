"""The node lifecycle conditions on the Node, as pure functions (KEP-5683, issue 23).

With ``--node-conditions`` (off by default: the Go NMO writes no node
conditions, and scripts read the Node) nmo keeps four condition types on
``Node.status.conditions`` while a maintenance holds the node, so that other
controllers (storage operators adjusting their PDBs, autoscalers) can see it
without knowing the NodeMaintenance CRD:

==========================  =====================================================
``MaintenancePlanned``      True while admitted but queued (fleet budget, window,
                            etcd quorum) or about to start; False once it started
``MaintenanceInProgress``   True once the node is taken (cordoned, tainted)
``DrainInProgress``         True while pods are being evicted (reason Draining,
                            TimedOut once the drain's deadline passed), and
                            while their volumes detach (WaitingForVolumeDetach)
``Drained``                 True once no pod is left to evict
==========================  =====================================================

Each carries a reason and a message that names the NodeMaintenance (the
message starts ``NodeMaintenance <name>:``, which is how a CR recognises the
conditions it wrote). They go when the maintenance ends: CR deleted, or
Failed with the node given back. A queued CR has no finalizer yet, so its
deletion leaves no pass of its own: the executor removes the conditions that
name a CR the cache no longer holds (:func:`owners`), when that CR's key is
reconciled (its deletion, or the leader's sweep of the node cache).

Everything is derived from the observed Node, never from memory: the patch
holds only the conditions whose status, reason or message differ from what
the node carries, and ``lastTransitionTime`` moves only when a condition's
status changes. So a restart, a leader change or a repeated pass writes
nothing new, and a node status rewrite that dropped them (a kubelet or kwok
replacing the status) is repaired on the next pass. The write is a
strategic-merge patch of the status subresource keyed by condition type:
other writers' conditions (kubelet's Ready...) are never part of it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from nmo.api import constants as c
from nmo.api.models import NodeMaintenanceStatus, Phase
from nmo.core.maintenance import nodepatch, transitions
from nmo.core.maintenance.drainplan import REASON_TIMED_OUT
from nmo.core.maintenance.observed import LeaseStep, Observed, Plan, Work

Obj = dict[str, Any]

TRUE, FALSE = "True", "False"
REASON_ADMITTED = "Admitted"  # Planned: admitted, taking the node
REASON_STARTED = "Started"  # Planned False: the maintenance started
REASON_NOT_STARTED = "NotStarted"
REASON_TAKEN = "NodeCordoned"  # InProgress: cordoned, tainted, labelled
REASON_DRAINED = "Drained"
REASON_DRAINING = "Draining"
# --wait-for-volume-detach: the pods left, their VolumeAttachments have not
# (the CR's VolumesDetached condition is False): the drain is not done yet.
REASON_VOLUMES = "WaitingForVolumeDetach"


class Stage(enum.Enum):
    """Where a maintenance is, as the node conditions tell it."""

    QUEUED = "queued"  # admitted by the webhook, held back by the budget/window/quorum
    STARTING = "starting"  # may start: lease, pod cache, the first node patch
    DRAINING = "draining"  # node taken, pods being evicted
    DRAINED = "drained"  # node taken, no pod left to evict


@dataclass(frozen=True)
class Want:
    """One condition as nmo wants it on the node."""

    type: str
    status: str  # "True" | "False"
    reason: str
    message: str


def prefix(name: str) -> str:
    """How a condition's message names its NodeMaintenance."""
    return f"NodeMaintenance {name}:"


def wanted(name: str, stage: Stage, *, reason: str = "") -> tuple[Want, ...]:
    """The four conditions for a maintenance at ``stage``.

    ``reason``: for QUEUED the CR's Queued reason (BudgetExhausted,
    OutsideWindow...), for DRAINING Draining, TimedOut or WaitingForVolumeDetach. Messages stay the
    same while the stage and reason do (the queue position and the drain's
    progress are on the CR), so a queue that moves or a drain that
    progresses writes nothing to the node.
    """
    nm = prefix(name)

    def want(type_: str, on: bool, why: str, text: str) -> Want:
        return Want(type_, TRUE if on else FALSE, why, f"{nm} {text}")

    if stage is Stage.QUEUED:
        why = reason or REASON_NOT_STARTED
        queued = f"queued ({why}), its Queued condition says why"
        return (
            want(c.NODE_CONDITION_PLANNED, True, why, queued),
            want(c.NODE_CONDITION_IN_PROGRESS, False, REASON_NOT_STARTED, queued),
            want(c.NODE_CONDITION_DRAIN_IN_PROGRESS, False, REASON_NOT_STARTED, queued),
            want(c.NODE_CONDITION_DRAINED, False, REASON_NOT_STARTED, queued),
        )
    if stage is Stage.STARTING:
        text = "admitted, about to cordon and drain the node"
        return (
            want(c.NODE_CONDITION_PLANNED, True, REASON_ADMITTED, text),
            want(c.NODE_CONDITION_IN_PROGRESS, False, REASON_NOT_STARTED, text),
            want(c.NODE_CONDITION_DRAIN_IN_PROGRESS, False, REASON_NOT_STARTED, text),
            want(c.NODE_CONDITION_DRAINED, False, REASON_NOT_STARTED, text),
        )
    started = want(c.NODE_CONDITION_PLANNED, False, REASON_STARTED, "started")
    taken = want(
        c.NODE_CONDITION_IN_PROGRESS,
        True,
        REASON_TAKEN,
        "node cordoned and tainted for maintenance",
    )
    if stage is Stage.DRAINED:
        done = "no pod left to evict"
        return (
            started,
            taken,
            want(c.NODE_CONDITION_DRAIN_IN_PROGRESS, False, REASON_DRAINED, done),
            want(c.NODE_CONDITION_DRAINED, True, REASON_DRAINED, done),
        )
    why = reason or REASON_DRAINING
    text = {
        REASON_DRAINING: "evicting pods",
        REASON_VOLUMES: "every pod left, waiting for their volumes to detach",
    }.get(why, f"evicting pods ({why})")
    return (
        started,
        taken,
        want(c.NODE_CONDITION_DRAIN_IN_PROGRESS, True, why, text),
        want(c.NODE_CONDITION_DRAINED, False, why, text),
    )


def ours(node: Obj) -> dict[str, Obj]:
    """nmo's lifecycle conditions the node carries, by type."""
    conditions = (node.get("status") or {}).get("conditions") or ()
    return {str(x.get("type")): x for x in conditions if x.get("type") in c.NODE_CONDITION_TYPES}


def owner_of(condition: Obj) -> str | None:
    """The NodeMaintenance a condition names (None: not one nmo wrote)."""
    message = str(condition.get("message") or "")
    head = prefix("")[:-1]  # "NodeMaintenance "
    if not message.startswith(head) or ":" not in message:
        return None
    return message[len(head) : message.index(":")]


def owners(node: Obj) -> frozenset[str]:
    """The NodeMaintenances the node's lifecycle conditions name (for the sweep of
    conditions whose CR is gone: a queued CR has no finalizer, so its deletion
    is seen only as its absence)."""
    return frozenset(o for x in ours(node).values() if (o := owner_of(x)) is not None)


def patch(node: Obj, wants: tuple[Want, ...], *, now: datetime) -> Obj | None:
    """The strategic-merge patch of the node's status setting ``wants``, None if
    the node carries them already. Only changed conditions are in it; a
    condition keeps its lastTransitionTime while its status stays."""
    have = ours(node)
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    out: list[Obj] = []
    for w in wants:
        old = have.get(w.type)
        if (
            old is not None
            and old.get("status") == w.status
            and old.get("reason") == w.reason
            and old.get("message") == w.message
        ):
            continue
        since = old.get("lastTransitionTime") if old and old.get("status") == w.status else None
        out.append(
            {
                "type": w.type,
                "status": w.status,
                "reason": w.reason,
                "message": w.message,
                "lastTransitionTime": since or stamp,
                "lastHeartbeatTime": stamp,
            }
        )
    return {"status": {"conditions": out}} if out else None


def removal(node: Obj, *, owner: str | None = None) -> Obj | None:
    """The strategic-merge patch deleting nmo's conditions from the node (those
    naming ``owner`` only, if given; for ``nmo cleanup`` every one naming a
    NodeMaintenance), None if there are none."""
    gone = [
        {"type": t, "$patch": "delete"}
        for t, x in ours(node).items()
        if (owner_of(x) is not None if owner is None else owner_of(x) == owner)
    ]
    return {"status": {"conditions": gone}} if gone else None


def stage_of(obs: Observed, out: Plan, st: NodeMaintenanceStatus) -> Stage:
    """The stage a live (not Failed) maintenance is at once ``out`` is applied."""
    assert obs.node is not None
    queued = transitions.condition(st, c.CONDITION_QUEUED)
    if out.work is Work.QUEUED or (
        st.phase is Phase.PENDING and queued is not None and queued.status.value == TRUE
    ):
        return Stage.QUEUED
    taken = (out.node_patch is not None and not out.restore) or nodepatch.in_maintenance(obs.node)
    if not taken:
        return Stage.STARTING
    return Stage.DRAINED if st.phase is Phase.SUCCEEDED else Stage.DRAINING


def _reason(st: NodeMaintenanceStatus, stage: Stage) -> str:
    """The reason a stage's conditions carry, from what the CR's status persists.

    Queued: the Queued condition's reason (the budget, the window, the
    quorum). Draining: WaitingForVolumeDetach while the CR's VolumesDetached
    condition is False, TimedOut once the drain's deadline passed, else
    Draining; not Blocked, which is known from the evictions' answers only,
    so a new leader would say Draining until its first eviction is refused,
    and write the node twice for nothing (the CR's Drained condition and
    pendingPodsDetails say which PodDisruptionBudget holds the drain).
    """
    if stage is Stage.QUEUED:
        queued = transitions.condition(st, c.CONDITION_QUEUED)
        return queued.reason if queued is not None else ""
    if stage is Stage.DRAINING:
        volumes = transitions.condition(st, c.CONDITION_VOLUMES_DETACHED)
        if volumes is not None and volumes.status.value == FALSE:
            return REASON_VOLUMES  # every pod left; its volumes not detached yet
        drained = transitions.condition(st, c.CONDITION_DRAINED)
        if drained is not None and drained.reason == REASON_TIMED_OUT:
            return REASON_TIMED_OUT
    return ""


def attach(obs: Observed, out: Plan, *, enabled: bool) -> Plan:
    """``out`` with the node conditions' patch of the pass (``Plan.node_conditions``).

    A pass that only reads, reports an error or lets the CR go without
    leaving the node (a duplicate) writes none. A maintenance that ends (its
    CR deleted, or Failed with the node given back) removes the conditions
    that name it; a live one sets the four for its stage.
    """
    node = obs.node
    if not enabled or node is None or out.reads or out.report is not None:
        return out
    nm = obs.nm
    name = nm.metadata.name
    body: Obj | None
    if nm.metadata.deletion_timestamp is not None:
        if out.lease is not LeaseStep.RELEASE:
            return out  # a duplicate never held the node; or already let go
        body = removal(node, owner=name)
    else:
        st = out.status or nm.status
        if st.phase is Phase.FAILED:
            body = removal(node, owner=name)
        elif out.work in (Work.FORGET, Work.STOP):
            return out
        else:
            stage = stage_of(obs, out, st)
            body = patch(node, wanted(name, stage, reason=_reason(st, stage)), now=obs.now)
    return replace(out, node_conditions=body) if body is not None else out
