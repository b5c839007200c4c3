"""The maintenance engine on the real sandbox (behavior.md A2-A5, B1-B9; B1,
B2, B8 and B9 where the Go NMO fails them are in test_improvements.py).

Every test gets its own kwok nodes and namespace; the session's nmo process
(``operator``) reconciles all of them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from audit import AuditWindow, nmo_events, show
from objects import NM, Api, deployment, pdb, pod_spec, uid
from operator_fixtures import Operator, idle, metric, wait_for

from nmo.api.constants import PLURAL
from nmo_sandbox import Sandbox

pytestmark = pytest.mark.integration

RETRIES = ("requeue", "error")  # nmo_reconcile_total results that schedule another pass
TAINT_KEYS = {"node.kubernetes.io/unschedulable", "medik8s.io/drain"}
LABEL = "remediation.medik8s.io/exclude-from-remediation"
PRIOR = "nodemaintenance.medik8s.io/prior-node-state"  # nmo's record, on the Node


@pytest.fixture
async def api(kube: httpx.AsyncClient) -> Api:
    return Api(kube)


def taint_keys(node: dict[str, Any]) -> set[str]:
    return {t["key"] for t in node["spec"].get("taints") or []}


async def wait_phase(api: Api, name: str, phase: str, timeout: float = 90) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        obj = await api.nm(name)
        return obj if obj and (obj.get("status") or {}).get("phase") == phase else None

    return await wait_for(check, timeout=timeout, what=f"{name} phase {phase}")


async def remove_nm(api: Api, name: str, timeout: float = 30) -> None:
    await api.delete(f"{NM}/{name}")

    async def gone() -> bool:
        return await api.nm(name) is None

    await wait_for(gone, timeout=timeout, what=f"{name} deleted")


async def reconciled_again(operator: Operator, api: Api, name: str, times: int = 1) -> str:
    """Make nmo run ``times`` more passes over ``name``, one after the other;
    returns the resourceVersion of the last change made for it.

    Each pass is caused by an annotation change (nmo reacts to any change but
    the status) and seen in nmo's ``nmo_reconcile_total``.
    """
    rv = ""
    for _ in range(times):
        # Idle first: a pass still finishing when ``before`` is read would be
        # taken for the pass the poke causes.
        before = metric(await idle(operator.metrics_port), "nmo_reconcile_total")
        poked = await api.merge(
            f"{NM}/{name}", {"metadata": {"annotations": {"example.com/poke": uid()}}}
        )
        rv = str(poked["metadata"]["resourceVersion"])

        async def counted(before: float = before) -> bool:
            return await operator.metric("nmo_reconcile_total") > before

        await wait_for(counted, timeout=30, what=f"nmo to reconcile {name} again")
    return rv


async def lease_renewed(api: Api, node: str, times: int = 1) -> None:
    """Wait until the node's lease has been renewed ``times`` more times."""
    seen: set[str] = set()

    async def renewed() -> bool:
        lease = await api.lease(node)
        assert lease is not None, f"the lease of node {node} is gone"
        seen.add(lease["spec"]["renewTime"])
        return len(seen) > times

    await wait_for(renewed, timeout=30, what=f"{times} more renewals of node-{node}'s lease")


async def test_full_maintenance_and_removal(
    operator: Operator, api: Api, namespace: str, node_factory: Any, sandbox: Sandbox
) -> None:
    pool = f"pool-{uid()}"
    (target,) = await node_factory(1, labels={"pool": pool})
    (spare,) = await node_factory(1)
    ns = namespace
    # Workloads on the target: a Deployment, a DaemonSet pod, a bare pod, an emptyDir pod.
    await api.create(
        f"/apis/apps/v1/namespaces/{ns}/deployments",
        deployment("web", 2, {"app": "web"}, pod_spec({"pool": pool})),
    )
    ds = deployment("agent", 0, {"app": "agent"}, pod_spec({"kubernetes.io/hostname": target}))
    ds["kind"] = "DaemonSet"
    del ds["spec"]["replicas"]
    await api.create(f"/apis/apps/v1/namespaces/{ns}/daemonsets", ds)
    await api.create(
        f"/api/v1/namespaces/{ns}/pods",
        {"metadata": {"name": "bare"}, "spec": pod_spec(node_name=target)},
    )
    await api.create(
        f"/api/v1/namespaces/{ns}/pods",
        {"metadata": {"name": "scratch"}, "spec": pod_spec(node_name=target, empty_dir=True)},
    )

    async def all_running() -> bool:
        pods = await api.pods(ns, node=target)
        return len(pods) == 5 and all(p["status"].get("phase") == "Running" for p in pods)

    await wait_for(all_running, what="5 running pods on the target")
    # Now the spare node may take the Deployment's replacements.
    await api.merge(f"/api/v1/nodes/{spare}", {"metadata": {"labels": {"pool": pool}}})
    ds_pod = next(
        p for p in await api.pods(ns, node=target) if p["metadata"]["name"].startswith("agent")
    )

    name = f"nm-{uid()}"
    await api.create_nm(name, target)
    nm = await wait_phase(api, name, "Succeeded")
    st = nm["status"]
    assert st["drainProgress"] == 100
    assert st["totalpods"] == 5
    assert st["evictionPods"] == 4
    assert st.get("pendingPods", []) == []
    assert "lastError" not in st  # B5: cleared on success
    assert "ownerReferences" not in nm["metadata"]  # B6 withdrawn: the Go NMO keeps none

    node = await api.node(target)
    assert node["spec"]["unschedulable"] is True
    assert taint_keys(node) >= TAINT_KEYS
    assert node["metadata"]["labels"][LABEL] == "true"
    left = await api.pods(ns, node=target)
    assert [p["metadata"]["uid"] for p in left] == [
        ds_pod["metadata"]["uid"]
    ]  # DaemonSet untouched

    async def web_elsewhere() -> bool:
        pods = [p for p in await api.pods(ns) if p["metadata"]["name"].startswith("web")]
        return len(pods) == 2 and all(
            p["spec"].get("nodeName") == spare and p["status"].get("phase") == "Running"
            for p in pods
        )

    await wait_for(web_elsewhere, what="Deployment replacements running on the spare node")

    lease = await api.lease(target)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "node-maintenance"
    assert lease["spec"]["leaseDurationSeconds"] == 3600
    assert lease["metadata"]["ownerReferences"][0]["name"] == target

    # B4: more reconciles and lease renewals emit no event again (none created,
    # none updated with a higher count). The Go NMO re-emits SucceedMaintenance
    # on every reconcile, and its recorder aggregates the repeats into one Event
    # object whose count grows: the count, not the number of objects, tells.
    async def succeed_recorded() -> bool:
        return len(await api.events(name, "SucceedMaintenance")) == 1

    await wait_for(succeed_recorded, what="SucceedMaintenance recorded")
    window = await AuditWindow.open(sandbox)
    await reconciled_again(operator, api, name, times=3)
    await lease_renewed(api, target, times=2)
    emitted = [e for e in nmo_events(await window.close()) if e.on("events") and e.is_write]
    assert not emitted, "events recorded again:\n" + show(emitted)
    for reason in ("BeginMaintenance", "SucceedMaintenance"):
        (recorded,) = await api.events(name, reason)
        assert recorded["count"] == 1, f"{reason} recorded {recorded['count']} times"

    # A foreign finalizer must survive our removal.
    await api.merge(
        f"{NM}/{name}",
        {"metadata": {"finalizers": [*nm["metadata"]["finalizers"], "example.com/keep"]}},
    )
    await api.delete(f"{NM}/{name}")

    async def released() -> dict[str, Any] | None:
        obj = await api.nm(name)
        return obj if obj and obj["metadata"]["finalizers"] == ["example.com/keep"] else None

    await wait_for(released, what="our finalizer removed, the foreign one kept")
    node = await api.node(target)
    assert not node["spec"].get("unschedulable")
    assert not taint_keys(node) & TAINT_KEYS
    assert LABEL not in node["metadata"]["labels"]
    assert await api.lease(target) is None
    assert len(await api.wait_events(target, "UncordonNode")) == 1
    assert len(await api.wait_events(name, "RemovedMaintenance")) == 1
    await api.merge(f"{NM}/{name}", {"metadata": {"finalizers": []}})


async def test_missing_node_fails_without_retry(
    operator: Operator, api: Api, sandbox: Sandbox
) -> None:
    name, node = f"nm-{uid()}", f"missing-{uid()}"
    listed = await api.get(NM)
    others = [o["metadata"]["name"] for o in (listed or {}).get("items", [])]
    # nmo's counters are per process: they speak of this CR only if it is alone.
    assert others == [], f"NodeMaintenances left behind by earlier tests: {others}"
    retries = {r: await operator.metric("nmo_reconcile_total", result=r) for r in RETRIES}
    window = await AuditWindow.open(sandbox)
    await api.create_nm(name, node)
    nm = await wait_phase(api, name, "Failed")
    assert nm["status"]["lastError"] == f'nodes "{node}" not found'
    rv = await reconciled_again(operator, api, name)  # a pass over the Failed CR
    again = await api.nm(name)
    assert again is not None
    assert again["metadata"]["resourceVersion"] == rv, "a Failed maintenance was retried"
    # Deleting it makes the last pass over it: by the time it is gone every
    # earlier pass has finished (one key is never reconciled twice at once).
    await remove_nm(api, name)
    assert len(await api.events(name, "FailedMaintenance")) == 1
    logged = await window.close()
    deleted = next(
        e.received for e in logged if not e.is_nmo and e.verb == "delete" and e.on(PLURAL, name)
    )
    events = nmo_events(logged)
    status_writes = [e for e in events if e.on(PLURAL, name, subresource="status") and e.is_write]
    assert len(status_writes) == 1, "a Failed maintenance was retried:\n" + show(status_writes)
    lookups = [e for e in events if e.on("nodes", node, subresource=None) and e.received < deleted]
    assert len(lookups) <= 1, "the missing node was looked up again:\n" + show(lookups)
    for result, count in retries.items():
        assert await operator.metric("nmo_reconcile_total", result=result) == count, (
            f"a reconcile of the Failed maintenance ended in {result}"
        )


def foreign_lease(node: dict[str, Any], holder: str = "node-healthcheck") -> dict[str, Any]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": f"node-{node['metadata']['name']}", "namespace": "medik8s-leases"},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 3600,
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": 0,
        },
    }


async def test_foreign_lease_blocks_then_release_lets_it_run(
    operator: Operator, api: Api, node_factory: Any, sandbox: Sandbox
) -> None:
    (target,) = await node_factory(1)
    await api.create(
        "/apis/coordination.k8s.io/v1/namespaces/medik8s-leases/leases",
        foreign_lease(await api.node(target)),
    )
    name = f"nm-{uid()}"
    await api.create_nm(name, target)

    async def blocked() -> dict[str, Any] | None:
        obj = await api.nm(name)
        err = ((obj or {}).get("status") or {}).get("lastError") or ""
        return obj if "can't update or invalidate the lease" in err else None

    nm = await wait_for(blocked, what="lease conflict reported")
    assert nm["status"]["phase"] == "Running"
    assert nm["status"]["lastError"] == (  # the Go NMO's words
        "failed to obtain a lease that is not owned by us : can't update or invalidate the "
        "lease because it is held by different owner: node-healthcheck errorOnLeaseCount 0"
    )
    # Two more attempts, both refused: not counted, and nothing done without the lease.
    window = await AuditWindow.open(sandbox)
    refused = await operator.metric("nmo_lease_errors_total", kind="foreign")

    async def retried_twice() -> bool:
        return await operator.metric("nmo_lease_errors_total", kind="foreign") >= refused + 2

    await wait_for(retried_twice, timeout=30, what="two more refused lease attempts")
    logged = nmo_events(await window.close())
    touched = [
        e
        for e in logged
        if e.is_write
        and (e.on("nodes", target, subresource=None) or e.on("leases", f"node-{target}"))
    ]
    assert not touched, "node or lease written without the lease:\n" + show(touched)
    # A refused attempt that changes nothing writes nothing (lastUpdate: once a minute).
    rewrites = [e for e in logged if e.is_write and e.on(PLURAL, name, subresource="status")]
    assert len(rewrites) <= 1, "status rewritten on every attempt:\n" + show(rewrites)
    nm = await api.nm(name)
    assert nm is not None
    assert "errorOnLeaseCount" not in nm["status"]  # 0, omitted as Go's omitempty does
    assert not (await api.node(target))["spec"].get("unschedulable"), "drained without the lease"

    await api.delete(f"/apis/coordination.k8s.io/v1/namespaces/medik8s-leases/leases/node-{target}")
    await wait_phase(api, name, "Succeeded", timeout=30)
    await remove_nm(api, name)


async def test_lease_taken_away_after_progress_fails_and_restores(
    operator: Operator, api: Api, node_factory: Any
) -> None:
    (target,) = await node_factory(1)
    name = f"nm-{uid()}"
    await api.create_nm(name, target)
    await wait_phase(api, name, "Succeeded")
    path = f"/apis/coordination.k8s.io/v1/namespaces/medik8s-leases/leases/node-{target}"
    lease = await api.get(path)
    assert lease is not None
    taken = foreign_lease(await api.node(target))
    taken["metadata"]["resourceVersion"] = lease["metadata"]["resourceVersion"]
    resp = await api.c.put(path, json=taken)
    assert resp.status_code == 200, resp.text

    counts: list[int] = []
    errors: list[str] = []

    async def failed() -> dict[str, Any] | None:
        obj = await api.nm(name)
        st = (obj or {}).get("status") or {}
        counts.append(int(st.get("errorOnLeaseCount") or 0))
        errors.append(st.get("lastError") or "")
        return obj if st.get("phase") == "Failed" else None

    nm = await wait_for(failed, timeout=60, what="Failed after lease errors")
    assert max(counts) >= 1
    assert "lease could not be extended after 4 attempts" in nm["status"]["lastError"]
    extend = (
        "failed to extend a lease that used to be owned by us, incrementing error on lease "
        "count: can't update or invalidate the lease because it is held by different owner: "
        "node-healthcheck, errorOnLeaseCount: "
    )
    counted = [e for e in errors if e.startswith("failed to extend")]
    assert counted and all(e[len(extend) :] in ("1", "2", "3") for e in counted), errors
    assert all(e.startswith(extend) for e in counted), counted
    node = await api.node(target)
    assert not node["spec"].get("unschedulable")
    assert not taint_keys(node) & TAINT_KEYS
    assert LABEL not in node["metadata"]["labels"]
    # the Go NMO's restore after lease exhaustion records UncordonNode
    assert len(await api.wait_events(target, "UncordonNode")) == 1
    await remove_nm(api, name)
    assert len(await api.events(target, "UncordonNode")) == 1, "uncordoned twice"
    lease = await api.get(path)
    assert lease is not None and lease["spec"]["holderIdentity"] == "node-healthcheck"  # left alone
    await api.delete(path)


async def test_pdb_blocks_then_relaxing_it_completes(
    operator: Operator, api: Api, namespace: str, node_factory: Any
) -> None:
    (target,) = await node_factory(1)
    ns = namespace
    await api.create(
        f"/apis/apps/v1/namespaces/{ns}/deployments",
        deployment("db", 2, {"app": "db"}, pod_spec({"kubernetes.io/hostname": target})),
    )
    await api.create(
        f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", pdb("db-pdb", {"app": "db"}, 2)
    )
    await api.create(
        f"/api/v1/namespaces/{ns}/pods",
        {"metadata": {"name": "free"}, "spec": pod_spec(node_name=target)},
    )

    async def ready() -> bool:
        pods = await api.pods(ns, node=target)
        budget = await api.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/db-pdb")
        return (
            len(pods) == 3
            and all(p["status"].get("phase") == "Running" for p in pods)
            and (budget or {}).get("status", {}).get("currentHealthy") == 2
        )

    await wait_for(ready, what="pods running and PDB computed")
    name = f"nm-{uid()}"
    await api.create_nm(name, target)

    async def blocked() -> dict[str, Any] | None:
        obj = await api.nm(name)
        st = (obj or {}).get("status") or {}
        details = st.get("pendingPodsDetails") or []
        if len(details) == 2 and all(d["reason"] == "DisruptionBudget" for d in details):
            return obj
        return None

    nm = await wait_for(blocked, what="both db pods blocked by the PDB")
    st = nm["status"]
    assert st["phase"] == "Running"
    assert 0 < st["drainProgress"] < 100
    assert all(d["disruptionBudget"] == "db-pdb" for d in st["pendingPodsDetails"])
    assert sorted(st["pendingPods"]) == sorted(p["name"] for p in st["pendingPodsRefs"])
    started = datetime.fromisoformat(st["drainStartTime"].replace("Z", "+00:00"))
    if (datetime.now(UTC) - started).total_seconds() < 29:
        assert "lastError" not in st, "the Go NMO writes none before a 30 s drain pass ends"
    else:
        assert "global timeout reached: 30s" in st["lastError"], st["lastError"]

    await api.merge(
        f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/db-pdb",
        {"spec": {"minAvailable": 0}},
    )
    nm = await wait_phase(api, name, "Succeeded", timeout=60)
    assert "lastError" not in nm["status"]
    await remove_nm(api, name)


async def test_duplicate_cr_refused_by_reconciler(
    operator: Operator, api: Api, node_factory: Any
) -> None:
    (target,) = await node_factory(1)
    first, second = f"nm-{uid()}-a", f"nm-{uid()}-b"
    await api.create_nm(first, target)
    await wait_phase(api, first, "Succeeded")
    await api.create_nm(second, target)
    dup = await wait_phase(api, second, "Failed")
    assert (
        dup["status"]["lastError"]
        == f"invalid nodeName, a NodeMaintenance for node {target} already exists"
    )
    await remove_nm(api, second)
    node = await api.node(target)
    assert node["spec"]["unschedulable"] is True, (
        "removing the duplicate undid the real maintenance"
    )
    assert await api.phase(first) == "Succeeded"
    await remove_nm(api, first)
    assert not (await api.node(target))["spec"].get("unschedulable")


async def test_prior_cordon_and_taints_are_kept(
    operator: Operator, api: Api, node_factory: Any
) -> None:
    (target,) = await node_factory(1)
    own_taint = {"key": "example.com/dedicated", "value": "db", "effect": "NoSchedule"}
    node = await api.node(target)
    await api.merge(
        f"/api/v1/nodes/{target}",
        {
            "spec": {
                "unschedulable": True,
                "taints": [*(node["spec"].get("taints") or []), own_taint],
            }
        },
    )
    name = f"nm-{uid()}"
    await api.create_nm(name, target)
    await wait_phase(api, name, "Succeeded")
    await remove_nm(api, name)
    node = await api.node(target)
    assert node["spec"]["unschedulable"] is True, (
        "a node cordoned before maintenance was uncordoned"
    )
    assert own_taint in node["spec"]["taints"]
    assert not taint_keys(node) & {"medik8s.io/drain"}
    assert await api.events(target, "UncordonNode") == []
    (kept,) = await api.wait_events(target, "NodeKeptCordoned")
    assert kept["involvedObject"]["kind"] == "Node" and kept["type"] == "Normal"
    assert "stays cordoned" in kept["message"]
    assert PRIOR not in (node["metadata"].get("annotations") or {}), "the record stays behind"


async def test_a_prior_state_forged_on_the_cr_is_ignored(
    operator: Operator, api: Api, node_factory: Any
) -> None:
    """A CR author pre-sets "the node was cordoned, tainted and excluded before":
    nmo records the real state on the node and restores that."""
    (target,) = await node_factory(1)
    keep = {"example.com/keep": "yes"}  # the record is added to the map, never replaces it
    await api.merge(f"/api/v1/nodes/{target}", {"metadata": {"annotations": keep}})
    forged = json.dumps(
        {
            "unschedulable": True,
            "taints": ["medik8s.io/drain", "node.kubernetes.io/unschedulable"],
            "label": True,
        }
    )
    name = f"nm-{uid()}"
    created = await api.create(
        NM,
        {
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
            "kind": "NodeMaintenance",
            "metadata": {"name": name, "annotations": {PRIOR: forged}},
            "spec": {"nodeName": target},
        },
    )
    await wait_phase(api, name, "Succeeded")
    during = await api.node(target)
    assert during["metadata"]["annotations"].items() >= keep.items()
    record = json.loads(during["metadata"]["annotations"][PRIOR])
    assert record == {
        "unschedulable": False,
        "taints": [],
        "label": False,
        "maintenance": created["metadata"]["uid"],
    }
    await remove_nm(api, name)
    node = await api.node(target)
    assert not node["spec"].get("unschedulable"), "the forged prior state kept the cordon"
    assert not taint_keys(node) & {"medik8s.io/drain", "node.kubernetes.io/unschedulable"}
    assert "remediation.medik8s.io/exclude-from-remediation" not in node["metadata"]["labels"]
    assert PRIOR not in (node["metadata"].get("annotations") or {})
    assert node["metadata"]["annotations"].items() >= keep.items()


async def test_lease_renewed_in_background(operator: Operator, api: Api, node_factory: Any) -> None:
    (target,) = await node_factory(1)
    name = f"nm-{uid()}"
    await api.create_nm(name, target)
    await wait_phase(api, name, "Succeeded")
    first = await api.lease(target)
    assert first is not None

    async def renewed() -> bool:
        lease = await api.lease(target)
        return lease is not None and lease["spec"]["renewTime"] > first["spec"]["renewTime"]

    await wait_for(renewed, timeout=15, what="lease renewed with no reconcile running")
    await remove_nm(api, name)


async def test_node_deleted_keeps_the_cr_which_applies_again_when_the_node_returns(
    operator: Operator, api: Api, node_factory: Any, sandbox: Sandbox
) -> None:
    """As the Go NMO: the CR survives its Node (B6 withdrawn), and a Node that
    registers again under the name is put back into maintenance, never left
    schedulable mid-maintenance."""
    (target,) = await node_factory(1)
    name = f"nm-{uid()}"
    await api.create_nm(name, target)
    nm = await wait_phase(api, name, "Succeeded")
    assert "ownerReferences" not in nm["metadata"], "the CR would go with its Node"
    await sandbox.delete_node(target)
    failed = await wait_phase(api, name, "Failed")
    assert failed["status"]["lastError"] == f'nodes "{target}" not found'

    async def lease_collected() -> bool:  # owned by the Node: the garbage collector's
        return await api.lease(target) is None

    await wait_for(lease_collected, timeout=60, what="the deleted node's lease collected")
    assert await api.nm(name) is not None, "the CR went with its Node"

    await sandbox.create_node(target)  # the node registers again
    back = await wait_phase(api, name, "Succeeded")
    assert back["metadata"]["finalizers"] == ["foregroundDeleteNodeMaintenance"]
    node = await api.node(target)
    assert node["spec"]["unschedulable"] is True
    assert taint_keys(node) >= TAINT_KEYS
    assert node["metadata"]["labels"][LABEL] == "true"
    lease = await api.lease(target)
    assert lease is not None and lease["spec"]["holderIdentity"] == "node-maintenance"
    assert "exists again, resuming" in operator.logs()

    await remove_nm(api, name)
    node = await api.node(target)
    assert not node["spec"].get("unschedulable"), "leaving uncordons, as the Go NMO"
    assert not (taint_keys(node) & TAINT_KEYS)
    assert await api.lease(target) is None


async def test_a_node_owner_written_by_an_older_nmo_is_removed(
    operator: Operator, api: Api, node_factory: Any
) -> None:
    (target,) = await node_factory(1)
    node = await api.node(target)
    name = f"nm-{uid()}"
    old_ref = {
        "apiVersion": "v1",
        "kind": "Node",
        "name": target,
        "uid": node["metadata"]["uid"],
        "blockOwnerDeletion": False,
        "controller": False,
    }
    await api.create(
        NM,
        {
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
            "kind": "NodeMaintenance",
            "metadata": {"name": name, "ownerReferences": [old_ref]},
            "spec": {"nodeName": target},
        },
    )
    nm = await wait_phase(api, name, "Succeeded")
    assert "ownerReferences" not in nm["metadata"]
    await remove_nm(api, name)


async def pdb_blocked_maintenance(api: Api, ns: str, node_factory: Any) -> tuple[str, str]:
    """A maintenance whose only pod is held by a PDB (minAvailable 1); returns (CR, node)."""
    (target,) = await node_factory(1)
    await api.create(
        f"/apis/apps/v1/namespaces/{ns}/deployments",
        deployment("db", 1, {"app": "db"}, pod_spec({"kubernetes.io/hostname": target})),
    )
    await api.create(
        f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", pdb("db-pdb", {"app": "db"}, 1)
    )

    async def ready() -> bool:
        budget = await api.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/db-pdb")
        return (budget or {}).get("status", {}).get("currentHealthy") == 1

    await wait_for(ready, what="PDB computed")
    name = f"nm-{uid()}"
    await api.create_nm(name, target)

    async def blocked() -> bool:
        obj = await api.nm(name)
        return bool(((obj or {}).get("status") or {}).get("pendingPodsDetails"))

    await wait_for(blocked, what="drain blocked by PDB")
    return name, target


async def test_operator_restart_mid_drain_converges(
    operator: Operator, api: Api, namespace: str, node_factory: Any
) -> None:
    name, target = await pdb_blocked_maintenance(api, namespace, node_factory)
    operator.kill()
    await api.merge(
        f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/db-pdb",
        {"spec": {"minAvailable": 0}},
    )
    await operator.start()
    await wait_phase(api, name, "Succeeded", timeout=60)
    assert len(await api.events(name, "BeginMaintenance")) == 1
    assert len(await api.wait_events(name, "SucceedMaintenance")) == 1
    lease = await api.lease(target)
    assert lease is not None and lease["spec"]["leaseTransitions"] == 0
    await remove_nm(api, name)


async def test_apiserver_restart_mid_drain_converges(
    operator: Operator, api: Api, namespace: str, node_factory: Any, sandbox: Any
) -> None:
    name, node = await pdb_blocked_maintenance(api, namespace, node_factory)
    window = await AuditWindow.open(sandbox)
    await sandbox.restart_apiserver(downtime=3.0)
    async with sandbox.client() as fresh:
        again = Api(fresh)
        await again.merge(
            f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/db-pdb",
            {"spec": {"minAvailable": 0}},
        )
        await wait_phase(again, name, "Succeeded", timeout=90)
        await lease_renewed(again, node)  # nmo carries on after Succeeded, too
        requests = nmo_events(await window.close())
        lists = [e for e in requests if e.verb == "list"]
        print(f"\nnmo requests across the apiserver restart: {len(requests)} (LISTs: {len(lists)})")
        assert len(requests) < 300, "request storm after the apiserver restart:\n" + show(requests)
        assert operator.proc is not None and operator.proc.poll() is None, (
            "nmo died with the apiserver"
        )
        await remove_nm(again, name)


async def test_adopts_a_maintenance_started_by_the_go_nmo(
    operator: Operator, api: Api, namespace: str, node_factory: Any
) -> None:
    """A CR the Go NMO left Running: node cordoned, tainted, labelled, lease held."""
    (target,) = await node_factory(1)
    operator.kill()  # the Go NMO was in charge until now
    await api.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {"metadata": {"name": "left-behind"}, "spec": pod_spec(node_name=target)},
    )
    node = await api.node(target)
    await api.merge(
        f"/api/v1/nodes/{target}",
        {
            "metadata": {"labels": {LABEL: "true"}},
            "spec": {
                "unschedulable": True,
                "taints": [
                    *(node["spec"].get("taints") or []),
                    {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                    {"key": "medik8s.io/drain", "effect": "NoSchedule"},
                ],
            },
        },
    )
    lease = foreign_lease(node, holder="node-maintenance")
    await api.create("/apis/coordination.k8s.io/v1/namespaces/medik8s-leases/leases", lease)
    name = f"nm-{uid()}"
    created = await api.create(
        NM,
        {
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
            "kind": "NodeMaintenance",
            "metadata": {"name": name, "finalizers": ["foregroundDeleteNodeMaintenance"]},
            "spec": {"nodeName": target},
        },
    )
    # The Go NMO's status: Running, one pod pending, no nmo fields.
    resp = await api.c.patch(
        f"{NM}/{name}/status",
        json={
            "metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
            "status": {
                "phase": "Running",
                "drainProgress": 0,
                "evictionPods": 1,
                "totalpods": 1,
                "pendingPods": ["left-behind"],
                "lastError": "global timeout reached: 30s",
            },
        },
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert resp.status_code == 200, resp.text
    await operator.start()  # nmo takes over
    nm = await wait_phase(api, name, "Succeeded")
    assert "lastError" not in nm["status"]
    assert nm["status"]["evictionPods"] == 1  # NMO's figures are kept
    assert len(await api.wait_events(name, "SucceedMaintenance")) == 1
    assert len(await api.events(name, "BeginMaintenance")) == 0  # begun by NMO, not again
    await remove_nm(api, name)
    after = await api.node(target)
    assert not after["spec"].get("unschedulable"), "NMO's maintenance must end uncordoned"
    assert not taint_keys(after) & TAINT_KEYS
    assert LABEL not in after["metadata"]["labels"]
    assert await api.lease(target) is None
