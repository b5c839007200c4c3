"""``nmo plan``'s pure preflight: pod split, order groups, PDB figures, verdict and JSON."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import partial
from typing import Any

import pytest

import builders
from nmo.core.maintenance.disruption import (
    MAX_WARNING_CHARS,
    MAX_WARNINGS,
    budgets_for,
    disruption_warnings,
)
from nmo.ops import preflight

Obj = dict[str, Any]
RULE = "nodemaintenance.medik8s.io/drain"
ORDER = "nodemaintenance.medik8s.io/drain-order"
WEB = {"app": "web"}


pod = partial(
    builders.pod,
    namespace="shop",
    labels={},
    annotations={},
    owner="ReplicaSet/rs",
    node="node-2",
    grace=5,
    phase="Running",
    ready=True,
)
pdb = partial(
    builders.pdb,
    namespace="shop",
    generation=2,
    match_labels=WEB,
    observed_generation=2,
    desired=3,
    current=3,
    expected=3,
)


def plan(pods: list[Obj], pdbs: list[Obj] | None = None, **kw: Any) -> preflight.Preflight:
    ds_exists = kw.pop("ds_exists", True)
    kw.setdefault("pod_rules_namespaces", {"*"})  # these tables test the pod rules
    return preflight.preflight("node-2", pods, pdbs or [], lambda _key: ds_exists, **kw)


def keys(lines: tuple[preflight.PodLine, ...]) -> list[str]:
    return [x.key for x in lines]


# -- which pods go, stay or are waited on -------------------------------------------


@pytest.mark.parametrize(
    ("p", "kw", "where", "reason"),
    [
        pytest.param(pod("web-1"), {}, "evict", "", id="plain pod"),
        pytest.param(pod("bare", owner=None), {}, "evict", "", id="no controller"),
        pytest.param(
            pod("agent", owner="DaemonSet/agent"),
            {},
            "skipped",
            preflight.Skip.DAEMONSET,
            id="daemonset",
        ),
        pytest.param(
            pod("agent", owner="DaemonSet/gone"),
            {"ds_exists": False},
            "evict",
            "",
            id="daemonset gone",
        ),
        pytest.param(pod("static", mirror=True), {}, "skipped", preflight.Skip.MIRROR, id="mirror"),
        pytest.param(
            pod("cache", labels={RULE: "skip"}), {}, "skipped", preflight.Skip.DRAIN_RULE, id="skip"
        ),
        pytest.param(
            pod("job", labels={RULE: "wait-completed"}),
            {},
            "waited",
            "WaitingForCompletion",
            id="wait-completed running",
        ),
        pytest.param(
            pod("job", labels={RULE: "wait-completed"}, phase="Succeeded"),
            {},
            "skipped",
            preflight.Skip.COMPLETED,
            id="wait-completed done",
        ),
        pytest.param(
            pod("odd", labels={RULE: "later"}), {}, "waited", "InvalidDrainRule", id="unknown rule"
        ),
        pytest.param(
            pod("db", labels={"app": "db"}),
            {"pod_selector": {"matchLabels": WEB}},
            "skipped",
            preflight.Skip.NOT_SELECTED,
            id="outside selector",
        ),
        pytest.param(
            pod("web", labels=WEB),
            {"pod_selector": {"matchLabels": WEB}},
            "evict",
            "",
            id="inside selector",
        ),
    ],
)
def test_pod_split(p: Obj, kw: dict[str, Any], where: str, reason: str) -> None:
    result = plan([p], **kw)
    lines = getattr(result, where)
    assert keys(lines) == [f"shop/{p['metadata']['name']}"]
    assert lines[0].reason == reason
    others = {"evict", "waited", "skipped"} - {where}
    assert all(not getattr(result, o) for o in others)


def test_skip_messages_say_why() -> None:
    result = plan(
        [
            pod("agent", owner="DaemonSet/agent"),
            pod("cache", labels={RULE: "skip"}),
            pod("db", labels={"app": "db"}),
        ],
        pod_selector={"matchLabels": {"app": "db"}},
    )
    why = {x.name: x.message for x in result.skipped}
    assert why["agent"] == "managed by DaemonSet shop/agent"
    assert why["cache"] == f"labelled {RULE}=skip"
    result = plan([pod("web", labels={"app": "x"})], pod_selector={"matchLabels": WEB})
    assert result.skipped[0].message == "does not match the pod selector app=web"


def test_unknown_rule_and_invalid_selector_block() -> None:
    odd = plan([pod("odd", labels={RULE: "later"})])
    assert odd.blocked
    assert "unknown drain rule" in odd.verdict()
    broken = plan([pod("web")], pod_selector={"matchExpressions": [{"key": "a", "operator": "In"}]})
    assert broken.blocked
    assert "needs at least one value" in broken.verdict()


def test_wait_completed_does_not_block() -> None:
    result = plan([pod("job", labels={RULE: "wait-completed"})])
    assert not result.blocked
    assert result.verdict() == "node-2: 0 pods to evict, 1 waited on, 0 skipped; nothing blocks now"


def test_no_pods() -> None:
    result = plan([])
    assert not result.blocked
    assert not result.groups
    assert result.verdict() == "node-2: 0 pods to evict, 0 waited on, 0 skipped; nothing blocks now"
    assert preflight.render(result).splitlines()[-1] == result.verdict()


# -- drain order --------------------------------------------------------------------


ORDERED = [
    pod("late", annotations={ORDER: "10"}),
    pod("early", annotations={ORDER: "-1"}),
    pod("dns", priority_class="system-cluster-critical"),
    pod("web"),
    pod("job", labels={RULE: "wait-completed"}),
    pod("bad", annotations={ORDER: "soon"}),
]


def test_order_groups_lowest_first_critical_with_the_others_by_default() -> None:
    result = plan(ORDERED)
    assert [(g.label, g.pods) for g in result.groups] == [
        ("order -1", ("shop/early",)),
        ("order 0", ("shop/bad", "shop/dns", "shop/job", "shop/web")),
        ("order 10", ("shop/late",)),
    ]


def test_order_groups_lowest_first_critical_last() -> None:
    result = plan(ORDERED, critical_last=True)
    assert [(g.label, g.pods) for g in result.groups] == [
        ("order -1", ("shop/early",)),
        ("order 0", ("shop/bad", "shop/job", "shop/web")),
        ("order 0 (critical pods)", ("shop/dns",)),
        ("order 10", ("shop/late",)),
    ]
    assert keys(result.evict) == ["shop/early", "shop/bad", "shop/web", "shop/dns", "shop/late"]
    assert any("is not an integer, using 0" in w for w in result.warnings)


# -- PodDisruptionBudgets -------------------------------------------------------------


@pytest.mark.parametrize(
    ("allowed", "pods_on_node", "blocks", "at_once"),
    [(0, 2, True, 0), (1, 2, False, 1), (2, 2, False, 2), (5, 2, False, 2)],
)
def test_budget_allowing(allowed: int, pods_on_node: int, blocks: bool, at_once: int) -> None:
    pods = [pod(f"web-{i}", labels=WEB) for i in range(pods_on_node)]
    result = plan(pods, [pdb("web-pdb", allowed=allowed)])
    (cov,) = result.budgets.coverage
    assert cov.key == "shop/web-pdb"
    assert cov.pods == tuple(f"shop/web-{i}" for i in range(pods_on_node))
    assert (cov.blocks, cov.at_once, result.blocked) == (blocks, at_once, blocks)
    assert all(x.budgets == ("shop/web-pdb",) for x in result.evict)


def test_blocked_verdict_names_the_budget_and_its_pods() -> None:
    result = plan(
        [
            pod("web-1", labels=WEB),
            pod("web-2", labels=WEB),
            pod("db"),
            pod("job", labels={RULE: "wait-completed"}),
            pod("agent", owner="DaemonSet/a"),
        ],
        [pdb("web-pdb", allowed=0)],
    )
    assert result.verdict() == (
        "node-2: 3 pods to evict, 1 waited on, 1 skipped; BLOCKED now by PodDisruptionBudget "
        "shop/web-pdb needs 3 healthy and has 3 (0 disruptions allowed), covering 2 pods on "
        "this node: shop/web-1, shop/web-2"
    )


def test_throttling_budget_is_reported_but_does_not_block() -> None:
    pods = [pod(f"web-{i}", labels=WEB) for i in range(3)]
    result = plan(pods, [pdb("web-pdb", allowed=1, desired=2)])
    assert result.verdict() == (
        "node-2: 3 pods to evict, 0 waited on, 0 skipped; nothing blocks now "
        "(shop/web-pdb allows 1 eviction at once for 3 pods)"
    )


def test_pod_covered_by_two_budgets_blocks() -> None:
    both = pod("web-1", labels={**WEB, "tier": "front"})
    result = plan(
        [both],
        [
            pdb("web-pdb", allowed=1),
            pdb("front-pdb", allowed=1, selector={"matchLabels": {"tier": "front"}}),
        ],
    )
    assert [c.key for c in result.budgets.coverage] == ["shop/front-pdb", "shop/web-pdb"]
    assert not result.budgets.blocking
    assert result.blocked
    assert result.evict[0].budgets == ("shop/front-pdb", "shop/web-pdb")
    assert result.blockers == [
        "pod shop/web-1 is selected by 2 PodDisruptionBudgets (shop/front-pdb, shop/web-pdb): "
        "the eviction API refuses to evict it"
    ]


@pytest.mark.parametrize(
    ("p", "budget", "held"),
    [
        pytest.param(
            pod("w", labels=WEB, phase="Pending"), pdb("b", allowed=0), False, id="pending"
        ),
        pytest.param(pod("w", labels=WEB, phase="Failed"), pdb("b", allowed=0), False, id="failed"),
        pytest.param(
            pod("w", labels=WEB, deleting=True), pdb("b", allowed=0), False, id="terminating"
        ),
        pytest.param(
            pod("w", labels=WEB, namespace="other"),
            pdb("b", allowed=0),
            False,
            id="other namespace",
        ),
        pytest.param(
            pod("w", labels=WEB), pdb("b", allowed=0, selector={}), True, id="empty selector"
        ),
        pytest.param(pod("w", labels={"app": "x"}), pdb("b", allowed=0), False, id="not selected"),
        pytest.param(
            pod("w", labels=WEB),
            pdb("b", allowed=3, observed_generation=1),
            True,
            id="stale status",
        ),
        pytest.param(
            pod("w", labels=WEB, ready=False),
            pdb("b", allowed=0, desired=2, current=2),
            False,
            id="unready, budget at its desired count",
        ),
        pytest.param(
            pod("w", labels=WEB, ready=False),
            pdb("b", allowed=0, desired=3, current=2),
            True,
            id="unready, budget below its desired count",
        ),
        pytest.param(
            pod("w", labels=WEB, ready=False),
            pdb("b", allowed=0, desired=3, current=2, policy="AlwaysAllow"),
            False,
            id="unready, AlwaysAllow",
        ),
    ],
)
def test_eviction_api_rules(p: Obj, budget: Obj, held: bool) -> None:
    budgets = budgets_for([p], [budget])
    assert budgets.blocked is held


def test_null_selector_selects_nothing() -> None:
    budget = pdb("b", allowed=0)
    budget["spec"]["selector"] = None
    assert not budgets_for([pod("w", labels=WEB)], [budget]).coverage


def test_skipped_and_waited_pods_are_not_held_by_budgets() -> None:
    result = plan(
        [pod("w", labels={**WEB, RULE: "skip"}), pod("j", labels={**WEB, RULE: "wait-completed"})],
        [pdb("web-pdb", allowed=0)],
    )
    assert not result.budgets.coverage
    assert not result.blocked


# -- JSON and text ----------------------------------------------------------------------


def test_document_shape() -> None:
    result = plan(
        [pod("web-1", labels=WEB), pod("agent", owner="DaemonSet/a")], [pdb("web-pdb", allowed=0)]
    )
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    doc = preflight.document([result], {"gone": 'node "gone" not found'}, now)
    assert doc["schema"] == "nmo.plan/v1"
    assert doc["generatedAt"] == "2026-01-02T03:04:05Z"
    assert doc["blocked"] is True
    assert doc["errors"] == [{"node": "gone", "message": 'node "gone" not found'}]
    (item,) = doc["items"]
    assert item["counts"] == {"evict": 1, "waited": 0, "skipped": 1}
    assert item["evict"] == [
        {
            "namespace": "shop",
            "name": "web-1",
            "phase": "Running",
            "order": 0,
            "critical": False,
            "graceSeconds": 5,
            "disruptionBudgets": ["shop/web-pdb"],
        }
    ]
    assert item["skipped"][0]["reason"] == "DaemonSet"
    assert item["disruptionBudgets"] == [
        {
            "namespace": "shop",
            "name": "web-pdb",
            "desiredHealthy": 3,
            "currentHealthy": 3,
            "disruptionsAllowed": 0,
            "expectedPods": 3,
            "observed": True,
            "evictionsAtOnce": 0,
            "blocking": True,
            "pods": ["shop/web-1"],
            "unhealthyPodsLetGo": [],
        }
    ]
    assert item["orderGroups"] == [
        {"order": 0, "critical": False, "label": "order 0", "pods": ["shop/web-1"]}
    ]
    assert item["verdict"] == result.verdict()


def test_text_has_every_section_and_ends_with_the_verdict() -> None:
    result = plan(
        [
            pod("web-1", labels=WEB),
            pod("agent", owner="DaemonSet/a"),
            pod("job", labels={RULE: "wait-completed"}),
        ],
        [pdb("web-pdb", allowed=0)],
    )
    text = preflight.render(result)
    for title in (
        "NODE node-2",
        "TO EVICT (1)",
        "WAITED ON (1)",
        "SKIPPED (1)",
        "DRAIN ORDER",
        "DISRUPTION BUDGETS (1)",
    ):
        assert title in text
    assert "shop/web-pdb  3        3        0        3         0        BLOCKS  shop/web-1" in text
    assert text.splitlines()[-1] == result.verdict()


# -- admission warnings -----------------------------------------------------------------


def test_warning_text() -> None:
    budgets = budgets_for([pod("web-1", labels=WEB)], [pdb("web-pdb", allowed=0)])
    assert disruption_warnings(budgets, "node-2") == [
        "PodDisruptionBudget shop/web-pdb allows no disruption now (needs 3 healthy, has 3): "
        "the drain of node-2 will wait for it"
    ]


def test_no_warning_when_a_disruption_is_allowed() -> None:
    budgets = budgets_for([pod("web-1", labels=WEB)], [pdb("web-pdb", allowed=1)])
    assert disruption_warnings(budgets, "node-2") == []


def test_warnings_stay_under_the_limits() -> None:
    long = "x" * 240
    pods = [pod(f"p{i}", labels={"i": str(i)}, namespace=long[:63]) for i in range(9)]
    pdbs = [
        pdb(f"{long}-{i}", allowed=0, namespace=long[:63], selector={"matchLabels": {"i": str(i)}})
        for i in range(9)
    ]
    warnings = disruption_warnings(budgets_for(pods, pdbs), "n" * 253)
    assert len(warnings) == MAX_WARNINGS
    assert all(len(w) <= MAX_WARNING_CHARS for w in warnings)
    assert warnings[-1].startswith("and 5 more PodDisruptionBudget problems")
