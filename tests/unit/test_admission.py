"""The fleet budget and the maintenance window as tables (pure; injected clock).

:func:`nmo.core.maintenance.admission.decide` is a function of the ledger, the
queue, the nodes, the settings and now. The matrix crosses the budget's
two limits with the fleet's state and checks the invariants: never more
admitted than ``--max-parallel-maintenances``, never more unavailable nodes
than ``--max-unavailable`` (counting nodes already unschedulable or not
Ready), strict creation order, and nothing new outside the window.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from nmo.api.models import NodeMaintenance
from nmo.controller import ledger
from nmo.core.maintenance import admission
from nmo.kube.errors import Forbidden, Invalid, KubeError, NotFound, Transient

Obj = dict[str, Any]
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)  # a Tuesday


def nm(name: str, node: str, created: int = 0) -> NodeMaintenance:
    stamp = (NOW - timedelta(minutes=60 - created)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return NodeMaintenance.from_api(
        {
            "metadata": {"name": name, "uid": f"u-{name}", "creationTimestamp": stamp},
            "spec": {"nodeName": node},
        }
    )


def node(*, ready: bool = True, cordoned: bool = False) -> Obj:
    return {
        "spec": {"unschedulable": cordoned},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


NODES = 10


@pytest.mark.parametrize(
    ("max_parallel", "max_unavailable", "admitted", "down", "queued"),
    list(itertools.product((0, 1, 3), ("", "2", "30%"), (0, 1, 3), (0, 1, 2), (1, 4))),
)
def test_budget_matrix(
    max_parallel: int, max_unavailable: str, admitted: int, down: int, queued: int
) -> None:
    settings = admission.BudgetSettings(max_parallel=max_parallel, max_unavailable=max_unavailable)
    nodes = {f"n{i}": node(ready=not (NODES - down <= i)) for i in range(NODES)}
    ledger = {f"a{i}": f"n{i}" for i in range(admitted)}  # admitted on n0..
    queue = [nm(f"q{i}", f"n{admitted + i}", created=i) for i in range(queued)]
    fleet = admission.fleet(ledger, queue, nodes)
    decisions = [admission.decide(q, fleet, settings, NOW) for q in queue]
    admits = [d.admit for d in decisions]
    # Strict FIFO: only the head of the queue may start; the others follow it.
    assert not any(admits[1:])
    n_admit = sum(admits)
    if max_parallel:
        assert admitted + n_admit <= max(admitted, max_parallel)
    cap = settings.unavailable_cap(NODES)
    if cap is not None:
        out = set(ledger.values()) | {n for n, o in nodes.items() if admission.unavailable(o)}
        for q, ok in zip(queue, admits, strict=True):
            if ok and q.spec.node_name not in out:
                out.add(q.spec.node_name)
        assert len(out) <= max(cap, len(set(ledger.values()) | fleet.unavailable_nodes))
    if not max_parallel and cap is None:
        assert admits[0]
        assert all(d.reason == admission.REASON_ORDER for d in decisions[1:])
    for position, d in enumerate(decisions, 1):
        if not d.admit:
            assert d.position == position and d.queued == queued
            assert d.reason in (
                admission.REASON_BUDGET,
                admission.REASON_UNAVAILABLE,
                admission.REASON_ORDER,
            )
            if d.reason == admission.REASON_ORDER:
                assert position > 1
            assert d.message.startswith(f"position {position} of {queued} in the queue: ")


def test_budget_messages() -> None:
    settings = admission.BudgetSettings(max_parallel=2)
    fleet = admission.fleet({"a": "n1", "b": "n2"}, [nm("q1", "n3", 1), nm("q2", "n4", 2)], {})
    d = admission.decide(nm("q2", "n4", 2), fleet, settings, NOW)
    assert (d.admit, d.reason) == (False, "BudgetExhausted")
    assert d.message == (
        "position 2 of 2 in the queue: 2 of 2 maintenances running (--max-parallel-maintenances)"
    )
    settings = admission.BudgetSettings(max_unavailable="20%")
    nodes = {f"n{i}": node(cordoned=i == 0) for i in range(10)}
    fleet = admission.fleet({"a": "n1"}, [nm("q", "n5")], nodes)
    d = admission.decide(nm("q", "n5"), fleet, settings, NOW)
    assert d.message == (
        "position 1 of 1 in the queue: 2 of 2 nodes unavailable (--max-unavailable 20%)"
    )


def test_a_node_already_out_does_not_use_an_unavailability_slot() -> None:
    settings = admission.BudgetSettings(max_unavailable="1")
    nodes = {"n0": node(cordoned=True), "n1": node()}
    fleet = admission.fleet({}, [nm("q", "n0")], nodes)
    assert admission.decide(nm("q", "n0"), fleet, settings, NOW).admit
    assert not admission.decide(
        nm("r", "n1"), admission.fleet({}, [nm("r", "n1")], nodes), settings, NOW
    ).admit


@pytest.mark.parametrize(
    ("text", "total", "cap"), [("3", 10, 3), ("20%", 10, 2), ("25%", 10, 3), ("1%", 10, 1)]
)
def test_unavailable_cap_rounds_up(text: str, total: int, cap: int) -> None:
    assert admission.BudgetSettings(max_unavailable=text).unavailable_cap(total) == cap


@pytest.mark.parametrize("text", ["0", "-1", "0%", "150%", "two", ""])
def test_bad_max_unavailable(text: str) -> None:
    with pytest.raises(ValueError, match="invalid --max-unavailable"):
        admission.parse_max_unavailable(text)


# -- the window, with an injected clock ------------------------------------------------

BERLIN_NIGHT = admission.parse_window("Mon-Fri", "22:00", "06:00", "Europe/Berlin")


@pytest.mark.parametrize(
    ("now", "is_open"),
    [
        (datetime(2026, 12, 1, 20, 59, tzinfo=UTC), False),  # Tue 21:59 Berlin
        (datetime(2026, 12, 1, 21, 0, tzinfo=UTC), True),  # Tue 22:00 Berlin
        (datetime(2026, 12, 2, 4, 59, tzinfo=UTC), True),  # Wed 05:59, Tuesday's window
        (datetime(2026, 12, 2, 5, 0, tzinfo=UTC), False),  # Wed 06:00: closed
        (datetime(2026, 12, 5, 21, 30, tzinfo=UTC), False),  # Sat 22:30: not a window day
        (datetime(2026, 12, 5, 4, 0, tzinfo=UTC), True),  # Sat 05:00, Friday's window
    ],
)
def test_window_open(now: datetime, is_open: bool) -> None:
    assert BERLIN_NIGHT.is_open(now) is is_open


def test_window_next_open_and_queued_reason() -> None:
    now = datetime(2026, 12, 5, 12, tzinfo=UTC)  # Saturday noon
    assert BERLIN_NIGHT.next_open(now) == datetime(2026, 12, 7, 21, tzinfo=UTC)  # Mon 22:00
    settings = admission.BudgetSettings(window=BERLIN_NIGHT)
    d = admission.decide(nm("q", "n1"), admission.fleet({}, [nm("q", "n1")], {}), settings, now)
    assert (d.admit, d.reason) == (False, "OutsideWindow")
    assert d.message == (
        "position 1 of 1 in the queue: outside the maintenance window "
        "(Mon-Fri 22:00-06:00 Europe/Berlin); it opens at 2026-12-07T21:00:00Z"
    )
    assert d.retry_after == (datetime(2026, 12, 7, 21, tzinfo=UTC) - now).total_seconds()
    # Inside the window the budget decides as usual; an admitted CR is never held back.
    inside = datetime(2026, 12, 7, 22, tzinfo=UTC)
    assert admission.decide(
        nm("q", "n1"), admission.fleet({}, [nm("q", "n1")], {}), settings, inside
    ).admit
    assert admission.decide(
        nm("q", "n1"), admission.fleet({"q": "n1"}, [], {}), settings, now
    ).admit


@pytest.mark.parametrize(
    ("days", "start", "end", "tz", "error"),
    [
        ("Funday", "22:00", "06:00", "UTC", "invalid day 'Funday'"),
        ("Mon", "25:00", "06:00", "UTC", "invalid window start '25:00'"),
        ("Mon", "22:00", "6", "UTC", "invalid window end '6'"),
        ("Mon", "22:00", "06:00", "Mars/Olympus", "unknown time zone 'Mars/Olympus'"),
        ("Mon", "06:00", "06:00", "UTC", "start and end are equal"),
    ],
)
def test_bad_windows(days: str, start: str, end: str, tz: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        admission.parse_window(days, start, end, tz)


def test_day_ranges_wrap() -> None:
    assert admission.parse_days("Fri-Mon") == frozenset({4, 5, 6, 0})
    assert admission.parse_days("sat, Sun") == frozenset({5, 6})


def test_an_admitted_cr_not_yet_running_is_not_ahead_in_the_queue() -> None:
    """The ledger admitted q1; its status still says nothing: q2 is the head now."""
    settings = admission.BudgetSettings(max_parallel=2)
    q1, q2 = nm("q1", "n1", 1), nm("q2", "n2", 2)
    fleet = admission.fleet({"q1": "n1"}, [q1, q2], {})
    assert admission.decide(q2, fleet, settings, NOW).admit


@pytest.mark.parametrize(
    ("method", "error", "says"),
    [
        (
            "POST",
            NotFound('namespaces "ns" not found'),
            'namespace "ns" does not exist, so the fleet budget\'s ledger, Lease '
            "ns/nmo-maintenance-budget, cannot be created: create it (kubectl create namespace "
            "ns) or pass --budget-namespace=<namespace> (default: the leader election namespace)",
        ),
        (
            "POST",
            Forbidden(
                "is being terminated",
                body={"details": {"causes": [{"type": "NamespaceTerminating"}]}},
            ),
            'namespace "ns" is being deleted, so the fleet budget\'s ledger, Lease '
            "ns/nmo-maintenance-budget, cannot be created: wait until it is gone and create it "
            "again or pass --budget-namespace=<namespace> (default: the leader election "
            "namespace)",
        ),
        (
            "PUT",
            Forbidden("leases is forbidden: User cannot update"),
            "not allowed to update the fleet budget's ledger, Lease ns/nmo-maintenance-budget: "
            "leases is forbidden: User cannot update; grant get, create and update on "
            'leases.coordination.k8s.io in namespace "ns" (the chart\'s leader-election Role '
            "does) or pass --budget-namespace=<namespace> (default: the leader election "
            "namespace)",
        ),
    ],
)
def test_a_ledger_that_cannot_be_written_says_why_and_what_to_do(
    method: str, error: KubeError, says: str
) -> None:
    explained = ledger.explain(error, method=method, namespace="ns")
    assert isinstance(explained, ledger.LedgerUnavailable)
    assert str(explained) == says
    assert explained.status_code == error.status_code


@pytest.mark.parametrize(
    ("method", "error"),
    [
        ("GET", NotFound("gone")),  # a missing ledger is an empty one, read elsewhere
        ("PUT", Transient("PUT: ReadTimeout")),  # retried with backoff as any other
        ("POST", Invalid("bad")),
    ],
)
def test_other_ledger_errors_pass_through(method: str, error: KubeError) -> None:
    assert ledger.explain(error, method=method, namespace="ns") is error
