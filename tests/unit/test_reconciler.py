"""The executor (:class:`nmo.controller.reconciler.Reconciler`): a plan in, the exact
requests out, in their fixed order, for every branch (issue 21 item 5).

Like Cluster API's ``TestEvictPods``: the planner's own plan for a situation
is applied against a recording API server (respx behind the real
:class:`~nmo.kube.client.Kube`), and the test reads the requests it got, in
order. Failures are injected per request; what the executor records for the
next pass (a failed lease request, an API error, the answers of reads) is
read back from the maintenance's record, and the next pass's plan from the
real planner.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import respx

import builders
from nmo.api import constants as c
from nmo.api.models import NodeMaintenance
from nmo.controller.evictor import Evictor
from nmo.controller.leaseholder import LeaseClient
from nmo.controller.ledger import LEDGER_NAME, FleetLedger
from nmo.controller.memory import Memories, Memory
from nmo.controller.reconciler import Ports, Reconciler
from nmo.controller.recorder import EventRecorder
from nmo.controller.renewer import LeaseRenewers
from nmo.core.maintenance import planner, policy
from nmo.core.maintenance.admission import BudgetSettings
from nmo.core.maintenance.nodepatch import PriorState
from nmo.core.maintenance.observed import (
    LeaseFailure,
    LedgerWrite,
    Plan,
    Read,
    ReadKind,
    Result,
    Work,
)
from nmo.kube.client import Kube, api_path, nm_path, node_path
from nmo.kube.errors import Conflict, KubeError
from nmo.kube.informer import Informer
from nmo.telemetry.metrics import Metrics

Obj = dict[str, Any]
LEASE_NS = "medik8s-leases"
NM = nm_path("nm-1")
STATUS = nm_path("nm-1", "status")
NODE = node_path("n1")
LEASES = api_path("coordination.k8s.io/v1", "leases", namespace=LEASE_NS)
LEASE = f"{LEASES}/{c.lease_name('n1')}"
LEDGER = api_path("coordination.k8s.io/v1", "leases", namespace="nmo", name=LEDGER_NAME)
EVICT = "/api/v1/namespaces/app/pods/a/eviction"
SETTINGS = policy.PlanSettings()
BUDGET = policy.PlanSettings(budget=BudgetSettings(max_parallel=1))


def fresh_cr(**kw: Any) -> Obj:
    return builders.nm(uid="uid-nm-1", resource_version="10", created="2026-12-01T11:00:00Z", **kw)


TAKEN = builders.node(
    uid="node-uid",
    resource_version="5",
    labels={c.EXCLUDE_FROM_REMEDIATION_LABEL: "true"},
    taints=[{"key": key, "effect": c.TAINT_EFFECT} for key in c.MAINTENANCE_TAINT_KEYS],
    unschedulable=True,
    prior=PriorState(maintenance="uid-nm-1"),
)


@dataclass
class Api:
    """The recording API server: every request in order, and failures on demand."""

    router: respx.MockRouter
    fail: dict[tuple[str, str], int] = field(default_factory=dict)  # (method, path) -> status
    fail_once: dict[tuple[str, str], int] = field(default_factory=dict)  # the next one only
    since: int = 0  # requests() and events() read the calls from here on
    objects: dict[str, Obj] = field(default_factory=dict)  # path -> what a GET answers

    def answer(self, request: httpx.Request) -> httpx.Response:
        key = (request.method, request.url.path)
        if key in self.fail or key in self.fail_once:
            code = self.fail.get(key) or self.fail_once.pop(key)
            status = {"kind": "Status", "code": code, "message": f"injected {code}"}
            return httpx.Response(code, json=status)
        path = request.url.path
        if request.method == "GET":
            if path in self.objects:
                return httpx.Response(200, json=self.objects[path])
            return httpx.Response(404, json={"kind": "Status", "code": 404, "message": "nf"})
        body = json.loads(request.content or b"{}")
        if request.method == "DELETE":
            return httpx.Response(200, json={"kind": "Status", "status": "Success"})
        if path.endswith("/events"):
            return httpx.Response(201, json=body)
        if path.endswith("/eviction"):
            return httpx.Response(201, json={})
        if path in (NM, STATUS):
            current = self.objects.get(NM, fresh_cr())
            merged = {**current, **{k: v for k, v in body.items() if k != "metadata"}}
            meta = {**current["metadata"], **(body.get("metadata") or {})}
            meta["resourceVersion"] = str(int(current["metadata"]["resourceVersion"]) + 1)
            merged["metadata"] = meta
            self.objects[NM] = merged
            return httpx.Response(200, json=merged)
        if request.method == "POST":
            created = {**body, "metadata": {**body["metadata"], "uid": "u", "resourceVersion": "1"}}
            return httpx.Response(201, json=created)
        if request.method == "PUT":  # a replace: the next resourceVersion
            rv = int(body["metadata"].get("resourceVersion") or 0) + 1
            return httpx.Response(
                200, json=body | {"metadata": body["metadata"] | {"resourceVersion": str(rv)}}
            )
        return httpx.Response(200, json={"metadata": {}})

    def mark(self) -> None:
        """Later requests() and events() start here (the next pass's requests)."""
        self.since = len(self.router.calls)

    def requests(self) -> list[tuple[str, str]]:
        """The requests made, in order, but discovery and Events (read apart)."""
        out = []
        for call in list(self.router.calls)[self.since :]:
            path = call.request.url.path
            if path.startswith("/version") or path.endswith("/events"):
                continue
            out.append((call.request.method, path))
        return out

    def events(self) -> list[str]:
        return [
            json.loads(call.request.content)["reason"]
            for call in list(self.router.calls)[self.since :]
            if call.request.url.path.endswith("/events") and call.request.method == "POST"
        ]


@pytest.fixture
def api(api_server: respx.MockRouter) -> Api:
    recording = Api(api_server)
    api_server.route(name="everything").mock(side_effect=recording.answer)
    return recording


@dataclass
class Harness:
    api: Api
    reconciler: Reconciler
    memories: Memories
    maintenances: Informer
    nodes: Informer
    pods: Informer
    started: list[str] = field(default_factory=list)

    def record(self) -> Memory:
        return self.memories.recall("uid-nm-1", "nm-1", "n1")

    def put(self, cr: Obj, node: Obj | None = None, pods: tuple[Obj, ...] = ()) -> None:
        self.maintenances.store["nm-1"] = cr
        self.api.objects[NM] = cr
        if node is not None:
            self.nodes.store["n1"] = node
        record = self.record()
        self.pods.store = {f"app/{p['metadata']['name']}": p for p in pods}
        self.pods.synced.set()
        record.pods = self.pods

    async def pass_(self, settings: policy.PlanSettings = SETTINGS) -> tuple[Plan, Result]:
        """One pass as the engine runs it: the planner's plan, then the executor."""
        self.reconciler.settings = settings
        raw = self.maintenances.store["nm-1"]
        record = self.record()
        obs = self.reconciler.observe(NodeMaintenance.from_api(raw), record)
        plan = planner.plan(obs, settings)
        if not plan.reads:
            record.planned_failures()
        try:
            return plan, await self.reconciler.apply(raw, obs, plan, record)
        except Conflict:
            raise
        except KubeError as exc:
            if plan.report is None:
                record.api_error = str(exc)
            raise


@pytest.fixture
def harness(api: Api, kube: Kube) -> Iterator[Harness]:
    metrics = Metrics()
    memories = Memories()
    maintenances = Informer(kube, NM, name="nodemaintenances")
    nodes = Informer(kube, node_path(), name="nodes")
    pods = Informer(kube, api_path("v1", "pods"), name="pods:n1")
    leases = LeaseClient(kube, LEASE_NS)
    started: list[str] = []
    ports = Ports(
        kube=kube,
        maintenances=maintenances,
        nodes=nodes,
        memories=memories,
        leases=leases,
        renewers=LeaseRenewers(leases, interval=300.0, on_failure=lambda _: None, metrics=metrics),
        evictor=Evictor(kube, max_parallel=5, on_change=lambda _: None, metrics=metrics),
        recorder=EventRecorder(kube, instance="nmo-test"),
        metrics=metrics,
        watch_pods=lambda record: started.append(record.node),
        ledger=FleetLedger(kube, namespace="nmo", maintenances=maintenances, nodes=nodes),
    )
    h = Harness(api, Reconciler(ports), memories, maintenances, nodes, pods, started)
    yield h
    memories.forget_all()


async def settle(record: Memory) -> None:
    """Let the eviction tasks the pass started send their requests and finish."""
    await asyncio.gather(*record.evictions, return_exceptions=True)


# -- entering ------------------------------------------------------------------------


async def test_entering_writes_finalizer_then_lease_then_node_then_evicts(
    harness: Harness,
) -> None:
    pod = builders.pod("a", namespace="app", uid="u-a", node="n1")
    harness.put(fresh_cr(), builders.node(uid="node-uid", resource_version="5"), (pod,))
    plan, result = await harness.pass_()
    assert plan.reads == (Read(ReadKind.MAINTENANCE, "nm-1"),)
    assert harness.api.requests() == [("GET", NM)], "a live read before a lease is taken"
    assert result == Result(requeue_after=0)
    harness.api.mark()

    plan, _ = await harness.pass_()
    await settle(harness.record())
    sent = harness.api.requests()
    assert sent[:4] == [("PATCH", NM), ("GET", LEASE), ("POST", LEASES), ("PATCH", NODE)]
    assert set(sent[4:]) == {("POST", EVICT), ("PATCH", STATUS)}
    assert harness.started == ["n1"], "the pod watch started with the pass"
    assert harness.api.events() == ["BeginMaintenance"]


async def test_a_node_that_changed_ends_the_pass_after_the_finalizer_and_its_event(
    harness: Harness,
) -> None:
    harness.put(fresh_cr(), builders.node(uid="node-uid", resource_version="5"))
    harness.record().fetched.confirmed = True
    harness.api.fail[("PATCH", NODE)] = 409
    with pytest.raises(Conflict, match="node n1 changed meanwhile"):
        await harness.pass_()
    assert harness.api.requests() == [
        ("PATCH", NM),
        ("GET", LEASE),
        ("POST", LEASES),
        ("PATCH", NODE),
    ], "no status, no eviction"
    assert harness.api.events() == ["BeginMaintenance"], "the finalizer's event, nothing else"
    assert harness.record().api_error is None, "a conflict is no error: the pass is repeated"


async def test_a_lease_held_by_another_ends_the_pass_and_the_next_one_reports_it(
    harness: Harness,
) -> None:
    harness.put(
        fresh_cr(status={"phase": "Running", "evictionPods": 1, "totalpods": 1}),
        builders.node(uid="node-uid", resource_version="5"),
    )
    harness.api.objects[LEASE] = builders.lease(
        "nhc", builders_now(), namespace=LEASE_NS, uid="l", resource_version="3", duration=3600
    )
    harness.record().fetched.confirmed = True
    _, result = await harness.pass_()
    assert result == Result(requeue_after=0)
    assert harness.api.requests() == [("PATCH", NM), ("GET", LEASE)], "no node patch, no lease"
    failure = harness.record().lease_failure
    assert failure is not None and failure.foreign
    harness.api.mark()
    plan, _ = await harness.pass_()
    assert plan.status is not None and "held by different owner" in (plan.status.last_error or "")
    assert harness.api.requests() == [("PATCH", STATUS)], "the failure is reported, not retried"


async def test_an_api_error_ends_the_pass_and_the_next_one_writes_last_error_only(
    harness: Harness,
) -> None:
    harness.put(fresh_cr(), builders.node(uid="node-uid", resource_version="5"))
    harness.record().fetched.confirmed = True
    harness.api.fail[("PATCH", NODE)] = 403
    with pytest.raises(KubeError, match="injected 403"):
        await harness.pass_()
    assert harness.record().api_error == "injected 403"
    harness.api.mark()
    plan, _ = await harness.pass_()
    assert plan.report is not None
    assert harness.api.requests() == [("PATCH", STATUS)]
    patch = json.loads(harness.api.router.calls[-1].request.content)
    assert patch == {"status": plan.report}, "lastError and lastUpdate only, no resourceVersion"
    written = harness.api.objects[NM]["status"]
    assert written["lastError"] == "injected 403"


async def test_a_missing_node_is_read_live_once_then_failed_on_the_answer(
    harness: Harness,
) -> None:
    harness.put(fresh_cr())
    plan, _ = await harness.pass_()
    assert plan.reads == (Read(ReadKind.NODE, "n1"),)
    assert harness.api.requests() == [("GET", NODE)]
    harness.api.mark()
    plan, _ = await harness.pass_()
    assert plan.work is Work.STOP, "not found: Failed"
    assert harness.api.requests() == [("PATCH", NM), ("PATCH", STATUS)]
    assert harness.api.events() == ["BeginMaintenance", "FailedMaintenance"]


# -- the fleet ledger ----------------------------------------------------------------


async def test_admission_reads_the_ledger_then_writes_it_before_anything_else(
    harness: Harness,
) -> None:
    harness.put(fresh_cr(), builders.node(uid="node-uid", resource_version="5"))
    harness.record().fetched.confirmed = True
    plan, _ = await harness.pass_(BUDGET)
    assert plan.reads == (Read(ReadKind.LEDGER),)
    assert harness.api.requests() == [("GET", LEDGER)]
    harness.api.mark()
    harness.record().fetched.confirmed = True
    plan, _ = await harness.pass_(BUDGET)
    assert plan.ledger is not None and plan.ledger.admitted == "nm-1"
    sent = harness.api.requests()
    assert sent[0] == ("POST", api_path("coordination.k8s.io/v1", "leases", namespace="nmo"))
    assert sent[1:4] == [("PATCH", NM), ("GET", LEASE), ("POST", LEASES)]


async def test_a_ledger_conflict_ends_the_pass_before_the_cr_is_touched(
    harness: Harness,
) -> None:
    harness.put(fresh_cr(), builders.node(uid="node-uid", resource_version="5"))
    harness.api.objects[LEDGER] = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEDGER_NAME, "namespace": "nmo", "resourceVersion": "7"},
        "spec": {},
    }
    await harness.pass_(BUDGET)  # reads the ledger
    harness.api.fail[("PUT", LEDGER)] = 409
    harness.api.mark()
    harness.record().fetched.confirmed = True
    with pytest.raises(Conflict):
        await harness.pass_(BUDGET)
    assert harness.api.requests() == [("PUT", LEDGER)], "nothing after a lost compare-and-swap"
    harness.api.mark()
    plan, _ = await harness.pass_(BUDGET)
    assert plan.reads == (Read(ReadKind.LEDGER),), "the next pass reads the ledger again"


# -- leaving -------------------------------------------------------------------------


async def test_leaving_restores_the_node_then_releases_the_lease_then_the_finalizer(
    harness: Harness,
) -> None:
    harness.put(fresh_cr(finalizers=[c.FINALIZER], deleting=True), TAKEN)
    harness.api.objects[LEASE] = builders.lease(
        c.LEASE_HOLDER, builders_now(), namespace=LEASE_NS, uid="l", resource_version="3"
    )
    plan, _ = await harness.pass_()
    assert plan.work is Work.FORGET
    assert harness.api.requests() == [
        ("PATCH", NODE),
        ("GET", LEASE),
        ("DELETE", LEASE),
        ("PATCH", NM),
    ]
    assert harness.api.events() == ["UncordonNode", "RemovedMaintenance"]
    assert harness.memories.get("uid-nm-1") is None, "the record is forgotten"


async def test_a_restore_that_meets_a_changed_node_keeps_lease_and_finalizer(
    harness: Harness,
) -> None:
    harness.put(fresh_cr(finalizers=[c.FINALIZER], deleting=True), TAKEN)
    harness.api.fail[("PATCH", NODE)] = 409
    with pytest.raises(Conflict):
        await harness.pass_()
    assert harness.api.requests() == [("PATCH", NODE)], "lease and finalizer stay for the retry"
    assert harness.api.events() == []


async def test_a_lease_failure_past_the_limit_restores_releases_then_fails(
    harness: Harness,
) -> None:
    running = fresh_cr(
        finalizers=[c.FINALIZER],
        status={"phase": "Running", "evictionPods": 1, "totalpods": 1, "errorOnLeaseCount": 3},
    )
    harness.put(running, TAKEN)
    harness.record().lease_failure = LeaseFailure("injected 500", foreign=False)
    plan, _ = await harness.pass_()
    assert plan.work is Work.STOP
    assert harness.api.requests() == [("PATCH", NODE), ("GET", LEASE), ("PATCH", STATUS)]
    assert harness.api.events() == ["UncordonNode", "FailedMaintenance"]


def builders_now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


# -- the reconcile: rounds while a plan reads ---------------------------------------


async def test_one_reconcile_reads_the_missing_node_then_fails_the_cr(harness: Harness) -> None:
    harness.put(fresh_cr())
    result = await harness.reconciler.reconcile("nm-1")
    assert result.terminal, "one reconcile, as the Go NMO's: no requeue for a read"
    assert harness.api.requests() == [("GET", NODE), ("PATCH", NM), ("PATCH", STATUS)]
    assert harness.api.objects[NM]["status"]["lastError"] == 'nodes "n1" not found'


async def test_one_reconcile_confirms_the_cr_then_takes_lease_and_node(harness: Harness) -> None:
    harness.put(fresh_cr(), builders.node(uid="node-uid", resource_version="5"))
    await harness.reconciler.reconcile("nm-1")
    sent = harness.api.requests()
    assert sent[:5] == [
        ("GET", NM),
        ("PATCH", NM),
        ("GET", LEASE),
        ("POST", LEASES),
        ("PATCH", NODE),
    ]


async def test_an_api_error_is_in_last_error_when_the_reconcile_fails(harness: Harness) -> None:
    harness.put(fresh_cr(), builders.node(uid="node-uid", resource_version="5"))
    harness.api.fail[("PATCH", NODE)] = 403
    with pytest.raises(KubeError, match="injected 403"):
        await harness.reconciler.reconcile("nm-1")
    assert harness.api.requests()[-2:] == [("PATCH", NODE), ("PATCH", STATUS)]
    assert harness.api.objects[NM]["status"]["lastError"] == "injected 403"
    harness.api.mark()
    with pytest.raises(KubeError, match="injected 403"):
        await harness.reconciler.reconcile("nm-1")
    assert ("PATCH", STATUS) not in harness.api.requests(), "said once per heartbeat"


async def test_a_status_that_cannot_be_written_leaves_the_error_in_the_log(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    harness.put(fresh_cr(), builders.node(uid="node-uid", resource_version="5"))
    harness.api.fail[("PATCH", NODE)] = 403
    harness.api.fail[("PATCH", STATUS)] = 403
    with pytest.raises(KubeError, match="injected 403"):
        await harness.reconciler.reconcile("nm-1")
    assert "could not record the error in its status" in caplog.text


async def test_a_node_that_changed_is_read_live_and_patched_again_in_the_same_reconcile(
    harness: Harness,
) -> None:
    harness.put(fresh_cr(), builders.node(uid="node-uid", resource_version="5"))
    harness.api.objects[NODE] = builders.node(uid="node-uid", resource_version="6")
    harness.api.fail_once[("PATCH", NODE)] = 409
    await harness.reconciler.reconcile("nm-1")
    sent = harness.api.requests()
    at = sent.index(("PATCH", NODE))
    assert sent[at : at + 3] == [("PATCH", NODE), ("GET", NODE), ("PATCH", NODE)]
    patch = json.loads(
        [
            c
            for c in harness.api.router.calls
            if c.request.method == "PATCH" and c.request.url.path == NODE
        ][-1].request.content
    )
    assert {"op": "test", "path": "/metadata/resourceVersion", "value": "6"} in patch
    assert sent.count(("PATCH", NM)) == 1 and sent.count(("POST", LEASES)) == 1, "not redone"


async def test_a_leave_whose_ledger_write_fails_still_lets_the_cr_go(harness: Harness) -> None:
    harness.put(fresh_cr(finalizers=[c.FINALIZER], deleting=True), TAKEN)
    harness.api.objects[LEDGER] = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": LEDGER_NAME,
            "namespace": "nmo",
            "resourceVersion": "7",
            "annotations": {
                "nodemaintenance.medik8s.io/admitted": json.dumps(
                    {"nm-1": {"uid": "uid-nm-1", "node": "n1"}}
                )
            },
        },
        "spec": {},
    }
    harness.api.fail[("PUT", LEDGER)] = 403
    harness.reconciler.settings = BUDGET
    await harness.reconciler.reconcile("nm-1")
    sent = harness.api.requests()
    assert sent[-2:] == [("PUT", LEDGER), ("PATCH", NM)], "the finalizer goes all the same"


async def test_a_release_is_a_compare_and_swap_on_the_version_it_was_decided_on(
    harness: Harness,
) -> None:
    ledger = harness.reconciler.ports.ledger
    assert ledger is not None
    harness.api.objects[LEDGER] = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": LEDGER_NAME, "namespace": "nmo", "resourceVersion": "7"},
        "spec": {},
    }
    await ledger.read()
    view = ledger.view()
    assert view is not None and view.version == "7"
    await ledger.write(LedgerWrite({"a": {"uid": "u-a", "node": "n2"}}, version="7", admitted="a"))
    held = ledger.view()
    assert held is not None and held.version == "8", "the write's answer is the view now"
    harness.api.fail_once[("PUT", LEDGER)] = 409  # what the API server says to "7" now
    with pytest.raises(Conflict):  # a release decided on "7", before that admission
        await ledger.write(LedgerWrite({}, version="7", released="nm-1"))
    puts = [c for c in harness.api.router.calls if c.request.method == "PUT"]
    assert json.loads(puts[-1].request.content)["metadata"]["resourceVersion"] == "7"
    assert ledger.view() is None, "a lost swap drops the view: the next pass reads it again"


# -- node lifecycle conditions (--node-conditions) ------------------------------------

CONDITIONS_ON = policy.PlanSettings(node_conditions=True)
NODE_STATUS = node_path("n1", "status")


def _with_conditions(node: Obj, owner: str, stage: Any) -> Obj:
    """``node`` carrying the four lifecycle conditions of ``owner`` at ``stage``."""
    from nmo.core.maintenance import nodeconditions

    body = nodeconditions.patch(node, nodeconditions.wanted(owner, stage), now=builders_now())
    assert body is not None
    return {**node, "status": {"conditions": body["status"]["conditions"]}}


async def test_a_queued_cr_deleted_without_a_finalizer_takes_its_node_conditions_along(
    harness: Harness,
) -> None:
    """A queued CR has no finalizer: its deletion is seen only as its absence from
    the cache. The pass on its name removes the conditions that name it (and
    only those); it left MaintenancePlanned True on the node forever before."""
    from nmo.core.maintenance.nodeconditions import Stage

    harness.reconciler.settings = CONDITIONS_ON
    harness.nodes.store["n1"] = _with_conditions(
        builders.node(uid="node-uid"), "nm-1", Stage.QUEUED
    )
    harness.nodes.store["n2"] = _with_conditions(
        builders.node("n2", uid="node-uid-2"), "nm-2", Stage.QUEUED
    )
    await harness.reconciler.reconcile("nm-1")  # not in the cache: deleted
    assert harness.api.requests() == [("PATCH", NODE_STATUS)]
    call = harness.api.router.calls[-1].request
    assert call.headers["content-type"] == "application/strategic-merge-patch+json"
    body = json.loads(call.content)
    assert sorted(x["type"] for x in body["status"]["conditions"]) == sorted(c.NODE_CONDITION_TYPES)
    assert all(x["$patch"] == "delete" for x in body["status"]["conditions"])
    harness.api.mark()
    await harness.reconciler.reconcile("nm-3")
    assert harness.api.requests() == [], "a gone CR that named no node writes nothing"


async def test_a_refused_removal_for_a_gone_cr_is_logged_not_retried_by_its_name(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    from nmo.core.maintenance.nodeconditions import Stage

    harness.reconciler.settings = CONDITIONS_ON
    harness.nodes.store["n1"] = _with_conditions(
        builders.node(uid="node-uid"), "nm-1", Stage.QUEUED
    )
    harness.api.fail[("PATCH", NODE_STATUS)] = 403
    result = await harness.reconciler.reconcile("nm-1")
    assert result.requeue_after is None, "a refusal for good is not retried forever"
    assert "gone; could not remove its lifecycle conditions from node n1" in caplog.text


async def test_without_the_flag_a_gone_cr_writes_nothing(harness: Harness) -> None:
    from nmo.core.maintenance.nodeconditions import Stage

    harness.nodes.store["n1"] = _with_conditions(
        builders.node(uid="node-uid"), "nm-1", Stage.QUEUED
    )
    await harness.reconciler.reconcile("nm-1")
    assert harness.api.requests() == [], "default flags: no nodes/status request"


async def test_a_refused_condition_removal_does_not_hold_the_deletion(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """nodes/status not granted (the flag passed by hand) or a policy refusing
    the write: the CR is let go all the same (finalizer removed, lease
    released), the log says why; it stayed deleting forever before."""
    from nmo.core.maintenance.nodeconditions import Stage

    harness.put(
        fresh_cr(finalizers=[c.FINALIZER], deleting=True),
        _with_conditions(TAKEN, "nm-1", Stage.DRAINED),
    )
    harness.api.objects[LEASE] = builders.lease(
        c.LEASE_HOLDER, builders_now(), namespace=LEASE_NS, uid="l", resource_version="3"
    )
    harness.api.fail[("PATCH", NODE_STATUS)] = 403
    plan, _ = await harness.pass_(CONDITIONS_ON)
    assert plan.node_conditions is not None
    assert harness.api.requests() == [
        ("PATCH", NODE),
        ("PATCH", NODE_STATUS),
        ("GET", LEASE),
        ("DELETE", LEASE),
        ("PATCH", NM),
    ]
    assert "could not remove its lifecycle conditions from node n1" in caplog.text


async def test_a_condition_removal_that_fails_for_now_is_retried_with_the_deletion(
    harness: Harness,
) -> None:
    """A 500 is not a refusal for good: the let-go stops there and is retried."""
    from nmo.core.maintenance.nodeconditions import Stage

    harness.put(
        fresh_cr(finalizers=[c.FINALIZER], deleting=True),
        _with_conditions(TAKEN, "nm-1", Stage.DRAINED),
    )
    harness.api.fail[("PATCH", NODE_STATUS)] = 500
    with pytest.raises(KubeError):
        await harness.pass_(CONDITIONS_ON)
    assert ("PATCH", NM) not in harness.api.requests(), "the finalizer stays for the retry"


async def test_a_refused_condition_write_while_entering_is_an_api_error(
    harness: Harness,
) -> None:
    """Entering, the write is retried as any other (lastError says it)."""
    harness.put(fresh_cr(), builders.node(uid="node-uid", resource_version="5"))
    harness.record().fetched.confirmed = True
    harness.api.fail[("PATCH", NODE_STATUS)] = 403
    with pytest.raises(KubeError, match="injected 403"):
        await harness.pass_(CONDITIONS_ON)
