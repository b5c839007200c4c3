"""Emergency cleanup of a node left in maintenance (guide section 6, B11).

The guide's manual steps (uncordon, remove two taints, remove a label, strip
the finalizer) are easy to get wrong: it names the wrong label key, it
uncordons a node an admin had cordoned on purpose, and it says nothing about
the node lease that keeps remediation operators away. This module computes
the cleanup as a :class:`Plan` from the observed node, NodeMaintenances and
lease (:func:`plan_cleanup`, pure), and applies it with optimistic
concurrency (:func:`execute`). It guarantees:

* only nmo's marks are removed: the two maintenance taints with effect
  NoSchedule, both exclude-from-remediation label keys, the node lease when
  its holder is ``node-maintenance``, and the ``foregroundDeleteNodeMaintenance``
  finalizer; every other taint, label, lease and finalizer is kept and
  reported;
* a recorded prior state (B7, on the node, written by nmo) wins: a node
  cordoned before the maintenance stays cordoned, a taint or label that
  existed before stays; the record is removed with the marks;
* the exclude-from-remediation label goes only with a sign that a
  maintenance set it (nmo's record, the drain taint, or the node lease held
  by ``node-maintenance``): otherwise it is an admin's, and stays;
* nmo's node lifecycle conditions (``--node-conditions``: MaintenancePlanned,
  MaintenanceInProgress, DrainInProgress, Drained, whose message names a
  NodeMaintenance) are removed from the node's status; other conditions stay;
* a cordon with no sign of maintenance is an admin's, and is left alone;
* a second run finds nothing to do.

Cleanup bypasses the operator. While an nmo leader is alive it would redo or
undo the changes, so :func:`watch_leader` lets the CLI refuse: the leader is
alive when its lease moves between two reads, whatever the clocks say.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from nmo.api import constants as c
from nmo.core.maintenance import nodeconditions
from nmo.core.maintenance.nodepatch import recorded_prior, restore
from nmo.kube.client import Kube, api_path, nm_path, node_path
from nmo.kube.errors import NotFound

Obj = dict[str, Any]

LABEL_KEYS = (c.EXCLUDE_FROM_REMEDIATION_LABEL, c.GUIDE_EXCLUDE_LABEL)
# How long cleanup watches the leader lease for a renewal. A live leader
# (nmo or the Go NMO) renews every 2 s, so 5 s sees at least two renewals.
LEADER_WINDOW = 5.0


class StepKind(enum.StrEnum):
    UNCORDON = "uncordon"
    REMOVE_TAINT = "remove-taint"
    REMOVE_LABEL = "remove-label"
    REMOVE_RECORD = "remove-record"
    REMOVE_CONDITION = "remove-condition"
    RELEASE_LEASE = "release-lease"
    REMOVE_FINALIZER = "remove-finalizer"
    DELETE_MAINTENANCE = "delete-nodemaintenance"


@dataclass(frozen=True)
class Step:
    """One change the cleanup makes, as shown before and after applying it."""

    kind: StepKind
    target: str
    what: str

    def __str__(self) -> str:
        return f"{self.target}: {self.what}"


@dataclass(frozen=True)
class Plan:
    """Everything the cleanup would change, and what it leaves alone and why."""

    node_name: str
    node_found: bool
    steps: tuple[Step, ...] = ()
    kept: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    node_patch: list[Obj] | None = None
    # Strategic-merge patch of the node's status removing nmo's lifecycle conditions.
    conditions_patch: Obj | None = None
    lease: Obj | None = None  # our lease, deleted with uid/resourceVersion preconditions
    finalizer_patches: tuple[tuple[str, list[Obj]], ...] = ()
    deletions: tuple[tuple[str, str], ...] = ()  # (name, uid): deleted with a uid precondition

    @property
    def empty(self) -> bool:
        return not self.steps


def _holder(lease: Obj | None) -> str:
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def leader_alive(first: Obj | None, later: Obj | None) -> str | None:
    """The holder of the leader-election lease if a leader renewed it between two reads.

    Evidence of life is the lease moving (its resourceVersion or renewTime
    changed, or another holder took it), never its renewTime against this
    machine's clock: a leader whose clock runs behind looks expired while it
    renews, and a dead one whose clock ran ahead looks alive for as long as
    its clock was off.
    """
    holder = _holder(later)
    if first is None or later is None or not holder:
        return None
    before, after = first.get("metadata") or {}, later.get("metadata") or {}
    moved = (
        before.get("resourceVersion") != after.get("resourceVersion")
        or (first.get("spec") or {}).get("renewTime") != (later.get("spec") or {}).get("renewTime")
        or _holder(first) != holder
    )
    return holder if moved else None


async def watch_leader(
    kube: Kube,
    namespace: str,
    first: Obj | None,
    *,
    window: float = LEADER_WINDOW,
    poll: float = 0.5,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> str | None:
    """Re-read the leader lease for up to ``window`` seconds; the live holder, or None.

    A lease with no holder answers at once. Otherwise it is read again every
    ``poll`` seconds until it moves (a live leader renews every 2 s) or the
    window has passed.
    """
    if not _holder(first):
        return None
    waited = 0.0
    while waited < window:
        await sleep(poll)
        waited += poll
        later = await _get_or_none(kube, lease_path(namespace, c.LEADER_ELECTION_ID))
        if later is None:
            return None
        if (holder := leader_alive(first, later)) is not None:
            return holder
    return None


@dataclass
class _Draft:
    steps: list[Step] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _node_changes(
    node: Obj, maintenances: list[Obj], our_lease: bool, draft: _Draft
) -> list[Obj] | None:
    labels = (node.get("metadata") or {}).get("labels") or {}
    taints: list[Obj] = list((node.get("spec") or {}).get("taints") or [])
    prior = recorded_prior(node)  # on the node: only a Node writer can have set it
    drain_taint = any(
        t.get("key") == c.DRAIN_TAINT_KEY and t.get("effect") == c.TAINT_EFFECT for t in taints
    )
    evidence = drain_taint or bool(maintenances) or our_lease or prior is not None
    # The exclude label stops remediation of the node: an admin may have set
    # it on purpose. It goes only with a sign that a maintenance set it: nmo's
    # record (which says whether it was there before), the drain taint that
    # is set with it, or the node lease held by node-maintenance.
    label_is_ours = prior is not None or drain_taint or our_lease
    target = f"node/{node['metadata']['name']}"
    plan = restore(
        node,
        prior,
        labels=LABEL_KEYS if label_is_ours else (),
        cordon_is_ours=evidence,
        recorded=f"recorded on {target} by nmo",
        forget=True,
    )
    if not label_is_ours:
        draft.kept.extend(
            f"{target}: label {key} shows no sign that a maintenance set it; left alone "
            f"(kubectl label node {node['metadata']['name']} {key}- if you mean it)"
            for key in LABEL_KEYS
            if key in labels
        )
    draft.steps.extend(Step(StepKind(kind), target, what) for kind, what in plan.removed)
    draft.kept.extend(plan.kept)
    return plan.ops


def plan_cleanup(
    node_name: str,
    *,
    node: Obj | None,
    maintenances: list[Obj],
    lease: Obj | None,
    lease_namespace: str,
    delete_maintenances: bool = False,
) -> Plan:
    """What cleaning ``node_name`` changes (pure). ``maintenances`` are its CRs."""
    draft = _Draft()
    lease_holder = str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")
    our_lease = lease is not None and lease_holder == c.LEASE_HOLDER
    node_patch = conditions_patch = None
    if node is not None:
        node_patch = _node_changes(node, maintenances, our_lease, draft)
        conditions_patch = nodeconditions.removal(node)
        if conditions_patch is not None:
            draft.steps.extend(
                Step(
                    StepKind.REMOVE_CONDITION, f"node/{node_name}", f"remove condition {x['type']}"
                )
                for x in conditions_patch["status"]["conditions"]
            )
    lease_ref = f"lease/{lease_namespace}/{c.lease_name(node_name)}"
    if our_lease:
        draft.steps.append(
            Step(StepKind.RELEASE_LEASE, lease_ref, f"release (holder {c.LEASE_HOLDER})")
        )
    elif lease is not None:
        who = f"held by {lease_holder}" if lease_holder else "has no holder"
        draft.kept.append(f"{lease_ref}: {who}, not nmo's; left alone")
    patches: list[tuple[str, list[Obj]]] = []
    deletions: list[tuple[str, str]] = []
    for nm in maintenances:
        meta = nm.get("metadata") or {}
        name = str(meta.get("name", ""))
        target = f"nodemaintenance/{name}"
        finalizers = list(meta.get("finalizers") or [])
        if c.FINALIZER in finalizers:
            others = [f for f in finalizers if f != c.FINALIZER]
            draft.steps.append(
                Step(StepKind.REMOVE_FINALIZER, target, f"remove finalizer {c.FINALIZER}")
            )
            patches.append(
                (
                    name,
                    [
                        {"op": "test", "path": "/metadata/uid", "value": meta.get("uid", "")},
                        {
                            "op": "test",
                            "path": "/metadata/resourceVersion",
                            "value": meta.get("resourceVersion", ""),
                        },
                        {"op": "replace", "path": "/metadata/finalizers", "value": others},
                    ],
                )
            )
            if others:
                draft.kept.append(f"{target}: finalizers {', '.join(others)} are not nmo's")
        if meta.get("deletionTimestamp"):
            continue
        if delete_maintenances:
            draft.steps.append(Step(StepKind.DELETE_MAINTENANCE, target, "delete"))
            deletions.append((name, str(meta.get("uid", ""))))
        else:
            draft.notes.append(
                f"{target} still exists: when the operator runs again it puts {node_name} "
                f"back into maintenance; delete it (kubectl delete nm {name}) "
                "or re-run with --delete-maintenance"
            )
    return Plan(
        node_name=node_name,
        node_found=node is not None,
        steps=tuple(draft.steps),
        kept=tuple(draft.kept),
        notes=tuple(draft.notes),
        node_patch=node_patch,
        conditions_patch=conditions_patch,
        lease=lease if our_lease else None,
        finalizer_patches=tuple(patches),
        deletions=tuple(deletions),
    )


@dataclass(frozen=True)
class Observed:
    """What the cleanup reads before deciding."""

    node: Obj | None
    maintenances: list[Obj]
    lease: Obj | None
    leader: Obj | None
    crd_installed: bool = True


NM_PATH = nm_path()


def lease_path(namespace: str, name: str | None = None) -> str:
    return api_path("coordination.k8s.io/v1", "leases", namespace=namespace, name=name)


async def _get_or_none(kube: Kube, path: str) -> Obj | None:
    try:
        return await kube.get(path)
    except NotFound:
        return None


async def observe(
    kube: Kube, node_name: str, *, lease_namespace: str, operator_namespace: str
) -> Observed:
    """Read the node, its NodeMaintenances, its lease and the leader lease."""
    node = await _get_or_none(kube, node_path(node_name))
    crd_installed = True
    try:
        items = (await kube.list_all(NM_PATH)).get("items") or []
    except NotFound:
        items, crd_installed = [], False
    mine = [m for m in items if (m.get("spec") or {}).get("nodeName") == node_name]
    lease = await _get_or_none(kube, lease_path(lease_namespace, c.lease_name(node_name)))
    leader = await _get_or_none(kube, lease_path(operator_namespace, c.LEADER_ELECTION_ID))
    return Observed(node, mine, lease, leader, crd_installed)


async def execute(kube: Kube, plan: Plan, *, lease_namespace: str) -> list[str]:
    """Apply a plan; returns what was done. A concurrent change raises Conflict."""
    done: list[str] = []
    if plan.node_patch is not None:
        await kube.json_patch(node_path(plan.node_name), plan.node_patch)
        done += [
            str(s)
            for s in plan.steps
            if s.target == f"node/{plan.node_name}" and s.kind is not StepKind.REMOVE_CONDITION
        ]
    if plan.conditions_patch is not None:
        try:
            await kube.strategic_patch(node_path(plan.node_name, "status"), plan.conditions_patch)
        except NotFound:
            pass
        else:
            done += [str(s) for s in plan.steps if s.kind is StepKind.REMOVE_CONDITION]
    if plan.lease is not None:
        meta = plan.lease["metadata"]
        try:
            await kube.delete(
                lease_path(lease_namespace, meta["name"]),
                body={
                    "preconditions": {
                        "uid": meta["uid"],
                        "resourceVersion": meta["resourceVersion"],
                    }
                },
            )
        except NotFound:
            pass
        done += [str(s) for s in plan.steps if s.kind is StepKind.RELEASE_LEASE]
    for name, patch in plan.finalizer_patches:
        try:
            await kube.json_patch(f"{NM_PATH}/{name}", patch)
        except NotFound:
            continue
        done.append(f"nodemaintenance/{name}: removed finalizer {c.FINALIZER}")
    for name, uid in plan.deletions:
        try:
            # The CR the user confirmed, not one re-created under its name since.
            await kube.delete(f"{NM_PATH}/{name}", body={"preconditions": {"uid": uid}})
        except NotFound:
            continue
        done.append(f"nodemaintenance/{name}: deleted")
    return done


def same_or_smaller(new: Plan, confirmed: Plan) -> bool:
    """Whether a re-computed plan only does what the user already confirmed."""
    return set(new.steps) <= set(confirmed.steps) and set(new.deletions) <= set(confirmed.deletions)
