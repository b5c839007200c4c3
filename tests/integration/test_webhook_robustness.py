"""The webhook's HTTPS endpoint under abuse, certificate rotation and slow caches.

nmo's webhook server runs on 127.0.0.1 with a certificate from the sandbox CA,
in a thread with its own event loop (:class:`ThreadedWebhook`), so that
synchronous hypothesis tests can block on requests while it answers, and so
that load generated here does not share the server's loop. Lookups come from
real informers on the sandbox's apiserver, as in ``nmo run``.

* bad input straight to the endpoint: a clear 4xx or a denied review, never
  a 5xx, and the server keeps serving; then >= 1000 hypothesis-generated
  bodies, none answered with a 5xx;
* rotating the certificate files under 20 concurrent admission loops: the
  new certificate is served within a poll interval, no request or handshake
  fails, also when the pair is caught halfway through a file-by-file swap;
* ``/readyz`` of a real ``nmo run`` fails, naming the cache checks, while the
  informers cannot sync, and passes once they can.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from audit import AuditWindow, nmo_events
from chart_identity import chart_identity
from cryptography import x509
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from objects import NM_KIND, NM_RESOURCE
from operator_fixtures import free_port
from operator_fixtures import wait_for as until

from nmo.api import constants as c
from nmo.api.crd import crd
from nmo.kube.client import Kube
from nmo.kube.informer import Informer
from nmo.server.intake import MAX_BODY_BYTES
from nmo.server.servers import Servers, ServerSettings
from nmo.telemetry.metrics import Metrics
from nmo.webhooks.lookups import MAINTENANCES_PATH, NODES_PATH, build_lookups
from nmo_sandbox import Sandbox

pytestmark = pytest.mark.integration

Json = dict[str, Any]
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
REVIEW = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
POLL = 5.0  # ServerSettings' default certificate poll interval, as in nmo run


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def admission(node: str, *, dry_run: bool = True, operation: str = "CREATE") -> Json:
    """A review the apiserver would send for ``kubectl create`` of a CR for ``node``."""
    obj = {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND,
        "metadata": {"name": unique("nm"), "uid": str(uuid.uuid4())},
        "spec": {"nodeName": node, "reason": "robustness"},
    }
    request = {
        "uid": str(uuid.uuid4()),
        "kind": NM_KIND,
        "resource": NM_RESOURCE,
        "requestKind": NM_KIND,
        "requestResource": NM_RESOURCE,
        "name": obj["metadata"]["name"],
        "operation": operation,
        "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
        "object": obj,
        "oldObject": None,
        "dryRun": dry_run,
    }
    return {**REVIEW, "request": request}


def client_context(ca_file: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_file))


async def install_crd(kube: httpx.AsyncClient) -> None:
    resp = await kube.post(CRDS, json=crd())
    assert resp.status_code in (201, 409), resp.text

    async def established() -> bool:
        status = (await kube.get(f"{CRDS}/{c.CRD_NAME}")).json().get("status") or {}
        conds = status.get("conditions") or []
        return any(x["type"] == "Established" and x["status"] == "True" for x in conds)

    await until(established, what="the NodeMaintenance CRD")


class ThreadedWebhook:
    """nmo's webhook server (informers, lookups, TLS) on an event loop in its own thread."""

    def __init__(self, kubeconfig: Path, cert_dir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.cert_dir = cert_dir
        self.port = 0
        self.servers: Servers | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="nmo-webhook", daemon=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}{c.WEBHOOK_PATH}"

    def start(self, timeout: float = 60.0) -> None:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the webhook server thread did not start")
        if self._error is not None:
            raise RuntimeError("the webhook server failed to start") from self._error

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        kube = await Kube.connect(kubeconfig=str(self.kubeconfig))
        nodes = Informer(kube, NODES_PATH, name="nodes")
        maintenances = Informer(kube, MAINTENANCES_PATH, name="nodemaintenances")
        lookups = build_lookups(kube, nodes=nodes, maintenances=maintenances)
        informers = [asyncio.create_task(i.run(), name=i.name) for i in (nodes, maintenances)]
        settings = ServerSettings(
            bind_address="127.0.0.1",
            webhook_port=0,
            probes_port=None,
            metrics_port=None,
            cert_dir=self.cert_dir,
            cert_poll_interval=POLL,
            graceful_shutdown_seconds=1,
        )
        self.servers = Servers(settings, kube=kube, lookups=lookups, metrics=Metrics())
        try:
            await self.servers.start()
            await asyncio.wait_for(nodes.synced.wait(), 30)
            await asyncio.wait_for(maintenances.synced.wait(), 30)
            self.port = self.servers.ports["webhook"]
            self._ready.set()
            await self._stop.wait()
        finally:
            await self.servers.stop()
            for task in informers:
                task.cancel()
            await asyncio.gather(*informers, return_exceptions=True)
            await kube.close()


@contextlib.asynccontextmanager
async def threaded_webhook(
    sandbox: Sandbox, cert_dir: Path
) -> AsyncIterator[tuple[ThreadedWebhook, str]]:
    """A running :class:`ThreadedWebhook` and a Node of its own (allowed creates)."""
    node = unique("robust")
    async with sandbox.client() as kube:
        await install_crd(kube)
    await sandbox.create_node(node)
    hook = ThreadedWebhook((await chart_identity(sandbox)).kubeconfig, cert_dir)
    try:
        await asyncio.to_thread(hook.start)
        yield hook, node
    finally:
        await asyncio.to_thread(hook.stop)
        await sandbox.delete_node(node)


@pytest.fixture(scope="module")
async def hook(
    sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[ThreadedWebhook, str]]:
    certs = tmp_path_factory.mktemp("robust-certs")
    sandbox.issue_serving_cert(certs, ["127.0.0.1"], name="tls")
    async with threaded_webhook(sandbox, certs) as running:
        yield running


def check_answer(resp: httpx.Response) -> None:
    """Never a 5xx; a 200 is a well-formed review, a 4xx says why in plain text."""
    assert resp.status_code < 500, (resp.status_code, resp.text[:300])
    if resp.status_code == 200:
        answer = resp.json()
        assert answer["kind"] == "AdmissionReview"
        assert isinstance(answer["response"]["uid"], str)
        assert isinstance(answer["response"]["allowed"], bool)
        assert answer["response"].get("status", {}).get("code") != 500, answer
    else:
        assert resp.text.strip(), resp.status_code


async def assert_serving(http: httpx.AsyncClient, hook: ThreadedWebhook, node: str) -> None:
    resp = await http.post(hook.url, json=admission(node))
    assert resp.status_code == 200, resp.text
    assert resp.json()["response"]["allowed"] is True, resp.text


# -- bad input ---------------------------------------------------------------------

JSON_TYPE = {"Content-Type": "application/json"}


def bad(request: Json) -> bytes:
    return json.dumps({**REVIEW, "request": request}).encode()


def nm_request(**fields: Any) -> Json:
    request: Json = {
        "uid": "bad-1",
        "kind": NM_KIND,
        "resource": NM_RESOURCE,
        "operation": "CREATE",
        "object": {"apiVersion": c.API_VERSION, "kind": c.KIND, "spec": {"nodeName": "x"}},
    }
    request.update(fields)
    return request


async def chunked(total: int, size: int = 256 * 1024) -> AsyncIterator[bytes]:
    for _ in range(total // size):
        yield b" " * size


BAD_INPUTS = [
    pytest.param(b"{not json", JSON_TYPE, 400, "not JSON", id="malformed JSON"),
    pytest.param(b"\xff\x00\xfe", JSON_TYPE, 400, "not JSON", id="binary"),
    pytest.param(b"", JSON_TYPE, 400, "empty", id="empty body"),
    pytest.param(b'{"hello": "world"}', JSON_TYPE, 400, "request.uid", id="not a review"),
    pytest.param(b"[1, 2]", JSON_TYPE, 400, "not a JSON object", id="a list"),
    pytest.param(json.dumps(REVIEW).encode(), JSON_TYPE, 400, "request.uid", id="no request"),
    pytest.param(
        bad({"operation": "CREATE", "object": {}}), JSON_TYPE, 400, "request.uid", id="no uid"
    ),
    pytest.param(b"[" * 100_000, JSON_TYPE, 400, "nested too deeply", id="deep nesting"),
    pytest.param(b"9" * 10_000, JSON_TYPE, 400, "not JSON", id="10000-digit number"),
    pytest.param(
        bad(nm_request(operation="EXPLODE")), JSON_TYPE, 200, "request.operation", id="bad op"
    ),
    pytest.param(
        bad(nm_request(kind={"group": "", "version": "v1", "kind": "Pod"})),
        JSON_TYPE,
        200,
        "AdmissionReview is for kind Pod (core), this webhook validates NodeMaintenance",
        id="another kind",
    ),
    pytest.param(
        bad(nm_request(resource={"group": "apps", "version": "v1", "resource": "deployments"})),
        JSON_TYPE,
        200,
        "AdmissionReview is for resource deployments (apps), this webhook validates",
        id="another resource",
    ),
    pytest.param(
        bad(nm_request(object={"apiVersion": "v1", "kind": "Secret"})),
        JSON_TYPE,
        200,
        "request.object is a Secret (v1)",
        id="another object",
    ),
    pytest.param(
        b" " * (MAX_BODY_BYTES + 1),
        JSON_TYPE,
        413,
        f"request body of {MAX_BODY_BYTES + 1} bytes exceeds the webhook's limit of "
        f"{MAX_BODY_BYTES} bytes",
        id="oversized",
    ),
    pytest.param("chunked", JSON_TYPE, 413, "exceeds the webhook's limit", id="oversized chunked"),
    pytest.param(
        json.dumps(admission("x")).encode(),
        {"Content-Type": "text/plain"},
        415,
        "Content-Type 'text/plain' is not supported; an AdmissionReview is sent as "
        "application/json",
        id="wrong content type",
    ),
    pytest.param(
        json.dumps(admission("x")).encode(),
        {"Content-Type": "application/x-www-form-urlencoded"},
        415,
        "is not supported",
        id="form content type",
    ),
]


@pytest.mark.parametrize(("body", "headers", "status", "says"), BAD_INPUTS)
async def test_bad_input_gets_a_clear_answer_and_the_server_keeps_serving(
    hook: tuple[ThreadedWebhook, str],
    sandbox: Sandbox,
    body: bytes | str,
    headers: dict[str, str],
    status: int,
    says: str,
) -> None:
    server, node = hook
    async with httpx.AsyncClient(verify=client_context(sandbox.ca_file)) as http:
        content = chunked(MAX_BODY_BYTES + 1024 * 1024) if body == "chunked" else body
        resp = await http.post(server.url, content=content, headers=headers)
        check_answer(resp)
        assert resp.status_code == status
        if status == 200:
            answer = resp.json()["response"]
            assert (answer["uid"], answer["allowed"]) == ("bad-1", False)
            assert answer["status"]["code"] == 400
            assert says in answer["status"]["message"]
        else:
            assert says in resp.text
        await assert_serving(http, server, node)  # on the same keep-alive connection


async def test_an_endless_body_is_refused_without_reading_it(
    hook: tuple[ThreadedWebhook, str], sandbox: Sandbox
) -> None:
    """A 1 GB Content-Length, and no body at all: the 413 comes at once, and closes."""
    server, node = hook
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", server.port, ssl=client_context(sandbox.ca_file)
    )
    try:
        head = (
            f"POST {c.WEBHOOK_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n"
        )
        writer.write(head.encode())
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5)  # until the server closes
    finally:
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await writer.wait_closed()
    text = answer.decode()
    assert text.startswith("HTTP/1.1 413 ")
    assert "connection: close" in text.lower()
    assert "request body of 1000000000 bytes exceeds the webhook's limit" in text
    async with httpx.AsyncClient(verify=client_context(sandbox.ca_file)) as http:
        await assert_serving(http, server, node)


async def test_other_methods_and_paths_are_4xx(
    hook: tuple[ThreadedWebhook, str], sandbox: Sandbox
) -> None:
    server, node = hook
    base = f"https://127.0.0.1:{server.port}"
    async with httpx.AsyncClient(verify=client_context(sandbox.ca_file), base_url=base) as http:
        assert (await http.get(c.WEBHOOK_PATH)).status_code == 405
        assert (await http.put(c.WEBHOOK_PATH, json={})).status_code == 405
        assert (await http.post("/mutate-nothing", json=admission(node))).status_code == 404
        await assert_serving(http, server, node)


async def test_an_idle_connection_is_not_closed_under_the_apiserver(
    hook: tuple[ThreadedWebhook, str], sandbox: Sandbox
) -> None:
    """The apiserver reuses idle connections for 90 s; uvicorn's default closed them
    after 5 s, and a review sent as the server closed one failed with EOF."""
    server, node = hook
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", server.port, ssl=client_context(sandbox.ca_file)
    )

    async def admit() -> bytes:
        body = json.dumps(admission(node)).encode()
        writer.write(
            f"POST {c.WEBHOOK_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return head + await reader.readexactly(length)

    try:
        assert b'"allowed":true' in await admit()
        await asyncio.sleep(7)  # past uvicorn's default keep-alive of 5 s
        answer = await admit()  # the same connection
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert b'"allowed":true' in answer
    finally:
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await writer.wait_closed()


# -- fuzzing -----------------------------------------------------------------------

FUZZ_EXAMPLES = 1100  # a few may be skipped as duplicates; at least 1000 are sent


# Fuzzed CREATEs that are no dry run claim their node for a while (lookups.py), so
# the fuzz names the sandbox's own nodes and the module's node stays free for the
# final check.
FUZZ_NODES = ["node-1", "node-2"]


def fuzz_strategies() -> st.SearchStrategy[tuple[str | None, bytes]]:
    """(Content-Type, body): bytes, JSON, review-shaped JSON, huge and deep bodies."""
    leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=40))
    values = st.recursive(
        leaf,
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids),
        max_leaves=12,
    )

    def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.one_of(strategy, strategy, strategy, values)  # mostly plausible

    names = st.one_of(
        st.sampled_from([*FUZZ_NODES, "", "../namespaces/default/pods", "Node-1", "a" * 300]),
        st.text(max_size=30),
    )
    gvk = st.fixed_dictionaries(
        {},
        optional={
            "group": maybe(st.sampled_from([c.GROUP, "", "apps"])),
            "version": maybe(st.sampled_from([c.VERSION, "v1"])),
            "kind": maybe(st.sampled_from([c.KIND, "Pod", ""])),
        },
    )
    gvr = st.fixed_dictionaries(
        {},
        optional={
            "group": maybe(st.sampled_from([c.GROUP, ""])),
            "version": maybe(st.sampled_from([c.VERSION, "v1"])),
            "resource": maybe(st.sampled_from([c.PLURAL, "nodes", ""])),
        },
    )
    meta = st.fixed_dictionaries(
        {},
        optional={
            "name": maybe(st.text(max_size=20)),
            "uid": maybe(st.uuids().map(str)),
            "deletionTimestamp": maybe(st.just("2024-01-01T00:00:00Z")),
        },
    )
    objects = st.fixed_dictionaries(
        {},
        optional={
            "apiVersion": maybe(st.sampled_from([c.API_VERSION, "v1", ""])),
            "kind": maybe(st.sampled_from([c.KIND, "Pod"])),
            "metadata": maybe(meta),
            "spec": maybe(
                st.fixed_dictionaries(
                    {}, optional={"nodeName": maybe(names), "reason": maybe(st.text())}
                )
            ),
        },
    )
    requests = st.fixed_dictionaries(
        {},
        optional={
            "uid": maybe(st.uuids().map(str) | st.text(max_size=10)),
            "kind": maybe(gvk),
            "resource": maybe(gvr),
            "subResource": maybe(st.sampled_from(["", "status"])),
            "name": maybe(st.text(max_size=20)),
            "operation": maybe(st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT", "x"])),
            "userInfo": maybe(st.fixed_dictionaries({}, optional={"username": maybe(st.text())})),
            "object": maybe(objects),
            "oldObject": maybe(objects),
            "dryRun": maybe(st.booleans()),
        },
    )
    # Shaped like the apiserver's reviews, with any field possibly odd.
    plausible = st.fixed_dictionaries(
        {
            "uid": st.uuids().map(str),
            "operation": st.sampled_from(["CREATE", "CREATE", "UPDATE", "DELETE", "CONNECT"]),
            "object": objects,
        },
        optional={
            "kind": maybe(gvk),
            "resource": maybe(gvr),
            "oldObject": maybe(objects),
            "dryRun": maybe(st.booleans()),
            "userInfo": maybe(st.fixed_dictionaries({"username": st.text(max_size=20)})),
        },
    ).map(lambda request: {**REVIEW, "request": request})
    reviews = st.fixed_dictionaries(
        {},
        optional={
            "apiVersion": maybe(
                st.sampled_from(["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])
            ),
            "kind": maybe(st.sampled_from(["AdmissionReview", "Status"])),
            "request": maybe(requests),
        },
    )

    def huge(spec: tuple[int, str]) -> bytes:
        size, where = spec
        if where == "raw":
            return b"x" * size
        if where == "nested":
            return b"[" * (size // 2) + b"]" * (size // 2)
        review = admission(FUZZ_NODES[0])
        if where == "uid":
            review["request"]["uid"] = "u" * size
        else:
            review["request"]["object"]["spec"]["nodeName"] = "n" * size
        return json.dumps(review).encode()

    sizes = st.sampled_from(
        [10_000, 1_000_000, MAX_BODY_BYTES - 300, MAX_BODY_BYTES, MAX_BODY_BYTES + 1]
    ) | st.integers(100_000, MAX_BODY_BYTES + 500_000)
    bodies = st.one_of(
        st.binary(max_size=512),
        values.map(lambda v: json.dumps(v).encode()),
        reviews.map(lambda v: json.dumps(v).encode()),
        reviews.map(lambda v: json.dumps(v).encode()),
        plausible.map(lambda v: json.dumps(v).encode()),
        plausible.map(lambda v: json.dumps(v).encode()),
        st.tuples(sizes, st.sampled_from(["raw", "nested", "uid", "nodeName"])).map(huge),
    )
    content_types = st.sampled_from(
        ["application/json"] * 12
        + ["application/json; charset=utf-8", "text/plain", "application/yaml", "", None]
    )
    return st.tuples(content_types, bodies)


def test_a_thousand_generated_bodies_get_no_5xx(
    hook: tuple[ThreadedWebhook, str], sandbox: Sandbox
) -> None:
    server, node = hook
    statuses: Counter[int] = Counter()
    started = time.monotonic()
    # TCP_NODELAY: httpx's sync transport writes headers and body separately, and
    # Nagle's algorithm would hold the body back for the server's delayed ACK (40 ms).
    transport = httpx.HTTPTransport(
        verify=client_context(sandbox.ca_file),
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
    )
    with httpx.Client(transport=transport, timeout=30) as http:

        @settings(
            max_examples=FUZZ_EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=fuzz_strategies())
        # Each kind of answer at least once, whatever the draw.
        @example(case=("application/json", json.dumps(admission(node)).encode()))
        @example(case=("application/json", b"{]"))
        @example(case=("application/json", b" " * (MAX_BODY_BYTES + 1)))
        @example(case=("text/plain", b"{}"))
        def one(case: tuple[str | None, bytes]) -> None:
            content_type, body = case
            headers = {} if content_type is None else {"Content-Type": content_type}
            resp = http.post(server.url, content=body, headers=headers)
            statuses[resp.status_code] += 1
            check_answer(resp)

        one()
        after = http.post(server.url, json=admission(node))
    elapsed = time.monotonic() - started
    print(f"\nfuzz: {sum(statuses.values())} bodies in {elapsed:.1f}s, statuses {dict(statuses)}")
    assert sum(statuses.values()) >= 1000
    assert not [s for s in statuses if s >= 500]
    assert statuses[200] and statuses[400] and statuses[413] and statuses[415]
    assert after.status_code == 200
    assert after.json()["response"]["allowed"] is True


# -- certificate rotation ----------------------------------------------------------


async def served_serial(port: int, ca_file: Path) -> int:
    """The serial of the certificate a fresh, verified handshake gets."""
    _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context(ca_file))
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await writer.wait_closed()
    return x509.load_der_x509_certificate(der).serial_number


def serial_of(cert_file: Path) -> int:
    return x509.load_pem_x509_certificate(cert_file.read_bytes()).serial_number


class Load:
    """Admission requests in concurrent loops, every failure kept."""

    def __init__(self, hook: ThreadedWebhook, node: str, ca_file: Path, loops: int = 20) -> None:
        self.hook, self.node, self.ca_file, self.loops = hook, node, ca_file, loops
        self.ok = 0
        self.handshakes = 0
        self.failures: list[str] = []
        self.serials: list[tuple[float, int]] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def _admit(self, fresh_connections: bool) -> None:
        # Half the loops open a connection (a handshake) per request, half keep one alive.
        headers = {"Connection": "close"} if fresh_connections else {}
        async with httpx.AsyncClient(verify=client_context(self.ca_file), timeout=10) as http:
            while not self._stop.is_set():
                try:
                    resp = await http.post(
                        self.hook.url, json=admission(self.node), headers=headers
                    )
                    if resp.status_code != 200 or resp.json()["response"]["allowed"] is not True:
                        self.failures.append(f"{resp.status_code} {resp.text[:200]}")
                    else:
                        self.ok += 1
                except (httpx.HTTPError, ssl.SSLError, OSError) as exc:
                    self.failures.append(f"{type(exc).__name__}: {exc}")

    async def _watch_serial(self) -> None:
        while not self._stop.is_set():
            try:
                serial = await served_serial(self.hook.port, self.ca_file)
                self.handshakes += 1
                self.serials.append((time.monotonic(), serial))
            except (ssl.SSLError, OSError) as exc:
                self.failures.append(f"handshake {type(exc).__name__}: {exc}")
            await asyncio.sleep(0.05)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._admit(fresh_connections=i % 2 == 0))
            for i in range(self.loops)
        ]
        self._tasks.append(asyncio.create_task(self._watch_serial()))

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def flowing(self, more: int, timeout: float = 30) -> None:
        """Wait until ``more`` admissions and a handshake have succeeded from now on."""
        ok, handshakes = self.ok, self.handshakes

        async def flowed() -> bool:
            return self.ok >= ok + more and self.handshakes > handshakes

        await until(flowed, timeout=timeout, what=f"{more} more admissions under load")

    async def serving(self, serial: int, since: float, timeout: float) -> float:
        """Seconds from ``since`` until handshakes present ``serial``."""

        async def seen() -> float | None:
            for at, got in self.serials:
                if at >= since and got == serial:
                    return at - since
            return None

        took: float = await until(seen, timeout=timeout, what=f"serial {serial:x} served")
        return took


def kubelet_layout(cert_dir: Path, version: str, sandbox: Sandbox) -> Path:
    """A Secret volume's layout: ``tls.crt -> ..data/tls.crt``, ``..data -> ..<version>``."""
    target = cert_dir / f"..{version}"
    sandbox.issue_serving_cert(target, ["127.0.0.1"], name="tls")
    link = cert_dir / "..data_tmp"
    link.symlink_to(target.name)
    os.replace(link, cert_dir / "..data")  # the atomic swap the kubelet does
    for name in ("tls.crt", "tls.key"):
        if not (cert_dir / name).is_symlink():
            (cert_dir / name).symlink_to(f"..data/{name}")
    return target / "tls.crt"


async def test_rotated_certificate_is_served_with_no_failed_admission(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    certs = tmp_path / "secret-volume"
    certs.mkdir()
    first = serial_of(kubelet_layout(certs, "v1", sandbox))
    async with threaded_webhook(sandbox, certs) as (server, node):
        assert await served_serial(server.port, sandbox.ca_file) == first
        load = Load(server, node, sandbox.ca_file)
        load.start()
        try:
            await load.flowing(50)  # with the first certificate

            # 1. The kubelet updates the mounted Secret: both files swap at once.
            rotated = time.monotonic()
            second = serial_of(kubelet_layout(certs, "v2", sandbox))
            atomic_took = await load.serving(second, rotated, timeout=POLL + 3)

            # 2. Files replaced one by one, with a poll in between: the watcher
            # finds a new certificate next to the old key and must keep serving
            # the intact previous pair until the key arrives.
            staging = tmp_path / "staging"
            third_cert = sandbox.issue_serving_cert(staging, ["127.0.0.1"], name="tls")
            third = serial_of(third_cert.cert_file)
            assert server.servers is not None
            watcher = server.servers.certificates["webhook"]
            reloads = watcher.reloads
            os.replace(third_cert.cert_file, certs / "tls.crt")
            half = time.monotonic()
            checks = watcher.checks  # every later poll sees the new cert next to the old key

            async def looked_twice() -> bool:
                return watcher.checks >= checks + 2

            await until(looked_twice, timeout=3 * POLL, what="two polls of the half-rotated files")
            await load.flowing(50)  # handshakes and admissions after those polls
            assert watcher.reloads == reloads, "a half-rotated pair was loaded"
            assert {s for at, s in load.serials if at > half + 0.2} == {second}
            os.replace(third_cert.key_file, certs / "tls.key")
            completed = time.monotonic()
            split_took = await load.serving(third, completed, timeout=POLL + 3)
            await load.flowing(50)  # and load keeps flowing on the new one
        finally:
            await load.stop()
        assert server.servers is not None
        reloads = server.servers.certificates["webhook"].reloads
    print(
        f"\nrotation: {load.ok} admissions and {load.handshakes} probe handshakes, "
        f"{len(load.failures)} failures; new certificate served {atomic_took:.1f}s after "
        f"the Secret swap and {split_took:.1f}s after the last file (poll {POLL:g}s)"
    )
    assert load.failures == []
    assert load.ok > 200
    assert reloads == 2
    assert load.serials[-1][1] == third


# -- readiness before the caches sync ----------------------------------------------


class NmoProcess:
    """``nmo run`` as users run it, with its own ports and log file."""

    def __init__(self, log: Path, *args: str) -> None:
        self.probe_port = free_port()
        self.log = log
        argv = [
            sys.executable, "-m", "nmo", "run", "--bind-address", "127.0.0.1",
            "--health-probe-port", str(self.probe_port),
            "--metrics-port", str(free_port()), "--no-metrics-secure",
            "--webhook-port", str(free_port()), *args,
        ]  # fmt: skip
        with log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def nmo_process(tmp_path: Path) -> Iterator[Callable[..., NmoProcess]]:
    started: list[NmoProcess] = []

    def start(*args: str) -> NmoProcess:
        started.append(NmoProcess(tmp_path / f"nmo-{len(started)}.log", *args))
        return started[-1]

    yield start
    for proc in started:
        proc.stop()


async def curl(url: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "-w", "\n%{http_code}", url,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, _err = await proc.communicate()
    body, _, code = out.decode().rpartition("\n")
    return int(code or 0), body


READ_ONLY = [
    {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [c.GROUP], "resources": [c.PLURAL], "verbs": ["get", "list", "watch"]},
]


async def test_readyz_names_the_cache_checks_until_they_sync(
    sandbox: Sandbox,
    kube: httpx.AsyncClient,
    namespace: str,
    tmp_path: Path,
    nmo_process: Callable[..., NmoProcess],
) -> None:
    await install_crd(kube)
    # The namespace's default ServiceAccount may list nothing cluster-wide:
    # nmo connects, serves its probes, and its informers keep retrying.
    kubeconfig = await sandbox.service_account_kubeconfig(
        namespace, "default", tmp_path / "sa.kubeconfig"
    )
    certs = tmp_path / "certs"
    sandbox.issue_serving_cert(certs, ["127.0.0.1"], name="tls")
    window = await AuditWindow.open(sandbox)
    p = nmo_process("--kubeconfig", str(kubeconfig), "--no-leader-elect", "--cert-dir", str(certs))
    base = f"http://127.0.0.1:{p.probe_port}"

    async def probes_up() -> bool:
        assert p.proc.poll() is None, p.log.read_text()[-3000:]
        return (await curl(f"{base}/healthz"))[0] == 200

    await until(probes_up, what="nmo's probe server")
    user = f"system:serviceaccount:{namespace}:default"

    async def refused_twice() -> bool:
        refused = Counter(
            e.resource
            for e in nmo_events(window.events())
            if e.username == user and e.verb == "list" and e.code == 403
        )
        return all(refused[r] >= 2 for r in ("nodes", c.PLURAL))

    await until(refused_twice, what="the informers' lists to be refused twice each")
    code, verbose = await curl(f"{base}/readyz?verbose")
    assert code == 500, verbose
    assert "[-]informers failed: maintenance and node caches have not synced yet" in verbose
    assert (
        "[-]webhook-caches failed: node and NodeMaintenance caches have not synced yet" in verbose
    )
    assert "[+]webhook ok" in verbose  # the certificate is there: only the caches fail
    assert verbose.rstrip().endswith("readyz check failed")
    assert (await curl(f"{base}/readyz/webhook-caches"))[0] == 500
    assert await curl(f"{base}/healthz") == (200, "ok")  # alive, only not ready
    assert "forbidden" in p.log.read_text().lower()

    # Granted read access, the informers' next retry syncs and readiness follows.
    role = unique("nmo-readyz")
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    await kube.post(f"{rbac}/clusterroles", json={"metadata": {"name": role}, "rules": READ_ONLY})
    binding = {
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}],
    }
    await kube.post(f"{rbac}/clusterrolebindings", json=binding)
    try:

        async def ready() -> bool:
            return (await curl(f"{base}/readyz"))[0] == 200

        await until(ready, timeout=60, what="/readyz to pass once the caches can sync")
        assert await curl(f"{base}/readyz") == (200, "ok")
    finally:
        await kube.delete(f"{rbac}/clusterrolebindings/{role}")
        await kube.delete(f"{rbac}/clusterroles/{role}")
