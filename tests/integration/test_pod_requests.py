"""nmo reads pods node by node, never the whole cluster's (core-v2.md, "Memory
grows with the cluster, not with the work").

The apiserver's audit log shows every pod list and watch nmo makes. Over the
whole life of one nmo process that runs a maintenance from start to end,
each of them must carry the field selector ``spec.nodeName=<node>``, and at
least one must be for the node under maintenance.
"""

from __future__ import annotations

import re
import signal
from typing import Any

import httpx
import pytest
from audit import AuditEvent, AuditWindow, nmo_events, show
from objects import NM, Api, pod_spec, uid
from operator_fixtures import Operator, wait_for

from nmo.api import constants as c
from nmo_sandbox import Sandbox

pytestmark = pytest.mark.integration

_NODE_EQUALS = re.compile(r"spec\.nodeName==?([^=!].*)")


class UnscopedPodReads(AssertionError):
    """nmo listed or watched pods without restricting them to one node."""


@pytest.fixture
def api(kube: httpx.AsyncClient) -> Api:
    return Api(kube)


def selected_node(selector: str) -> str | None:
    """The node an equality requirement ``spec.nodeName=<node>`` (or ``==``) of a
    field selector names; None when there is none (``!=``, empty, absent)."""
    for requirement in selector.split(","):
        match = _NODE_EQUALS.fullmatch(requirement.strip())
        if match:
            return match.group(1)
    return None


def pod_reads(events: list[AuditEvent]) -> list[AuditEvent]:
    """nmo's lists and watches of pods (not of a subresource such as eviction)."""
    return [e for e in nmo_events(events) if e.on("pods") and e.verb in ("list", "watch")]


def nodes_read(event: AuditEvent) -> set[str]:
    """The nodes a pod list/watch is restricted to (empty: all pods it may see)."""
    return {node for sel in event.field_selectors if (node := selected_node(sel)) is not None}


@pytest.mark.parametrize(
    ("selector", "node"),
    [
        ("spec.nodeName=worker-1", "worker-1"),
        ("spec.nodeName==worker-1", "worker-1"),
        ("status.phase!=Succeeded,spec.nodeName=worker-1", "worker-1"),
        ("spec.nodeName!=", None),
        ("spec.nodeName!=worker-1", None),
        ("spec.nodeName=", None),
        ("metadata.namespace=default", None),
        ("", None),
    ],
)
def test_selected_node(selector: str, node: str | None) -> None:
    assert selected_node(selector) == node


def test_the_audit_uri_is_url_decoded() -> None:
    event = AuditEvent(
        {
            "userAgent": "nmo/0.1.0",
            "verb": "list",
            "objectRef": {"resource": "pods", "apiVersion": "v1"},
            "requestURI": "/api/v1/pods?fieldSelector=spec.nodeName%21%3D&limit=500",
            "requestReceivedTimestamp": "2025-01-01T00:00:00.000000Z",
        }
    )
    assert pod_reads([event]) == [event]
    assert event.field_selectors == ["spec.nodeName!="]
    assert nodes_read(event) == set()


async def test_nmo_lists_and_watches_pods_only_of_nodes_under_maintenance(
    operator: Operator, api: Api, namespace: str, node_factory: Any, sandbox: Sandbox
) -> None:
    (target,) = await node_factory(1)
    for i in range(3):
        await api.create(
            f"/api/v1/namespaces/{namespace}/pods",
            {"metadata": {"name": f"p{i}"}, "spec": pod_spec(node_name=target)},
        )

    async def running() -> bool:
        pods = await api.pods(namespace, node=target)
        return len(pods) == 3 and all(p["status"].get("phase") == "Running" for p in pods)

    await wait_for(running, what="3 running pods on the target")

    # One nmo process's whole life inside the window: started after the first
    # marker, stopped before the second (a watch is logged when it ends).
    window = await AuditWindow.open(sandbox)
    await operator.restart()
    try:
        name = f"nm-{uid()}"
        await api.create_nm(name, target)

        async def succeeded() -> bool:
            return await api.phase(name) == "Succeeded"

        await wait_for(succeeded, timeout=90, what=f"{name} Succeeded")
        assert await api.pods(namespace, node=target) == []
        await api.delete(f"{NM}/{name}")

        async def done() -> bool:
            gone = await api.nm(name) is None
            return gone and not (await api.node(target))["spec"].get("unschedulable")

        await wait_for(done, what=f"{name} removed and {target} uncordoned")

        def maintenance_watches() -> int:
            return sum(
                1
                for e in nmo_events(window.events())
                if e.verb == "watch" and e.on(c.PLURAL, subresource=None)
            )

        watches = maintenance_watches()
        operator.kill(signal.SIGTERM)

        async def watches_ended() -> bool:
            return maintenance_watches() > watches

        await wait_for(watches_ended, timeout=30, what="the stopped nmo's watches to be logged")
        events = await window.close()
    finally:
        if operator.proc is None:
            await operator.start()

    reads = pod_reads(events)
    unscoped = [e for e in reads if not nodes_read(e)]
    if unscoped:
        raise UnscopedPodReads(
            "nmo read pods beyond the nodes under maintenance:\n" + show(unscoped)
        )
    assert [e for e in reads if target in nodes_read(e)], (
        f"no nmo pod list or watch for node {target} (so nothing proves the check ran); "
        f"nmo's pod reads:\n{show(reads)}"
    )
