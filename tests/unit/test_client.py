"""The kr8s boundary's error paths the sandbox cannot produce on demand.

500s, timeouts, dropped connections, 429 with Retry-After, and the mapping
of every status to nmo's own errors (respx stands in for the apiserver).
"""

from __future__ import annotations

import httpx
import pytest
import respx

from nmo.kube.client import Kube, RetryPolicy, _widen_pool, api_path, parse_retry_after
from nmo.kube.errors import AlreadyExists, Conflict, Forbidden, NotFound, TooManyRequests, Transient
from nmo.kube.transport import Transport

NODE = "/api/v1/nodes/n1"


async def test_500_is_retried_then_succeeds(api_server: respx.MockRouter, kube: Kube) -> None:
    route = api_server.get(NODE).mock(
        side_effect=[
            httpx.Response(500, json={"message": "etcd leader changed"}),
            httpx.Response(200, json={"metadata": {"name": "n1"}}),
        ]
    )
    assert (await kube.get(NODE))["metadata"]["name"] == "n1"
    assert route.call_count == 2


async def test_persistent_500_raises_transient_after_the_attempts(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    route = api_server.get(NODE).respond(503, text="upstream connect error")
    with pytest.raises(Transient) as info:
        await kube.get(NODE)
    assert info.value.status_code == 503
    assert "upstream connect error" in info.value.message
    assert route.call_count == 4


@pytest.mark.parametrize(
    "error",
    [httpx.ReadTimeout("slow"), httpx.ConnectError("refused"), httpx.RemoteProtocolError("eof")],
)
async def test_transport_errors_become_transient(
    api_server: respx.MockRouter, kube: Kube, error: Exception
) -> None:
    route = api_server.get(NODE).mock(side_effect=error)
    with pytest.raises(Transient):
        await kube.get(NODE)
    assert route.call_count == 4


async def test_429_honours_retry_after(api_server: respx.MockRouter, kube: Kube) -> None:
    route = api_server.get(NODE).mock(
        side_effect=[
            httpx.Response(429, headers={"Retry-After": "0"}, json={"message": "slow down"}),
            httpx.Response(200, json={"ok": True}),
        ]
    )
    assert await kube.get(NODE) == {"ok": True}
    assert route.call_count == 2


def test_retry_after_is_a_floor_and_the_cap_holds() -> None:
    policy = RetryPolicy(base_delay=0.1, max_delay=10)
    assert all(policy.delay(0, retry_after=3) >= 3 for _ in range(50))
    assert all(policy.delay(20) <= 10 for _ in range(50))
    assert all(policy.delay(0, retry_after=60) == 10 for _ in range(5))
    delays = [policy.delay(3) for _ in range(200)]
    assert len(set(delays)) > 100, "backoff is not jittered"
    assert parse_retry_after("7") == 7
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (404, {"reason": "NotFound", "message": 'nodes "n1" not found'}, NotFound),
        (409, {"reason": "Conflict", "message": "the object has been modified"}, Conflict),
        (409, {"reason": "AlreadyExists", "message": "already exists"}, AlreadyExists),
        (403, {"reason": "Forbidden", "message": "forbidden"}, Forbidden),
    ],
)
async def test_client_errors_map_and_are_not_retried(
    api_server: respx.MockRouter,
    kube: Kube,
    status: int,
    body: dict[str, str],
    error: type[Exception],
) -> None:
    route = api_server.get(NODE).respond(status, json=body)
    with pytest.raises(error) as info:
        await kube.get(NODE)
    assert str(info.value) == body["message"]
    assert route.call_count == 1  # no retry, and no kr8s re-authentication on 403


async def test_eviction_429_is_not_retried_when_the_caller_says_so(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    path = api_path("v1", "pods", namespace="ns", name="p", subresource="eviction")
    route = api_server.post(path).respond(
        429,
        headers={"Retry-After": "10"},
        json={
            "reason": "TooManyRequests",
            "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            "details": {
                "causes": [
                    {
                        "reason": "DisruptionBudget",
                        "message": "The disruption budget db-pdb needs 2 healthy pods "
                        "and has 2 currently",
                    }
                ]
            },
        },
    )
    with pytest.raises(TooManyRequests) as info:
        await kube.request("POST", path, body={}, retry=False)
    assert route.call_count == 1
    assert info.value.retry_after == 10
    assert info.value.causes[0]["reason"] == "DisruptionBudget"


async def test_list_follows_continue_tokens(api_server: respx.MockRouter, kube: Kube) -> None:
    def page(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("continue") == "t2":
            return httpx.Response(
                200, json={"metadata": {"resourceVersion": "9"}, "items": [{"n": 2}]}
            )
        return httpx.Response(200, json={"metadata": {"continue": "t2"}, "items": [{"n": 1}]})

    api_server.get("/api/v1/pods").mock(side_effect=page)
    result = await kube.list_all("/api/v1/pods")
    assert [i["n"] for i in result["items"]] == [1, 2]
    assert result["metadata"]["resourceVersion"] == "9"


async def test_malformed_error_body_still_maps(api_server: respx.MockRouter, kube: Kube) -> None:
    api_server.get(NODE).respond(404, text="<html>not json</html>")
    with pytest.raises(NotFound, match="not json"):
        await kube.get(NODE)


async def test_the_pool_fits_the_watches_and_keeps_a_connection_per_request_slot(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    api = kube._api
    await api._create_session()  # what kr8s does on first use
    limits = httpx.Limits(max_connections=640, max_keepalive_connections=128)
    await _widen_pool(api, limits)
    pool = api._session._transport
    assert isinstance(pool, Transport)
    assert (pool.max_connections, pool.max_keepalive, pool.keepalive_expiry) == (640, 128, 5.0)
    # kr8s rebuilds its client after a 401/403: the rebuilt one is widened too
    await api._create_session()
    rebuilt = api._session._transport
    assert rebuilt is not pool and isinstance(rebuilt, Transport)
    assert (rebuilt.max_connections, rebuilt.max_keepalive) == (640, 128)
