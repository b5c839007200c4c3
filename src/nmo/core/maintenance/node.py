"""What to change on the Node, as pure functions (behavior.md A2 5-7, A3, B7).

Entering maintenance adds the exclude-from-remediation label, the two
maintenance taints (every other taint is kept) and ``spec.unschedulable``.
Before touching the node, the CR records the node's prior state (was it
cordoned, which maintenance taints were already there) so leaving
maintenance restores it instead of blindly uncordoning (B7).

Taint changes are JSON patches with a ``test`` on the node's
resourceVersion: a concurrent change answers 409 and the reconcile retries on
fresh state, so no other writer's taint is ever lost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from nmo.api import constants as c

Node = dict[str, Any]


@dataclass(frozen=True)
class PriorState:
    """The node as it was before the maintenance began."""

    unschedulable: bool = False
    taints: tuple[str, ...] = ()  # maintenance taint keys that already existed
    label: bool = False  # exclude-from-remediation label already present

    def to_annotation(self) -> str:
        return json.dumps(
            {"unschedulable": self.unschedulable, "taints": list(self.taints), "label": self.label},
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
            )
        except (ValueError, AttributeError):
            return None


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


def enter_patch(node: Node) -> list[dict[str, Any]] | None:
    """A guarded JSON patch putting the node into maintenance, or None if done."""
    if in_maintenance(node):
        return None
    ops: list[dict[str, Any]] = []
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


def leave_patch(node: Node, prior: PriorState | None) -> list[dict[str, Any]] | None:
    """A guarded JSON patch restoring the node, or None if nothing to undo.

    Without a recorded prior state (a CR created by the Go NMO) this does what
    NMO does: remove both taints, uncordon, remove the label.
    """
    prior = prior or PriorState()
    ops: list[dict[str, Any]] = []
    taints = _taints(node)
    keep = [t for t in taints if not _is_maintenance_taint(t) or t.get("key") in prior.taints]
    if len(keep) != len(taints):
        ops.append({"op": "replace", "path": "/spec/taints", "value": keep})
    if is_cordoned(node) and not prior.unschedulable:
        ops.append({"op": "replace", "path": "/spec/unschedulable", "value": False})
    if has_label(node) and not prior.label:
        ops.append(
            {
                "op": "remove",
                "path": f"/metadata/labels/{_escape(c.EXCLUDE_FROM_REMEDIATION_LABEL)}",
            }
        )
    return _guarded(node, ops) if ops else None


def uncordons(node: Node, prior: PriorState | None) -> bool:
    """Whether leaving maintenance uncordons the node (for the UncordonNode event)."""
    return is_cordoned(node) and not (prior and prior.unschedulable)


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")
