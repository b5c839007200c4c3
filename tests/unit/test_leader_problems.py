"""Leader election that cannot work says why, and what to pass (issue 11 item 2).

The answers an apiserver gives for the usual mistakes (a namespace that does
not exist, RBAC that forbids the Lease, refused credentials, a namespace
being deleted) become :attr:`LeaderElector.problem`: one sentence naming the
cause and the fix, logged at once and then only when it changes or every
``REPEAT_PROBLEM`` seconds, and cleared by the first attempt that gets an
answer. A standby refused because another replica holds the Lease has no
problem. The sandbox shows the missing namespace end to end
(tests/integration/test_leader_default.py); respx stands in here for the
answers that are hard to produce there.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
import respx

from nmo.controller import leader
from nmo.controller.leader import LeaderElector, LeaderSettings
from nmo.kube.client import Kube

LEASES = "/apis/coordination.k8s.io/v1/namespaces/nmo/leases"
SETTINGS = LeaderSettings(namespace="nmo", name="135b1886.medik8s.io", identity="me")


def _status(code: int, reason: str, message: str, **details: Any) -> httpx.Response:
    body = {"kind": "Status", "status": "Failure", "code": code, "reason": reason}
    return httpx.Response(code, json={**body, "message": message, "details": details})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _problems(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "nmo.leader" and r.levelno >= logging.WARNING]


async def test_a_missing_namespace_is_named_with_the_fix_then_clears_when_created(
    api_server: respx.MockRouter, kube: Kube, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nmo.leader")
    api_server.get(f"{LEASES}/135b1886.medik8s.io").mock(
        return_value=_status(404, "NotFound", 'leases.coordination.k8s.io "x" not found')
    )
    create = api_server.post(LEASES).mock(
        return_value=_status(404, "NotFound", 'namespaces "nmo" not found')
    )
    clock = Clock()
    elector = LeaderElector(kube, SETTINGS, clock=clock)

    assert await elector._acquire(1.0) is False
    problem = elector.problem
    assert problem is not None
    assert 'namespace "nmo" does not exist' in problem
    assert "kubectl create namespace nmo" in problem
    assert "--leader-election-namespace" in problem
    assert "retrying every 2s" in problem
    assert [r.getMessage() for r in _problems(caplog)] == [problem]
    assert _problems(caplog)[0].levelno == logging.ERROR

    for _ in range(5):  # every retry_period: the same problem is not logged again...
        clock.now += 2
        assert await elector._acquire(1.0) is False
    assert len(_problems(caplog)) == 1
    clock.now += leader.REPEAT_PROBLEM  # ...until REPEAT_PROBLEM has passed
    assert await elector._acquire(1.0) is False
    assert len(_problems(caplog)) == 2

    create.mock(return_value=httpx.Response(201, json={}))  # kubectl create namespace nmo
    assert await elector._acquire(1.0) is True
    assert elector.problem is None
    assert any("leader election works again" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("method", "route", "expected"),
    [
        ("GET", "lease", "not allowed to get the Lease nmo/135b1886.medik8s.io"),
        ("POST", "leases", "not allowed to create the Lease nmo/135b1886.medik8s.io"),
        ("PUT", "lease", "not allowed to update the Lease nmo/135b1886.medik8s.io"),
    ],
)
async def test_rbac_that_forbids_the_lease_is_named_with_the_verbs_to_grant(
    api_server: respx.MockRouter, kube: Kube, method: str, route: str, expected: str
) -> None:
    message = (
        'leases.coordination.k8s.io is forbidden: User "system:serviceaccount:nmo:nmo" '
        f'cannot {method.lower()} resource "leases" in API group "coordination.k8s.io" '
        'in the namespace "nmo"'
    )
    forbidden = _status(403, "Forbidden", message)
    lease = {"metadata": {"name": "135b1886.medik8s.io", "resourceVersion": "1"}, "spec": {}}
    path = f"{LEASES}/135b1886.medik8s.io"
    get = httpx.Response(200, json=lease) if method == "PUT" else httpx.Response(404, json={})
    api_server.get(path).mock(return_value=forbidden if method == "GET" else get)
    api_server.post(LEASES).mock(return_value=forbidden)
    api_server.put(path).mock(return_value=forbidden)
    elector = LeaderElector(kube, SETTINGS)

    assert await elector._acquire(1.0) is False
    assert elector.problem is not None
    assert expected in elector.problem
    assert message in elector.problem  # who was refused, as the apiserver says it
    assert "grant get, create and update on leases.coordination.k8s.io" in elector.problem


async def test_refused_credentials_are_named(api_server: respx.MockRouter, kube: Kube) -> None:
    api_server.get(f"{LEASES}/135b1886.medik8s.io").mock(
        return_value=_status(401, "Unauthorized", "Unauthorized")
    )
    elector = LeaderElector(kube, SETTINGS)
    assert await elector._acquire(1.0) is False
    assert elector.problem is not None
    assert "refuses this process's credentials" in elector.problem
    assert "--kubeconfig" in elector.problem


async def test_a_namespace_being_deleted_is_named(api_server: respx.MockRouter, kube: Kube) -> None:
    api_server.get(f"{LEASES}/135b1886.medik8s.io").mock(return_value=httpx.Response(404))
    api_server.post(LEASES).mock(
        return_value=_status(
            403,
            "Forbidden",
            'leases "x" is forbidden: unable to create new content in namespace nmo '
            "because it is being terminated",
            causes=[{"type": "NamespaceTerminating", "field": "metadata.namespace"}],
        )
    )
    elector = LeaderElector(kube, SETTINGS)
    assert await elector._acquire(1.0) is False
    assert elector.problem is not None
    assert 'namespace "nmo" is being deleted' in elector.problem


async def test_a_lease_held_by_another_replica_is_no_problem(
    api_server: respx.MockRouter, kube: Kube, caplog: pytest.LogCaptureFixture
) -> None:
    held = {
        "metadata": {"name": "135b1886.medik8s.io", "resourceVersion": "7"},
        "spec": {"holderIdentity": "other", "leaseDurationSeconds": 15, "renewTime": "t1"},
    }
    api_server.get(f"{LEASES}/135b1886.medik8s.io").mock(
        return_value=httpx.Response(200, json=held)
    )
    elector = LeaderElector(kube, SETTINGS)
    assert await elector._acquire(1.0) is False  # a standby
    assert elector.problem is None
    assert not _problems(caplog)


async def test_an_api_server_that_does_not_answer_fails_readiness_only_once_it_lasts(
    api_server: respx.MockRouter, kube: Kube, caplog: pytest.LogCaptureFixture
) -> None:
    """One slow answer must not take a standby out of its Service; a dead
    API server for ``renew_deadline`` does."""
    route = api_server.get(f"{LEASES}/135b1886.medik8s.io").mock(
        return_value=_status(503, "ServiceUnavailable", "etcdserver: leader changed")
    )
    clock = Clock()
    elector = LeaderElector(kube, SETTINGS, clock=clock)
    assert await elector._acquire(1.0) is False
    assert elector.problem is None  # not yet a readiness problem...
    (logged,) = _problems(caplog)  # ...but said at once
    assert logged.levelno == logging.WARNING
    assert "etcdserver: leader changed" in logged.getMessage()
    clock.now += SETTINGS.renew_deadline
    assert await elector._acquire(1.0) is False
    assert elector.problem is not None
    assert "etcdserver: leader changed" in elector.problem
    route.mock(return_value=httpx.Response(404, json={}))
    api_server.post(LEASES).mock(return_value=httpx.Response(201, json={}))
    assert await elector._acquire(1.0) is True
    assert elector.problem is None
