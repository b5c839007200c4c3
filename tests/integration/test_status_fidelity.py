"""Status, events and lease as scripts see them, on the real sandbox (issue 11, 5-8 and 10).

What a script or an alert written for the Go NMO reads must read the same:
lastError in the Go wording and for every failed API request of a pass,
lastUpdate moving once a minute while a maintenance is live, zero counts and
empty lists absent (``omitempty``), ``UncordonNode`` whenever nmo uncordons,
and medik8s/common's lease corner cases. API failures are real: a
ValidatingAdmissionPolicy denies the request, as RBAC or a webhook would.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from audit import AuditWindow, nmo_events, show
from objects import LEASES, NM, Api, deployment, pdb, pod_spec, uid
from operator_fixtures import CURRENT, Operator, wait_for

from nmo.api.constants import PLURAL
from nmo_sandbox import Sandbox

pytestmark = pytest.mark.integration

VAP = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
VAP_BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
HELD = "can't update or invalidate the lease because it is held by different owner: "
SECONDS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
TAINT_KEYS = {"node.kubernetes.io/unschedulable", "medik8s.io/drain"}
LABEL = "remediation.medik8s.io/exclude-from-remediation"


@pytest.fixture
async def api(kube: httpx.AsyncClient) -> Api:
    return Api(kube)


def status_of(obj: dict[str, Any] | None) -> dict[str, Any]:
    return dict((obj or {}).get("status") or {})


async def wait_status(api: Api, name: str, what: str, check: Any, timeout: float = 60) -> Any:
    async def probe() -> dict[str, Any] | None:
        st = status_of(await api.nm(name))
        return st if check(st) else None

    return await wait_for(probe, timeout=timeout, what=f"{name}: {what}")


async def remove_nm(api: Api, name: str) -> None:
    await api.delete(f"{NM}/{name}")

    async def gone() -> bool:
        return await api.nm(name) is None

    await wait_for(gone, timeout=30, what=f"{name} deleted")


@asynccontextmanager
async def denied(
    api: Api,
    *,
    group: str,
    version: str,
    resource: str,
    name: str,
    probe: str,
    reason: str | None = "Forbidden",
) -> AsyncIterator[str]:
    """A ValidatingAdmissionPolicy denying every UPDATE/PATCH of one object; yields
    its message. ``probe`` is the object's path: a dry-run patch shows when the
    apiserver enforces the policy."""
    policy = f"deny-{uid()}"
    message = f"{resource} {name} is frozen by the test"
    await api.create(
        VAP,
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": policy},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [group],
                            "apiVersions": [version],
                            "operations": ["UPDATE"],
                            "resources": [resource],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": f"object.metadata.name != '{name}'",
                        "message": message,
                        # Forbidden (403) as RBAC or a webhook answers; None: the
                        # policy's default, Invalid (422)
                        **({"reason": reason} if reason else {}),
                    }
                ],
            },
        },
    )
    await api.create(
        VAP_BINDINGS,
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": policy},
            "spec": {"policyName": policy, "validationActions": ["Deny"]},
        },
    )

    async def enforced() -> bool:
        resp = await api.c.patch(
            probe,
            params={"dryRun": "All"},
            json={"metadata": {"annotations": {"example.com/probe": uid()}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        return resp.status_code == (403 if reason else 422)

    try:
        await wait_for(enforced, timeout=30, what=f"policy {policy} enforced")
        yield message
    finally:
        await api.delete(f"{VAP_BINDINGS}/{policy}")
        await api.delete(f"{VAP}/{policy}")


async def lifted(api: Api, probe: str) -> None:
    async def allowed() -> bool:
        resp = await api.c.patch(
            probe,
            params={"dryRun": "All"},
            json={"metadata": {"annotations": {"example.com/probe": uid()}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        return resp.status_code == 200

    await wait_for(allowed, timeout=30, what="policy lifted")


# -- item 5: API failures of a pass reach lastError ---------------------------


def denials(window: AuditWindow, resource: str, name: str) -> list[Any]:
    """nmo's PATCHes of the object that the apiserver refused so far."""
    return [
        e
        for e in nmo_events(window.events())
        if e.on(resource, name) and e.verb == "patch" and e.code in (403, 422)
    ]


@pytest.mark.parametrize("reason", ["Forbidden", None])
async def test_a_denied_node_patch_reaches_last_error_and_is_retried(
    operator: Operator, api: Api, node_factory: Any, sandbox: Sandbox, reason: str | None
) -> None:
    """Label, taints and cordon refused by the apiserver: lastError says so (the
    API's message, as the Go NMO's onReconcileError), the pass is retried with
    backoff, and the same error is written once, not once per retry."""
    (target,) = await node_factory(1)
    name = f"nm-{uid()}"
    probe = f"/api/v1/nodes/{target}"
    errors = await operator.metric("nmo_reconcile_total", result="error")
    async with denied(
        api, group="", version="v1", resource="nodes", name=target, probe=probe, reason=reason
    ) as message:
        window = await AuditWindow.open(sandbox)
        await api.create_nm(name, target)
        st = await wait_status(
            api, name, "the denial in lastError", lambda s: message in (s.get("lastError") or "")
        )
        assert st["lastError"].startswith(f'nodes "{target}" is forbidden:'), st
        assert SECONDS.match(st["lastUpdate"]), st

        async def retried() -> bool:
            return len(denials(window, "nodes", target)) >= 5

        await wait_for(retried, timeout=60, what="nmo retrying the denied node patch")
        events = nmo_events(await window.close())
        writes = [e for e in events if e.on(PLURAL, name, subresource="status") and e.is_write]
        refused = denials(window, "nodes", target)
        print(f"\n{len(refused)} denied, {len(writes)} status writes")
        assert len(writes) == 1, "the same error written again:\n" + show(writes)
        # retried with backoff, not every 0.2 s (a 422 is not a node that changed meanwhile)
        span = (refused[4].received - refused[0].received).total_seconds()
        assert span >= 2.0, "retried without backoff:\n" + show(refused)

        # A pass is counted when its worker ends, after the refused answer.
        async def counted() -> bool:
            got = await operator.metric("nmo_reconcile_total", result="error")
            return got >= errors + 5

        await wait_for(counted, timeout=10, what="5 failed passes counted")
        assert not (await api.node(target))["spec"].get("unschedulable")
    await lifted(api, probe)
    st = await wait_status(api, name, "Succeeded", lambda s: s.get("phase") == "Succeeded")
    assert "lastError" not in st, st
    await remove_nm(api, name)


async def test_a_denied_finalizer_removal_reaches_last_error_and_uncordons_once(
    operator: Operator, api: Api, node_factory: Any, sandbox: Sandbox
) -> None:
    """Leaving: the node is restored (UncordonNode at once, as the Go NMO), then the
    finalizer removal is refused: lastError says so and the pass is retried on a
    node that needs no uncordon, so UncordonNode is recorded exactly once."""
    (target,) = await node_factory(1)
    name = f"nm-{uid()}"
    await api.create_nm(name, target)
    await wait_status(api, name, "Succeeded", lambda s: s.get("phase") == "Succeeded")
    probe = f"{NM}/{name}"
    async with denied(
        api,
        group="nodemaintenance.medik8s.io",
        version="v1beta1",
        resource=PLURAL,
        name=name,
        probe=probe,
    ) as message:
        window = await AuditWindow.open(sandbox)
        await api.delete(probe)
        st = await wait_status(
            api, name, "the denial in lastError", lambda s: message in (s.get("lastError") or "")
        )
        assert st["lastError"].startswith(
            f'nodemaintenances.nodemaintenance.medik8s.io "{name}" is forbidden:'
        ), st

        async def retried() -> bool:
            return len(denials(window, PLURAL, name)) >= 3

        await wait_for(retried, timeout=60, what="nmo retrying the finalizer removal")
        events = nmo_events(await window.close())
        writes = [e for e in events if e.on(PLURAL, name, subresource="status") and e.is_write]
        assert len(writes) == 1, "the same error written again:\n" + show(writes)
        obj = await api.nm(name)
        assert obj is not None and obj["metadata"].get("deletionTimestamp")
        assert not (await api.node(target))["spec"].get("unschedulable")
        assert await api.lease(target) is None, "the lease is released before the finalizer"
        assert len(await api.wait_events(target, "UncordonNode")) == 1
        assert await api.events(name, "RemovedMaintenance") == []

    async def gone() -> bool:
        return await api.nm(name) is None

    await wait_for(gone, timeout=90, what=f"{name} deleted once the policy is gone")
    assert len(await api.wait_events(name, "RemovedMaintenance")) == 1
    assert len(await api.events(target, "UncordonNode")) == 1, "uncordoned twice"


# -- items 5 and 8: lease errors counted to exhaustion, restore and release ----


async def test_a_lease_that_cannot_be_renewed_fails_restores_and_is_released(
    operator: Operator, api: Api, node_factory: Any
) -> None:
    (target,) = await node_factory(1)
    name = f"nm-{uid()}"
    await api.create_nm(name, target)
    await wait_status(api, name, "Succeeded", lambda s: s.get("phase") == "Succeeded")
    lease_path = f"{LEASES}/node-{target}"
    seen: list[tuple[int, str]] = []

    async with denied(
        api,
        group="coordination.k8s.io",
        version="v1",
        resource="leases",
        name=f"node-{target}",
        probe=lease_path,
    ) as message:

        def failed(st: dict[str, Any]) -> bool:
            seen.append((int(st.get("errorOnLeaseCount") or 0), st.get("lastError") or ""))
            return st.get("phase") == "Failed"

        st = await wait_status(api, name, "Failed after lease errors", failed, timeout=90)
        assert st["lastError"] == (
            "maintenance failed: lease could not be extended after 4 attempts"
        ), st
        # while counting, lastError is the API's own message (the Go NMO's err)
        counting = [(n, e) for n, e in seen if 0 < n <= 3]
        assert counting, f"no count seen before the failure: {seen}"
        assert all(message in e for _, e in counting), counting
        node = await api.node(target)
        assert not node["spec"].get("unschedulable")
        assert not {t["key"] for t in node["spec"].get("taints") or []} & TAINT_KEYS
        assert LABEL not in node["metadata"]["labels"]
        # As the Go NMO's stopNodeMaintenanceImp: UncordonNode, and our lease released.
        assert len(await api.wait_events(target, "UncordonNode")) == 1
        assert len(await api.wait_events(name, "FailedMaintenance")) == 1
        assert await api.lease(target) is None, "the lease was not released"
    await remove_nm(api, name)
    assert len(await api.events(target, "UncordonNode")) == 1, "uncordoned twice"


# -- items 6 and 7: lastUpdate once a minute, omitempty ------------------------


HEARTBEAT = 10  # --status-heartbeat of the test's own nmo (the default, 60, is unit-tested)


async def test_last_update_moves_once_a_heartbeat_and_empty_fields_are_omitted(
    sole_operator: None,
    api: Api,
    namespace: str,
    node_factory: Any,
    sandbox: Sandbox,
    tmp_path: Path,
) -> None:
    own = Operator(sandbox, tmp_path, extra=["--status-heartbeat", str(HEARTBEAT)])
    own.log_dir.mkdir(parents=True, exist_ok=True)
    CURRENT.append(own)
    await own.start()
    try:
        await _heartbeat_and_omitempty(api, namespace, node_factory, sandbox)
    finally:
        own.kill(signal.SIGTERM)
        CURRENT.remove(own)


async def _heartbeat_and_omitempty(
    api: Api, namespace: str, node_factory: Any, sandbox: Sandbox
) -> None:
    (target,) = await node_factory(1)
    await api.create(
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        deployment("db", 1, {"app": "db"}, pod_spec({"kubernetes.io/hostname": target})),
    )
    budget = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
    await api.create(budget, pdb("db-pdb", {"app": "db"}, 1))

    async def healthy() -> bool:
        obj = await api.get(f"{budget}/db-pdb")
        return (obj or {}).get("status", {}).get("currentHealthy") == 1

    await wait_for(healthy, what="PDB computed")
    name = f"nm-{uid()}"
    await api.create_nm(name, target)
    st = await wait_status(
        api, name, "blocked by the PDB", lambda s: bool(s.get("pendingPodsDetails"))
    )
    assert st["phase"] == "Running"
    assert "errorOnLeaseCount" not in st, "a zero count is omitted, as Go's omitempty"
    assert "drainProgress" not in st, "0 % is omitted, as Go's omitempty"

    async def last_update() -> datetime:
        stamp = status_of(await api.nm(name))["lastUpdate"]
        assert SECONDS.match(stamp), f"lastUpdate {stamp} not at second precision"
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))

    # Settled: the drain's first writes are over (lastUpdate still for 5 s).
    settled, since = await last_update(), time.monotonic()
    while time.monotonic() - since < 5:
        await asyncio.sleep(0.5)
        if (now := await last_update()) != settled:
            settled, since = now, time.monotonic()
    window = await AuditWindow.open(sandbox)
    oldest, moved = 0.0, settled
    deadline = time.monotonic() + HEARTBEAT + 30
    while moved == settled:
        assert time.monotonic() < deadline, f"lastUpdate stuck at {settled}"
        await asyncio.sleep(1)
        moved = await last_update()
        oldest = max(oldest, (datetime.now(UTC) - moved).total_seconds())
    events = nmo_events(await window.close())
    writes = [e for e in events if e.on(PLURAL, name, subresource="status") and e.is_write]
    gap = (moved - settled).total_seconds()
    print(f"\nlastUpdate moved after {gap:.0f}s; oldest seen {oldest:.1f}s; {len(writes)} writes")
    assert HEARTBEAT - 1 <= gap <= HEARTBEAT + 2, (settled, moved)
    assert oldest <= HEARTBEAT + 4, f"lastUpdate {oldest:.1f}s old while Running"
    assert len(writes) == 1, "more than one status write a heartbeat:\n" + show(writes)

    await api.merge(f"{budget}/db-pdb", {"spec": {"minAvailable": 0}})
    st = await wait_status(api, name, "Succeeded", lambda s: s.get("phase") == "Succeeded")
    for absent in (
        "pendingPods",
        "pendingPodsRefs",
        "pendingPodsDetails",
        "lastError",
        "errorOnLeaseCount",
    ):
        assert absent not in st, f"{absent} was set before and must be gone: {st}"
    assert st["drainProgress"] == 100 and st["evictionPods"] == 1 and st["totalpods"] == 1
    printed = await kubectl(
        sandbox,
        "get",
        "nm",
        name,
        "-o",
        "jsonpath={.status.errorOnLeaseCount}|{.status.pendingPods}|{.status.drainProgress}",
    )
    assert printed == "||100", printed
    await remove_nm(api, name)


async def kubectl(sandbox: Sandbox, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        str(sandbox.bin_dir / "kubectl"),
        "--kubeconfig",
        str(sandbox.kubeconfig),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


# -- item 10: medik8s/common's lease corner cases -----------------------------


def foreign(node: str, holder: str | None, *, renewed: bool = True) -> dict[str, Any]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    spec: dict[str, Any] = {"leaseDurationSeconds": 3600, "acquireTime": now}
    if holder is not None:
        spec["holderIdentity"] = holder
    if renewed:
        spec["renewTime"] = now
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": f"node-{node}", "namespace": "medik8s-leases"},
        "spec": spec,
    }


async def test_a_valid_lease_with_an_empty_holder_is_not_taken_over(
    operator: Operator, api: Api, node_factory: Any
) -> None:
    (target,) = await node_factory(1)
    await api.create(LEASES, foreign(target, ""))
    name = f"nm-{uid()}"
    await api.create_nm(name, target)
    st = await wait_status(api, name, "lease refused", lambda s: HELD in (s.get("lastError") or ""))
    assert st["lastError"] == (
        f"failed to obtain a lease that is not owned by us : {HELD} errorOnLeaseCount 0"
    ), st
    assert "errorOnLeaseCount" not in st
    lease = await api.lease(target)
    assert lease is not None and lease["spec"]["holderIdentity"] == "", "taken over"
    assert not (await api.node(target))["spec"].get("unschedulable")
    await api.delete(f"{LEASES}/node-{target}")
    await wait_status(api, name, "Succeeded", lambda s: s.get("phase") == "Succeeded")
    await remove_nm(api, name)


async def test_a_lease_without_renew_time_is_taken_over_and_owned_by_the_node(
    operator: Operator, api: Api, node_factory: Any
) -> None:
    (target,) = await node_factory(1)
    await api.create(LEASES, foreign(target, "node-healthcheck", renewed=False))
    name = f"nm-{uid()}"
    await api.create_nm(name, target)
    await wait_status(api, name, "Succeeded", lambda s: s.get("phase") == "Succeeded")
    lease = await api.lease(target)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "node-maintenance"
    assert lease["spec"]["leaseTransitions"] == 1
    node = await api.node(target)
    assert lease["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": target, "uid": node["metadata"]["uid"]}
    ]
    # A renewal points the ownerReferences at the Node again (common's RequestLease).
    lease["metadata"]["ownerReferences"] = []
    resp = await api.c.put(f"{LEASES}/node-{target}", json=lease)
    assert resp.status_code == 200, resp.text

    async def owned_again() -> bool:
        again = await api.lease(target)
        refs = (again or {}).get("metadata", {}).get("ownerReferences") or []
        return [r.get("uid") for r in refs] == [node["metadata"]["uid"]]

    await wait_for(owned_again, timeout=30, what="ownerReferences restored by a renewal")
    await remove_nm(api, name)
    assert await api.lease(target) is None
