"""``rest_client_requests_total`` counts every attempt as client-go does (issue 11 item 13).

Retries and dropped connections cannot be produced on demand by the sandbox,
so respx answers here; the integration test reads the same series from a
running nmo.
"""

from __future__ import annotations

import httpx
import pytest
import respx

from nmo.kube.client import Kube
from nmo.kube.errors import NotFound, Transient
from nmo.telemetry.metrics import Metrics

NODE = "/api/v1/nodes/n1"
HOST = "k8s.test:6443"


@pytest.fixture
def metrics(kube: Kube) -> Metrics:
    m = Metrics()
    kube.on_response = m.rest_request
    return m


def requests(metrics: Metrics, code: str, method: str) -> float:
    labels = {"code": code, "method": method, "host": HOST}
    return metrics.registry.get_sample_value("rest_client_requests_total", labels) or 0.0


async def test_every_attempt_is_counted_by_code_method_and_host(
    api_server: respx.MockRouter, kube: Kube, metrics: Metrics
) -> None:
    api_server.get(NODE).mock(
        side_effect=[
            httpx.Response(500, json={"message": "etcd leader changed"}),
            httpx.Response(200, json={"metadata": {"name": "n1"}}),
        ]
    )
    api_server.patch(NODE).respond(404, json={"reason": "NotFound"})
    await kube.get(NODE)
    with pytest.raises(NotFound):
        await kube.merge_patch(NODE, {"metadata": {}})
    assert requests(metrics, "500", "GET") == 1
    assert requests(metrics, "200", "GET") == 1
    assert requests(metrics, "404", "PATCH") == 1
    assert requests(metrics, "200", "PATCH") == 0


async def test_an_attempt_without_an_answer_is_an_error(
    api_server: respx.MockRouter, kube: Kube, metrics: Metrics
) -> None:
    api_server.get(NODE).mock(side_effect=httpx.ConnectError("refused"))
    with pytest.raises(Transient):
        await kube.get(NODE)
    assert requests(metrics, "<error>", "GET") == 4  # the boundary's 4 attempts


async def test_watches_and_text_requests_are_counted_too(
    api_server: respx.MockRouter, kube: Kube, metrics: Metrics
) -> None:
    api_server.get("/api/v1/nodes").respond(200, text='{"type":"ADDED","object":{}}\n')
    api_server.get("/api/v1/namespaces/ns/pods/p/log").respond(200, text="hello")
    seen = [e async for e in kube.stream("/api/v1/nodes", params={"watch": 1}, read_timeout=5)]
    assert len(seen) == 1
    assert await kube.request_text("/api/v1/namespaces/ns/pods/p/log") == "hello"
    assert requests(metrics, "200", "GET") == 2
