"""Pods' own drain rules are tenant input (issue 20): off by default, honoured
only for the namespaces an admin allows, and an admin cap on every drain."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from test_drainplan import NOW, START, deadline, no_ds, pod
from test_planner import node_obj, observed
from test_planner import pod as plan_pod

import builders
from nmo.api import constants as c
from nmo.api.models import NodeMaintenance, OnTimeout
from nmo.core.maintenance import planner, policy
from nmo.core.maintenance.drainplan import Deadline, deadline_of, plan_drain, timed_out_message
from nmo.core.maintenance.observed import Recall
from nmo.core.maintenance.podselect import (
    order_key,
    parse_namespaces,
    rules_from,
    select_pods,
)

Obj = dict[str, Any]

SKIP = {c.DRAIN_RULE_LABEL: c.DRAIN_RULE_SKIP}
WAIT = {c.DRAIN_RULE_LABEL: c.DRAIN_RULE_WAIT_COMPLETED}


def names(pods: list[Obj]) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods)


@pytest.mark.parametrize(
    "tenant",
    [
        pytest.param(pod("t", labels=SKIP), id="skip"),
        pytest.param(pod("t", labels=WAIT), id="wait-completed"),
        pytest.param(pod("t", labels={c.DRAIN_RULE_LABEL: "never"}), id="unknown-rule"),
        pytest.param(pod("t", order="-1"), id="drain-order"),
        pytest.param(pod("t", labels=WAIT, order="-1"), id="wait-completed-order-minus-one"),
    ],
)
def test_by_default_no_pod_steers_its_drain(tenant: Obj) -> None:
    """The issue's hold: wait-completed (or any value) with drain-order -1 held
    every other eviction forever. By default every pod is evicted at once."""
    other = pod("other")
    sel = select_pods([tenant, other], no_ds)
    assert names(sel.evict) == ["other", "t"]
    assert sel.skipped == [] and sel.wait == [] and sel.invalid == []
    assert names(sel.ignored) == ["t"]
    (said,) = [w for w in sel.warnings if w.startswith("ignoring the drain rules")]
    assert "app/t (nodemaintenance.medik8s.io/" in said
    out = plan_drain(sel, {}, {}, deadline(None), tick=0.0, now=NOW)
    assert names(out.survey.due) == ["other", "t"], "nothing holds the others back"
    detail = next(d for d in out.survey.report.details if d.name == "t")
    assert "drain rules ignored" in detail.message and "not allowed" in detail.message
    assert order_key(tenant) == (0, 0)


def test_only_the_allowed_namespaces_steer_their_drain() -> None:
    allowed = pod("a", ns="team-a", labels=SKIP)
    tenant = pod("b", ns="team-b", labels=SKIP)
    sel = select_pods([allowed, tenant], no_ds, rules=rules_from({"team-a"}))
    assert names(sel.skipped) == ["a"]
    assert names(sel.evict) == ["b"] and names(sel.ignored) == ["b"]
    everyone = select_pods([allowed, tenant], no_ds, rules=rules_from({"*"}))
    assert names(everyone.skipped) == ["a", "b"] and everyone.ignored == []


def test_the_crs_pod_selector_is_the_admins_and_always_applies() -> None:
    outside = pod("x", labels={"tier": "db"})
    sel = select_pods([outside], no_ds, {"matchLabels": {"tier": "web"}})
    assert names(sel.skipped) == ["x"] and sel.ignored == []


def test_an_ignored_order_does_not_hold_later_pods() -> None:
    first = pod("first", ns="team-a", order="-5")
    tenant = pod("tenant", ns="team-b", order="-9", labels=WAIT)
    rules = rules_from({"team-a"})
    sel = select_pods([first, tenant], no_ds, rules=rules)
    out = plan_drain(sel, {}, {}, deadline(None), tick=0.0, now=NOW, rules=rules)
    assert names(out.survey.due) == ["first"], "team-a's order -5 goes first"
    assert order_key(tenant, rules=rules) == (0, 0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", frozenset()),
        ("team-a, team-b", frozenset({"team-a", "team-b"})),
        ("*", frozenset({"*"})),
    ],
)
def test_the_namespaces_flag_parses(text: str, expected: frozenset[str]) -> None:
    assert parse_namespaces(text) == expected


@pytest.mark.parametrize("bad", ["Team", "a_b", "-x", "x" * 64])
def test_the_namespaces_flag_names_a_bad_entry(bad: str) -> None:
    with pytest.raises(ValueError, match=repr(bad).replace("*", r"\*")):
        parse_namespaces(f"ok,{bad}")


def test_the_first_pass_says_once_which_rules_it_ignored() -> None:
    tenant = plan_pod("t")
    tenant["metadata"]["labels"] = SKIP
    nm = NodeMaintenance.from_api(
        {
            "metadata": {"name": "nm-1", "uid": "uid-nm-1", "finalizers": [c.FINALIZER]},
            "spec": {"nodeName": "n1"},
            "status": {},
        }
    )
    first = planner.plan(
        observed(nm, node=node_obj(), pods=(tenant, plan_pod("b")), recall=Recall())
    )
    (event,) = [e for e in first.events if e.event[0] == c.EVENT_DRAIN_RULES_IGNORED]
    assert event.warning and "app/t (nodemaintenance.medik8s.io/drain=skip)" in event.event[1]
    assert names(list(first.evict)) == ["b", "t"]
    assert first.status is not None
    running = nm.model_copy(update={"status": first.status})
    again = planner.plan(observed(running, node=node_obj(), pods=(tenant, plan_pod("b"))))
    assert all(e.event[0] != c.EVENT_DRAIN_RULES_IGNORED for e in again.events), "once"
    allowed = policy.PlanSettings(pod_rules_namespaces=frozenset({"app"}))
    honoured = planner.plan(
        observed(nm, node=node_obj(), pods=(tenant, plan_pod("b")), recall=Recall()), allowed
    )
    assert names(list(honoured.evict)) == ["b"]
    assert all(e.event[0] != c.EVENT_DRAIN_RULES_IGNORED for e in honoured.events)


# -- the admin's cap on every drain ---------------------------------------------


def nm_with(timeout: int | None, action: str | None = None) -> NodeMaintenance:
    drain: Obj = {}
    if timeout is not None:
        drain["timeoutSeconds"] = timeout
    if action is not None:
        drain["onTimeout"] = action
    start = START.strftime("%Y-%m-%dT%H:%M:%SZ")
    return NodeMaintenance.from_api(
        builders.nm("nm", drain=drain or None, status={"drainStartTime": start})
    )


def capped(nm: NodeMaintenance, seconds: int) -> Deadline:
    """The deadline under an operator cap of ``seconds`` with action Delete."""
    return deadline_of(
        nm,
        NOW,
        default_timeout=0,
        default_action=OnTimeout.REPORT,
        cap_seconds=seconds,
        cap_action=OnTimeout.DELETE,
    )


@pytest.mark.parametrize(
    ("timeout", "action", "at", "expected_action", "is_capped"),
    [
        pytest.param(None, None, 600, OnTimeout.DELETE, True, id="no-cr-deadline"),
        pytest.param(0, "Report", 600, OnTimeout.DELETE, True, id="cr-says-none"),
        pytest.param(3600, "Report", 600, OnTimeout.DELETE, True, id="cr-later"),
        pytest.param(60, "Abort", 60, OnTimeout.ABORT, False, id="cr-earlier"),
    ],
)
def test_no_cr_lifts_the_operators_cap(
    timeout: int | None, action: str | None, at: int, expected_action: OnTimeout, is_capped: bool
) -> None:
    dl = capped(nm_with(timeout, action), 600)
    assert dl.at == START + timedelta(seconds=at)
    assert dl.action is expected_action and dl.capped is is_capped


def test_the_cap_is_named_when_it_is_reached() -> None:
    dl = capped(nm_with(None), 50)
    assert "(the operator's cap, --max-drain-seconds)" in timed_out_message(dl, 2)


def test_at_a_capped_delete_deadline_pods_held_by_their_own_rule_are_deleted() -> None:
    held = pod("held", labels=WAIT)
    rules = rules_from({"*"})
    sel = select_pods([held, pod("other")], no_ds, rules=rules)
    dl = capped(nm_with(None), 50)
    out = plan_drain(sel, {}, {}, dl, tick=0.0, now=NOW, rules=rules)
    assert out.timed_out
    assert names([p for p, _ in out.force]) == ["held", "other"]


def test_the_preflight_mirrors_the_operators_default() -> None:
    from nmo.ops import preflight

    tenant = pod("t", labels=SKIP)
    default = preflight.preflight("n1", [tenant], [], no_ds)
    assert [p.name for p in default.evict] == ["t"] and default.skipped == ()
    assert any(w.startswith("ignoring the drain rules") for w in default.warnings)
    allowed = preflight.preflight("n1", [tenant], [], no_ds, pod_rules_namespaces={"app"})
    assert allowed.evict == () and [p.name for p in allowed.skipped] == ["t"]
