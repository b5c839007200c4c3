"""Which pods a drain evicts: kubectl drain's filters, as pure functions.

The options are fixed to NMO's (``--force --delete-emptydir-data
--ignore-daemonsets``, the pod's own grace period):

- mirror (static) pods are skipped;
- pods controlled by an existing ``apps/v1`` DaemonSet are skipped with
  kubectl's warning "ignoring DaemonSet-managed Pods"; a DaemonSet pod whose
  DaemonSet is gone is evicted;
- pods with emptyDir volumes are evicted ("deleting Pods with local storage");
- pods without a controller are evicted ("deleting Pods that declare no
  controller").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from nmo.api import constants as c

Pod = dict[str, Any]


@dataclass
class Selection:
    """The outcome of filtering the pods bound to a node."""

    evict: list[Pod] = field(default_factory=list)
    daemonset: list[Pod] = field(default_factory=list)
    mirror: list[Pod] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def controller_of(pod: Pod) -> dict[str, Any] | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


def pod_name(pod: Pod) -> str:
    return str(pod["metadata"]["name"])


def pod_namespace(pod: Pod) -> str:
    return str(pod["metadata"].get("namespace", ""))


def pod_key(pod: Pod) -> str:
    return f"{pod_namespace(pod)}/{pod_name(pod)}"


def daemonset_owner(pod: Pod) -> str | None:
    """``namespace/name`` of the DaemonSet controlling the pod, if any."""
    ref = controller_of(pod)
    if (
        ref
        and ref.get("kind") == "DaemonSet"
        and str(ref.get("apiVersion", "")).startswith("apps/")
    ):
        return f"{pod_namespace(pod)}/{ref.get('name')}"
    return None


def _has_empty_dir(pod: Pod) -> bool:
    return any("emptyDir" in v for v in (pod.get("spec") or {}).get("volumes") or [])


def select_pods(pods: Iterable[Pod], daemonset_exists: Callable[[str], bool]) -> Selection:
    """Split the node's pods into those to evict and those to leave alone."""
    sel = Selection()
    local: list[str] = []
    unmanaged: list[str] = []
    for pod in pods:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if c.MIRROR_POD_ANNOTATION in annotations:
            sel.mirror.append(pod)
            continue
        ds = daemonset_owner(pod)
        if ds is not None and daemonset_exists(ds):
            sel.daemonset.append(pod)
            continue
        if _has_empty_dir(pod):
            local.append(pod_key(pod))
        if controller_of(pod) is None:
            unmanaged.append(pod_key(pod))
        sel.evict.append(pod)
    if sel.daemonset:
        names = ", ".join(pod_key(p) for p in sel.daemonset)
        sel.warnings.append(f"ignoring DaemonSet-managed Pods: {names}")
    if local:
        sel.warnings.append(f"deleting Pods with local storage: {', '.join(local)}")
    if unmanaged:
        sel.warnings.append(f"deleting Pods that declare no controller: {', '.join(unmanaged)}")
    return sel
