"""kubectl drain's pod filters, as nmo applies them (behavior.md A4)."""

from typing import Any

import pytest

from nmo.core.maintenance.pods import select_pods


def pod(
    name: str, *, owner: str | None = None, mirror: bool = False, empty_dir: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}"}
    if owner:
        kind, owner_name = owner.split("/")
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": kind, "name": owner_name, "controller": True}
        ]
    if mirror:
        meta["annotations"] = {"kubernetes.io/config.mirror": "x"}
    spec: dict[str, Any] = {"nodeName": "n1"}
    if empty_dir:
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    return {"metadata": meta, "spec": spec}


@pytest.mark.parametrize(
    ("p", "ds_exists", "evicted", "warning"),
    [
        (pod("rs", owner="ReplicaSet/web"), True, True, None),
        (pod("ds", owner="DaemonSet/agent"), True, False, "ignoring DaemonSet-managed Pods: ns/ds"),
        (pod("orphan-ds", owner="DaemonSet/gone"), False, True, None),
        (pod("static", mirror=True), True, False, None),
        (pod("bare"), True, True, "deleting Pods that declare no controller: ns/bare"),
        (
            pod("scratch", owner="ReplicaSet/web", empty_dir=True),
            True,
            True,
            "deleting Pods with local storage: ns/scratch",
        ),
    ],
)
def test_selection(p: dict[str, Any], ds_exists: bool, evicted: bool, warning: str | None) -> None:
    sel = select_pods([p], lambda _key: ds_exists)
    assert (p in sel.evict) is evicted
    if warning is None:
        assert not [w for w in sel.warnings if p["metadata"]["name"] in w]
    else:
        assert warning in sel.warnings


def test_daemonset_lookup_uses_namespace_and_name() -> None:
    seen: list[str] = []
    select_pods([pod("ds", owner="DaemonSet/agent")], lambda key: seen.append(key) or True)
    assert seen == ["ns/agent"]
