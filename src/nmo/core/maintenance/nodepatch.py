"""What to change on the Node, as pure functions (behavior.md A2 5-7, A3, B7).

Entering maintenance adds the exclude-from-remediation label, the two
maintenance taints (every other taint is kept) and ``spec.unschedulable``.
The node's prior state (was it cordoned, which maintenance taints and the
label were already there) is recorded so leaving maintenance restores it
instead of blindly uncordoning (B7).

Where the record lives decides who can forge it. It is an annotation on the
Node, written in the same guarded patch that first puts the node into
maintenance, and bound to the uid of the NodeMaintenance that wrote it.
So it is exactly the state before nmo's first change; only someone who may
write the Node (and could cordon it and label it anyway) can change it; a
CR's author cannot pre-set it (an annotation on the CR is not read), and a
record left by an earlier maintenance is not taken for this one's.

Taint changes are JSON patches with a ``test`` on the node's
resourceVersion: a concurrent change answers 409 and the reconcile retries on
fresh state, so no other writer's taint is ever lost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from nmo.api import constants as c

Node = dict[str, Any]


@dataclass(frozen=True)
class PriorState:
    """The node as it was before the maintenance began."""

    unschedulable: bool = False
    taints: tuple[str, ...] = ()  # maintenance taint keys that already existed
    label: bool = False  # exclude-from-remediation label already present
    maintenance: str = ""  # uid of the NodeMaintenance that recorded it

    def to_annotation(self) -> str:
        return json.dumps(
            {
                "unschedulable": self.unschedulable,
                "taints": list(self.taints),
                "label": self.label,
                "maintenance": self.maintenance,
            },
            sort_keys=True,
        )

    @classmethod
    def from_annotation(cls, value: str | None) -> PriorState | None:
        if not value:
            return None
        try:
            data = json.loads(value)
            return cls(
                unschedulable=bool(data.get("unschedulable", False)),
                taints=tuple(str(t) for t in data.get("taints", [])),
                label=bool(data.get("label", False)),
                maintenance=str(data.get("maintenance") or ""),
            )
        except (ValueError, AttributeError, TypeError):
            return None


def recorded_prior(node: Node) -> PriorState | None:
    """The prior state recorded on the node, whichever maintenance wrote it."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return PriorState.from_annotation(annotations.get(c.PRIOR_STATE_ANNOTATION))


def prior_for(node: Node | None, maintenance_uid: str) -> PriorState | None:
    """The prior state the given NodeMaintenance recorded on the node, or None."""
    prior = recorded_prior(node) if node is not None and maintenance_uid else None
    return prior if prior is not None and prior.maintenance == maintenance_uid else None


def _taints(node: Node) -> list[dict[str, Any]]:
    return list((node.get("spec") or {}).get("taints") or [])


def _is_maintenance_taint(taint: dict[str, Any]) -> bool:
    return taint.get("key") in c.MAINTENANCE_TAINT_KEYS and taint.get("effect") == c.TAINT_EFFECT


def prior_state(node: Node) -> PriorState:
    present = tuple(sorted(t["key"] for t in _taints(node) if _is_maintenance_taint(t)))
    labels = (node.get("metadata") or {}).get("labels") or {}
    return PriorState(
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        taints=present,
        label=labels.get(c.EXCLUDE_FROM_REMEDIATION_LABEL) == "true",
    )


def has_label(node: Node) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return labels.get(c.EXCLUDE_FROM_REMEDIATION_LABEL) == "true"


def is_cordoned(node: Node) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def in_maintenance(node: Node) -> bool:
    """Label, both taints and cordon are all in place."""
    keys = {t.get("key") for t in _taints(node) if _is_maintenance_taint(t)}
    return has_label(node) and is_cordoned(node) and keys >= set(c.MAINTENANCE_TAINT_KEYS)


def _guarded(node: Node, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rv = node["metadata"].get("resourceVersion", "")
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}, *ops]


def enter_patch(node: Node, *, record_for: str = "") -> list[dict[str, Any]] | None:
    """A guarded JSON patch putting the node into maintenance, or None if done.

    ``record_for`` is the uid of a NodeMaintenance taking the node for the
    first time: unless the node already carries that maintenance's record,
    the patch records the node's current state, bound to the uid.
    """
    record = bool(record_for) and prior_for(node, record_for) is None
    if in_maintenance(node) and not record:
        return None
    ops: list[dict[str, Any]] = []
    if record:
        value = replace(prior_state(node), maintenance=record_for).to_annotation()
        if (node.get("metadata") or {}).get("annotations") is None:
            ops.append(
                {
                    "op": "add",
                    "path": "/metadata/annotations",
                    "value": {c.PRIOR_STATE_ANNOTATION: value},
                }
            )
        else:
            ops.append({"op": "add", "path": _ANNOTATION_PATH, "value": value})
    if in_maintenance(node):
        return _guarded(node, ops)
    labels = (node.get("metadata") or {}).get("labels")
    if not has_label(node):
        if labels is None:
            ops.append(
                {
                    "op": "add",
                    "path": "/metadata/labels",
                    "value": {c.EXCLUDE_FROM_REMEDIATION_LABEL: "true"},
                }
            )
        else:
            ops.append(
                {
                    "op": "add",
                    "path": f"/metadata/labels/{_escape(c.EXCLUDE_FROM_REMEDIATION_LABEL)}",
                    "value": "true",
                }
            )
    taints = _taints(node)
    present = {t.get("key") for t in taints if _is_maintenance_taint(t)}
    missing = [k for k in c.MAINTENANCE_TAINT_KEYS if k not in present]
    if missing:
        new = taints + [{"key": k, "effect": c.TAINT_EFFECT} for k in missing]
        ops.append({"op": "add", "path": "/spec/taints", "value": new})
    if not is_cordoned(node):
        ops.append({"op": "add", "path": "/spec/unschedulable", "value": True})
    return _guarded(node, ops)


def _taint_text(taint: dict[str, Any]) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key')}{value}:{taint.get('effect')}"


@dataclass(frozen=True)
class Restore:
    """How to take a node out of maintenance: the patch, and why, change by change."""

    ops: list[dict[str, Any]] | None  # guarded JSON patch, None: nothing to undo
    uncordon: bool = False
    kept_cordoned: bool = False  # cordoned before the maintenance: stays so (B7)
    removed: tuple[
        tuple[str, str], ...
    ] = ()  # ("uncordon" | "remove-taint" | "remove-label" | "remove-record", what)
    kept: tuple[str, ...] = ()  # what stays, and why


def restore(
    node: Node,
    prior: PriorState | None,
    *,
    labels: tuple[str, ...] = (c.EXCLUDE_FROM_REMEDIATION_LABEL,),
    cordon_is_ours: bool = True,
    recorded: str = "",
    forget: bool = False,
) -> Restore:
    """The one restore planner, shared by the reconciler and ``nmo cleanup`` (B7, B11).

    Only nmo's marks go: the two maintenance taints with effect NoSchedule and
    the given label keys. A recorded prior state wins: a node cordoned before
    the maintenance stays cordoned (and keeps the unschedulable taint that
    goes with a cordon), a taint or label that existed before stays. Without
    a prior state (a CR the Go NMO created) this does what the Go NMO does.
    ``cordon_is_ours=False`` (cleanup found no sign of a maintenance) leaves
    a cordon alone: it is an admin's. ``recorded`` names where the prior
    state came from, for the explanations. ``forget`` (the maintenance is
    over: its CR is deleted, or cleanup) removes the record on the node with
    the marks when ``prior`` is that record; a Failed CR keeps it, so its
    deletion restores the same way again.
    """
    name = str(node["metadata"]["name"])
    target = f"node/{name}"
    source = f" ({recorded})" if recorded else ""
    removed: list[tuple[str, str]] = []
    kept: list[str] = []
    taints = _taints(node)
    cordoned = is_cordoned(node)
    uncordon = False
    kept_cordoned = cordoned and prior is not None and prior.unschedulable
    if kept_cordoned:
        kept.append(f"{target}: stays cordoned, it was cordoned before the maintenance{source}")
    elif cordoned and not cordon_is_ours:
        kept.append(
            f"{target}: cordoned, but shows no sign of a maintenance; left alone "
            f"(kubectl uncordon {name} if you mean it)"
        )
    elif cordoned:
        uncordon = True
        removed.append(("uncordon", "uncordon (spec.unschedulable=false)"))
    keep: list[dict[str, Any]] = []
    for taint in taints:
        text = _taint_text(taint)
        if not _is_maintenance_taint(taint):
            keep.append(taint)
            kept.append(f"{target}: taint {text} is not nmo's")
        elif prior is not None and taint.get("key") in prior.taints:
            keep.append(taint)
            kept.append(f"{target}: taint {text} existed before the maintenance{source}")
        elif taint.get("key") == c.UNSCHEDULABLE_TAINT_KEY and cordoned and not uncordon:
            keep.append(taint)
            kept.append(f"{target}: taint {text} stays with the cordon")
        else:
            removed.append(("remove-taint", f"remove taint {text}"))
    ops: list[dict[str, Any]] = []
    if len(keep) != len(taints):
        ops.append({"op": "replace", "path": "/spec/taints", "value": keep})
    if uncordon:
        ops.append({"op": "replace", "path": "/spec/unschedulable", "value": False})
    present = (node.get("metadata") or {}).get("labels") or {}
    for key in labels:
        if key not in present:
            continue
        if key == c.EXCLUDE_FROM_REMEDIATION_LABEL and prior is not None and prior.label:
            kept.append(f"{target}: label {key} existed before the maintenance{source}")
            continue
        removed.append(("remove-label", f"remove label {key}"))
        ops.append({"op": "remove", "path": f"/metadata/labels/{_escape(key)}"})
    if forget and prior is not None and prior == recorded_prior(node):
        removed.append(("remove-record", f"remove annotation {c.PRIOR_STATE_ANNOTATION}"))
        ops.append({"op": "remove", "path": _ANNOTATION_PATH})
    return Restore(
        ops=_guarded(node, ops) if ops else None,
        uncordon=uncordon,
        kept_cordoned=kept_cordoned,
        removed=tuple(removed),
        kept=tuple(kept),
    )


def leave_patch(
    node: Node, prior: PriorState | None, *, forget: bool = False
) -> list[dict[str, Any]] | None:
    """The guarded JSON patch restoring the node when its maintenance ends."""
    return restore(node, prior, forget=forget).ops


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


_ANNOTATION_PATH = f"/metadata/annotations/{_escape(c.PRIOR_STATE_ANNOTATION)}"
