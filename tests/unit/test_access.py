"""nmo's own permissions, asked with a SelfSubjectAccessReview and cached."""

from __future__ import annotations

import json

import httpx
import respx

from nmo.kube.access import REVIEWS_PATH, Access
from nmo.kube.client import Kube


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_one_review_per_ttl_whatever_the_answer(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    route = api_server.post(REVIEWS_PATH).mock(
        side_effect=[
            httpx.Response(201, json={"status": {"allowed": False}}),
            httpx.Response(201, json={"status": {"allowed": True}}),
        ]
    )
    clock = Clock()
    access = Access(kube, ttl=30.0, clock=clock)
    assert [await access.may_delete_pods() for _ in range(3)] == [False, False, False]
    assert route.call_count == 1
    sent = json.loads(route.calls.last.request.content)
    assert sent["kind"] == "SelfSubjectAccessReview"
    assert sent["spec"]["resourceAttributes"] == {"verb": "delete", "group": "", "resource": "pods"}
    clock.now += 30.0  # a grant (helm upgrade) is seen once the answer is old
    assert await access.may_delete_pods() is True
    assert route.call_count == 2


async def test_namespaces_are_asked_apart(api_server: respx.MockRouter, kube: Kube) -> None:
    route = api_server.post(REVIEWS_PATH).respond(201, json={"status": {"allowed": True}})
    access = Access(kube)
    assert await access.may_delete_pods("a") is True
    assert await access.may_delete_pods("b") is True
    assert await access.may_delete_pods("a") is True
    namespaces = [
        json.loads(c.request.content)["spec"]["resourceAttributes"]["namespace"]
        for c in route.calls
    ]
    assert namespaces == ["a", "b"]


async def test_a_failed_review_is_unknown_and_not_cached(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    route = api_server.post(REVIEWS_PATH).mock(
        side_effect=[
            httpx.Response(403, json={"reason": "Forbidden", "message": "no"}),
            httpx.Response(201, json={"status": {"allowed": False}}),
        ]
    )
    access = Access(kube)
    assert await access.may_delete_pods() is None
    assert await access.may_delete_pods() is False
    assert route.call_count == 2 and access.reviews == 2
