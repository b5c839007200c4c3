"""Names from objects never become paths nobody meant (issue 14, item 4).

``api_path`` refuses names that are not valid Kubernetes names, and the
reconciler treats a DaemonSet owner with such a name as "no DaemonSet": the
pod is evicted, as kubectl would, and nothing is requested for it.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import respx

from nmo.api.names import is_valid_name, name_error
from nmo.controller.memory import Memory
from nmo.controller.reconciler import Reconciler
from nmo.core.maintenance.observed import Read, ReadKind
from nmo.kube.client import Kube, api_path, node_path
from nmo.kube.errors import InvalidName, NotFound

CRAFTED = [
    "x/../../../api/v1/namespaces/kube-system/secrets/token",
    "..",
    ".",
    "x?watch=true",
    "x#frag",
    "x%2F..%2Fsecrets",
    "x/y",
    "",
    "UPPER",
    "a b",
    "-leading",
    "trailing-",
    "a" * 254,
    "x\n",
]


@pytest.mark.parametrize("name", ["p", "web-0", "node-1.example.com", "a" * 253, "0"])
def test_valid_names_make_the_usual_path(name: str) -> None:
    assert is_valid_name(name)
    path = api_path("apps/v1", "daemonsets", namespace="ns", name=name)
    assert path == f"/apis/apps/v1/namespaces/ns/daemonsets/{name}"


@pytest.mark.parametrize("name", CRAFTED)
def test_invalid_names_are_refused_with_a_clear_error(name: str) -> None:
    assert name_error(name) is not None
    with pytest.raises(InvalidName) as info:
        api_path("apps/v1", "daemonsets", namespace="ns", name=name)
    assert "invalid daemonsets name" in str(info.value)
    assert isinstance(info.value, NotFound)  # no object can have that name


@pytest.mark.parametrize("namespace", ["..", "a/b", "a.b", "a" * 64, "NS", "x?y"])
def test_invalid_namespaces_are_refused(namespace: str) -> None:
    with pytest.raises(InvalidName, match="invalid namespace"):
        api_path("v1", "pods", namespace=namespace, name="p")


def test_no_name_and_no_namespace_address_the_collection() -> None:
    assert api_path("v1", "pods") == "/api/v1/pods"
    assert api_path("v1", "pods", namespace="") == "/api/v1/pods"
    assert api_path("v1", "pods", namespace="ns") == "/api/v1/namespaces/ns/pods"


def test_a_crafted_node_name_is_refused() -> None:
    with pytest.raises(InvalidName):
        node_path("../namespaces/kube-system/secrets/x")


def _pod(owner: str, name: str = "p") -> dict[str, Any]:
    ref = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": owner, "controller": True}
    return {"metadata": {"name": name, "namespace": "ns", "ownerReferences": [ref]}}


def _reconciler(kube: Kube) -> Reconciler:
    return Reconciler(SimpleNamespace(kube=kube))  # type: ignore[arg-type]  # reads use kube only


async def test_a_crafted_daemonset_owner_is_not_fetched_and_not_a_daemonset(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    good = api_server.get("/apis/apps/v1/namespaces/ns/daemonsets/ds").respond(
        json={"metadata": {"name": "ds"}}
    )
    anything = api_server.route(name="anything").respond(200, json={})
    record = Memory(uid="u1", name="nm-1", node="n1")
    crafted = "x/../../../../api/v1/namespaces/kube-system/secrets/token"
    owners = ["ns/ds", f"ns/{crafted}", "ns/x?watch=1", "ns/"]
    await _reconciler(kube)._read(tuple(Read(ReadKind.DAEMONSET, o) for o in owners), record)
    assert record.daemonsets == {
        "ns/ds": True,
        f"ns/{crafted}": False,
        "ns/x?watch=1": False,
        "ns/": False,
    }
    assert good.call_count == 1
    assert anything.call_count == 0  # nothing else was requested


async def test_a_crafted_node_name_is_a_missing_node_without_a_request(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    anything = api_server.route(name="anything").respond(200, json={})
    record = Memory(uid="u1", name="nm-1", node="n1")
    crafted = "../../api/v1/namespaces/kube-system/secrets/x"
    await _reconciler(kube)._read((Read(ReadKind.NODE, crafted),), record)
    assert record.fetched.node_read
    assert record.fetched.node is None
    assert anything.call_count == 0


async def test_nmo_plan_does_not_follow_a_crafted_daemonset_owner(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    from nmo.ops.observe import observe

    crafted = "x/../../../../../../../api/v1/namespaces/ns/secrets/s"
    api_server.get("/api/v1/nodes/n1").respond(json={"metadata": {"name": "n1"}})
    api_server.get("/api/v1/pods").respond(json={"metadata": {}, "items": [_pod(crafted)]})
    api_server.get("/apis/policy/v1/namespaces/ns/poddisruptionbudgets").respond(
        json={"metadata": {}, "items": []}
    )
    anything = api_server.route(name="anything").respond(200, json={})
    state = await observe(kube, "n1")
    assert state.daemonsets == {f"ns/{crafted}": False}
    assert anything.call_count == 0
