"""Cache transforms: keep only the fields nmo reads (controller-runtime's idea).

Informers apply one of these to every object at the edge, before it is
stored, so a cached object costs what nmo uses of it rather than what the
API server sends (a kwok pod arrives at about 27 KB with managedFields; its
slim copy is a few hundred bytes). Each function documents who reads what;
a reader of a field not kept here sees it missing, so a new reader must add
its field here (the unit tests pin the kept fields).

Nodes are the one kind cached by the thousand (every replica holds every
Node of the cluster), so their copies are cut closest: only the label keys
and the condition nmo reads, strings that repeat from node to node
interned, and the parts most nodes share (no labels nmo reads, no taints,
Ready=True) one read-only object for all of them. Cached objects are never
written to; a shared part refuses a write (``TypeError``) rather than let it
reach every node.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from nmo.api import constants as c

Obj = dict[str, Any]

_ANNOTATION_PREFIX = "nodemaintenance.medik8s.io/"


def _pick(src: Obj | None, keys: tuple[str, ...]) -> Obj:
    src = src or {}
    return {k: src[k] for k in keys if k in src and src[k] is not None}


def _meta(obj: Obj, keys: tuple[str, ...]) -> Obj:
    return _pick(obj.get("metadata"), keys)


def maintenance(obj: Obj) -> Obj:
    """NodeMaintenance: everything but managedFields (the planner reads it all)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


# What nmo reads of a Node's labels: the control-plane role (the webhook's and
# the planner's etcd-quorum rule) and the label a maintenance sets.
NODE_LABELS = (c.MASTER_ROLE_LABEL, c.CONTROL_PLANE_ROLE_LABEL, c.EXCLUDE_FROM_REMEDIATION_LABEL)
_EMPTY: Mapping[str, Any] = MappingProxyType({})
_READY_STATUSES = ("True", "False", "Unknown")
# status for a node whose Ready condition has this status (None: it has none).
_STATUS: dict[str | None, Mapping[str, Any]] = {
    value: MappingProxyType({"conditions": (MappingProxyType({"type": "Ready", "status": value}),)})
    for value in _READY_STATUSES
} | {None: MappingProxyType({"conditions": ()})}
_TAINT_STRINGS = ("key", "value", "effect")  # repeated from node to node: interned


def _interned(value: Any) -> Any:
    return sys.intern(value) if type(value) is str else value


def _node_status(status: Any) -> Mapping[str, Any]:
    for cond in (status or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            value = cond.get("status")
            if value in _READY_STATUSES:
                return _STATUS[value]
            ready = {"type": "Ready"} if value is None else {"type": "Ready", "status": value}
            return {"conditions": (ready,)}
    return _STATUS[None]


def node(obj: Obj) -> Obj:
    """Node: identity; of the labels only :data:`NODE_LABELS` (the webhook's and
    the etcd-quorum rule's control-plane check, the label nmo sets); of the
    annotations only nmo's prior-state record; taints and cordon (enter/leave
    patches: every taint kept whole, a leave patch writes the others back);
    the Ready condition's status (the fleet budget's count of unavailable
    nodes). The labels and annotations maps stay (empty if need be) when the
    node has them, so a patch adding a label or the record adds a key to the
    map instead of replacing one it cannot see."""
    src = obj.get("metadata") or {}
    meta: Obj = {k: src[k] for k in ("name", "uid", "resourceVersion") if src.get(k) is not None}
    labels = src.get("labels")
    if isinstance(labels, dict):
        kept = {k: _interned(labels[k]) for k in NODE_LABELS if k in labels}
        meta["labels"] = kept or _EMPTY
    annotations = src.get("annotations")
    if isinstance(annotations, dict):
        record = annotations.get(c.PRIOR_STATE_ANNOTATION, _EMPTY)
        meta["annotations"] = _EMPTY if record is _EMPTY else {c.PRIOR_STATE_ANNOTATION: record}
    spec = obj.get("spec") or {}
    slim_spec: Obj = {}
    taints = spec.get("taints")
    if taints is not None:
        slim_spec["taints"] = [
            {k: _interned(v) if k in _TAINT_STRINGS else v for k, v in t.items()} for t in taints
        ]
    if spec.get("unschedulable") is not None:
        slim_spec["unschedulable"] = spec["unschedulable"]
    return {
        "apiVersion": _interned(obj.get("apiVersion", "v1")),
        "kind": _interned(obj.get("kind", "Node")),
        "metadata": meta,
        "spec": slim_spec or _EMPTY,
        "status": _node_status(obj.get("status")),
    }


def pod(obj: Obj) -> Obj:
    """Pod: what the drain reads (identity, deletion, controller, mirror
    annotation and nmo's own annotations, labels, emptyDir volumes, node,
    priority, grace period, phase and Ready condition), and the claims its
    volumes name (volume-safe completion: a pod that stays keeps them)."""
    meta = obj.get("metadata") or {}
    slim_meta = _pick(
        meta,
        (
            "name",
            "namespace",
            "uid",
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "labels",
        ),
    )
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if k == c.MIRROR_POD_ANNOTATION or k.startswith(_ANNOTATION_PREFIX)
    }
    if annotations:
        slim_meta["annotations"] = annotations
    owners = [
        _pick(ref, ("apiVersion", "kind", "name", "uid", "controller"))
        for ref in meta.get("ownerReferences") or []
        if ref.get("controller")
    ]
    if owners:
        slim_meta["ownerReferences"] = owners
    spec = obj.get("spec") or {}
    slim_spec = _pick(spec, ("nodeName", "priorityClassName", "terminationGracePeriodSeconds"))
    volumes = [_pod_volume(v) for v in spec.get("volumes") or () if _VOLUME_KINDS & v.keys()]
    if volumes:
        slim_spec["volumes"] = volumes
    status = obj.get("status") or {}
    slim_status = _pick(status, ("phase",))
    ready = [
        _pick(cond, ("type", "status"))
        for cond in status.get("conditions") or []
        if cond.get("type") == "Ready"
    ]
    if ready:
        slim_status["conditions"] = ready
    return {"metadata": slim_meta, "spec": slim_spec, "status": slim_status}


_VOLUME_KINDS = frozenset({"emptyDir", "persistentVolumeClaim", "ephemeral"})


def _pod_volume(vol: Obj) -> Obj:
    """A pod's volume as nmo reads it: its name and kind (a claim: its name)."""
    out: Obj = {"name": vol.get("name")}
    if "emptyDir" in vol:
        out["emptyDir"] = {}
    claim = vol.get("persistentVolumeClaim")
    if isinstance(claim, dict) and claim.get("claimName"):
        out["persistentVolumeClaim"] = {"claimName": claim["claimName"]}
    if "ephemeral" in vol:
        out["ephemeral"] = {}
    return out


def volume_attachment(obj: Obj) -> Obj:
    """VolumeAttachment: name, deletion, node, and the volume it attaches
    (a PV's name, or an inline volume's access modes and handle)."""
    spec = obj.get("spec") or {}
    source = spec.get("source") or {}
    slim_source = _pick(source, ("persistentVolumeName",))
    inline = source.get("inlineVolumeSpec")
    if isinstance(inline, dict):
        slim_source["inlineVolumeSpec"] = {
            "accessModes": inline.get("accessModes") or [],
            "csi": _pick(inline.get("csi"), ("driver", "volumeHandle")),
        }
    return {
        "metadata": _meta(obj, ("name", "deletionTimestamp")),
        "spec": {**_pick(spec, ("nodeName", "attacher")), "source": slim_source},
    }


def persistent_volume(obj: Obj) -> Obj:
    """PersistentVolume: name, access modes and the claim it is bound to."""
    spec = obj.get("spec") or {}
    slim_spec = _pick(spec, ("accessModes",))
    ref = spec.get("claimRef")
    if isinstance(ref, dict):
        slim_spec["claimRef"] = _pick(ref, ("namespace", "name"))
    return {"metadata": _meta(obj, ("name",)), "spec": slim_spec}


def pdb(obj: Obj) -> Obj:
    """PodDisruptionBudget: identity, selector and the disruption figures."""
    return {
        "metadata": _meta(obj, ("name", "namespace", "uid", "resourceVersion")),
        "spec": _pick(obj.get("spec"), ("selector", "minAvailable", "maxUnavailable")),
        "status": _pick(
            obj.get("status"),
            ("disruptionsAllowed", "currentHealthy", "desiredHealthy", "expectedPods"),
        ),
    }
