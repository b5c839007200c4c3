"""Cache transforms: keep only the fields nmo reads (controller-runtime's idea).

Informers apply one of these to every object at the edge, before it is
stored, so a cached object costs what nmo uses of it rather than what the
API server sends (a kwok pod arrives at about 27 KB with managedFields; its
slim copy is a few hundred bytes). Each function documents who reads what;
a reader of a field not kept here sees it missing, so a new reader must add
its field here (the unit tests pin the kept fields).
"""

from __future__ import annotations

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


def node(obj: Obj) -> Obj:
    """Node: identity, labels (webhook's control-plane check, the label nmo sets),
    taints and cordon (enter/leave patches), Ready condition, and of the
    annotations only nmo's prior-state record. The annotations map stays
    (empty if need be) when the node has one, so a patch adding the record
    adds a key to it instead of replacing a map it cannot see."""
    meta = _meta(obj, ("name", "uid", "resourceVersion", "creationTimestamp", "labels"))
    annotations = (obj.get("metadata") or {}).get("annotations")
    if isinstance(annotations, dict):
        meta["annotations"] = {
            k: v for k, v in annotations.items() if k == c.PRIOR_STATE_ANNOTATION
        }
    out: Obj = {
        "apiVersion": obj.get("apiVersion", "v1"),
        "kind": obj.get("kind", "Node"),
        "metadata": meta,
        "spec": _pick(obj.get("spec"), ("taints", "unschedulable")),
    }
    conditions = (obj.get("status") or {}).get("conditions") or []
    out["status"] = {
        "conditions": [_pick(cond, ("type", "status")) for cond in conditions if "type" in cond]
    }
    return out


def pod(obj: Obj) -> Obj:
    """Pod: what the drain reads (identity, deletion, controller, mirror
    annotation and nmo's own annotations, labels, emptyDir volumes, node,
    priority, grace period, phase and Ready condition)."""
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
    volumes = [
        {"name": v.get("name"), "emptyDir": {}}
        for v in spec.get("volumes") or []
        if "emptyDir" in v
    ]
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
