"""The HTTP adapters: AdmissionReview in/out, probes, and /metrics authn/authz.

The metrics tests go through the real :class:`nmo.kube.client.Kube` (kr8s and
httpx underneath) with respx standing in for the kube-apiserver.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
import respx
from prometheus_client.parser import text_string_to_metric_families
from webhook_fakes import FakeLookups, nm, node

from nmo.api.constants import WEBHOOK_PATH, Messages
from nmo.kube.client import Kube
from nmo.server.app import create_metrics_app, create_probes_app, create_webhook_app
from nmo.server.metricsauth import MetricsAuth
from nmo.server.probes import CheckFailed, Probes
from nmo.telemetry.metrics import Metrics

Obj = dict[str, Any]


def review(operation: str = "CREATE", *, obj: Obj | None = None, old: Obj | None = None) -> Obj:
    request: Obj = {
        "uid": "req-1",
        "kind": {
            "group": "nodemaintenance.medik8s.io",
            "version": "v1beta1",
            "kind": "NodeMaintenance",
        },
        "resource": {
            "group": "nodemaintenance.medik8s.io",
            "version": "v1beta1",
            "resource": "nodemaintenances",
        },
        "name": "nm",
        "operation": operation,
        "userInfo": {"username": "admin"},
        "object": obj if obj is not None else nm("n1"),
    }
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def client(app: Any, base: str = "http://test") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base)


def count(metrics: Metrics, operation: str, result: str) -> float:
    value = metrics.registry.get_sample_value(
        "nmo_webhook_admissions_total", {"operation": operation, "result": result}
    )
    return value or 0.0


# -- webhook -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b"[1]", json.dumps({"apiVersion": "admission.k8s.io/v1"}).encode()],
)
async def test_unreadable_review_is_http_400(body: bytes) -> None:
    metrics = Metrics()
    async with client(create_webhook_app(lookups=FakeLookups(), metrics=metrics)) as http:
        resp = await http.post(WEBHOOK_PATH, content=body)
    assert resp.status_code == 400
    assert resp.text.strip()
    assert count(metrics, "UNKNOWN", "error") == 1


async def test_malformed_review_with_uid_gets_an_errored_review() -> None:
    body = review()
    del body["request"]["operation"]
    async with client(create_webhook_app(lookups=FakeLookups(), metrics=Metrics())) as http:
        resp = await http.post(WEBHOOK_PATH, json=body)
    assert resp.status_code == 200
    answer = resp.json()
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "req-1"
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 400
    assert "request.operation" in answer["response"]["status"]["message"]


@pytest.mark.parametrize(
    ("body", "lookups", "allowed", "message", "result"),
    [
        pytest.param(
            review(),
            FakeLookups(),
            False,
            Messages.WEBHOOK_NO_NODE.format(node="n1"),
            "denied",
            id="create missing node",
        ),
        pytest.param(
            review(),
            FakeLookups(nodes={"n1": node("n1")}, existing={"n1"}),
            False,
            Messages.WEBHOOK_DUPLICATE.format(node="n1"),
            "denied",
            id="create duplicate",
        ),
        pytest.param(
            review(), FakeLookups(nodes={"n1": node("n1")}), True, "", "allowed", id="create ok"
        ),
        pytest.param(
            review(),
            FakeLookups(failing={"node"}),
            False,
            "could not get node for validating spec.NodeName, please try again: "
            "could not get node: node exploded",
            "error",
            id="create lookup failure",
        ),
        pytest.param(
            review("UPDATE", obj=nm("n2"), old=nm("n1")),
            FakeLookups(),
            False,
            "updating spec.NodeName isn't allowed",
            "denied",
            id="update node name",
        ),
        pytest.param(
            review("UPDATE", obj=nm("n1"), old=nm("n1")),
            FakeLookups(),
            True,
            "",
            "allowed",
            id="update reason",
        ),
        pytest.param(review("DELETE"), FakeLookups(), True, "", "allowed", id="delete"),
    ],
)
async def test_review_answers(
    body: Obj, lookups: FakeLookups, allowed: bool, message: str, result: str
) -> None:
    metrics = Metrics()
    async with client(create_webhook_app(lookups=lookups, metrics=metrics)) as http:
        resp = await http.post(WEBHOOK_PATH, json=body)
    assert resp.status_code == 200
    answer = resp.json()
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "req-1"
    assert answer["response"]["allowed"] is allowed
    if not allowed:
        assert answer["response"]["status"] == {
            "code": 403,
            "reason": "Forbidden",
            "message": message,
        }
    operation = body["request"]["operation"]
    assert count(metrics, operation, result) == 1
    latency = metrics.registry.get_sample_value("nmo_webhook_admission_duration_seconds_count")
    assert latency == 1


async def test_decisions_are_logged_with_node_and_maintenance(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="nmo.webhooks")
    app = create_webhook_app(lookups=FakeLookups(), metrics=Metrics())
    async with client(app) as http:
        await http.post(WEBHOOK_PATH, json=review())
    lines = [r.getMessage() for r in caplog.records if r.name == "nmo.webhooks"]
    assert any("maintenance" in line and "n1" in line and "denied" in line for line in lines)


async def test_unexpected_exception_denies_with_a_review() -> None:
    class Broken(FakeLookups):
        async def get_node(self, name: str) -> Obj | None:
            raise RuntimeError("bug")

    metrics = Metrics()
    async with client(create_webhook_app(lookups=Broken(), metrics=metrics)) as http:
        resp = await http.post(WEBHOOK_PATH, json=review())
    answer = resp.json()["response"]
    assert (answer["uid"], answer["allowed"], answer["status"]["code"]) == ("req-1", False, 500)
    assert count(metrics, "CREATE", "error") == 1


async def test_internal_errors_show_a_reference_not_the_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The caller learns that it failed and a reference; the log has the details."""

    class Broken(FakeLookups):
        async def get_node(self, name: str) -> Obj | None:
            raise RuntimeError("secret-detail at /var/run/secrets/token")

    def broken_check() -> None:
        raise OSError("secret-detail in /etc/nmo/key.pem")

    with caplog.at_level("ERROR"):
        async with client(create_webhook_app(lookups=Broken(), metrics=Metrics())) as http:
            answer = (await http.post(WEBHOOK_PATH, json=review())).json()["response"]
        async with client(create_probes_app(Probes(readyz={"broken": broken_check}))) as http:
            aggregated = await http.get("/readyz")
            single = await http.get("/readyz/broken")
    shown = [answer["status"]["message"], aggregated.text, single.text]
    assert aggregated.status_code == single.status_code == 500
    for text in shown:
        assert "secret-detail" not in text, text
        ref = re.search(r"internal error \(ref ([0-9a-f]{12})\)", text)
        assert ref is not None, text
        assert any(
            ref.group(1) in r.getMessage() + str(getattr(r, "ref", ""))
            and "secret-detail" in (r.exc_text or str(r.exc_info))
            for r in caplog.records
        ), ref.group(1)


async def test_reviews_are_answered_before_fastapi_and_the_rest_by_it() -> None:
    metrics = Metrics()
    app = create_webhook_app(lookups=FakeLookups(nodes={"n1": node("n1")}), metrics=metrics)
    async with client(app) as http:
        answered = await http.post(WEBHOOK_PATH, json=review())
        other_methods = [await http.get(WEBHOOK_PATH), await http.put(WEBHOOK_PATH, json={})]
        other_path = await http.post(WEBHOOK_PATH + "-other", json=review())
    assert answered.status_code == 200
    assert answered.headers["content-type"] == "application/json"
    assert int(answered.headers["content-length"]) == len(answered.content)
    assert answered.json()["response"]["allowed"] is True
    assert [r.status_code for r in other_methods] == [405, 405]
    assert other_path.status_code == 404
    assert count(metrics, "CREATE", "allowed") == 1


async def test_background_tasks_run_for_the_lifespan_of_the_app() -> None:
    import asyncio

    ran = asyncio.Event()

    async def watcher() -> None:
        ran.set()
        await asyncio.Event().wait()

    app = create_webhook_app(
        lookups=FakeLookups(), metrics=Metrics(), background={"watcher": watcher}
    )
    sent: list[str] = []
    inbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    inbox.put_nowait({"type": "lifespan.startup"})

    async def send(message: Obj) -> None:
        sent.append(message["type"])
        if message["type"] == "lifespan.startup.complete":
            await asyncio.wait_for(ran.wait(), 5)
            inbox.put_nowait({"type": "lifespan.shutdown"})

    await asyncio.wait_for(app({"type": "lifespan", "state": {}}, inbox.get, send), 10)
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert ran.is_set()


async def test_a_bug_past_the_review_handler_is_a_logged_500_with_a_reference(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken:
        def observe(self, value: float) -> None:
            raise RuntimeError("secret-detail")

    metrics = Metrics()
    metrics.webhook_latency = Broken()  # type: ignore[assignment]
    app = create_webhook_app(lookups=FakeLookups(nodes={"n1": node("n1")}), metrics=metrics)
    with caplog.at_level("ERROR"):
        async with client(app) as http:
            resp = await http.post(WEBHOOK_PATH, json=review())
    assert resp.status_code == 500
    assert resp.headers["connection"] == "close"
    assert "secret-detail" not in resp.text
    ref = re.search(r"internal error \(ref ([0-9a-f]{12})\)", resp.text)
    assert ref is not None, resp.text
    assert any(getattr(r, "ref", "") == ref.group(1) for r in caplog.records)


# -- probes -----------------------------------------------------------------------


def failing_webhook() -> None:
    raise CheckFailed("webhook server is off: no certificate in /certs")


async def test_probes_ok_and_verbose() -> None:
    async def informers() -> None:
        return None

    probes = Probes(readyz={"informers": informers})
    async with client(create_probes_app(probes)) as http:
        assert (await http.get("/healthz")).text == "ok"
        ready = await http.get("/readyz")
        assert (ready.status_code, ready.text) == (200, "ok")
        verbose = await http.get("/readyz?verbose")
    assert verbose.status_code == 200
    assert verbose.text == "[+]informers ok\n[+]ping ok\nreadyz check passed\n"


async def test_readyz_names_the_failing_check_and_why() -> None:
    probes = Probes(readyz={"webhook": failing_webhook})
    async with client(create_probes_app(probes)) as http:
        resp = await http.get("/readyz")
        single = await http.get("/readyz/webhook")
        excluded = await http.get("/readyz?verbose&exclude=webhook&exclude=nope")
        missing = await http.get("/readyz/nope")
        healthz = await http.get("/healthz")
    assert resp.status_code == 500
    assert resp.headers["content-type"].startswith("text/plain")
    assert "[-]webhook failed: webhook server is off: no certificate in /certs" in resp.text
    assert resp.text.endswith("readyz check failed\n")
    assert single.status_code == 500
    assert "no certificate" in single.text
    assert excluded.status_code == 200
    assert "[+]webhook excluded: ok" in excluded.text
    assert 'no matches for "nope"' in excluded.text
    assert missing.status_code == 404
    assert healthz.text == "ok"  # liveness does not depend on the webhook


async def test_hanging_check_times_out() -> None:
    import asyncio

    async def hangs() -> None:
        await asyncio.Event().wait()

    probes = Probes(readyz={"stuck": hangs}, timeout=0.01)
    async with client(create_probes_app(probes)) as http:
        resp = await http.get("/readyz")
    assert resp.status_code == 500
    assert "[-]stuck failed: timed out" in resp.text


async def test_leaderz_follows_the_leading_callable() -> None:
    state = {"leading": False}
    probes = Probes(leading=lambda: state["leading"])
    async with client(create_probes_app(probes)) as http:
        standby = await http.get("/leaderz")
        state["leading"] = True
        leader = await http.get("/leaderz")
        head = await http.head("/leaderz")
        ready = await http.get("/readyz")
    assert (standby.status_code, standby.text) == (503, "not leading")
    assert standby.headers["content-type"].startswith("text/plain")
    assert (leader.status_code, leader.text) == (200, "leading")
    assert head.status_code == 200
    assert (ready.status_code, ready.text) == (200, "ok")  # a standby is ready too


async def test_leaderz_absent_without_a_leading_callable() -> None:
    async with client(create_probes_app(Probes())) as http:
        assert (await http.get("/leaderz")).status_code == 404


# -- metrics ----------------------------------------------------------------------


USERS = {
    "prom-token": {"username": "system:serviceaccount:monitoring:prometheus", "groups": ["sa"]},
    "nobody-token": {"username": "nobody", "groups": []},
}


def token_review(request: httpx.Request) -> httpx.Response:
    token = json.loads(request.content)["spec"]["token"]
    user = USERS.get(token)
    status: Obj = {"authenticated": user is not None}
    if user:
        status["user"] = user
    else:
        status["error"] = "invalid bearer token"
    return httpx.Response(201, json={"kind": "TokenReview", "status": status})


def access_review(request: httpx.Request) -> httpx.Response:
    spec = json.loads(request.content)["spec"]
    allowed = spec["user"] == USERS["prom-token"]["username"] and spec["nonResourceAttributes"] == {
        "path": "/metrics",
        "verb": "get",
    }
    return httpx.Response(201, json={"kind": "SubjectAccessReview", "status": {"allowed": allowed}})


async def test_metrics_require_a_token_review_and_access_review(
    api_server: respx.MockRouter, kube: Kube
) -> None:
    reviews = api_server.post("/apis/authentication.k8s.io/v1/tokenreviews").mock(
        side_effect=token_review
    )
    access = api_server.post("/apis/authorization.k8s.io/v1/subjectaccessreviews").mock(
        side_effect=access_review
    )
    metrics = Metrics()
    metrics.webhook_admissions.labels(operation="CREATE", result="allowed").inc()
    app = create_metrics_app(metrics=metrics, auth=MetricsAuth(kube))
    async with client(app, "https://metrics.test") as http:
        missing = await http.get("/metrics")
        bad_scheme = await http.get("/metrics", headers={"Authorization": "Basic eDp5"})
        invalid = await http.get("/metrics", headers={"Authorization": "Bearer wrong"})
        forbidden = await http.get("/metrics", headers={"Authorization": "Bearer nobody-token"})
        ok = await http.get("/metrics", headers={"Authorization": "Bearer prom-token"})
        again = await http.get("/metrics", headers={"Authorization": "Bearer prom-token"})
    assert (missing.status_code, missing.text.strip()) == (401, "Unauthorized")
    assert bad_scheme.status_code == 401
    assert invalid.status_code == 401
    assert forbidden.status_code == 403
    assert forbidden.text.strip() == "Authorization denied for user nobody"
    assert ok.status_code == 200
    assert 'nmo_webhook_admissions_total{operation="CREATE",result="allowed"} 1.0' in ok.text
    assert again.status_code == 200
    # wrong, nobody, prom: the second prom-token scrape is answered from the cache.
    assert reviews.call_count == 3
    assert access.call_count == 2


async def test_metrics_api_errors_answer_500(api_server: respx.MockRouter, kube: Kube) -> None:
    api_server.post("/apis/authentication.k8s.io/v1/tokenreviews").respond(
        500, json={"kind": "Status", "message": "etcd down"}
    )
    app = create_metrics_app(metrics=Metrics(), auth=MetricsAuth(kube))
    async with client(app) as http:
        resp = await http.get("/metrics", headers={"Authorization": "Bearer prom-token"})
    assert (resp.status_code, resp.text.strip()) == (500, "Authentication failed")


async def test_metrics_served_plainly_without_auth() -> None:
    metrics = Metrics()
    metrics.webhook_latency.observe(0.2)
    async with client(create_metrics_app(metrics=metrics, auth=None)) as http:
        resp = await http.get("/metrics")
    assert resp.status_code == 200
    served = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(resp.text)
        for s in family.samples
    }
    name = "nmo_webhook_admission_duration_seconds"
    assert served[(f"{name}_count", ())] == 1
    assert served[(f"{name}_bucket", (("le", "0.1"),))] == 0
    assert served[(f"{name}_bucket", (("le", "0.25"),))] == 1
    assert served[("process_resident_memory_bytes", ())] > 0
