"""``nmo plan``: what a maintenance of a node would do right now, changing nothing (pure).

Before putting a node into maintenance an admin wants to know which pods
will be evicted, which are left alone and why, which the drain will wait on,
in what order, and whether a PodDisruptionBudget will hold it. The drain's
own pure modules answer each part, so the preflight says what the operator
would do, not an approximation of it:

* :func:`nmo.core.maintenance.podselect.select_pods` splits the pods (DaemonSet,
  mirror, drain rules, ``--pod-selector``);
* :func:`nmo.core.maintenance.podselect.order_key` groups the drain order;
* :func:`nmo.core.maintenance.disruption.budgets_for` says which PDBs would
  refuse an eviction now, with their figures.

:func:`preflight` turns the observed pods, PDBs and DaemonSets of one node
into a :class:`Preflight`; :func:`document` is the stable ``-o json``
contract (``schema: nmo.plan/v1``, docs/troubleshooting-ops.md) and
:func:`render` the human text, ending with the one-line verdict. A node is
*blocked* when its drain could not finish without someone acting: a PDB that
allows no disruption (or has not computed its status), a pod selected by two
PDBs, an unknown drain rule or an invalid pod selector. Reading the cluster
is :mod:`nmo.ops.observe`'s job.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from nmo.api import constants as c
from nmo.core.maintenance.disruption import Budgets, budgets_for, names, shared_text
from nmo.core.maintenance.drainstate import REASON_INVALID_RULE, REASON_WAIT_COMPLETED
from nmo.core.maintenance.podselect import (
    RulesFrom,
    daemonset_owner,
    describe_order,
    grace_seconds,
    no_pod_rules,
    order_key,
    pod_key,
    pod_name,
    pod_namespace,
    pod_phase,
    rules_from,
    select_pods,
)
from nmo.core.maintenance.selectors import format_selector

Obj = dict[str, Any]

SCHEMA = "nmo.plan/v1"
NAMED_IN_VERDICT = 5


class Skip(enum.StrEnum):
    """Why a pod is left alone (the ``reason`` of a skipped pod in the JSON)."""

    DAEMONSET = "DaemonSet"
    MIRROR = "MirrorPod"
    DRAIN_RULE = "DrainRuleSkip"
    NOT_SELECTED = "NotSelected"
    COMPLETED = "Completed"


@dataclass(frozen=True)
class PodLine:
    """One pod of the node, as the preflight reports it."""

    namespace: str
    name: str
    reason: str = ""  # skipped and waited pods: a Skip value or a drain reason
    message: str = ""
    order: int = 0
    critical: bool = False
    grace_seconds: int = 0
    phase: str = ""
    budgets: tuple[str, ...] = ()  # PDBs selecting it (evicted pods)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class OrderGroup:
    order: int
    critical: bool
    pods: tuple[str, ...]

    @property
    def label(self) -> str:
        return describe_order((self.order, 1 if self.critical else 0))


@dataclass(frozen=True)
class Preflight:
    node: str
    pod_selector: Mapping[str, Any] | None
    evict: tuple[PodLine, ...] = ()
    waited: tuple[PodLine, ...] = ()
    skipped: tuple[PodLine, ...] = ()
    groups: tuple[OrderGroup, ...] = ()
    budgets: Budgets = field(default_factory=Budgets)
    invalid: tuple[tuple[str, str], ...] = ()  # (pod key, why) for pods whose rule blocks
    warnings: tuple[str, ...] = ()

    @property
    def blockers(self) -> list[str]:
        """Everything that would hold the drain right now, one sentence each."""
        out = [
            f"{cov.why()}, covering {len(cov.pods)} pod{_s(len(cov.pods))} on this node: "
            f"{names(cov.pods, NAMED_IN_VERDICT)}"
            for cov in self.budgets.blocking
        ]
        out += [shared_text(sh) for sh in self.budgets.shared]
        out += [f"{key}: {why}" for key, why in self.invalid]
        return out

    @property
    def blocked(self) -> bool:
        return bool(self.budgets.blocked or self.invalid)

    def verdict(self) -> str:
        counts = (
            f"{self.node}: {len(self.evict)} pod{_s(len(self.evict))} to evict, "
            f"{len(self.waited)} waited on, {len(self.skipped)} skipped"
        )
        if self.blocked:
            return f"{counts}; BLOCKED now by " + "; ".join(self.blockers)
        slow = [
            f"{cov.key} allows {cov.at_once} eviction{_s(cov.at_once)} at once "
            f"for {len(cov.pods)} pods"
            for cov in self.budgets.coverage
            if len(cov.pods) > cov.at_once
        ]
        return f"{counts}; nothing blocks now" + (f" ({'; '.join(slow)})" if slow else "")


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _line(
    pod: Obj,
    reason: str = "",
    message: str = "",
    budgets: Sequence[str] = (),
    *,
    critical_last: bool = False,
    rules: RulesFrom = no_pod_rules,
) -> PodLine:
    order, critical = order_key(pod, critical_last=critical_last, rules=rules)
    return PodLine(
        namespace=pod_namespace(pod),
        name=pod_name(pod),
        reason=reason,
        message=message,
        order=order,
        critical=bool(critical),
        grace_seconds=grace_seconds(pod),
        phase=pod_phase(pod),
        budgets=tuple(budgets),
    )


_LISTED_WARNINGS = ("ignoring DaemonSet-managed Pods", "leaving Pods alone")


def _by_key(line: PodLine) -> str:
    return line.key


def preflight(
    node: str,
    pods: Iterable[Obj],
    pdbs: Iterable[Obj],
    daemonset_exists: Callable[[str], bool],
    pod_selector: Mapping[str, Any] | None = None,
    *,
    critical_last: bool = False,
    pod_rules_namespaces: Collection[str] = (),
) -> Preflight:
    """What draining ``node`` would do now, from its pods, their PDBs and DaemonSets
    (``critical_last``: as an operator started with ``--critical-pods-last``;
    ``pod_rules_namespaces``: with ``--pod-drain-rules-namespaces``)."""
    rules = rules_from(pod_rules_namespaces)
    sel = select_pods(pods, daemonset_exists, pod_selector, rules=rules)
    budgets = budgets_for(sel.evict, pdbs)
    covering: dict[str, list[str]] = {}
    for cov in budgets.coverage:
        for key in (*cov.pods, *cov.passing):
            covering.setdefault(key, []).append(cov.key)
    evict = [
        _line(
            p,
            budgets=sorted(covering.get(pod_key(p), [])),
            critical_last=critical_last,
            rules=rules,
        )
        for p in sel.evict
    ]
    waited = [
        _line(
            p,
            REASON_WAIT_COMPLETED,
            "labelled wait-completed: waiting for it to complete",
            critical_last=critical_last,
            rules=rules,
        )
        for p in sel.wait
    ] + [
        _line(p, REASON_INVALID_RULE, why, critical_last=critical_last, rules=rules)
        for p, why in sel.invalid
    ]
    skipped = [
        _line(p, Skip.MIRROR, "mirror (static) pod, managed by the kubelet") for p in sel.mirror
    ]
    skipped += [
        _line(p, Skip.DAEMONSET, f"managed by DaemonSet {daemonset_owner(p)}")
        for p in sel.daemonset
    ]
    for p in sel.skipped:
        labels = (p.get("metadata") or {}).get("labels") or {}
        if labels.get(c.DRAIN_RULE_LABEL) == c.DRAIN_RULE_SKIP and rules(pod_namespace(p)):
            why = f"labelled {c.DRAIN_RULE_LABEL}={c.DRAIN_RULE_SKIP}"
            skipped.append(_line(p, Skip.DRAIN_RULE, why))
        else:
            why = f"does not match the pod selector {format_selector(pod_selector)}"
            skipped.append(_line(p, Skip.NOT_SELECTED, why))
    skipped += [
        _line(p, Skip.COMPLETED, f"labelled wait-completed and already {pod_phase(p)}")
        for p in sel.completed
    ]
    groups: dict[tuple[int, int], list[str]] = {}
    for p in (*sel.evict, *sel.waited):
        groups.setdefault(order_key(p, critical_last=critical_last, rules=rules), []).append(
            pod_key(p)
        )
    # The skipped pods are listed with their reasons already.
    warnings = [w for w in sel.warnings if not w.startswith(_LISTED_WARNINGS)]
    return Preflight(
        node=node,
        pod_selector=pod_selector,
        evict=tuple(sorted(evict, key=lambda line: ((line.order, line.critical), line.key))),
        waited=tuple(sorted(waited, key=_by_key)),
        skipped=tuple(sorted(skipped, key=_by_key)),
        groups=tuple(
            OrderGroup(order=k[0], critical=bool(k[1]), pods=tuple(sorted(v)))
            for k, v in sorted(groups.items())
        ),
        budgets=budgets,
        invalid=tuple(sorted((pod_key(p), why) for p, why in sel.invalid)),
        warnings=tuple(warnings),
    )


# -- the -o json document ------------------------------------------------------


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod_view(line: PodLine, *, evicted: bool) -> Obj:
    view: Obj = {"namespace": line.namespace, "name": line.name, "phase": line.phase or None}
    if evicted:
        view |= {
            "order": line.order,
            "critical": line.critical,
            "graceSeconds": line.grace_seconds,
            "disruptionBudgets": list(line.budgets),
        }
    else:
        view |= {"reason": line.reason, "message": line.message}
    return view


def node_view(p: Preflight) -> Obj:
    """One node of the ``-o json`` document (stable field names)."""
    return {
        "node": p.node,
        "podSelector": dict(p.pod_selector) if p.pod_selector is not None else None,
        "blocked": p.blocked,
        "verdict": p.verdict(),
        "counts": {"evict": len(p.evict), "waited": len(p.waited), "skipped": len(p.skipped)},
        "evict": [_pod_view(x, evicted=True) for x in p.evict],
        "waited": [_pod_view(x, evicted=False) for x in p.waited],
        "skipped": [_pod_view(x, evicted=False) for x in p.skipped],
        "orderGroups": [
            {"order": g.order, "critical": g.critical, "label": g.label, "pods": list(g.pods)}
            for g in p.groups
        ],
        "disruptionBudgets": [
            {
                "namespace": cov.namespace,
                "name": cov.name,
                "desiredHealthy": cov.figures.desired_healthy,
                "currentHealthy": cov.figures.current_healthy,
                "disruptionsAllowed": cov.figures.disruptions_allowed,
                "expectedPods": cov.figures.expected_pods,
                "observed": cov.figures.observed,
                "evictionsAtOnce": cov.at_once,
                "blocking": cov.blocks,
                "pods": list(cov.pods),
                "unhealthyPodsLetGo": list(cov.passing),
            }
            for cov in p.budgets.coverage
        ],
        "sharedPods": [
            {"pod": sh.pod, "disruptionBudgets": list(sh.budgets)} for sh in p.budgets.shared
        ],
        "blockers": p.blockers,
        "warnings": list(p.warnings),
    }


def document(results: Sequence[Preflight], errors: Mapping[str, str], now: datetime) -> Obj:
    """The ``-o json`` document: one item per node found, errors per node not read."""
    return {
        "schema": SCHEMA,
        "generatedAt": _iso(now),
        "blocked": any(p.blocked for p in results),
        "items": [node_view(p) for p in results],
        "errors": [{"node": n, "message": m} for n, m in errors.items()],
    }


# -- the human text --------------------------------------------------------------


def _table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "    "
) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=True)]
    out = []
    for row in (headers, *rows):
        cells = [str(x).ljust(w) for x, w in zip(row, widths, strict=True)]
        out.append((indent + "  ".join(cells)).rstrip())
    return out


def render(p: Preflight) -> str:
    """One node's preflight as text: sections, then the verdict line."""
    lines = [f"NODE {p.node}"]
    if p.pod_selector is not None:
        lines.append(f"  pod selector: {format_selector(p.pod_selector)}")
    lines.append(f"  TO EVICT ({len(p.evict)})")
    if p.evict:
        rows = [
            (
                x.key,
                describe_order((x.order, int(x.critical))),
                f"{x.grace_seconds}s",
                ", ".join(x.budgets) or "-",
            )
            for x in p.evict
        ]
        lines += _table(("POD", "ORDER", "GRACE", "DISRUPTION BUDGET"), rows)
    for title, pods in (("WAITED ON", p.waited), ("SKIPPED", p.skipped)):
        lines.append(f"  {title} ({len(pods)})")
        if pods:
            lines += _table(("POD", "REASON", "WHY"), [(x.key, x.reason, x.message) for x in pods])
    if p.groups:
        lines.append("  DRAIN ORDER (a group starts once the earlier ones have left)")
        for i, g in enumerate(p.groups, 1):
            lines.append(f"    {i}. {g.label}: {names(g.pods, 10)}")
    lines.append(f"  DISRUPTION BUDGETS ({len(p.budgets.coverage)})")
    if p.budgets.coverage:
        budget_rows = [
            (
                cov.key,
                str(cov.figures.desired_healthy),
                str(cov.figures.current_healthy),
                str(cov.figures.disruptions_allowed),
                str(cov.figures.expected_pods),
                str(cov.at_once),
                "BLOCKS" if cov.blocks else "ok",
                names(cov.pods, 10) or "-",
            )
            for cov in p.budgets.coverage
        ]
        headers = (
            "BUDGET",
            "DESIRED",
            "CURRENT",
            "ALLOWED",
            "EXPECTED",
            "AT ONCE",
            "NOW",
            "PODS ON THIS NODE",
        )
        lines += _table(headers, budget_rows)
    for sh in p.budgets.shared:
        lines.append(f"    {shared_text(sh)}")
    if p.warnings:
        lines.append("  WARNINGS")
        lines += [f"    {w}" for w in p.warnings]
    lines.append(p.verdict())
    return "\n".join(lines)
