"""Drain control on the real sandbox (issue 12): deadlines under each onTimeout,
drain rules, drain order and the Drained condition, against real PDBs.

Every drain here is held by a PodDisruptionBudget that never allows an
eviction (minAvailable equal to the pods it selects), unless the test says
otherwise. Pods are kwok pods: an evicted or deleted pod stays Terminating
for its grace period (nmo's pod-delete stage), then goes.

nmo runs as the chart's ServiceAccount (chart_identity.py): onTimeout Delete
deletes pods only with the chart value ``drain.allowPodDeletion=true``;
without it the refusal is reported once and no DELETE follows (issue 19).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import signal
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from audit import AuditEvent, AuditWindow, nmo_events, show
from chart_identity import ALLOW_POD_DELETION, chart_identity
from objects import NM, Api, pdb, uid
from operator_fixtures import CURRENT, Operator, idle, metric, scrape, wait_for
from workloads import bare_pod, running

from nmo_sandbox import Sandbox

pytestmark = pytest.mark.integration

RULE = "nodemaintenance.medik8s.io/drain"
ORDER = "nodemaintenance.medik8s.io/drain-order"


@pytest.fixture
async def api(kube: httpx.AsyncClient) -> Api:
    return Api(kube)


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def drained(obj: dict[str, Any] | None) -> dict[str, Any]:
    """The Drained condition of a CR ({} if none yet)."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Drained":
            return dict(cond)
    return {}


async def never_allowing_pdb(api: Api, ns: str, name: str, labels: dict[str, str], n: int) -> None:
    """A PDB with minAvailable == the n pods it selects: it never allows an eviction."""
    await api.create(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", pdb(name, labels, n))

    async def computed() -> bool:
        budget = await api.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}")
        st = (budget or {}).get("status") or {}
        return st.get("currentHealthy") == n and st.get("disruptionsAllowed") == 0

    await wait_for(computed, what=f"PDB {name} computed")


async def create_nm(api: Api, node: str, drain: dict[str, Any] | None = None) -> str:
    name = f"nm-{uid()}"
    spec: dict[str, Any] = {"nodeName": node, "reason": "drain control test"}
    if drain is not None:
        spec["drain"] = drain
    await api.create(
        NM,
        {
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
            "kind": "NodeMaintenance",
            "metadata": {"name": name},
            "spec": spec,
        },
    )
    return name


async def wait_reason(api: Api, name: str, reason: str, timeout: float = 60) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        obj = await api.nm(name)
        return obj if drained(obj).get("reason") == reason else None

    return await wait_for(check, timeout=timeout, what=f"{name}: Drained reason {reason}")


async def wait_phase(api: Api, name: str, phase: str, timeout: float = 60) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        obj = await api.nm(name)
        return obj if ((obj or {}).get("status") or {}).get("phase") == phase else None

    return await wait_for(check, timeout=timeout, what=f"{name} phase {phase}")


async def remove_nm(api: Api, name: str) -> None:
    await api.delete(f"{NM}/{name}")

    async def gone() -> bool:
        return await api.nm(name) is None

    await wait_for(gone, timeout=30, what=f"{name} deleted")


async def blocked_node(
    api: Api, ns: str, node_factory: Any, pods: int = 2, grace: int = 1
) -> tuple[str, list[str]]:
    """A node whose ``pods`` pods are all held by a never-allowing PDB."""
    (node,) = await node_factory(1)
    names = [f"db-{i}" for i in range(pods)]
    for name in names:
        await bare_pod(api, ns, name, node, labels={"app": "db"}, grace=grace)
    await running(api, ns, names)
    await never_allowing_pdb(api, ns, "db-pdb", {"app": "db"}, pods)
    return node, names


# -- the Drained condition, Blocked ---------------------------------------------------


async def test_blocked_condition_names_the_pdb_with_its_numbers(
    operator: Operator, api: Api, namespace: str, node_factory: Any, sandbox: Sandbox
) -> None:
    node, pods = await blocked_node(api, namespace, node_factory)
    name = await create_nm(api, node)
    held = ", ".join(f"{namespace}/{p}" for p in pods)
    expected = (
        f"PodDisruptionBudget {namespace}/db-pdb needs 2 healthy and has 2 "
        f"(0 disruptions allowed), holding 2 pods: {held}"
    )
    # Both evictions are in flight at once: a pass between their two answers
    # names only the pod already refused, so wait for the message naming both.
    await wait_reason(api, name, "Blocked")

    async def both_held() -> dict[str, Any] | None:
        obj = await api.nm(name)
        return obj if drained(obj).get("message") == expected else None

    obj = await wait_for(both_held, timeout=30, what=f"{name}: Blocked holding both pods")
    cond = drained(obj)
    assert cond["status"] == "False" and cond["reason"] == "Blocked", cond
    shown = await sandbox.kubectl("get", "nm", name, check=True)
    print(f"kubectl get nm during a blocked drain:\n{shown.stdout}")
    header, row = shown.stdout.splitlines()[:2]
    assert header.split()[:5] == ["NAME", "NODE", "PHASE", "PROGRESS", "DRAIN"], header
    starts = [header.index(col) for col in header.split()[:6]]
    cells = [row[a:b].strip() for a, b in itertools.pairwise(starts)]
    # PROGRESS is blank at 0 %, as with the Go NMO (drainProgress is omitempty)
    assert cells == [name, node, "Running", "", "Blocked"], row

    async def gauge() -> float:
        return await operator.metric("nmo_drain_blocked_seconds", maintenance=name)

    assert await wait_for(gauge, what="nmo_drain_blocked_seconds for the CR") > 0
    # Relaxing the PDB lets the drain finish: Drained True.
    await api.merge(
        f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/db-pdb",
        {"spec": {"minAvailable": 0}},
    )
    done = await wait_phase(api, name, "Succeeded")
    assert drained(done)["status"] == "True" and drained(done)["reason"] == "Drained"
    await remove_nm(api, name)


# -- deadlines ---------------------------------------------------------------------


async def test_timeout_report_keeps_draining(
    operator: Operator, api: Api, namespace: str, node_factory: Any
) -> None:
    node, pods = await blocked_node(api, namespace, node_factory)
    before = await operator.metric("nmo_drain_timeouts_total", action="Report")
    name = await create_nm(api, node, {"timeoutSeconds": 3})
    obj = await wait_reason(api, name, "TimedOut", timeout=30)
    st = obj["status"]
    assert (ts(st["drainDeadline"]) - ts(st["drainStartTime"])).total_seconds() == 3
    assert st["phase"] == "Running"
    message = drained(obj)["message"]
    assert message.startswith("drain did not finish within 3s (deadline "), message
    assert "onTimeout Report: still draining" in message
    assert f"PodDisruptionBudget {namespace}/db-pdb needs 2 healthy and has 2" in message
    # Still draining: the pods are there, nothing was deleted.
    assert sorted(p["metadata"]["name"] for p in await api.pods(namespace)) == pods
    assert all("deletionTimestamp" not in p["metadata"] for p in await api.pods(namespace))

    async def one_event() -> bool:
        return len(await api.events(name, "DrainTimedOut")) == 1

    await wait_for(one_event, what="one DrainTimedOut event")
    assert await operator.metric("nmo_drain_timeouts_total", action="Report") == before + 1
    # The drain goes on: relaxing the PDB completes it.
    await api.merge(
        f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/db-pdb",
        {"spec": {"minAvailable": 0}},
    )
    await wait_phase(api, name, "Succeeded")
    events = await api.events(name, "DrainTimedOut")
    assert len(events) == 1 and events[0]["type"] == "Warning", events
    assert events[0].get("count", 1) == 1
    await remove_nm(api, name)


@pytest.fixture
async def deleting_operator(
    sole_operator: None, sandbox: Sandbox, tmp_path: Path
) -> AsyncIterator[Operator]:
    """nmo as the ServiceAccount of the chart installed with drain.allowPodDeletion=true."""
    identity = await chart_identity(sandbox, variant="pod-deletion", values=ALLOW_POD_DELETION)
    op = Operator(sandbox, tmp_path / "nmo", identity=identity)
    op.log_dir.mkdir(parents=True)
    CURRENT.append(op)  # its log is attached to a failure report
    try:
        await op.start()
        yield op
    finally:
        op.kill(signal.SIGTERM)
        CURRENT.remove(op)


async def test_timeout_delete_removes_pods_with_their_grace_period(
    deleting_operator: Operator, api: Api, namespace: str, node_factory: Any, sandbox: Sandbox
) -> None:
    operator = deleting_operator
    (node,) = await node_factory(1)
    graces = {"db-long": 4, "db-zero": 0}
    for pod, grace in graces.items():
        await bare_pod(api, namespace, pod, node, labels={"app": "db"}, grace=grace)
    await running(api, namespace, list(graces))
    await never_allowing_pdb(api, namespace, "db-pdb", {"app": "db"}, 2)
    window = await AuditWindow.open(sandbox)
    before = await operator.metric("nmo_forced_deletions_total", outcome="deleted")
    seen: dict[str, tuple[datetime, int]] = {}  # pod -> (deletion requested, grace used)
    # Every change of the pods, from a watch opened before the CR: a pod
    # deleted with 1 s of grace is gone before a poll may look.
    async with sandbox.client() as client:
        listing = (await client.get(f"/api/v1/namespaces/{namespace}/pods")).json()
        watching = asyncio.Event()

        async def watch() -> None:
            params = {"watch": "1", "resourceVersion": listing["metadata"]["resourceVersion"]}
            path = f"/api/v1/namespaces/{namespace}/pods"
            async with client.stream("GET", path, params=params, timeout=None) as resp:
                watching.set()
                async for line in resp.aiter_lines():
                    meta = json.loads(line)["object"]["metadata"] if line.strip() else {}
                    if "deletionTimestamp" in meta and meta["name"] not in seen:
                        grace = int(meta["deletionGracePeriodSeconds"])
                        requested = ts(meta["deletionTimestamp"]).timestamp() - grace
                        seen[meta["name"]] = (datetime.fromtimestamp(requested, UTC), grace)

        watcher = asyncio.create_task(watch())
        await watching.wait()
        try:
            name = await create_nm(api, node, {"timeoutSeconds": 8, "onTimeout": "Delete"})

            async def all_gone() -> bool:
                obj = await api.nm(name)
                return ((obj or {}).get("status") or {}).get("phase") == "Succeeded"

            await wait_for(all_gone, timeout=60, what="the drain to finish by deletion")

            async def both_watched() -> bool:
                return len(seen) == len(graces)

            await wait_for(both_watched, timeout=10, what="both deletions watched")
        finally:
            watcher.cancel()
    obj = await api.nm(name)
    assert obj is not None
    deadline = ts(obj["status"]["drainDeadline"])
    print(f"forced deletions (pod: requested, grace): {seen}; deadline {deadline}")
    assert set(seen) == set(graces), seen
    # Own grace period, at least 1 s; never before deadline - grace.
    assert seen["db-long"][1] == 4 and seen["db-zero"][1] == 1, seen
    for pod, (requested, grace) in seen.items():
        earliest = (deadline.timestamp() - grace) - 1.0  # second precision of the stamps
        assert requested.timestamp() >= earliest, (pod, requested, deadline, grace)
    events = await api.wait_events(name, "PodForceDeleted", count=len(graces))
    assert sorted(e["message"].split()[4] for e in events) == sorted(
        f"{namespace}/{p}" for p in graces
    ), events
    assert all(e["type"] == "Warning" for e in events)
    assert await operator.metric("nmo_forced_deletions_total", outcome="deleted") == before + 2
    # The pods went by DELETE with a UID precondition, never by an accepted eviction.
    mine = [e for e in nmo_events(await window.close()) if e.on("pods", subresource=None)]
    deletes = [e for e in mine if e.verb == "delete" and e.code == 200]
    evictions = [e for e in mine if e.subresource == "eviction" and e.code == 201]
    assert sorted(e.name for e in deletes) == sorted(graces), show(mine)
    assert evictions == [], show(evictions)
    await remove_nm(api, name)


def forced(events: list[AuditEvent], pods: list[str]) -> list[AuditEvent]:
    """nmo's DELETEs of these pods (evictions are POSTs to pods/eviction)."""
    return [e for e in nmo_events(events) if e.on("pods") and e.verb == "delete" and e.name in pods]


async def test_timeout_delete_without_the_permission_is_reported_once_and_not_retried(
    operator: Operator, api: Api, namespace: str, node_factory: Any, sandbox: Sandbox
) -> None:
    """The chart's default RBAC grants no delete on pods: the DELETE at the
    deadline gets 403, once; lastError and the Drained condition say so and name
    the chart value; pass after pass, no DELETE follows, until the spec changes
    (here, once delete is granted: then the pods go)."""
    node, pods = await blocked_node(api, namespace, node_factory)
    window = await AuditWindow.open(sandbox)
    before = await operator.metric("nmo_forced_deletions_total", outcome="forbidden")
    name = await create_nm(api, node, {"timeoutSeconds": 3, "onTimeout": "Delete"})

    async def reported() -> dict[str, Any] | None:
        # Deletions start at the deadline minus the pods' grace period (1 s): the
        # refusal is said before the deadline, the deadline in the pass after it.
        obj = await api.nm(name)
        error = ((obj or {}).get("status") or {}).get("lastError") or ""
        timed_out = drained(obj).get("reason") == "TimedOut"
        return obj if timed_out and "drain.allowPodDeletion=true" in error else None

    obj = await wait_for(reported, timeout=60, what=f"{name}: the refused deletion in lastError")
    error = obj["status"]["lastError"]
    assert error.startswith("onTimeout Delete: nmo may not delete pods: pods "), error
    assert "is forbidden" in error and 'cannot delete resource "pods"' in error, error
    cond = drained(obj)
    assert cond["reason"] == "TimedOut" and error in cond["message"], cond
    assert obj["status"]["phase"] == "Running"

    # More passes of this CR (an annotation wakes one, the spec unchanged): no DELETE.
    port = operator.metrics_port
    for i in range(3):
        passes = metric(await idle(port), "controller_runtime_reconcile_total")
        await api.merge(f"{NM}/{name}", {"metadata": {"annotations": {"test/pass": str(i)}}})

        async def passed(done: float = passes) -> bool:
            return metric(await scrape(port), "controller_runtime_reconcile_total") > done

        await wait_for(passed, what=f"a pass of {name} after annotation {i}")
    await idle(port)
    deletes = forced(await window.close(), pods)
    assert [e.code for e in deletes] == [403], show(deletes)  # one, for the first pod only
    assert await operator.metric("nmo_forced_deletions_total", outcome="forbidden") == before + 1
    logged = operator.logs().splitlines()
    said = [line for line in logged if name in line and "not retrying" in line]
    assert len(said) == 1, said
    again = await api.nm(name)
    assert again is not None and again["status"]["lastError"] == error
    # All pods still there, none deleted.
    assert all("deletionTimestamp" not in p["metadata"] for p in await api.pods(namespace))

    # Granted delete on pods and the spec changed: the refusal is lifted, the pods go.
    user = (await chart_identity(sandbox)).username.split(":")
    role = f"nmo-test-pod-deletion-{uid()}"
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}
    await api.create(f"{rbac}/clusterroles", {"metadata": {"name": role}, "rules": [rule]})
    subject = {"kind": "ServiceAccount", "namespace": user[2], "name": user[3]}
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role}
    await api.create(
        f"{rbac}/clusterrolebindings",
        {"metadata": {"name": role}, "roleRef": ref, "subjects": [subject]},
    )
    try:
        as_nmo = f"--as=system:serviceaccount:{user[2]}:{user[3]}"

        async def granted() -> bool:
            answer = await sandbox.kubectl("auth", "can-i", "delete", "pods", "-A", as_nmo)
            return answer.stdout.strip() == "yes"

        await wait_for(granted, what="delete on pods granted to nmo's ServiceAccount")
        await api.merge(f"{NM}/{name}", {"spec": {"drain": {"timeoutSeconds": 4}}})
        done = await wait_phase(api, name, "Succeeded", timeout=60)
        assert "lastError" not in done["status"], done["status"]
    finally:
        await api.delete(f"{rbac}/clusterrolebindings/{role}")
        await api.delete(f"{rbac}/clusterroles/{role}")
    await remove_nm(api, name)


async def test_timeout_abort_restores_node_and_fails(
    operator: Operator, api: Api, namespace: str, node_factory: Any
) -> None:
    node, pods = await blocked_node(api, namespace, node_factory)
    name = await create_nm(api, node, {"timeoutSeconds": 3, "onTimeout": "Abort"})
    obj = await wait_phase(api, name, "Failed", timeout=30)
    error = obj["status"]["lastError"]
    assert error.startswith("drain did not finish within 3s (deadline "), error
    assert "onTimeout Abort: maintenance aborted, node restored and lease released" in error
    assert drained(obj)["reason"] == "TimedOut"

    async def restored() -> bool:
        n = await api.node(node)
        taints = {t["key"] for t in n["spec"].get("taints") or []}
        return (
            not n["spec"].get("unschedulable")
            and not taints & {"node.kubernetes.io/unschedulable", "medik8s.io/drain"}
            and "remediation.medik8s.io/exclude-from-remediation" not in n["metadata"]["labels"]
        )

    await wait_for(restored, what="node restored after abort")

    async def released() -> bool:
        lease = await api.lease(node)
        return lease is None or not lease["spec"].get("holderIdentity")

    await wait_for(released, what="lease released after abort")
    for reason in ("DrainTimedOut", "FailedMaintenance", "UncordonNode"):
        target = node if reason == "UncordonNode" else name
        assert len(await api.wait_events(target, reason)) == 1, reason
    # No pod was removed: the PDB held, and Abort never deletes.
    assert sorted(p["metadata"]["name"] for p in await api.pods(namespace)) == pods
    assert all("deletionTimestamp" not in p["metadata"] for p in await api.pods(namespace))
    await remove_nm(api, name)


async def test_deadline_survives_an_operator_kill(
    operator: Operator, api: Api, namespace: str, node_factory: Any
) -> None:
    node, _ = await blocked_node(api, namespace, node_factory)
    timeout = 12
    name = await create_nm(api, node, {"timeoutSeconds": timeout})
    obj = await wait_reason(api, name, "Blocked")
    start, deadline = ts(obj["status"]["drainStartTime"]), ts(obj["status"]["drainDeadline"])
    halfway = start.timestamp() + timeout / 2 - time.time()
    await asyncio.sleep(max(0.0, halfway))  # the clock under test: kill at half the deadline
    operator.kill()
    await asyncio.sleep(2)
    await operator.start()
    obj = await wait_reason(api, name, "TimedOut", timeout=60)
    assert ts(obj["status"]["drainStartTime"]) == start
    assert ts(obj["status"]["drainDeadline"]) == deadline
    # The event is posted after the status write that says TimedOut: wait for it.
    (event,) = await wait_for(
        lambda: api.events(name, "DrainTimedOut"), what="the DrainTimedOut event"
    )
    fired = ts(event.get("eventTime") or event["firstTimestamp"])
    moved = (fired - deadline).total_seconds()
    print(f"deadline {deadline}, timed out at {fired}: moved {moved:+.2f}s after a kill at half")
    assert -1.0 <= moved <= 5.0, moved  # second precision; a pass within a few seconds
    await remove_nm(api, name)


async def test_operator_default_timeout_is_persisted(
    operator: Operator, api: Api, namespace: str, node_factory: Any
) -> None:
    """--drain-timeout applies to CRs without one, and its deadline outlives the flag."""
    node, _ = await blocked_node(api, namespace, node_factory)
    saved = list(operator.extra)
    operator.extra = [*saved, "--drain-timeout", "600", "--drain-on-timeout", "Report"]
    try:
        await operator.restart()
        name = await create_nm(api, node)
        obj = await wait_reason(api, name, "Blocked")
        st = obj["status"]
        assert (ts(st["drainDeadline"]) - ts(st["drainStartTime"])).total_seconds() == 600
    finally:
        operator.extra = saved
        await operator.restart()
    await wait_for(
        lambda: _deadline_kept(api, name, st["drainDeadline"]),
        what="the persisted deadline kept without the flag",
    )
    await remove_nm(api, name)


async def _deadline_kept(api: Api, name: str, deadline: str) -> bool:
    obj = await api.nm(name)
    st = (obj or {}).get("status") or {}
    return st.get("drainDeadline") == deadline and drained(obj).get("reason") == "Blocked"


# -- drain rules -------------------------------------------------------------------


@contextlib.asynccontextmanager
async def flags(operator: Operator, *extra: str) -> AsyncIterator[None]:
    """The session's nmo restarted with ``extra`` flags for a test, then as it was."""
    saved = list(operator.extra)
    operator.extra = [*saved, *extra]
    try:
        await operator.restart()
        yield
    finally:
        operator.extra = saved
        await operator.restart()


async def test_pod_drain_rules_are_ignored_by_default_and_said_once(
    operator: Operator, api: Api, namespace: str, node_factory: Any, sandbox: Sandbox
) -> None:
    """Pod labels are tenant input (issue 20): with default flags no pod steers
    its drain, as with the Go NMO. The issue's hold (wait-completed with
    drain-order -1) stalled every other eviction for good; now every pod is
    evicted at once, and a Warning names the ignored rules once."""
    (node,) = await node_factory(1)
    await bare_pod(api, namespace, "plain", node)
    await bare_pod(api, namespace, "stay", node, labels={RULE: "skip"})
    await bare_pod(
        api, namespace, "hold", node, labels={RULE: "wait-completed"}, annotations={ORDER: "-1"}
    )
    await running(api, namespace, ["plain", "stay", "hold"])
    window = await AuditWindow.open(sandbox)
    name = await create_nm(api, node)
    done = await wait_phase(api, name, "Succeeded")
    assert done["status"]["evictionPods"] == 3, done["status"]
    assert await api.pods(namespace, node=node) == []
    evicted = sorted(
        e.name
        for e in nmo_events(await window.close())
        if e.on("pods", subresource="eviction") and e.verb == "create"
    )
    assert evicted == ["hold", "plain", "stay"], evicted
    (event,) = await api.wait_events(name, "DrainRulesIgnored")
    assert event["type"] == "Warning"
    assert f"{namespace}/stay (nodemaintenance.medik8s.io/drain=skip)" in event["message"]
    assert event.get("count", 1) == 1
    await remove_nm(api, name)


async def test_drain_rules_and_pod_selector(
    operator: Operator, api: Api, namespace: str, node_factory: Any, sandbox: Sandbox
) -> None:
    async with flags(operator, "--pod-drain-rules-namespaces", namespace):
        await _drain_rules_and_pod_selector(api, namespace, node_factory, sandbox)


async def _drain_rules_and_pod_selector(
    api: Api, namespace: str, node_factory: Any, sandbox: Sandbox
) -> None:
    (node,) = await node_factory(1)
    web = {"tier": "web"}
    await bare_pod(api, namespace, "web", node, labels=web)
    await bare_pod(api, namespace, "web-skip", node, labels={**web, RULE: "skip"})
    await bare_pod(api, namespace, "web-job", node, labels={**web, RULE: "wait-completed"})
    await bare_pod(api, namespace, "db", node, labels={"tier": "db"})
    await running(api, namespace, ["web", "web-skip", "web-job", "db"])
    window = await AuditWindow.open(sandbox)
    name = await create_nm(api, node, {"podSelector": {"matchLabels": web}})
    obj = await wait_reason(api, name, "WaitingForCompletion")
    st = obj["status"]
    assert st["pendingPods"] == ["web-job"], st
    assert st["evictionPods"] == 2, st  # web and web-job; web-skip and db are left alone
    assert f"{namespace}/web-job" in drained(obj)["message"]
    (detail,) = st["pendingPodsDetails"]
    assert detail["reason"] == "WaitingForCompletion", detail
    # The job completes (as its kubelet would report it): the maintenance finishes.
    resp = await api.c.patch(
        f"/api/v1/namespaces/{namespace}/pods/web-job/status",
        json={"status": {"phase": "Succeeded"}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert resp.status_code == 200, resp.text
    done = await wait_phase(api, name, "Succeeded")
    assert drained(done)["status"] == "True"
    left = {p["metadata"]["name"] for p in await api.pods(namespace)}
    assert {"web-skip", "db", "web-job"} <= left and "web" not in left, left
    evicted = sorted(
        e.name
        for e in nmo_events(await window.close())
        if e.on("pods", subresource="eviction") and e.verb == "create"
    )
    assert evicted == ["web"], evicted
    await remove_nm(api, name)


async def test_unknown_drain_rule_blocks_instead_of_evicting(
    operator: Operator, api: Api, namespace: str, node_factory: Any
) -> None:
    async with flags(operator, "--pod-drain-rules-namespaces", namespace):
        await _unknown_drain_rule_blocks(api, namespace, node_factory)


async def _unknown_drain_rule_blocks(api: Api, namespace: str, node_factory: Any) -> None:
    (node,) = await node_factory(1)
    await bare_pod(api, namespace, "typo", node, labels={RULE: "skipp"})
    await running(api, namespace, ["typo"])
    name = await create_nm(api, node)
    obj = await wait_reason(api, name, "Blocked")
    assert "unknown drain rule nodemaintenance.medik8s.io/drain='skipp'" in drained(obj)["message"]
    assert obj["status"]["pendingPodsDetails"][0]["reason"] == "InvalidDrainRule"
    # Fixing the label (here: removing it) lets the drain evict it.
    await api.merge(
        f"/api/v1/namespaces/{namespace}/pods/typo", {"metadata": {"labels": {RULE: None}}}
    )
    await wait_phase(api, name, "Succeeded")
    await remove_nm(api, name)


# -- order -------------------------------------------------------------------------


async def _evictions_and_departures(
    api: Api, sandbox: Sandbox, node: str
) -> tuple[str, dict[str, datetime], dict[str, datetime]]:
    """Maintain ``node`` to Succeeded: (the CR, each pod's eviction, each pod's departure)."""
    window = await AuditWindow.open(sandbox)
    name = await create_nm(api, node)
    await wait_phase(api, name, "Succeeded", timeout=90)
    events = await window.close()
    evicted = {
        e.name: e.received
        for e in nmo_events(events)
        if e.on("pods", subresource="eviction") and e.verb == "create" and e.code == 201
    }
    # A pod has left the node when the last DELETE (kwok, after the grace period) is logged.
    left: dict[str, datetime] = {}
    for e in events:
        if e.on("pods") and e.verb == "delete" and not e.is_nmo and e.code == 200:
            left[e.name] = e.received
    return name, evicted, left


async def test_critical_pods_are_evicted_with_the_others_by_default(
    operator: Operator, api: Api, namespace: str, node_factory: Any, sandbox: Sandbox
) -> None:
    """The Go NMO evicts every pod at once; so does nmo without --critical-pods-last."""
    (node,) = await node_factory(1)
    await bare_pod(api, namespace, "web", node, grace=5)
    await bare_pod(api, namespace, "critical", node, priority_class="system-cluster-critical")
    await running(api, namespace, ["web", "critical"])
    name, evicted, left = await _evictions_and_departures(api, sandbox, node)
    print(f"evictions: {evicted}; left: {left}")
    assert set(evicted) == {"web", "critical"}, evicted
    assert evicted["critical"] < left["web"], (evicted, left)
    await remove_nm(api, name)


async def test_drain_order_and_critical_pods_last(
    operator: Operator, api: Api, namespace: str, node_factory: Any, sandbox: Sandbox
) -> None:
    (node,) = await node_factory(1)
    await bare_pod(api, namespace, "late", node, annotations={ORDER: "1"})
    await bare_pod(api, namespace, "first", node, grace=2)
    await bare_pod(api, namespace, "critical", node, priority_class="system-cluster-critical")
    await bare_pod(api, namespace, "early", node, annotations={ORDER: "-1"}, grace=2)
    await running(api, namespace, ["late", "first", "critical", "early"])
    rules = ("--pod-drain-rules-namespaces", namespace)
    async with flags(operator, "--critical-pods-last", *rules):
        name, evicted, left = await _evictions_and_departures(api, sandbox, node)
    order = sorted(evicted, key=lambda n: evicted[n])
    print(f"evictions: {[(n, evicted[n].isoformat()) for n in order]}; left: {left}")
    assert order == ["early", "first", "critical", "late"], order
    for earlier, later in (("early", "first"), ("first", "critical"), ("critical", "late")):
        assert evicted[later] >= left[earlier], (earlier, later, evicted, left)
    await remove_nm(api, name)


# -- the schema refuses bad input ----------------------------------------------------


@pytest.mark.parametrize(
    ("drain", "needle"),
    [
        ({"timeoutSeconds": -1}, "spec.drain.timeoutSeconds"),
        ({"onTimeout": "Later"}, "spec.drain.onTimeout"),
    ],
)
async def test_schema_refuses_bad_drain_fields(
    api: Api, node_factory: Any, drain: dict[str, Any], needle: str
) -> None:
    (node,) = await node_factory(1)
    resp = await api.c.post(
        NM,
        json={
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
            "kind": "NodeMaintenance",
            "metadata": {"name": f"nm-{uid()}"},
            "spec": {"nodeName": node, "drain": drain},
        },
    )
    assert resp.status_code == 422, resp.text
    assert needle in resp.json()["message"], resp.text
