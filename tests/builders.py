"""Kubernetes objects as tests build them, one builder per kind, and a JSON-patch applier.

Every builder writes only what it is asked for: a field left at its default is
absent from the object (tests tell "absent" from "empty" apart: a node
without labels is patched differently from one with ``{}``). A module that
builds many objects alike binds its defaults once, e.g.
``pod = partial(builders.pod, namespace="shop", node="n1", phase="Running")``.

``uid`` may name the object: ``"{name}"`` in it is replaced by the object's
name (``uid="uid-{name}"``). ``deleting`` is ``True`` (a fixed timestamp) or
the ``deletionTimestamp`` itself.

Importable as ``builders`` from every test directory: pytest puts ``tests/``
on ``sys.path`` for ``tests/conftest.py`` (rootless conftests, the
``prepend`` import mode), as it puts each test directory there for its own
test modules (``from objects import ...``, ``from webhook_fakes import ...``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from nmo.api import constants as c
from nmo.core.maintenance.lease import format_micro
from nmo.core.maintenance.nodepatch import PriorState

Obj = dict[str, Any]
DELETED_AT = "2026-01-01T11:00:00Z"  # ``deleting=True``


def _meta(
    name: str | None,
    *,
    namespace: str | None = None,
    uid: str | None = None,
    resource_version: str | None = None,
    generation: int | None = None,
    created: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    finalizers: Sequence[str] | None = None,
    owners: Sequence[Obj] | None = None,
    deleting: bool | str = False,
    deletion_grace: int | None = None,
) -> Obj:
    meta: Obj = {}
    if name is not None:
        meta["name"] = name
    if namespace is not None:
        meta["namespace"] = namespace
    if uid is not None:
        meta["uid"] = uid.replace("{name}", name or "")
    if resource_version is not None:
        meta["resourceVersion"] = resource_version
    if generation is not None:
        meta["generation"] = generation
    if created is not None:
        meta["creationTimestamp"] = created
    if labels is not None:
        meta["labels"] = dict(labels)
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    if finalizers is not None:
        meta["finalizers"] = list(finalizers)
    if owners is not None:
        meta["ownerReferences"] = copy.deepcopy(list(owners))
    if deleting:
        meta["deletionTimestamp"] = DELETED_AT if deleting is True else deleting
    if deletion_grace is not None:
        meta["deletionGracePeriodSeconds"] = deletion_grace
    return meta


def _with(annotations: Mapping[str, str] | None, more: Mapping[str, str]) -> dict[str, str] | None:
    """``annotations`` with ``more`` added; None when both are empty and none were asked for."""
    if annotations is None and not more:
        return None
    return {**(annotations or {}), **more}


def owner_ref(ref: str, *, api_version: str | None = "apps/v1", controller: bool = True) -> Obj:
    """An ownerReference from ``"Kind/name"``."""
    kind, name = ref.split("/")
    out: Obj = {}
    if api_version is not None:
        out["apiVersion"] = api_version
    out.update(kind=kind, name=name, controller=controller)
    return out


def pod(
    name: str,
    *,
    namespace: str | None = None,
    uid: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    owner: str | Obj | None = None,
    mirror: bool = False,
    order: str | None = None,
    deleting: bool | str = False,
    deletion_grace: int | None = None,
    node: str | None = None,
    grace: int | None = None,
    priority_class: str | None = None,
    empty_dir: bool = False,
    containers: Sequence[Obj] | None = None,
    phase: str | None = None,
    ready: bool | str | None = None,
    conditions: Sequence[Obj] | None = None,
) -> Obj:
    """A Pod. ``owner``: ``"Kind/name"`` (an apps/v1 controller) or a whole reference;
    ``mirror``: a static pod's mirror; ``order``: its drain-order annotation;
    ``ready``: one Ready condition (``conditions``: the whole list instead)."""
    more = {}
    if order is not None:
        more[c.DRAIN_ORDER_ANNOTATION] = order
    if mirror:
        more[c.MIRROR_POD_ANNOTATION] = "mirror"
    owners = None
    if owner is not None:
        owners = [owner_ref(owner) if isinstance(owner, str) else owner]
    meta = _meta(
        name,
        namespace=namespace,
        uid=uid,
        labels=labels,
        annotations=_with(annotations, more),
        owners=owners,
        deleting=deleting,
        deletion_grace=deletion_grace,
    )
    spec: Obj = {}
    if node is not None:
        spec["nodeName"] = node
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    if containers is not None:
        spec["containers"] = copy.deepcopy(list(containers))
    if empty_dir:
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    status: Obj = {}
    if phase is not None:
        status["phase"] = phase
    if ready is not None:
        conditions = [{"type": "Ready", "status": str(ready)}]
    if conditions is not None:
        status["conditions"] = copy.deepcopy(list(conditions))
    out: Obj = {"metadata": meta, "spec": spec}
    if status:
        out["status"] = status
    return out


def node(
    name: str | None = "n1",
    *,
    uid: str | None = None,
    resource_version: str | None = None,
    labels: Mapping[str, str] | None = None,
    hostname: bool = False,
    role: str | None = None,
    annotations: Mapping[str, str] | None = None,
    prior: PriorState | None = None,
    taints: Sequence[Obj] | None = None,
    unschedulable: bool | None = None,
    ready: bool | None = None,
) -> Obj:
    """A Node. ``hostname``: the kubernetes.io/hostname label; ``role``: a role label
    (value ""); ``prior``: the record nmo writes on a node it takes; ``name=None``:
    no metadata at all."""
    if hostname or role:
        labels = {**({"kubernetes.io/hostname": name or ""} if hostname else {}), **(labels or {})}
        if role:
            labels[role] = ""
    if prior is not None:
        annotations = {**(annotations or {}), c.PRIOR_STATE_ANNOTATION: prior.to_annotation()}
    out: Obj = {}
    meta = _meta(
        name, uid=uid, resource_version=resource_version, labels=labels, annotations=annotations
    )
    if meta:
        out["metadata"] = meta
    spec: Obj = {}
    if unschedulable is not None:
        spec["unschedulable"] = unschedulable
    if taints is not None:
        spec["taints"] = copy.deepcopy(list(taints))
    out["spec"] = spec
    if ready is not None:
        out["status"] = {"conditions": [{"type": "Ready", "status": str(ready)}]}
    return out


def nm(
    name: str = "nm-1",
    node: str = "n1",
    *,
    uid: str | None = None,
    resource_version: str | None = None,
    created: str | None = None,
    finalizers: Sequence[str] | None = None,
    annotations: Mapping[str, str] | None = None,
    prior: PriorState | None = None,
    deleting: bool | str = False,
    reason: str | None = None,
    drain: Obj | None = None,
    status: Obj | None = None,
    typed: bool = False,
) -> Obj:
    """A NodeMaintenance (the dict the API serves; ``typed``: with apiVersion and kind).
    ``prior``: the record nmo keeps on the CR."""
    if prior is not None:
        annotations = {**(annotations or {}), c.PRIOR_STATE_ANNOTATION: prior.to_annotation()}
    spec: Obj = {"nodeName": node}
    if reason is not None:
        spec["reason"] = reason
    if drain is not None:
        spec["drain"] = copy.deepcopy(drain)
    out: Obj = {"apiVersion": c.API_VERSION, "kind": c.KIND} if typed else {}
    out["metadata"] = _meta(
        name,
        uid=uid,
        resource_version=resource_version,
        created=created,
        finalizers=finalizers,
        annotations=annotations,
        deleting=deleting,
    )
    out["spec"] = spec
    if status is not None:
        out["status"] = copy.deepcopy(status)
    return out


def pdb(
    name: str,
    *,
    namespace: str | None = None,
    generation: int | None = None,
    selector: Obj | None = None,
    match_labels: Mapping[str, str] | None = None,
    min_available: int | str | None = None,
    policy: str | None = None,
    observed_generation: int | None = None,
    desired: int | None = None,
    current: int | None = None,
    allowed: int | None = None,
    expected: int | None = None,
    typed: bool = False,
) -> Obj:
    """A PodDisruptionBudget. ``match_labels``: the selector's matchLabels (``selector``,
    a whole one, wins); ``policy``: its unhealthyPodEvictionPolicy; ``desired``, ``current``,
    ``allowed``, ``expected``: its status figures."""
    spec: Obj = {}
    if min_available is not None:
        spec["minAvailable"] = min_available
    if selector is None and match_labels is not None:
        selector = {"matchLabels": dict(match_labels)}
    if selector is not None:
        spec["selector"] = copy.deepcopy(selector)
    if policy is not None:
        spec["unhealthyPodEvictionPolicy"] = policy
    status: Obj = {}
    for key, value in (
        ("observedGeneration", observed_generation),
        ("desiredHealthy", desired),
        ("currentHealthy", current),
        ("disruptionsAllowed", allowed),
        ("expectedPods", expected),
    ):
        if value is not None:
            status[key] = value
    out: Obj = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget"} if typed else {}
    out["metadata"] = _meta(name, namespace=namespace, generation=generation)
    if spec:
        out["spec"] = spec
    if status:
        out["status"] = status
    return out


def lease(
    holder: str | None = None,
    renewed: datetime | None = None,
    *,
    name: str = "node-n1",
    namespace: str | None = None,
    uid: str | None = None,
    resource_version: str | None = None,
    duration: int | None = None,
    transitions: int | None = None,
    acquired: datetime | Literal["renewed"] | None = "renewed",
) -> Obj:
    """A coordination.k8s.io Lease held by ``holder`` (``""`` is a holder too), last
    renewed at ``renewed`` and acquired then too, unless ``acquired`` says otherwise
    (None: no acquireTime)."""
    spec: Obj = {}
    if holder is not None:
        spec["holderIdentity"] = holder
    if duration is not None:
        spec["leaseDurationSeconds"] = duration
    if transitions is not None:
        spec["leaseTransitions"] = transitions
    if renewed is not None:
        spec["renewTime"] = format_micro(renewed)
    when = renewed if acquired == "renewed" else acquired
    if isinstance(when, datetime):
        spec["acquireTime"] = format_micro(when)
    meta = _meta(name, namespace=namespace, uid=uid, resource_version=resource_version)
    return {"metadata": meta, "spec": spec}


def apply_patch(doc: Obj, ops: Sequence[Obj] | None) -> Obj:
    """``doc`` after an RFC 6902 JSON patch (a copy): add, replace, remove and test on
    object members (``~1`` and ``~0`` unescaped); a failing test raises AssertionError."""
    doc = copy.deepcopy(doc)
    for op in ops or ():
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for part in parts[:-1]:
            parent = parent[part]
        last = parts[-1]
        if op["op"] == "test":
            assert parent[last] == op["value"], f"test op failed: {op}"
        elif op["op"] in ("add", "replace"):
            parent[last] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            del parent[last]
        else:
            raise AssertionError(f"unsupported op: {op}")
    return doc
