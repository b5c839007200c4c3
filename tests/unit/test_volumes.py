"""Volume-safe completion as tables (issue 23 part 2): which attachments a
finished drain waits for, and what the planner does while, after and when
it cannot tell (no cluster, no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from nmo.api import constants as c
from nmo.api.models import NodeMaintenance, Phase
from nmo.core.maintenance import planner, policy, volumes
from nmo.core.maintenance.observed import Observed, Read, ReadKind, Recall, VolumeFacts
from nmo.core.maintenance.volumes import waited_for
from nmo.kube import slim

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
Obj = dict[str, Any]
ON = policy.PlanSettings(volume_detach=True, volume_detach_timeout=300)


def va(name: str, pv: str | None = None, *, node: str = "n1", deleting: bool = False) -> Obj:
    meta: Obj = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T11:59:00Z"
    source: Obj = (
        {"persistentVolumeName": pv}
        if pv
        else {
            "inlineVolumeSpec": {"accessModes": ["ReadWriteOnce"], "csi": {"volumeHandle": "h-1"}}
        }
    )
    return {"metadata": meta, "spec": {"nodeName": node, "source": source}}


def pv(name: str, claim: str | None, mode: str = "ReadWriteOnce") -> Obj:
    spec: Obj = {"accessModes": [mode]}
    if claim:
        ns, cname = claim.split("/")
        spec["claimRef"] = {"namespace": ns, "name": cname}
    return {"metadata": {"name": name}, "spec": spec}


def pod(name: str, claims: list[str], ns: str = "app") -> Obj:
    vols = [
        {"name": f"v{i}", "persistentVolumeClaim": {"claimName": cl}} for i, cl in enumerate(claims)
    ]
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"u-{name}"},
        "spec": {"nodeName": "n1", "volumes": vols},
    }


def test_what_is_waited_for() -> None:
    facts = VolumeFacts(
        attachments=(
            va("a-rwo", "pv-rwo", deleting=True),
            va("b-rwx", "pv-rwx"),
            va("c-rox", "pv-rox"),
            va("d-kept", "pv-kept"),
            va("e-gone-pv", "pv-unknown"),
            va("f-inline"),
        ),
        volumes={
            "pv-rwo": pv("pv-rwo", "app/data"),
            "pv-rwx": pv("pv-rwx", "app/shared", "ReadWriteMany"),
            "pv-rox": pv("pv-rox", "app/ro", "ReadOnlyMany"),
            "pv-kept": pv("pv-kept", "app/agent-state"),
            "pv-unknown": None,
        },
    )
    staying = (pod("agent", ["agent-state"]),)
    got = waited_for(facts, staying)
    assert [a.name for a in got] == ["a-rwo", "e-gone-pv", "f-inline"]
    assert got[0].describe() == "a-rwo (PersistentVolume pv-rwo, claim app/data, detaching)"
    assert got[1].describe() == "e-gone-pv (PersistentVolume pv-unknown)"
    assert got[2].describe() == "f-inline (inline volume h-1)"


def test_a_claim_of_the_same_name_in_another_namespace_does_not_keep_a_volume() -> None:
    facts = VolumeFacts(attachments=(va("a", "pv-1"),), volumes={"pv-1": pv("pv-1", "app/data")})
    assert [a.name for a in waited_for(facts, (pod("other", ["data"], ns="elsewhere"),))] == ["a"]


def test_a_generic_ephemeral_volume_of_a_staying_pod_is_kept() -> None:
    staying = {
        "metadata": {"name": "agent", "namespace": "app"},
        "spec": {"volumes": [{"name": "scratch", "ephemeral": {}}]},
    }
    facts = VolumeFacts(
        attachments=(va("a", "pv-1"),), volumes={"pv-1": pv("pv-1", "app/agent-scratch")}
    )
    assert waited_for(facts, (staying,)) == ()


def test_the_slim_pod_keeps_the_claims_volume_safe_completion_reads() -> None:
    full = pod("agent", ["agent-state"])
    full["spec"]["volumes"].append({"name": "cfg", "configMap": {"name": "x"}})
    full["spec"]["volumes"].append({"name": "tmp", "emptyDir": {"medium": "Memory"}})
    kept = slim.pod(full)["spec"]["volumes"]
    assert kept == [
        {"name": "v0", "persistentVolumeClaim": {"claimName": "agent-state"}},
        {"name": "tmp", "emptyDir": {}},
    ]
    facts = VolumeFacts(
        attachments=(va("a", "pv-1"),), volumes={"pv-1": pv("pv-1", "app/agent-state")}
    )
    assert waited_for(facts, (slim.pod(full),)) == ()


def test_slim_attachment_and_volume_keep_what_the_decision_reads() -> None:
    raw = va("a", "pv-1", deleting=True) | {"status": {"attached": True}}
    raw["metadata"]["managedFields"] = [{"manager": "kcm"}]
    assert slim.volume_attachment(raw) == {
        "metadata": {"name": "a", "deletionTimestamp": "2026-12-01T11:59:00Z"},
        "spec": {"nodeName": "n1", "source": {"persistentVolumeName": "pv-1"}},
    }
    full_pv = pv("pv-1", "app/data") | {"status": {"phase": "Bound"}}
    full_pv["spec"]["csi"] = {"driver": "d", "volumeHandle": "h"}
    full_pv["spec"]["claimRef"]["uid"] = "u"
    assert slim.persistent_volume(full_pv) == pv("pv-1", "app/data")


# -- the planner -------------------------------------------------------------


def nm(
    *, drain: Obj | None = None, conditions: list[Obj] | None = None, phase: str = "Running"
) -> NodeMaintenance:
    node = "n1"
    spec: Obj = {"nodeName": node}
    if drain is not None:
        spec["drain"] = drain
    status: Obj = {
        "phase": phase,
        "totalpods": 1,
        "evictionPods": 1,
        "drainProgress": 100,
        "pendingPods": [],
        "drainStartTime": "2026-12-01T11:00:00Z",
        "conditions": conditions or [],
    }
    return NodeMaintenance.from_api(
        {
            "metadata": {
                "name": "nm-1",
                "uid": "uid-nm-1",
                "resourceVersion": "10",
                "generation": 1,
                "creationTimestamp": "2026-12-01T11:00:00Z",
                "finalizers": [c.FINALIZER],
            },
            "spec": spec,
            "status": status,
        }
    )


NODE: Obj = {
    "metadata": {
        "name": "n1",
        "uid": "node-uid",
        "resourceVersion": "7",
        "labels": {c.EXCLUDE_FROM_REMEDIATION_LABEL: "true"},
    },
    "spec": {
        "taints": [{"key": k, "effect": c.TAINT_EFFECT} for k in c.MAINTENANCE_TAINT_KEYS],
        "unschedulable": True,
    },
}


def observed(
    m: NodeMaintenance, facts: VolumeFacts | None, now: datetime = NOW, **kw: Any
) -> Observed:
    return Observed(
        nm=m,
        others=(),
        node=NODE,
        pods=kw.pop("pods", ()),
        daemonsets={},
        drain={},
        recall=Recall(lease_held=True, confirmed=True),
        now=now,
        tick=100.0,
        volumes=facts,
        **kw,
    )


ATTACHED = VolumeFacts(attachments=(va("csi-1", "pv-1"),), volumes={"pv-1": pv("pv-1", "app/data")})


def cond(status: Any) -> Any:
    return next(x for x in status.conditions if x.type == c.CONDITION_VOLUMES_DETACHED)


def test_off_by_default_a_finished_drain_succeeds_without_a_read() -> None:
    out = planner.plan(observed(nm(), None))
    assert out.reads == () and out.status is not None and out.status.phase is Phase.SUCCEEDED
    assert not any(x.type == c.CONDITION_VOLUMES_DETACHED for x in out.status.conditions or [])


def test_a_finished_drain_that_waits_reads_the_volumes_first() -> None:
    out = planner.plan(observed(nm(), None), ON)
    assert out.reads == (Read(ReadKind.VOLUMES, "n1"),)
    assert out.status is None and out.events == ()


@pytest.mark.parametrize(
    ("drain", "settings", "reads"),
    [
        ({"waitForVolumeDetach": {"enabled": True}}, policy.SETTINGS, True),
        ({"waitForVolumeDetach": {"enabled": False}}, ON, False),
        ({"waitForVolumeDetach": {"timeoutSeconds": 30}}, policy.SETTINGS, False),
        ({"waitForVolumeDetach": {"timeoutSeconds": 30}}, ON, True),
    ],
)
def test_the_spec_overrides_the_flag(
    drain: Obj, settings: policy.PlanSettings, reads: bool
) -> None:
    out = planner.plan(observed(nm(drain=drain), None), settings)
    assert bool(out.reads) is reads


def test_while_attached_it_stays_running_and_names_the_attachment() -> None:
    out = planner.plan(observed(nm(), ATTACHED), ON)
    assert out.status is not None and out.status.phase is Phase.RUNNING
    got = cond(out.status)
    assert got.status.value == "False" and got.reason == volumes.REASON_WAITING
    assert got.message == (
        "waiting until 2026-12-01T12:05:00Z: 1 volume(s) still attached to node n1: "
        "csi-1 (PersistentVolume pv-1, claim app/data)"
    )
    assert got.last_transition_time == NOW
    assert out.result.requeue_after == ON.volume_poll
    assert out.events == () and out.volume_wait is None
    assert any("drain complete, 1 volume(s) still attached" in n for n in out.notes)


def waiting_since(since: datetime, reason: str = volumes.REASON_WAITING) -> list[Obj]:
    return [
        {
            "type": c.CONDITION_VOLUMES_DETACHED,
            "status": "False",
            "reason": reason,
            "message": "...",
            "lastTransitionTime": since.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    ]


def test_the_deadline_counts_from_when_the_wait_began_and_the_poll_stops_at_it() -> None:
    began = NOW - timedelta(seconds=298)
    out = planner.plan(observed(nm(conditions=waiting_since(began)), ATTACHED), ON)
    assert out.result.requeue_after == pytest.approx(2.0)
    assert cond(out.status).last_transition_time == began


def test_at_the_deadline_it_reports_and_proceeds() -> None:
    began = NOW - timedelta(seconds=300)
    out = planner.plan(observed(nm(conditions=waiting_since(began)), ATTACHED), ON)
    assert out.status is not None and out.status.phase is Phase.SUCCEEDED
    got = cond(out.status)
    assert got.status.value == "False" and got.reason == volumes.REASON_TIMED_OUT
    assert got.message == (
        "volumes not detached within 300s (deadline 2026-12-01T12:00:00Z): 1 volume(s) still "
        "attached to node n1: csi-1 (PersistentVolume pv-1, claim app/data); "
        "the maintenance proceeds"
    )
    reasons = [e.event[0] for e in out.events]
    assert reasons == [c.EVENT_VOLUME_DETACH_TIMED_OUT, c.EVENT_SUCCEEDED[0]]
    assert out.events[0].warning and out.events[0].event[1] == got.message
    assert out.volume_wait == ("timed_out", 300.0)


def test_a_spec_timeout_is_its_own_deadline() -> None:
    began = NOW - timedelta(seconds=30)
    m = nm(drain={"waitForVolumeDetach": {"timeoutSeconds": 30}}, conditions=waiting_since(began))
    out = planner.plan(observed(m, ATTACHED), ON)
    assert out.status is not None and out.status.phase is Phase.SUCCEEDED
    assert cond(out.status).reason == volumes.REASON_TIMED_OUT


def test_a_timeout_past_the_webhooks_bound_is_a_day_and_the_crd_refuses_it() -> None:
    """A CR stored without the webhook (timeoutSeconds 10**12): the deadline was
    past year 9999 and every pass crashed (OverflowError); it waits a day."""
    m = nm(drain={"waitForVolumeDetach": {"timeoutSeconds": 10**12}})
    out = planner.plan(observed(m, ATTACHED), ON)
    assert out.status is not None and out.status.phase is Phase.RUNNING
    day = (NOW + timedelta(seconds=c.VOLUME_DETACH_TIMEOUT_MAX)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert f"waiting until {day}" in cond(out.status).message
    from nmo.api.crd import crd

    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    wait = spec["properties"]["drain"]["properties"]["waitForVolumeDetach"]
    assert wait["properties"]["timeoutSeconds"]["maximum"] == c.VOLUME_DETACH_TIMEOUT_MAX


def test_once_detached_it_succeeds_and_says_how_long_it_waited() -> None:
    began = NOW - timedelta(seconds=42)
    out = planner.plan(observed(nm(conditions=waiting_since(began)), VolumeFacts()), ON)
    assert out.status is not None and out.status.phase is Phase.SUCCEEDED
    got = cond(out.status)
    assert got.status.value == "True" and got.reason == volumes.REASON_DETACHED
    assert [e.event[0] for e in out.events] == [c.EVENT_SUCCEEDED[0]]
    assert out.volume_wait == ("detached", 42.0)


def test_nothing_attached_at_the_end_of_the_drain_succeeds_at_once_without_a_wait() -> None:
    out = planner.plan(observed(nm(), VolumeFacts()), ON)
    assert out.status is not None and out.status.phase is Phase.SUCCEEDED
    assert cond(out.status).status.value == "True"
    assert out.volume_wait is None  # no wait: nothing for the histogram


def test_a_failed_read_is_shown_and_the_deadline_still_holds() -> None:
    failed = VolumeFacts(error="403 Forbidden: volumeattachments is forbidden")
    out = planner.plan(observed(nm(), failed), ON)
    assert out.status is not None and out.status.phase is Phase.RUNNING
    got = cond(out.status)
    assert got.reason == volumes.REASON_READ_FAILED and "403 Forbidden" in got.message
    began = NOW - timedelta(seconds=300)
    m = nm(conditions=waiting_since(began, volumes.REASON_READ_FAILED))
    late = planner.plan(observed(m, failed), ON)
    assert late.status is not None and late.status.phase is Phase.SUCCEEDED
    assert cond(late.status).reason == volumes.REASON_TIMED_OUT


def test_a_wait_the_cr_turns_off_ends_at_once_and_says_so() -> None:
    began = NOW - timedelta(seconds=20)
    m = nm(drain={"waitForVolumeDetach": {"enabled": False}}, conditions=waiting_since(began))
    out = planner.plan(observed(m, None), ON)
    assert out.reads == () and out.status is not None and out.status.phase is Phase.SUCCEEDED
    got = cond(out.status)
    assert (got.status.value, got.reason) == ("False", volumes.REASON_TURNED_OFF)
    assert out.volume_wait == ("turned_off", 20.0)


def test_a_drain_with_pods_again_drops_the_wait_and_its_next_end_waits_afresh() -> None:
    """A pod bound to the node by name during the wait: the drain evicts it, and
    the wait that had begun goes with it. Before, the node said
    WaitingForVolumeDetach while pods were evicted, and the next end of the
    drain timed out at once (deadline from the first wait)."""
    from nmo.core.maintenance import nodeconditions

    began = NOW - timedelta(seconds=1000)
    m = nm(conditions=waiting_since(began))
    both = policy.PlanSettings(volume_detach=True, volume_detach_timeout=300, node_conditions=True)
    out = planner.plan(observed(m, None, pods=(pod("late", []),)), both)
    assert out.reads == () and out.status is not None
    assert out.status.phase is Phase.RUNNING and out.status.pending_pods == ["late"]
    assert not any(x.type == c.CONDITION_VOLUMES_DETACHED for x in out.status.conditions or [])
    assert out.node_conditions is not None
    dip = next(
        x
        for x in out.node_conditions["status"]["conditions"]
        if x["type"] == c.NODE_CONDITION_DRAIN_IN_PROGRESS
    )
    assert (dip["status"], dip["reason"]) == ("True", nodeconditions.REASON_DRAINING)
    ended = m.model_copy(update={"status": out.status})  # the pod left
    again = planner.plan(observed(ended, ATTACHED), ON)
    assert again.status is not None and again.status.phase is Phase.RUNNING
    assert cond(again.status).reason == volumes.REASON_WAITING
    assert cond(again.status).last_transition_time == NOW


def test_a_succeeded_maintenance_is_not_held_again() -> None:
    out = planner.plan(observed(nm(phase="Succeeded"), None), ON)
    assert out.reads == ()


def test_a_waiting_status_is_not_rewritten_while_nothing_changes() -> None:
    first = planner.plan(observed(nm(), ATTACHED), ON)
    assert first.status is not None
    again = nm().model_copy(update={"status": first.status})  # what the first pass wrote
    out = planner.plan(observed(again, ATTACHED, NOW + timedelta(seconds=5)), ON)
    assert out.status is None and out.result.requeue_after == ON.volume_poll


@pytest.mark.parametrize(
    ("value", "denied"),
    [
        (None, False),
        (1, False),
        (86400, False),
        (0, True),
        (86401, True),
        (-5, True),
        ("60", True),
        (True, True),
    ],
)
def test_timeout_validation(value: object, denied: bool) -> None:
    problem = volumes.timeout_error(value)
    assert (problem is not None) is denied
    if denied:
        assert problem is not None and "waitForVolumeDetach.timeoutSeconds" in problem
