"""``nmo status``: the stable JSON view and the rich rendering (B9)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from rich.console import Console

import builders
from nmo.api import constants as c
from nmo.ops import summary

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def running_nm() -> dict[str, Any]:
    return builders.nm(
        created="2026-01-01T11:50:00Z",
        reason="kernel upgrade",
        status={
            "phase": "Running",
            "drainProgress": 50,
            "lastUpdate": "2026-01-01T11:59:00Z",
            "lastError": "not all pods evicted: 1 pending; shop/db-0: blocked by PDB db",
            "totalpods": 5,
            "evictionPods": 2,
            "errorOnLeaseCount": 0,
            "pendingPods": ["db-0"],
            "pendingPodsRefs": [{"namespace": "shop", "name": "db-0"}],
            "pendingPodsDetails": [
                {
                    "namespace": "shop",
                    "name": "db-0",
                    "reason": "DisruptionBudget",
                    "message": "Cannot evict pod as it would violate the pod's disruption budget.",
                    "disruptionBudget": "db",
                    "since": "2026-01-01T11:55:00Z",
                }
            ],
        },
    )


LEASE = builders.lease(
    c.LEASE_HOLDER,
    datetime(2026, 1, 1, 11, 58, tzinfo=UTC),
    namespace="medik8s-leases",
    duration=3600,
    acquired=None,
)


def event(kind: str, name: str, reason: str, t: str) -> dict[str, Any]:
    return {
        "involvedObject": {"kind": kind, "name": name},
        "reason": reason,
        "type": "Normal",
        "message": reason,
        "lastTimestamp": t,
    }


EVENTS = [
    event("Node", "n1", "UncordonNode", "2026-01-01T11:52:00Z"),
    event(c.KIND, "nm-1", "BeginMaintenance", "2026-01-01T11:50:00Z"),
    event(c.KIND, "other", "BeginMaintenance", "2026-01-01T11:51:00Z"),
    event("Node", "n2", "Something", "2026-01-01T11:51:00Z"),
]


def test_summary_is_stable_json() -> None:
    s = summary.summarize(running_nm(), lease=LEASE, events=EVENTS, now=NOW)
    assert list(s) == [
        "name", "node", "reason", "phase", "drainProgress", "deleting", "createdAt",
        "lastUpdate", "lastError", "totalPods", "evictionPods", "errorOnLeaseCount",
        "pendingPods", "conditions", "lease", "events",
    ]  # fmt: skip
    assert s["pendingPods"] == [
        {
            "namespace": "shop",
            "name": "db-0",
            "reason": "DisruptionBudget",
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "disruptionBudget": "db",
            "since": "2026-01-01T11:55:00Z",
        }
    ]
    assert s["lease"] == {
        "name": "node-n1",
        "namespace": "medik8s-leases",
        "holder": c.LEASE_HOLDER,
        "renewTime": "2026-01-01T11:58:00Z",
        "expires": "2026-01-01T12:58:00Z",
        "valid": True,
    }
    assert [e["reason"] for e in s["events"]] == ["BeginMaintenance", "UncordonNode"]
    doc = summary.document([s], NOW)
    assert doc["schema"] == summary.SCHEMA and doc["items"] == [s]
    json.dumps(doc)  # serializable as is


def test_go_nmo_cr_falls_back_to_refs_and_no_lease() -> None:
    nm = running_nm()
    del nm["status"]["pendingPodsDetails"]
    s = summary.summarize(nm, lease=None, events=[], now=NOW)
    assert s["pendingPods"][0]["name"] == "db-0"
    assert s["pendingPods"][0]["reason"] is None
    assert s["lease"] is None


def test_expired_lease_is_not_valid() -> None:
    lease = {**LEASE, "spec": {**LEASE["spec"], "renewTime": "2026-01-01T10:00:00.000000Z"}}
    view = summary.lease_view(lease, NOW)
    assert view is not None and view["valid"] is False


def render_text(summaries: list[dict[str, Any]]) -> str:
    console = Console(record=True, width=160, color_system=None)
    console.print(summary.render(summaries, NOW))
    return console.export_text()


def test_render_shows_why_pods_are_pending() -> None:
    text = render_text([summary.summarize(running_nm(), lease=LEASE, events=EVENTS, now=NOW)])
    for expected in (
        "nodemaintenance/nm-1",
        "Running",
        "50%",
        "shop/db-0",
        "DisruptionBudget",
        "5m ago",
        "node-maintenance, valid, expires in 58m",
        "not all pods evicted",
        "BeginMaintenance",
    ):
        assert expected in text, expected


def test_render_succeeded_and_empty() -> None:
    nm = running_nm()
    nm["status"].update(phase="Succeeded", drainProgress=100, pendingPodsDetails=[], lastError="")
    text = render_text([summary.summarize(nm, lease=None, events=[], now=NOW)])
    assert "Succeeded" in text and "100%" in text and "Pending pods" not in text
    assert "No NodeMaintenance found." in render_text([])


def condition(type_: str, status: str, reason: str, message: str) -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T11:59:00Z"}  # fmt: skip


@pytest.mark.parametrize(
    ("held", "shown"),
    [
        (
            condition(c.CONDITION_QUEUED, "True", "Soaking", "node n0 returned 20s ago"),
            "Waiting Queued Soaking: node n0 returned 20s ago",
        ),
        (
            condition(c.CONDITION_QUEUED, "True", "AlertFiring", "alerts firing: NodeDown"),
            "Waiting Queued AlertFiring: alerts firing: NodeDown",
        ),
        (
            condition(c.CONDITION_VOLUMES_DETACHED, "False", "Waiting", "csi-1 still attached"),
            "Waiting VolumesDetached Waiting: csi-1 still attached",
        ),
        (condition(c.CONDITION_QUEUED, "False", "Admitted", "started"), None),
        (condition(c.CONDITION_VOLUMES_DETACHED, "True", "Detached", "none left"), None),
    ],
)
def test_status_says_what_the_maintenance_waits_for(
    held: dict[str, str], shown: str | None
) -> None:
    """Queued (fleet limits, window, soak, alert gate) and VolumesDetached hold a
    maintenance with no pod pending: the text view names them, -o json lists
    every condition."""
    nm = running_nm()
    nm["status"]["conditions"] = [held]
    s = summary.summarize(nm, lease=None, events=[], now=NOW)
    assert s["conditions"] == [
        {"type": held["type"], "status": held["status"], "reason": held["reason"],
         "message": held["message"], "since": "2026-01-01T11:59:00Z"}
    ]  # fmt: skip
    text = " ".join(render_text([s]).split())
    if shown is None:
        assert "Waiting" not in text
    else:
        assert shown in text, text


HOSTILE = ("[/]", "[link=https://evil.example/]click[/link]", "[bold red]x", "[")


@pytest.mark.parametrize("text", HOSTILE)
def test_cluster_strings_are_never_markup(text: str) -> None:
    """Reason, errors, pod and event texts come from the cluster: shown as they are."""
    nm = running_nm()
    nm["spec"]["reason"] = text
    nm["status"]["lastError"] = text
    nm["status"]["pendingPodsDetails"][0] |= {"reason": text, "message": text}
    events = [event(c.KIND, "nm-1", "BeginMaintenance", "2026-01-01T11:50:01Z") | {"message": text}]
    lease = {**LEASE, "spec": {**LEASE["spec"], "holderIdentity": text}}
    view = summary.summarize(nm, lease=lease, events=events, now=NOW)
    console = Console(width=400, force_terminal=True, color_system="truecolor")
    with console.capture() as captured:
        console.print(summary.render([view], NOW))
    raw = captured.get()
    assert "\x1b]8;" not in raw  # no OSC 8 terminal hyperlink
    recorder = Console(record=True, width=400, color_system=None)
    recorder.print(summary.render([view], NOW))
    plain = recorder.export_text()
    for field in ("Reason", "Last error"):
        line = next(x for x in plain.splitlines() if field in x)
        assert text in line
    assert plain.count(text) >= 6
