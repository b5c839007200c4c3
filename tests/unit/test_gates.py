"""The fleet's gates (issue 23 part 4): the soak after a node returns and the
alert gate, as pure decisions and as the planner applies them."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from test_planner import NOW, nm_obj, node_obj, observed

from nmo.core.maintenance import admission, gates, planner, policy
from nmo.core.maintenance.admission import Admission, BudgetSettings
from nmo.core.maintenance.gates import AlertsSeen, Returned
from nmo.core.maintenance.observed import Ledger, LedgerWrite, Observed, Work

URL = "https://prometheus.monitoring.svc:9091"
ANSWERED = AlertsSeen(URL, firing=("KubeNodeNotReady", "Watchdog"), answered=True)
QUIET = AlertsSeen(URL, firing=("Watchdog",), answered=True)
DOWN = AlertsSeen(URL, error="connection refused")
NEVER = AlertsSeen(URL)
BACK = Returned("old", "n9", NOW - timedelta(seconds=20))  # 20 s ago


def alert(name: str | None, state: str = "firing") -> dict[str, Any]:
    labels = {} if name is None else {"alertname": name, "severity": "warning"}
    return {"labels": labels, "state": state, "annotations": {}}


def answer(*alerts: dict[str, Any]) -> dict[str, Any]:
    return {"status": "success", "data": {"alerts": list(alerts)}}


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (answer(), ()),
        (answer(alert("B"), alert("A")), ("A", "B")),
        (answer(alert("A"), alert("A")), ("A",)),  # one name per alert, whatever the labels
        (answer(alert("A", "pending"), alert("B", "inactive")), ()),  # not firing (yet)
        (answer(alert(None), alert("")), ()),  # no alert name
        (answer("junk", alert("C")), ("C",)),  # type: ignore[arg-type]
    ],
)
def test_firing_alerts_are_the_names_of_firing_ones(body: Any, names: tuple[str, ...]) -> None:
    assert gates.firing_alerts(body) == names


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        {"status": "error", "error": "bad"},
        {"status": "success"},
        {"status": "success", "data": {"alerts": "no"}},
    ],
)
def test_an_answer_that_is_not_an_alerts_list_is_an_error(body: Any) -> None:
    with pytest.raises(ValueError, match=r"Prometheus|alerts"):
        gates.firing_alerts(body)


@pytest.mark.parametrize(
    ("pattern", "blocked"),
    [
        (".*", ("KubeNodeNotReady", "Watchdog")),
        ("NotReady", ("KubeNodeNotReady",)),  # unanchored, as kured's filter
        ("^NotReady$", ()),
        ("^(KubeNodeNotReady|Etcd.*)$", ("KubeNodeNotReady",)),
        ("Nothing", ()),
    ],
)
def test_blocked_by_searches_the_alert_names(pattern: str, blocked: tuple[str, ...]) -> None:
    assert gates.blocked_by(ANSWERED.firing, pattern) == blocked


@pytest.mark.parametrize(
    ("returned", "soak", "left"),
    [
        (None, 60, 0.0),
        (BACK, 0, 0.0),  # no soak configured
        (BACK, 15, 0.0),  # over
        (BACK, 20, 0.0),  # just over
        (BACK, 60, 40.0),
        (replace(BACK, at=NOW + timedelta(hours=1)), 60, 60.0),  # a clock ahead: one soak
    ],
)
def test_soak_left(returned: Returned | None, soak: float, left: float) -> None:
    assert gates.soak_left(returned, soak, NOW) == left


def test_the_ledger_record_round_trips_and_a_bad_one_is_none() -> None:
    back = Returned("nm-a", "node-a", datetime(2026, 12, 1, 12, 0, 1, 250000, tzinfo=UTC))
    assert gates.decode_returned(gates.encode_returned(back)) == back
    for bad in (None, "", "{", "[]", '{"at": "yesterday"}', '{"at": "2026-12-01T12:00:00"}'):
        assert gates.decode_returned(bad) is None, bad


ADMIT = Admission(True, admission.REASON_ADMITTED, "admitted", 1, 3)
ORDER = Admission(False, admission.REASON_ORDER, "position 2 of 3 ...", 2, 3, retry_after=1.0)
BUDGET_FULL = Admission(False, admission.REASON_BUDGET, "position 1 of 3: 1 of 1 ...", 1, 3)
GATED = BudgetSettings(max_parallel=1, soak_seconds=60, blocking_url=URL, blocking_alerts="Node")


@pytest.mark.parametrize(
    ("decision", "returned", "alerts", "reason", "message", "retry"),
    [
        (ADMIT, None, QUIET, "Admitted", "admitted", None),
        (BUDGET_FULL, BACK, ANSWERED, "BudgetExhausted", BUDGET_FULL.message, None),
        (
            ADMIT,
            None,
            ANSWERED,
            "AlertFiring",
            "position 1 of 3 in the queue: alert KubeNodeNotReady firing on Prometheus "
            "(--blocking-alerts 'Node')",
            30.0,
        ),
        (
            ORDER,
            None,
            ANSWERED,
            "AlertFiring",
            "position 2 of 3 in the queue: alert KubeNodeNotReady firing on Prometheus "
            "(--blocking-alerts 'Node')",
            30.0,  # not every second while the gate holds
        ),
        (
            ADMIT,
            None,
            DOWN,
            "PrometheusUnavailable",
            f"position 1 of 3 in the queue: cannot reach Prometheus at {URL}: connection "
            "refused; new maintenances wait until it answers (fail-closed, "
            "--blocking-prometheus-url)",
            30.0,
        ),
        (
            ADMIT,
            None,
            NEVER,
            "PrometheusUnavailable",
            f"position 1 of 3 in the queue: waiting for the first answer from Prometheus at "
            f"{URL} (--blocking-prometheus-url)",
            30.0,
        ),
        (
            ADMIT,
            BACK,
            QUIET,
            "Soaking",
            "position 1 of 3 in the queue: soaking after node n9 returned from maintenance old "
            "at 2026-12-01T11:59:40Z; the next maintenance starts after 2026-12-01T12:00:40Z "
            "(--fleet-soak-seconds 60)",
            40.0,
        ),
        (ADMIT, BACK, ANSWERED, "AlertFiring", None, 30.0),  # the alert is said first
        (ADMIT, replace(BACK, at=NOW - timedelta(minutes=5)), QUIET, "Admitted", "admitted", None),
    ],
)
def test_hold(
    decision: Admission,
    returned: Returned | None,
    alerts: AlertsSeen,
    reason: str,
    message: str | None,
    retry: float | None,
) -> None:
    out = gates.hold(decision, returned=returned, alerts=alerts, settings=GATED, now=NOW)
    assert out.reason == reason
    assert out.admit is (reason == "Admitted")
    if message is not None:
        assert out.message == message
    assert out.retry_after == retry
    if not out.admit:
        assert (out.position, out.queued) == (decision.position, decision.queued)


def test_many_alerts_are_named_ten_at_most() -> None:
    many = AlertsSeen(URL, firing=tuple(f"A{i:02d}" for i in range(13)), answered=True)
    every = replace(GATED, blocking_alerts="^A")
    out = gates.hold(ADMIT, returned=None, alerts=many, settings=every, now=NOW)
    assert "alerts A00, A01, A02, A03, A04, A05, A06, A07, A08, A09 and 3 more firing" in (
        out.message
    )


def test_the_gates_turn_the_budget_machinery_on() -> None:
    assert not BudgetSettings().enabled
    assert BudgetSettings(soak_seconds=1).enabled
    assert BudgetSettings(blocking_url=URL, blocking_alerts=".*").enabled


# -- as the planner applies them ---------------------------------------------

SOAK = replace(policy.SETTINGS, budget=BudgetSettings(max_parallel=2, soak_seconds=60))
ALERTS = replace(
    policy.SETTINGS, budget=BudgetSettings(blocking_url=URL, blocking_alerts="NotReady")
)
NODES = {"n1": node_obj(), "n9": node_obj(name="n9")}
MINE = {"uid": "uid-nm-1", "node": "n1"}


def waiting(
    *,
    entries: dict[str, dict[str, str]] | None = None,
    gone: frozenset[str] = frozenset(),
    returned: Returned | None = None,
    alerts: AlertsSeen | None = None,
) -> Observed:
    nm = nm_obj()
    return observed(
        nm,
        node=node_obj(),
        ledger=Ledger(entries=entries or {}, gone=gone, returned=returned),
        fleet=admission.fleet({}, [nm], NODES),
        alerts=alerts,
    )


def test_a_cr_the_budget_admits_soaks_after_a_return_and_writes_nothing() -> None:
    late = replace(BACK, at=NOW - timedelta(seconds=50))
    plan = planner.plan(waiting(returned=late), SOAK)
    assert plan.work is Work.QUEUED and plan.ledger is None and plan.node_patch is None
    assert plan.status is not None
    (cond,) = plan.status.conditions or []
    assert (cond.type, cond.status.value, cond.reason) == ("Queued", "True", "Soaking")
    assert plan.result.requeue_after == 10.0  # when the soak ends


def test_after_the_soak_it_starts() -> None:
    over = replace(BACK, at=NOW - timedelta(seconds=61))
    plan = planner.plan(waiting(returned=over), SOAK)
    assert plan.work is Work.RUN
    assert plan.ledger == LedgerWrite({"nm-1": MINE}, admitted="nm-1")


def test_a_maintenance_already_admitted_is_never_held() -> None:
    for obs in (
        waiting(entries={"nm-1": MINE}, returned=BACK),
        waiting(entries={"nm-1": MINE}, alerts=ANSWERED),
        waiting(entries={"nm-1": MINE}, alerts=DOWN),
    ):
        gated = replace(SOAK, budget=replace(SOAK.budget, blocking_url=URL, blocking_alerts="."))
        plan = planner.plan(obs, gated)
        assert plan.work is Work.RUN and plan.ledger is None


def test_a_return_is_recorded_with_the_release_when_there_is_a_soak() -> None:
    entries = {"nm-1": MINE, "b": {"uid": "u-b", "node": "n9"}}
    leave = planner.plan(
        replace(observed(nm_obj(deleting=True)), ledger=Ledger(entries=entries)), SOAK
    )
    assert leave.ledger == LedgerWrite(
        {"b": {"uid": "u-b", "node": "n9"}},
        released="nm-1",
        returned=Returned("nm-1", "n1", NOW),
    )
    plain = replace(SOAK, budget=BudgetSettings(max_parallel=2))
    leave = planner.plan(
        replace(observed(nm_obj(deleting=True)), ledger=Ledger(entries=entries)), plain
    )
    assert leave.ledger is not None and leave.ledger.returned is None, "no soak: no record"


def test_a_pruned_slot_starts_the_soak_now() -> None:
    entries = {"old": {"uid": "u-old", "node": "n9"}}
    plan = planner.plan(waiting(entries=entries, gone=frozenset({"old"})), SOAK)
    assert plan.work is Work.QUEUED
    assert plan.ledger == LedgerWrite({}, returned=Returned("old", "n9", NOW))
    assert plan.status is not None
    assert [x.reason for x in plan.status.conditions or []] == ["Soaking"]


@pytest.mark.parametrize(
    ("alerts", "reason", "named"),
    [
        (ANSWERED, "AlertFiring", "alert KubeNodeNotReady firing"),
        (DOWN, "PrometheusUnavailable", "cannot reach Prometheus"),
        (NEVER, "PrometheusUnavailable", "waiting for the first answer"),
    ],
)
def test_the_alert_gate_queues_a_new_maintenance(
    alerts: AlertsSeen, reason: str, named: str
) -> None:
    plan = planner.plan(waiting(alerts=alerts), ALERTS)
    assert plan.work is Work.QUEUED and plan.ledger is None and plan.metadata is None
    assert plan.status is not None
    (cond,) = plan.status.conditions or []
    assert (cond.reason, cond.status.value) == (reason, "True")
    assert named in (cond.message or "")


def test_no_matching_alert_lets_it_start() -> None:
    plan = planner.plan(waiting(alerts=QUIET), ALERTS)
    assert plan.work is Work.RUN
    assert plan.ledger == LedgerWrite({"nm-1": MINE}, admitted="nm-1")


def test_a_return_stamped_ahead_of_this_clock_is_stamped_again_now() -> None:
    """The record is stamped by the clock of the replica that freed the slot; a
    leader whose clock is behind it (by an hour here) would hold the fleet for
    that hour plus the soak, not one soak. It holds, and records the return
    again at its own now, so the soak ends one soak from now on its clock."""
    ahead = replace(BACK, at=NOW + timedelta(hours=1))
    plan = planner.plan(waiting(returned=ahead), SOAK)
    assert plan.work is Work.QUEUED
    assert plan.ledger == LedgerWrite({}, returned=replace(ahead, at=NOW))
    assert plan.status is not None
    (cond,) = plan.status.conditions or []
    ends = (NOW + timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert cond.reason == "Soaking" and f"starts after {ends}" in (cond.message or "")
    again = planner.plan(waiting(returned=replace(ahead, at=NOW)), SOAK)
    assert again.work is Work.QUEUED and again.ledger is None, "written once"
    # A second of skew is not worth a write.
    near = planner.plan(waiting(returned=replace(BACK, at=NOW + timedelta(seconds=1))), SOAK)
    assert near.work is Work.QUEUED and near.ledger is None


def test_a_slot_pruned_in_an_admitted_crs_pass_starts_the_soak_too() -> None:
    """A CR already in the ledger whose start is not recorded yet (its status
    write failed after the ledger's) prunes a vanished CR's slot in its pass:
    that pruning starts the soak as any other does, or the next queued CR
    would take the freed slot at once."""
    entries = {"nm-1": MINE, "old": {"uid": "u-old", "node": "n9"}}
    plan = planner.plan(waiting(entries=entries, gone=frozenset({"old"})), SOAK)
    assert plan.work is Work.RUN
    assert plan.ledger == LedgerWrite({"nm-1": MINE}, returned=Returned("old", "n9", NOW))
