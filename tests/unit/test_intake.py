"""Bad input to the webhook app: a clear 4xx or a denied review, never a 5xx.

The same matrix runs over real HTTPS in
``tests/integration/test_webhook_robustness.py``; here it goes through the
ASGI app with small limits so each case takes milliseconds.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from webhook_fakes import FakeLookups, node

from nmo.api.constants import WEBHOOK_PATH, Messages
from nmo.server.app import create_webhook_app
from nmo.telemetry.metrics import Metrics

Obj = dict[str, Any]
LIMIT = 32 * 1024
NM_KIND = {"group": "nodemaintenance.medik8s.io", "version": "v1beta1", "kind": "NodeMaintenance"}
NM_RESOURCE = {
    "group": "nodemaintenance.medik8s.io",
    "version": "v1beta1",
    "resource": "nodemaintenances",
}


def review(**request: Any) -> Obj:
    base: Obj = {
        "uid": "req-1",
        "kind": NM_KIND,
        "resource": NM_RESOURCE,
        "operation": "CREATE",
        "object": {"metadata": {"name": "nm"}, "spec": {"nodeName": "n1"}},
    }
    base.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": base}


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    app = create_webhook_app(
        lookups=FakeLookups(nodes={"n1": node("n1")}), metrics=Metrics(), max_body_bytes=LIMIT
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="https://webhook.test") as client:
        yield client


async def post(
    http: httpx.AsyncClient, content: Any, content_type: str | None = "application/json"
) -> httpx.Response:
    headers = {"Content-Type": content_type} if content_type else {}
    return await http.post(WEBHOOK_PATH, content=content, headers=headers)


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("application/json", 200),
        ("application/json; charset=utf-8", 200),
        ("Application/JSON", 200),
        (None, 200),  # hand-made requests: read as JSON
        ("text/plain", 415),
        ("application/x-www-form-urlencoded", 415),
        ("application/yaml", 415),
        ("application/jsonx", 415),
    ],
)
async def test_content_type(http: httpx.AsyncClient, content_type: str | None, status: int) -> None:
    resp = await post(http, json.dumps(review()).encode(), content_type)
    assert resp.status_code == status
    if status == 415:
        assert "application/json" in resp.text
        assert resp.headers["content-type"].startswith("text/plain")
    else:
        assert resp.json()["response"]["allowed"] is True


async def test_declared_oversized_body_is_413(http: httpx.AsyncClient) -> None:
    resp = await post(http, b" " * (LIMIT + 1))
    assert resp.status_code == 413
    assert resp.text.strip() == (
        f"request body of {LIMIT + 1} bytes exceeds the webhook's limit of {LIMIT} bytes"
    )
    assert "connection" not in resp.headers  # the small rest is drained, keep-alive holds


async def test_body_at_the_limit_is_read(http: httpx.AsyncClient) -> None:
    body = json.dumps(review()).encode()
    resp = await post(http, body + b" " * (LIMIT - len(body)))
    assert resp.status_code == 200


async def chunks(total: int, size: int = 100) -> AsyncIterator[bytes]:
    for _ in range(total // size):
        yield b" " * size


async def test_chunked_oversized_body_is_413(http: httpx.AsyncClient) -> None:
    resp = await post(http, chunks(LIMIT * 2))
    assert resp.status_code == 413
    assert f"exceeds the webhook's limit of {LIMIT} bytes" in resp.text


async def test_chunked_body_past_the_drain_allowance_closes_the_connection() -> None:
    app = create_webhook_app(lookups=FakeLookups(), metrics=Metrics(), max_body_bytes=10)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="https://webhook.test") as http:
        drained = await post(http, chunks(1024 * 1024, size=64 * 1024))
        endless = await post(http, chunks(9 * 1024 * 1024, size=64 * 1024))  # > 10 B + 8 MiB
    assert drained.status_code == 413
    assert "connection" not in drained.headers
    assert endless.status_code == 413
    assert endless.headers["connection"] == "close"


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"{", id="truncated JSON"),
        pytest.param(b"\xff\xfe{}", id="not UTF-8"),
        pytest.param(b"[" * 5000 + b"]" * 5000, id="nested too deeply"),
        pytest.param(b"1" * 5000, id="number of 5000 digits"),
        pytest.param(b'"AdmissionReview"', id="a string"),
        pytest.param(b'{"kind": "AdmissionReview"}', id="no request"),
        pytest.param(b'{"request": {"operation": "CREATE"}}', id="no uid"),
        pytest.param(b'{"request": {"uid": ""}}', id="empty uid"),
        pytest.param(b'{"request": {"uid": 7}}', id="uid not a string"),
    ],
)
async def test_unreadable_body_is_400(http: httpx.AsyncClient, body: bytes) -> None:
    resp = await post(http, body)
    assert resp.status_code == 400
    assert resp.text.strip()


@pytest.mark.parametrize(
    ("request_fields", "named"),
    [
        pytest.param(
            {"kind": {"group": "", "version": "v1", "kind": "Pod"}}, "kind Pod (core)", id="kind"
        ),
        pytest.param(
            {"kind": {**NM_KIND, "group": "example.com"}},
            "kind NodeMaintenance (example.com)",
            id="kind of another group",
        ),
        pytest.param(
            {"resource": {"group": "", "version": "v1", "resource": "nodes"}},
            "resource nodes (core)",
            id="resource",
        ),
        pytest.param(
            {"object": {"apiVersion": "v1", "kind": "Node", "spec": {"nodeName": "n1"}}},
            "request.object is a Node (v1)",
            id="object",
        ),
        pytest.param(
            {"operation": "UPDATE", "oldObject": {"apiVersion": "apps/v1", "kind": "Deployment"}},
            "request.oldObject is a Deployment (apps/v1)",
            id="old object",
        ),
    ],
)
async def test_review_about_something_else_is_denied(
    http: httpx.AsyncClient, request_fields: Obj, named: str
) -> None:
    resp = await post(http, json.dumps(review(**request_fields)).encode())
    assert resp.status_code == 200
    answer = resp.json()["response"]
    assert (answer["uid"], answer["allowed"], answer["status"]["code"]) == ("req-1", False, 400)
    assert named in answer["status"]["message"]
    assert "this webhook validates NodeMaintenance" in answer["status"]["message"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("metadata", "not a mapping"),
        ("metadata", ["a", "list"]),
        ("spec", 5),
        ("spec", {"nodeName": ["n1"]}),
    ],
)
async def test_odd_object_shapes_are_answered(
    http: httpx.AsyncClient, field: str, value: Any
) -> None:
    obj = {"metadata": {"name": "nm"}, "spec": {"nodeName": "n1"}, field: value}
    resp = await post(http, json.dumps(review(object=obj)).encode())
    assert resp.status_code == 200
    status = resp.json()["response"].get("status", {})
    assert status.get("code") != 500, status


@pytest.mark.parametrize(
    "name",
    ["../namespaces/default/pods", "Node-1", "n1/status", "n" * 254, "a..b", "-n1", "n1\u00e9"],
)
async def test_names_no_node_can_have_are_refused_without_a_lookup(
    http: httpx.AsyncClient, name: str
) -> None:
    obj = {"metadata": {"name": "nm"}, "spec": {"nodeName": name}}
    resp = await post(http, json.dumps(review(object=obj)).encode())
    message = resp.json()["response"]["status"]["message"]
    shown = name if len(name) <= 253 else name[:253] + "..."
    assert message == Messages.WEBHOOK_NO_NODE.format(node=shown)


async def test_lone_surrogates_are_escaped_not_a_500(http: httpx.AsyncClient) -> None:
    body = json.dumps(review(uid="\ud800")).encode()  # ensure_ascii: "\\ud800"
    resp = await post(http, body)
    assert resp.status_code == 200
    assert resp.json()["response"]["uid"] == "\ud800"
    obj = {"metadata": {"name": "nm"}, "spec": {"nodeName": "\udfff"}}
    resp = await post(http, json.dumps(review(object=obj)).encode())
    assert resp.status_code == 200
    assert resp.json()["response"]["allowed"] is False
