"""Which pods a drain evicts, and in what order: kubectl drain's filters and
nmo's drain rules, as pure functions.

The options are fixed to NMO's (``--force --delete-emptydir-data
--ignore-daemonsets``, the pod's own grace period):

- mirror (static) pods are skipped;
- pods controlled by an existing DaemonSet are skipped with kubectl's
  warning "ignoring DaemonSet-managed Pods". As in kubectl's
  ``daemonSetFilter``, a DaemonSet controller is an ownerReference with
  ``controller: true``, kind ``DaemonSet`` and apiVersion exactly
  ``apps/v1`` (any other apiVersion is an ordinary controller), and the
  DaemonSet is looked up by name in ``apps/v1``. A finished DaemonSet pod
  (phase Succeeded or Failed) is evicted without a lookup, and one whose
  DaemonSet is gone is evicted;
- pods with emptyDir volumes are evicted ("deleting Pods with local storage");
- pods without a controller are evicted ("deleting Pods that declare no
  controller").

Finished pods are evicted without the last two warnings, as kubectl's
filters let any finished pod go.

nmo's drain rules (issue 12) come after those filters. Pod labels and
annotations are tenant input: they are honoured only for pods of the
namespaces an admin allows (``--pod-drain-rules-namespaces``; none by
default, as the Go NMO consults none). A rule of any other pod is ignored,
the pod is drained as if it had none, and the selection says so
(``Selection.ignored``). The CR's ``spec.drain.podSelector`` is the admin's
and always applies.

- a pod labelled ``nodemaintenance.medik8s.io/drain=skip``, or not matching
  the CR's ``spec.drain.podSelector``, is left alone and does not block;
- ``nodemaintenance.medik8s.io/drain=wait-completed``: not evicted; the drain
  waits until the pod has completed (phase Succeeded or Failed) or is gone;
- any other value of that label is a mistake that must not cost the pod:
  it is not evicted and blocks the drain until the label is fixed.

Order: the ``nodemaintenance.medik8s.io/drain-order`` annotation (an
integer, lowest first, default 0); within one order, and only when the
operator is started with ``--critical-pods-last`` (off by default: the Go NMO
evicts every pod at once), pods of the ``system-cluster-critical`` and
``system-node-critical`` priority classes go last (:func:`order_key`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nmo.api import constants as c
from nmo.core.maintenance.selectors import selector_error, selector_matches

Pod = dict[str, Any]

# namespace -> may its pods steer their own drain (the drain label, drain-order)?
RulesFrom = Callable[[str], bool]

ANY_NAMESPACE = "*"  # in --pod-drain-rules-namespaces: every namespace (issue 12's behaviour)


def no_pod_rules(_namespace: str) -> bool:
    """The default: no pod steers its drain, as with the Go NMO."""
    return False


def every_namespace(_namespace: str) -> bool:
    return True


def rules_from(namespaces: Collection[str]) -> RulesFrom:
    """The namespaces whose pods' drain rules are honoured (``*``: all)."""
    if not namespaces:
        return no_pod_rules
    if ANY_NAMESPACE in namespaces:
        return every_namespace
    allowed = frozenset(namespaces)
    return allowed.__contains__


_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def parse_namespaces(text: str) -> frozenset[str]:
    """``--pod-drain-rules-namespaces``: comma-separated namespace names, or ``*``.

    Raises ValueError naming the first entry that is not a namespace name.
    """
    names = [part.strip() for part in text.split(",") if part.strip()]
    for name in names:
        if name != ANY_NAMESPACE and not _NAMESPACE.fullmatch(name):
            raise ValueError(
                f"{name!r} is not a namespace name (lower-case DNS label) or {ANY_NAMESPACE!r}"
            )
    return frozenset(names)


def has_rules(pod: Pod) -> bool:
    """Whether the pod carries a drain rule label or a drain-order annotation."""
    meta = pod.get("metadata") or {}
    return c.DRAIN_RULE_LABEL in (meta.get("labels") or {}) or c.DRAIN_ORDER_ANNOTATION in (
        meta.get("annotations") or {}
    )


def ignored_rules(pod: Pod) -> str:
    """The pod's own rules, as shown when they are ignored."""
    meta = pod.get("metadata") or {}
    parts = []
    if (rule := (meta.get("labels") or {}).get(c.DRAIN_RULE_LABEL)) is not None:
        parts.append(f"{c.DRAIN_RULE_LABEL}={rule}")
    if (order := (meta.get("annotations") or {}).get(c.DRAIN_ORDER_ANNOTATION)) is not None:
        parts.append(f"{c.DRAIN_ORDER_ANNOTATION}={order}")
    return ", ".join(parts)


DAEMONSET_KIND = "DaemonSet"
DAEMONSET_API_VERSION = "apps/v1"


@dataclass
class Selection:
    """The outcome of filtering the pods bound to a node."""

    evict: list[Pod] = field(default_factory=list)
    daemonset: list[Pod] = field(default_factory=list)
    mirror: list[Pod] = field(default_factory=list)
    skipped: list[Pod] = field(default_factory=list)  # drain=skip or outside podSelector
    wait: list[Pod] = field(default_factory=list)  # drain=wait-completed, not completed yet
    completed: list[Pod] = field(default_factory=list)  # drain=wait-completed, completed
    invalid: list[tuple[Pod, str]] = field(default_factory=list)  # unknown rule: (pod, why)
    ignored: list[Pod] = field(default_factory=list)  # rules of a namespace not allowed them
    warnings: list[str] = field(default_factory=list)

    @property
    def waited(self) -> list[Pod]:
        """Pods the drain waits on without evicting them (wait-completed, invalid rule)."""
        return [*self.wait, *(p for p, _ in self.invalid)]


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
    meta = pod["metadata"]  # inline: a pass asks it several times per pod of the node
    return f"{meta.get('namespace', '')}/{meta['name']}"


def daemonset_owner(pod: Pod) -> str | None:
    """``namespace/name`` of the DaemonSet controlling the pod, if any
    (kubectl's ``isControllerRefDaemonSet``: kind ``DaemonSet``, apiVersion
    ``apps/v1``)."""
    ref = controller_of(pod)
    if ref and ref.get("kind") == DAEMONSET_KIND and ref.get("apiVersion") == DAEMONSET_API_VERSION:
        return f"{pod_namespace(pod)}/{ref.get('name')}"
    return None


def running_daemonset_owner(pod: Pod) -> str | None:
    """The DaemonSet owner whose existence decides the pod's fate: None for a
    finished pod, which is evicted whoever owns it."""
    return None if is_completed(pod) else daemonset_owner(pod)


def _has_empty_dir(pod: Pod) -> bool:
    return any("emptyDir" in v for v in (pod.get("spec") or {}).get("volumes") or [])


def pod_phase(pod: Pod) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def is_completed(pod: Pod) -> bool:
    return pod_phase(pod) in ("Succeeded", "Failed")


def drain_order(pod: Pod) -> tuple[int, str | None]:
    """The pod's drain order and, for an unreadable annotation, why 0 is used."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(c.DRAIN_ORDER_ANNOTATION)
    if raw is None:
        return 0, None
    try:
        return int(str(raw).strip()), None
    except ValueError:
        return 0, f"{pod_key(pod)}: {c.DRAIN_ORDER_ANNOTATION}={raw!r} is not an integer, using 0"


def is_critical(pod: Pod) -> bool:
    return (pod.get("spec") or {}).get("priorityClassName") in c.CRITICAL_PRIORITY_CLASSES


def order_key(
    pod: Pod, *, critical_last: bool = False, rules: RulesFrom = no_pod_rules
) -> tuple[int, int]:
    """Drain order: the annotation (of a namespace ``rules`` allows) first, then
    (with ``critical_last``) critical pods last within it."""
    order = drain_order(pod)[0] if rules(pod_namespace(pod)) else 0
    return order, 1 if critical_last and is_critical(pod) else 0


def describe_order(key: tuple[int, int]) -> str:
    order, critical = key
    return f"order {order}" + (" (critical pods)" if critical else "")


def grace_seconds(pod: Pod) -> int:
    """The pod's own grace period, at least 1 s (a forced deletion never uses 0)."""
    raw = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    grace = c.DEFAULT_GRACE_SECONDS if raw is None else int(raw)
    return max(1, grace)


IGNORED_RULES = (
    "ignoring the drain rules of Pods in namespaces not allowed to set them "
    "(--pod-drain-rules-namespaces)"
)


def select_pods(
    pods: Iterable[Pod],
    daemonset_exists: Callable[[str], bool],
    pod_selector: Mapping[str, Any] | None = None,
    *,
    rules: RulesFrom = no_pod_rules,
) -> Selection:
    """Split the node's pods into those to evict, to wait on and to leave alone
    (``rules``: whose drain rules are honoured)."""
    sel = Selection()
    local: list[str] = []
    unmanaged: list[str] = []
    # An invalid selector (the webhook refuses it; without the webhook it can
    # be stored) must not leave every pod alone and call the drain done.
    broken = selector_error(pod_selector, "spec.drain.podSelector")
    for pod in pods:
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        if c.MIRROR_POD_ANNOTATION in annotations:
            sel.mirror.append(pod)
            continue
        ds = running_daemonset_owner(pod)
        if ds is not None and daemonset_exists(ds):
            sel.daemonset.append(pod)
            continue
        labels = meta.get("labels") or {}
        if broken is not None:
            sel.invalid.append((pod, f"{broken}: nothing is evicted until it is fixed"))
            continue
        rule = labels.get(c.DRAIN_RULE_LABEL)
        own = rules(pod_namespace(pod))
        if not own:
            if has_rules(pod):
                sel.ignored.append(pod)
            rule = None
        if rule == c.DRAIN_RULE_SKIP or not selector_matches(pod_selector, labels):
            sel.skipped.append(pod)
            continue
        if rule == c.DRAIN_RULE_WAIT_COMPLETED:
            (sel.completed if is_completed(pod) else sel.wait).append(pod)
            continue
        if rule is not None:
            sel.invalid.append(
                (
                    pod,
                    f"unknown drain rule {c.DRAIN_RULE_LABEL}={rule!r} "
                    f"(expected {c.DRAIN_RULE_SKIP} or {c.DRAIN_RULE_WAIT_COMPLETED}): "
                    "not evicted; fix or remove the label",
                )
            )
            continue
        if own and (why := drain_order(pod)[1]) is not None:
            sel.warnings.append(why)
        if not is_completed(pod):
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
    if sel.ignored:
        names = ", ".join(f"{pod_key(p)} ({ignored_rules(p)})" for p in sel.ignored)
        sel.warnings.append(f"{IGNORED_RULES}: {names}")
    if sel.skipped:
        names = ", ".join(pod_key(p) for p in sel.skipped)
        sel.warnings.append(f"leaving Pods alone (drain rule or podSelector): {names}")
    return sel
