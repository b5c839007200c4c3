"""Shared fixtures for unit tests: respx standing in for the kube-apiserver.

kr8s (and so nmo's :class:`~nmo.kube.client.Kube`) talks httpx; respx
intercepts it. The kubeconfig is a dict so a developer's ~/.kube/config is
never read, and kr8s's per-loop client cache is cleared around each test.
"""

from __future__ import annotations

from collections.abc import Iterator

import kr8s
import pytest
import respx

from nmo.kube.client import Kube, RetryPolicy

SERVER = "https://k8s.test:6443"
KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "t", "cluster": {"server": SERVER, "insecure-skip-tls-verify": True}}],
    "users": [{"name": "t", "user": {"token": "operator-token"}}],
    "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
    "current-context": "t",
}


@pytest.fixture
def api_server() -> Iterator[respx.MockRouter]:
    kr8s.Api._instances.clear()
    with respx.mock(base_url=SERVER, assert_all_called=False) as mock:
        version = {"major": "1", "minor": "35", "gitVersion": "v1.35.4"}
        mock.get("/version/").respond(json=version)
        mock.get("/version").respond(json=version)
        yield mock
    kr8s.Api._instances.clear()


@pytest.fixture
async def kube(api_server: respx.MockRouter) -> Kube:
    api = await kr8s.asyncio.api(kubeconfig=KUBECONFIG)  # type: ignore[arg-type]  # dicts work
    # Fast retries: the subject is the policy, not the waiting.
    return Kube(api, retry=RetryPolicy(attempts=4, base_delay=0.001, max_delay=0.01))
