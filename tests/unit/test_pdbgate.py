"""No blind retries behind a PodDisruptionBudget: the gate as tables (issue 22).

:func:`nmo.core.maintenance.pdbgate.gate` is a function of the node's pods,
their drain states, the cached PDBs and the event loop's tick. The tables
check that a PDB whose status stands sends nothing but one probe per
interval, that any change of its status lets pods go at once (as many as it
allows), that pods it never refused are held with it and shown as refused,
and that a PDB missing from the cache leaves the pods to their backoff.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from nmo.api.models import OnTimeout
from nmo.core.maintenance import pdbgate
from nmo.core.maintenance.disruption import status_key
from nmo.core.maintenance.drainplan import Deadline, plan_drain
from nmo.core.maintenance.drainstate import REASON_PDB, REASON_WAITING, PodDrainState
from nmo.core.maintenance.podselect import select_pods

Obj = dict[str, Any]
NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
SINCE = NOW - timedelta(minutes=5)
RECHECK = 60.0


def pod(name: str, *, ns: str = "app", app: str = "web", ready: bool = True) -> Obj:
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"u-{name}", "labels": {"app": app}},
        "spec": {"nodeName": "n1"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def budget(allowed: int = 0, healthy: int = 3, name: str = "web", ns: str = "app") -> Obj:
    """A slim PDB, as the PDB informer keeps it."""
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"pdb-{name}", "resourceVersion": "9"},
        "spec": {"selector": {"matchLabels": {"app": name}}, "minAvailable": 3},
        "status": {
            "disruptionsAllowed": allowed,
            "currentHealthy": healthy,
            "desiredHealthy": 3,
            "expectedPods": 3,
        },
    }


STANDING = budget()
SEEN = status_key(STANDING)


def refused(
    name: str, at: float, *, seen: Any = SEEN, in_flight: bool = False, next_attempt: float = 1e9
) -> PodDrainState:
    return PodDrainState(
        uid=f"u-{name}",
        since=SINCE + timedelta(seconds=at),
        reason=REASON_PDB,
        message=f"The disruption budget web needs 3 healthy pods and has 3 currently ({name})",
        pdb="web",
        next_attempt=next_attempt,
        attempts=1,
        in_flight=in_flight,
        refused_at=at,
        budget_seen=seen,
    )


PODS = [pod("a"), pod("b"), pod("c")]
THREE = {"app/a": refused("a", 10.0), "app/b": refused("b", 20.0), "app/c": refused("c", 30.0)}
PDBS = {"app/web": STANDING}


def run(
    states: dict[str, PodDrainState],
    *,
    pods: list[Obj] | None = None,
    pdbs: dict[str, Obj] | None = None,
    tick: float = 40.0,
) -> pdbgate.Gate:
    return pdbgate.gate(
        PODS if pods is None else pods,
        states,
        PDBS if pdbs is None else pdbs,
        tick=tick,
        recheck=RECHECK,
    )


# -- a standing PDB: nothing but one probe per interval -------------------------------


@pytest.mark.parametrize(
    ("tick", "in_flight", "released", "wake"),
    [
        (40.0, None, set(), 50.0),  # refused last at 30: the probe is due at 90
        (89.9, None, set(), pytest.approx(0.1)),
        (90.0, None, {"app/a"}, None),  # the one refused longest ago, alone
        (500.0, None, {"app/a"}, None),  # however late, one probe
        (95.0, "app/b", set(), None),  # a probe in flight: its answer wakes the CR
    ],
)
def test_a_standing_pdb_is_probed_once_per_interval(
    tick: float, in_flight: str | None, released: set[str], wake: Any
) -> None:
    states = dict(THREE)
    if in_flight is not None:
        states[in_flight] = replace(states[in_flight], in_flight=True)
    gate = run(states, tick=tick)
    assert gate.released == released
    expected_held = {"app/a", "app/b", "app/c"} - released - ({in_flight} - {None})
    assert gate.held == expected_held
    assert gate.wake == wake


def test_the_probe_rotates_over_the_pods() -> None:
    states = dict(THREE)
    probed: list[str] = []
    tick = 90.0
    for _ in range(4):
        (key,) = run(states, tick=tick).released
        probed.append(key)
        states[key] = replace(states[key], refused_at=tick)  # refused again
        tick += RECHECK
    assert probed == ["app/a", "app/b", "app/c", "app/a"]


# -- a PDB that changed: pods go at once, as many as it allows ------------------------


@pytest.mark.parametrize(
    ("pdb", "in_flight", "released"),
    [
        (budget(healthy=2), None, {"app/a"}),  # another status, still 0 allowed: one probe
        (budget(allowed=1), None, {"app/a"}),
        (budget(allowed=2), None, {"app/a", "app/b"}),
        (budget(allowed=5), None, {"app/a", "app/b", "app/c"}),
        (budget(allowed=2), "app/a", {"app/b"}),  # one of the two slots is in flight
        (budget(allowed=1), "app/c", set()),
    ],
)
def test_a_changed_pdb_releases_its_pods_at_once(
    pdb: Obj, in_flight: str | None, released: set[str]
) -> None:
    states = dict(THREE)
    if in_flight is not None:
        states[in_flight] = replace(states[in_flight], in_flight=True)
    gate = run(states, pdbs={"app/web": pdb})
    assert gate.released == released, "the 429's backoff (1e9) is not waited for"
    assert gate.held == {"app/a", "app/b", "app/c"} - released - ({in_flight} - {None})


def test_a_refusal_against_a_status_that_shows_room_keeps_its_backoff() -> None:
    """The cache says 1 allowed and the API refused at that very status: the cache
    is behind, or another drain took it; the pods' backoff decides."""
    roomy = budget(allowed=1)
    states = {
        "app/a": refused("a", 10.0, seen=status_key(roomy), next_attempt=45.0),
        "app/b": refused("b", 20.0, seen=status_key(roomy), next_attempt=41.0),
    }
    gate = run(states, pods=PODS[:2], pdbs={"app/web": roomy})
    assert gate.released == set() and gate.held == {"app/a", "app/b"}
    assert gate.wake == pytest.approx(1.0)
    gate = run(states, pods=PODS[:2], pdbs={"app/web": roomy}, tick=46.0)
    assert gate.released == {"app/a"} and gate.held == {"app/b"}, "one slot"


# -- pods the PDB never refused -----------------------------------------------------


def test_pods_it_never_refused_are_held_and_shown_as_refused() -> None:
    pods = [*PODS, pod("d"), pod("e", ready=False), pod("f", app="db"), pod("g", ns="other")]
    gate = run(dict(THREE), pods=pods)
    assert gate.held == {"app/a", "app/b", "app/c", "app/d"}
    assert gate.released == set()
    shown = gate.shown["app/d"]
    latest = THREE["app/c"]
    assert (shown.uid, shown.reason, shown.pdb) == ("u-d", REASON_PDB, "web")
    assert shown.message == latest.message, "the latest refusal's words"
    assert shown.since == THREE["app/a"].since, "since the earliest refusal: stable"
    assert not shown.in_flight and shown.refused_at is None
    assert set(gate.shown) == {"app/d"}, "an unready pod may pass; others are not its pods"


def test_a_never_refused_pod_gets_a_slot_left_over_by_the_refused_ones() -> None:
    pods = [pod("a"), pod("d")]
    states = {"app/a": refused("a", 10.0)}
    gate = run(states, pods=pods, pdbs={"app/web": budget(allowed=2)})
    assert gate.released == {"app/a", "app/d"} and gate.held == set()
    gate = run(states, pods=pods, pdbs={"app/web": budget(allowed=1)})
    assert gate.released == {"app/a"} and gate.held == {"app/d"}


def test_a_pod_retried_after_a_409_waits_with_the_others() -> None:
    states = dict(THREE)
    states["app/b"] = replace(states["app/b"], refused_at=None, next_attempt=40.1)  # 409
    gate = run(states, tick=41.0)
    assert "app/b" in gate.held and gate.released == set()
    assert "app/b" not in gate.shown, "it shows its own refusal"


# -- no gate ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case", ["pdb-not-in-cache", "no-pdb-named", "only-409s", "another-reason"]
)
def test_nothing_is_gated_without_a_cached_pdb_that_refused(case: str) -> None:
    states = dict(THREE)
    pdbs = PDBS
    if case == "pdb-not-in-cache":
        pdbs = {}
    elif case == "no-pdb-named":
        states = {k: replace(s, pdb=None) for k, s in states.items()}
    elif case == "only-409s":
        states = {k: replace(s, refused_at=None) for k, s in states.items()}
    else:
        states = {k: replace(s, reason=REASON_WAITING) for k, s in states.items()}
    gate = run(states, pdbs=pdbs)
    assert gate == pdbgate.Gate()


# -- through the drain plan ---------------------------------------------------------


def test_the_drain_plan_sends_nothing_while_the_pdb_stands_and_reads_as_before() -> None:
    pods = [*PODS, pod("d")]
    selection = select_pods(pods, lambda _: False)
    deadline = Deadline(start=NOW - timedelta(minutes=10), at=None, action=OnTimeout.REPORT)
    plan = plan_drain(selection, dict(THREE), PDBS, deadline, tick=40.0, now=NOW)
    assert plan.survey.due == []
    assert plan.next_wake == pytest.approx(50.0)
    assert plan.condition.reason == "Blocked"
    assert plan.condition.message == (
        "PodDisruptionBudget app/web needs 3 healthy and has 3 (0 disruptions allowed), "
        "holding 4 pods: app/a, app/b, app/c, app/d"
    )
    details = {d.name: d for d in plan.survey.report.details}
    assert {d.reason for d in details.values()} == {REASON_PDB}
    assert details["d"].disruption_budget == "web"
    assert plan.survey.stale == []
    probe = plan_drain(selection, dict(THREE), PDBS, deadline, tick=90.0, now=NOW)
    assert [p["metadata"]["name"] for p in probe.survey.due] == ["a"]
    changed = plan_drain(
        selection, dict(THREE), {"app/web": budget(allowed=4)}, deadline, tick=41.0, now=NOW
    )
    assert sorted(p["metadata"]["name"] for p in changed.survey.due) == ["a", "b", "c", "d"]


def test_a_probe_in_flight_keeps_the_condition_blocked() -> None:
    """One pod behind its PDB: asking again does not flip Blocked to Draining and
    back (two status writes a probe, transitions being written at once)."""
    selection = select_pods([pod("a")], lambda _: False)
    deadline = Deadline(start=NOW - timedelta(minutes=10), at=None, action=OnTimeout.REPORT)
    probing = {"app/a": replace(THREE["app/a"], in_flight=True)}
    plan = plan_drain(selection, probing, PDBS, deadline, tick=95.0, now=NOW)
    assert plan.condition.reason == "Blocked", plan.condition
    assert "holding 1 pod: app/a" in plan.condition.message
    first = {"app/a": PodDrainState(uid="u-a", since=SINCE, reason="Evicting", in_flight=True)}
    plan = plan_drain(selection, first, PDBS, deadline, tick=1.0, now=NOW)
    assert plan.condition.reason == "Draining", "a first attempt is not held by anything yet"
