"""Which PodDisruptionBudgets stand in a drain's way right now, and by how much (pure).

Used before anything changes: by ``nmo plan`` (what a maintenance of a node
would meet) and by the webhook's admission warnings (a PDB that allows no
disruption when a NodeMaintenance is created). Both ask the same question the
eviction API answers per pod (``pkg/registry/core/pod/storage/eviction.go``),
so :func:`budgets_for` follows its rules, in its order:

1. a pod that is Pending, Succeeded, Failed or already terminating is
   deleted without looking at PDBs (:func:`ignores_budgets`);
2. a pod selected by more than one PDB of its namespace cannot be evicted at
   all (the API answers 500): :attr:`Budgets.shared`;
3. a PDB whose status has not observed its latest generation refuses;
4. an unready pod goes without consuming a disruption when its PDB is already
   at its desired healthy count, or says ``unhealthyPodEvictionPolicy:
   AlwaysAllow``;
5. otherwise the PDB must allow a disruption (``status.disruptionsAllowed``),
   and each eviction consumes one: :attr:`Coverage.at_once` evictions pass
   before the PDB has to see replacements become healthy.

A PDB selects the pods of its own namespace that its selector matches; a
null selector selects nothing, an empty one every pod (policy/v1). The
figures are the PDB's own status, as the eviction API reads them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nmo.core.maintenance.podselect import is_completed, pod_key, pod_namespace, pod_phase
from nmo.core.maintenance.selectors import selector_matches

Obj = Mapping[str, Any]
Pod = dict[str, Any]

ALWAYS_ALLOW = "AlwaysAllow"
MAX_WARNINGS = 5  # admission warnings per request: kubectl prints every one
MAX_WARNING_CHARS = 250  # the apiserver truncates a warning past 256 characters
_MAX_NAME_CHARS = 80  # a name inside a warning (names may be 253 characters long)


def _int(value: object) -> int:
    try:
        return int(value)  # type: ignore[call-overload, no-any-return]
    except (TypeError, ValueError):
        return 0


@dataclass(frozen=True)
class Figures:
    """A PDB's status, as the eviction API reads it."""

    desired_healthy: int
    current_healthy: int
    disruptions_allowed: int
    expected_pods: int
    observed: bool  # status.observedGeneration has caught up with metadata.generation

    @classmethod
    def of(cls, pdb: Obj) -> Figures:
        st = pdb.get("status") or {}
        generation = _int((pdb.get("metadata") or {}).get("generation"))
        return cls(
            desired_healthy=_int(st.get("desiredHealthy")),
            current_healthy=_int(st.get("currentHealthy")),
            disruptions_allowed=_int(st.get("disruptionsAllowed")),
            expected_pods=_int(st.get("expectedPods")),
            observed=_int(st.get("observedGeneration")) >= generation,
        )

    def text(self) -> str:
        """``needs 3 healthy and has 3 (0 disruptions allowed)`` (the Blocked message's words)."""
        return (
            f"needs {self.desired_healthy} healthy and has {self.current_healthy}"
            f" ({self.disruptions_allowed} disruptions allowed)"
        )


@dataclass(frozen=True)
class Coverage:
    """One PDB and the pods on the node it holds."""

    namespace: str
    name: str
    figures: Figures
    pods: tuple[str, ...]  # pod keys whose eviction this PDB decides
    passing: tuple[str, ...] = ()  # selected, but evicted without consuming a disruption

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def blocks(self) -> bool:
        """Whether the next eviction of one of its pods is refused right now."""
        return bool(self.pods) and (
            not self.figures.observed or self.figures.disruptions_allowed < 1
        )

    @property
    def at_once(self) -> int:
        """How many of its pods on the node can be evicted now, before replacements count."""
        if not self.figures.observed:
            return 0
        return max(0, min(self.figures.disruptions_allowed, len(self.pods)))

    def why(self) -> str:
        """What holds the drain, in the Blocked condition's words."""
        if not self.figures.observed:
            return (
                f"PodDisruptionBudget {self.key} has not observed its latest change yet "
                "(the eviction API refuses until it has)"
            )
        return f"PodDisruptionBudget {self.key} {self.figures.text()}"


@dataclass(frozen=True)
class Shared:
    """A pod selected by several PDBs: the eviction API refuses to evict it."""

    pod: str
    budgets: tuple[str, ...]  # PDB keys, sorted


@dataclass(frozen=True)
class Budgets:
    coverage: tuple[Coverage, ...] = ()  # PDBs selecting at least one of the pods, by key
    shared: tuple[Shared, ...] = ()

    @property
    def blocking(self) -> tuple[Coverage, ...]:
        return tuple(cov for cov in self.coverage if cov.blocks)

    @property
    def blocked(self) -> bool:
        return bool(self.blocking or self.shared)


def selects(pdb: Obj, pod: Pod) -> bool:
    """Whether the PDB selects the pod (same namespace; null selector: nothing)."""
    if (pdb.get("metadata") or {}).get("namespace") != pod_namespace(pod):
        return False
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return selector_matches((pdb.get("spec") or {}).get("selector"), labels, null_matches=False)


def ignores_budgets(pod: Pod) -> bool:
    """The eviction API deletes these without a PDB check: Pending, completed, terminating."""
    return (
        pod_phase(pod) == "Pending"
        or is_completed(pod)
        or bool((pod.get("metadata") or {}).get("deletionTimestamp"))
    )


def is_ready(pod: Pod) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def _passes_unready(pdb: Obj, figures: Figures, pod: Pod) -> bool:
    """Rule 4: an unready pod the PDB lets go without consuming a disruption."""
    if is_ready(pod):
        return False
    if (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy") == ALWAYS_ALLOW:
        return True
    return figures.current_healthy >= figures.desired_healthy > 0


def budgets_for(pods: Iterable[Pod], pdbs: Iterable[Obj]) -> Budgets:
    """The PDBs that decide the eviction of ``pods`` (the pods a drain would evict)."""
    candidates = [p for p in pods if not ignores_budgets(p)]
    by_pod: dict[str, list[str]] = {}
    coverage: list[Coverage] = []
    for pdb in pdbs:
        meta = pdb.get("metadata") or {}
        selected = [p for p in candidates if selects(pdb, p)]
        if not selected:
            continue
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        figures = Figures.of(pdb)
        held: list[str] = []
        passing: list[str] = []
        for p in selected:
            by_pod.setdefault(pod_key(p), []).append(key)
            passes = figures.observed and _passes_unready(pdb, figures, p)
            (passing if passes else held).append(pod_key(p))
        coverage.append(
            Coverage(
                namespace=str(meta.get("namespace", "")),
                name=str(meta.get("name", "")),
                figures=figures,
                pods=tuple(held),
                passing=tuple(passing),
            )
        )
    coverage.sort(key=lambda cov: cov.key)
    shared = tuple(
        Shared(pod=pod, budgets=tuple(sorted(keys)))
        for pod, keys in sorted(by_pod.items())
        if len(keys) > 1
    )
    return Budgets(coverage=tuple(coverage), shared=shared)


def status_key(pdb: Obj) -> tuple[tuple[str, str], ...]:
    """A PDB's status as a comparable value (plus its generation): what a refusal
    was decided against. Two equal keys mean the eviction API would answer the
    same; any change of a figure, of ``observedGeneration`` or of the spec's
    generation makes them differ. Only the fields the cache keeps count."""
    st = pdb.get("status") or {}
    meta = pdb.get("metadata") or {}
    items = [(str(k), str(v)) for k, v in st.items() if not isinstance(v, (dict, list))]
    items.append((".generation", str(meta.get("generation", ""))))
    return tuple(sorted(items))


def shared_text(shared: Shared) -> str:
    names = ", ".join(shared.budgets)
    return (
        f"pod {shared.pod} is selected by {len(shared.budgets)} PodDisruptionBudgets ({names}): "
        "the eviction API refuses to evict it"
    )


def _short(name: str) -> str:
    return name if len(name) <= _MAX_NAME_CHARS else name[: _MAX_NAME_CHARS - 3] + "..."


def _clip(text: str) -> str:
    return text if len(text) <= MAX_WARNING_CHARS else text[: MAX_WARNING_CHARS - 3] + "..."


def disruption_warnings(budgets: Budgets, node: str) -> list[str]:
    """Admission warnings for the PDBs that would hold the drain of ``node`` right now.

    At most :data:`MAX_WARNINGS`, each under :data:`MAX_WARNING_CHARS`; the
    last one counts what was left out.
    """
    where = _short(node)
    lines: list[str] = []
    for cov in budgets.blocking:
        f = cov.figures
        if not f.observed:
            why = "has not observed its latest change yet"
        else:
            why = (
                f"allows no disruption now (needs {f.desired_healthy} healthy, "
                f"has {f.current_healthy})"
            )
        text = f"PodDisruptionBudget {_short(cov.key)} {why}: the drain of {where} will wait for it"
        lines.append(_clip(text))
    for sh in budgets.shared:
        lines.append(
            _clip(
                f"pod {_short(sh.pod)} is selected by {len(sh.budgets)} PodDisruptionBudgets, "
                f"which the eviction API refuses: the drain of {where} will wait for it"
            )
        )
    if len(lines) <= MAX_WARNINGS:
        return lines
    rest = len(lines) - (MAX_WARNINGS - 1)
    return [
        *lines[: MAX_WARNINGS - 1],
        _clip(f"and {rest} more PodDisruptionBudget problems will hold the drain of {where}"),
    ]


def names(keys: Sequence[str], limit: int) -> str:
    """``a, b, c and 2 more``."""
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")
