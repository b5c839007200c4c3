"""A CR that disappears without nmo seeing its DELETE leaves nothing running.

Two ways a CR goes unseen (core-v2 item 3):

* its finalizer is stripped and it is deleted while nmo is stopped;
* it is deleted during a watch gap that ends in a re-list: here the
  apiserver is down while the CR and its lease are removed from etcd
  directly, so the restarted apiserver's watch cache starts past nmo's
  resourceVersion and nmo must re-list.

Either way no renewer for that node may survive, and its released lease must
never be re-created. Absence is proved from the audit log within a window
bounded by positive events: a control maintenance on another node renews
its lease (``--lease-renew-interval 2``) at least twice after the gap, so the
renewers had time to act; nmo never wrote the victim's lease, and made no
request for it at all once its NodeMaintenance LIST had answered (a renewal
already under way may read the lease once and find it gone).
"""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest
from audit import AuditEvent, AuditLog, nmo_events, show
from objects import NM, Api, uid
from operator_fixtures import Operator, wait_for

from nmo.api import constants as c
from nmo_sandbox import Sandbox

pytestmark = pytest.mark.usefixtures("operator")

LEASE_NS = "medik8s-leases"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases"


class Seen:
    """nmo's audit events since a point in time, read incrementally."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._log = AuditLog(sandbox.audit_log)
        self.events: list[AuditEvent] = []

    def read(self) -> list[AuditEvent]:
        self.events += nmo_events(self._log.read())
        return self.events

    def lease(self, node: str) -> list[AuditEvent]:
        return [
            e
            for e in self.read()
            if e.resource == "leases"
            and e.namespace == LEASE_NS
            and (e.name == f"node-{node}" or (e.verb == "create" and f"node-{node}" in str(e.raw)))
        ]

    def renewals(self, node: str) -> int:
        return sum(1 for e in self.lease(node) if e.verb == "update")

    def maintenance_lists(self) -> list[AuditEvent]:
        return [e for e in self.read() if e.verb == "list" and e.on(c.PLURAL)]


@pytest.fixture
async def api(kube: httpx.AsyncClient) -> Api:
    return Api(kube)


async def _etcd_delete(sandbox: Sandbox, key: str) -> None:
    """Delete one key through etcd's JSON gateway (the apiserver is down)."""
    async with httpx.AsyncClient(timeout=10) as etcd:
        resp = await etcd.post(
            f"http://127.0.0.1:{sandbox.ports.etcd}/v3/kv/deleterange",
            json={"key": base64.b64encode(key.encode()).decode()},
        )
    assert resp.status_code == 200, resp.text
    assert resp.json().get("deleted") == "1", f"{key}: {resp.text}"


async def _two_maintenances(api: Api, node_factory: Any) -> tuple[str, str, str, str]:
    victim_node, control_node = await node_factory(2)
    victim, control = f"nm-{uid()}", f"nm-{uid()}"
    await api.create_nm(victim, victim_node)
    await api.create_nm(control, control_node)
    for name in (victim, control):

        async def done(n: str = name) -> bool:
            return await api.phase(n) == "Succeeded"

        await wait_for(done, what=f"{name} Succeeded")
    assert await api.lease(victim_node) is not None
    return victim, victim_node, control, control_node


async def _assert_left_alone(seen: Seen, api: Api, victim_node: str, control_node: str) -> None:
    """No write to the victim's lease, and no request at all once nmo knew."""

    async def control_renewed_twice() -> bool:
        return seen.renewals(control_node) >= 2

    await wait_for(control_renewed_twice, timeout=60, what="two renewals of the control lease")
    touched = seen.lease(victim_node)
    writes = [e for e in touched if e.is_write]
    assert writes == [], f"nmo wrote the lease of a forgotten maintenance:\n{show(writes)}"
    known = min(str(e.raw.get("stageTimestamp")) for e in seen.maintenance_lists())
    late = [e for e in touched if str(e.raw.get("requestReceivedTimestamp")) > known]
    assert late == [], f"a renewer outlived its maintenance:\n{show(late)}"
    assert await api.lease(victim_node) is None, "the released lease was re-created"


async def test_deleted_while_nmo_was_stopped(
    operator: Operator, api: Api, node_factory: Any, sandbox: Sandbox
) -> None:
    victim, victim_node, control, control_node = await _two_maintenances(api, node_factory)
    operator.kill()
    await api.merge(f"{NM}/{victim}", {"metadata": {"finalizers": None}})
    await api.delete(f"{NM}/{victim}")
    await api.delete(
        f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases/node-{victim_node}"
    )
    seen = Seen(sandbox)
    await operator.start()
    await _assert_left_alone(seen, api, victim_node, control_node)
    await api.delete_nm_and_wait_gone(control)


async def test_deleted_during_a_watch_gap(
    operator: Operator, api: Api, node_factory: Any, sandbox: Sandbox
) -> None:
    victim, victim_node, control, control_node = await _two_maintenances(api, node_factory)
    await sandbox.stop_apiserver()
    await _etcd_delete(sandbox, f"/registry/nodemaintenance.medik8s.io/nodemaintenances/{victim}")
    await _etcd_delete(sandbox, f"/registry/leases/{LEASE_NS}/node-{victim_node}")
    seen = Seen(sandbox)
    await sandbox.start_apiserver()
    async with sandbox.client() as fresh:
        again = Api(fresh)

        async def relisted() -> bool:
            return bool(seen.maintenance_lists())

        await wait_for(relisted, timeout=60, what="nmo re-listing NodeMaintenances")
        await _assert_left_alone(seen, again, victim_node, control_node)
        assert operator.proc is not None and operator.proc.poll() is None
        await again.delete_nm_and_wait_gone(control)
