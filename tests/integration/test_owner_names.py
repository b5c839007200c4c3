"""A pod's ownerReference name never chooses what nmo fetches (issue 14, item 4).

A tenant can write any name into its pod's ownerReference. Pasted into a
path, ``x/../../../../../../../api/v1/namespaces/<ns>/secrets/<s>`` made nmo
GET that Secret with its own ServiceAccount: a 200 spared the pod from
eviction (it "is" a DaemonSet pod), a 403 blocked the node's maintenance.
nmo must refuse the name, treat the owner as "not an existing DaemonSet"
(the pod is evicted, as kubectl would) and complete the maintenance.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from audit import AuditWindow, nmo_events, show
from objects import NM, Api, pod_spec, uid
from operator_fixtures import Operator, wait_for

from nmo_sandbox import Sandbox

pytestmark = pytest.mark.integration


@pytest.fixture
async def api(kube: httpx.AsyncClient) -> Api:
    return Api(kube)


async def test_a_crafted_daemonset_owner_is_not_followed(
    sandbox: Sandbox, operator: Operator, api: Api, namespace: str, node_factory: Any
) -> None:
    (target,) = await node_factory(1)
    secret = f"bait-{uid()}"
    bait = await api.create(
        f"/api/v1/namespaces/{namespace}/secrets",
        {"metadata": {"name": secret}, "stringData": {"k": "v"}},
    )
    # seven ".." climb out of /apis/apps/v1/namespaces/<ns>/daemonsets/x
    crafted = "x/" + "../" * 7 + f"api/v1/namespaces/{namespace}/secrets/{secret}"
    pod = "tenant"
    spec = pod_spec(node_name=target)
    await api.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "metadata": {
                "name": pod,
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "DaemonSet",
                        "name": crafted,
                        # The garbage collector follows the crafted name too: with
                        # the Secret's uid it finds the "owner" and keeps the pod,
                        # so only nmo decides what happens to it.
                        "uid": bait["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": spec,
        },
    )
    stored = await api.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    assert stored is not None
    assert stored["metadata"]["ownerReferences"][0]["name"] == crafted

    window = await AuditWindow.open(sandbox)
    name = f"owner-{uid()}"
    await api.create_nm(name, target)
    try:

        async def succeeded() -> bool:
            return await api.phase(name) == "Succeeded"

        await wait_for(succeeded, timeout=90, what=f"{name} Succeeded")

        async def evicted() -> bool:
            return await api.get(f"/api/v1/namespaces/{namespace}/pods/{pod}") is None

        await wait_for(evicted, timeout=60, what="the pod with the crafted owner evicted")
        requests = nmo_events(await window.close())
        valid = re.compile(
            rf"^/apis/apps/v1/namespaces/{namespace}/daemonsets/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
        )
        strays = [
            e
            for e in requests
            if e.resource in ("secrets", "daemonsets") or "secrets" in e.uri or ".." in e.uri
        ]
        strays = [e for e in strays if not valid.match(e.uri.split("?", 1)[0])]
        assert not strays, "nmo requested a path it was steered to:\n" + show(strays)
        evictions = [e for e in requests if e.on("pods", pod, subresource="eviction")]
        assert evictions, "the pod was not evicted by nmo:\n" + show(requests)
    finally:
        await api.delete(f"{NM}/{name}")
