"""kubectl drain's pod filters, as nmo applies them (behavior.md A4)."""

from functools import partial
from typing import Any

import pytest

import builders
from builders import owner_ref
from nmo.core.maintenance.podselect import daemonset_owner, running_daemonset_owner, select_pods

pod = partial(builders.pod, namespace="ns", uid="uid-{name}", node="n1", phase="Running")


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


# kubectl's daemonSetFilter (k8s.io/kubectl/pkg/drain/filters.go): only a
# controller reference of kind DaemonSet in apps/v1 is a DaemonSet, and a
# finished pod is let go before the DaemonSet is looked up.
@pytest.mark.parametrize(
    ("p", "evicted", "looked_up"),
    [
        pytest.param(pod("ds", owner="DaemonSet/agent"), False, True, id="running"),
        pytest.param(
            pod("ds", owner="DaemonSet/agent", phase="Pending"), False, True, id="pending"
        ),
        pytest.param(
            pod("ds", owner="DaemonSet/agent", phase="Succeeded"), True, False, id="succeeded"
        ),
        pytest.param(pod("ds", owner="DaemonSet/agent", phase="Failed"), True, False, id="failed"),
        pytest.param(
            pod("ds", owner=owner_ref("DaemonSet/agent", api_version="apps/v1beta2")),
            True,
            False,
            id="apps/v1beta2 is not a DaemonSet",
        ),
        pytest.param(
            pod("ds", owner=owner_ref("DaemonSet/agent", api_version="extensions/v1beta1")),
            True,
            False,
            id="extensions/v1beta1 is not a DaemonSet",
        ),
        pytest.param(
            pod("ds", owner=owner_ref("DaemonSet/agent", controller=False)),
            True,
            False,
            id="owner that is not the controller",
        ),
        pytest.param(pod("ds", owner="daemonset/agent"), True, False, id="kind is case-sensitive"),
    ],
)
def test_daemonset_pods_as_kubectl_filters_them(
    p: dict[str, Any], evicted: bool, looked_up: bool
) -> None:
    seen: list[str] = []
    sel = select_pods([p], lambda key: seen.append(key) or True)
    assert (p in sel.evict) is evicted
    assert (p in sel.daemonset) is not evicted
    assert seen == (["ns/agent"] if looked_up else [])
    if evicted:
        assert not any("DaemonSet" in w for w in sel.warnings)


def test_an_owner_in_another_api_version_is_still_a_controller() -> None:
    """No "declare no controller" warning: kubectl only checks that a controller exists."""
    p = pod("ds", owner=owner_ref("DaemonSet/agent", api_version="apps/v1beta2"))
    assert select_pods([p], lambda _key: True).warnings == []


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_pods_are_evicted_without_warnings(phase: str) -> None:
    pods = [
        pod("bare", phase=phase),
        pod("scratch", owner="ReplicaSet/web", empty_dir=True, phase=phase),
    ]
    sel = select_pods(pods, lambda _key: True)
    assert sel.evict == pods
    assert sel.warnings == []


def test_running_daemonset_owner() -> None:
    assert running_daemonset_owner(pod("ds", owner="DaemonSet/agent")) == "ns/agent"
    assert running_daemonset_owner(pod("ds", owner="DaemonSet/agent", phase="Failed")) is None
    assert daemonset_owner(pod("ds", owner="DaemonSet/agent", phase="Failed")) == "ns/agent"
