"""Notifications on the real sandbox (issue 13): a real ``nmo run --notify-url``
POSTing to a small HTTP receiver on loopback.

Each test runs its own nmo with ``--notify-url`` instead of the session's
(both would reconcile the same CRs); the session's is restarted at the end
of the module. The receiver records every request and answers from a
script (500, 500, then 200...), so retries are seen from both ends: the
requests it got and nmo's ``nmo_notifications_total`` /
``nmo_notification_retries_total``.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from objects import Api
from operator_fixtures import CURRENT, Operator, free_port, others_stopped, wait_for
from test_drain_control import blocked_node, create_nm, drained, remove_nm, wait_phase

from nmo import __version__
from nmo_sandbox import Sandbox

pytestmark = pytest.mark.integration

IDENTITY = "nmo-notify-test"
PDB = "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/db-pdb"


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    status: int  # what the receiver answered


class Receiver:
    """An HTTP/1.1 server on 127.0.0.1 that answers from ``answers``, then 200."""

    def __init__(self, answers: list[int] | None = None) -> None:
        self.answers = list(answers or [])
        self.requests: list[Request] = []
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/nmo"

    async def __aenter__(self) -> Receiver:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *_: object) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            method, path, _ = head[0].split(" ", 2)
            headers = {
                k.strip().lower(): v.strip()
                for k, v in (line.split(":", 1) for line in head[1:] if line)
            }
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            status = self.answers.pop(0) if self.answers else 200
            self.requests.append(Request(method, path, headers, json.loads(body), status))
            head_out = f"HTTP/1.1 {status} Whatever\r\nContent-Length: 0\r\nConnection: close"
            writer.write(f"{head_out}\r\n\r\n".encode())
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def of(self, name: str) -> list[Request]:
        return [r for r in self.requests if r.body.get("maintenance") == name]

    def kinds(self, name: str, *, delivered: bool = True) -> list[str]:
        return [r.body["kind"] for r in self.of(name) if not delivered or r.status < 300]


@pytest.fixture(scope="module")
async def sole_operator(operator: Operator) -> AsyncIterator[None]:
    """For this module, the session's nmo is stopped (it installed the CRD first)."""
    async with others_stopped():
        yield


@pytest.fixture
async def api(kube: httpx.AsyncClient) -> Api:
    return Api(kube)


@contextmanager
def reported(op: Operator) -> Iterator[Operator]:
    CURRENT.append(op)  # its log is attached to a failure report
    try:
        yield op
    finally:
        op.kill(signal.SIGTERM)
        CURRENT.remove(op)


def notifying(sandbox: Sandbox, tmp_path: Path, url: str) -> Operator:
    return Operator(sandbox, tmp_path, extra=["--notify-url", url, "--identity", IDENTITY])


async def test_a_maintenance_notifies_begin_blocked_succeeded_removed(
    sole_operator: None,
    sandbox: Sandbox,
    api: Api,
    namespace: str,
    node_factory: Any,
    tmp_path: Path,
) -> None:
    async with Receiver() as receiver:
        with reported(notifying(sandbox, tmp_path, receiver.url)) as op:
            await op.start()
            node, _ = await blocked_node(api, namespace, node_factory)
            name = await create_nm(api, node)

            async def got(kind: str) -> bool:
                return kind in receiver.kinds(name)

            await wait_for(lambda: got("blocked"), what="a blocked notification")
            assert receiver.kinds(name) == ["begin", "blocked"]
            obj = await api.nm(name)
            blocked = receiver.of(name)[1]
            assert blocked.body == {
                "version": 1,
                "kind": "blocked",
                "maintenance": name,
                "node": node,
                "phase": "Running",
                "reason": "drain control test",
                "message": drained(obj)["message"],
                "time": blocked.body["time"],
                "operator": IDENTITY,
            }
            assert drained(obj)["message"].startswith(
                f"PodDisruptionBudget {namespace}/db-pdb needs 2 healthy and has 2"
            )
            assert blocked.method == "POST" and blocked.path == "/hooks/nmo"
            assert blocked.headers["content-type"] == "application/json"
            assert blocked.headers["user-agent"] == f"nmo/{__version__}"
            begin = receiver.of(name)[0].body
            assert (begin["kind"], begin["message"]) == ("begin", "Begin a node maintenance")

            await api.merge(PDB.format(ns=namespace), {"spec": {"minAvailable": 0}})
            await wait_phase(api, name, "Succeeded")
            await remove_nm(api, name)
            # Delivered in order by one task: once "removed" is in, all before it are
            # too, so the list is complete (a block notifies once).
            await wait_for(lambda: got("removed"), what="a removed notification")
            assert receiver.kinds(name) == ["begin", "blocked", "succeeded", "removed"]
            assert [r.body["phase"] for r in receiver.of(name)][2:] == ["Succeeded", "Succeeded"]
            assert all(r.status == 200 for r in receiver.of(name))

            async def delivered() -> bool:
                return await op.metric("nmo_notifications_total", result="delivered") >= 4

            await wait_for(delivered, what="4 notifications counted delivered")
            for kind in ("begin", "blocked", "succeeded", "removed"):
                assert (
                    await op.metric("nmo_notifications_total", kind=kind, result="delivered") == 1
                )
            assert await op.metric("nmo_notifications_total", result="failed") == 0
            assert await op.metric("nmo_notifications_total", result="dropped") == 0
            assert await op.metric("nmo_notification_retries_total") == 0


async def test_a_receiver_answering_500_twice_gets_it_on_the_third_attempt(
    sole_operator: None,
    sandbox: Sandbox,
    api: Api,
    node_factory: Any,
    tmp_path: Path,
) -> None:
    async with Receiver(answers=[500, 500]) as receiver:
        with reported(notifying(sandbox, tmp_path, receiver.url)) as op:
            await op.start()
            (node,) = await node_factory(1)  # nothing to evict: begin, then succeeded
            name = await create_nm(api, node)
            await wait_phase(api, name, "Succeeded")

            async def both() -> bool:
                return receiver.kinds(name) == ["begin", "succeeded"]

            await wait_for(both, what="begin and succeeded delivered")
            attempts = [(r.body["kind"], r.status) for r in receiver.of(name)]
            assert attempts == [
                ("begin", 500),
                ("begin", 500),
                ("begin", 200),
                ("succeeded", 200),
            ]
            first, *again = [r.body for r in receiver.of(name) if r.body["kind"] == "begin"]
            assert all(body == first for body in again), "a retry sends the same document"

            async def counted() -> bool:
                return await op.metric("nmo_notifications_total", result="delivered") >= 2

            await wait_for(counted, what="both counted delivered")
            assert await op.metric("nmo_notification_retries_total", kind="begin") == 2
            assert await op.metric("nmo_notification_retries_total", kind="succeeded") == 0
            assert await op.metric("nmo_notifications_total", kind="begin", result="delivered") == 1
            assert await op.metric("nmo_notifications_total", result="failed") == 0
            await remove_nm(api, name)


async def test_a_receiver_that_is_down_does_not_delay_the_maintenance(
    sole_operator: None,
    sandbox: Sandbox,
    api: Api,
    node_factory: Any,
    tmp_path: Path,
) -> None:
    down = f"http://127.0.0.1:{free_port()}/hooks/nmo"  # nothing listens: refused
    with reported(notifying(sandbox, tmp_path, down)) as op:
        await op.start()
        (node,) = await node_factory(1)
        name = await create_nm(api, node)
        await wait_phase(api, name, "Succeeded")
        # The maintenance finished while "begin" was still being retried: the
        # retries alone take at least 0.5 + 1 + 2 + 4 s before it can fail.
        assert await op.metric("nmo_notifications_total", kind="begin") == 0
        assert await op.metric("nmo_notification_retries_total", kind="begin") >= 1

        async def failed() -> float:
            return await op.metric("nmo_notifications_total", result="failed")

        assert await wait_for(failed, timeout=90, what="begin given up") >= 1
        assert await op.metric("nmo_notifications_total", kind="begin", result="failed") == 1
        assert await op.metric("nmo_notification_retries_total", kind="begin") == 4
        assert await op.metric("nmo_notifications_total", result="delivered") == 0
        assert await op.metric("nmo_reconcile_errors_total") == 0
        obj = await api.nm(name)
        assert obj is not None and obj["status"]["phase"] == "Succeeded"
        assert not obj["status"].get("lastError")
        log = op.logs()
        assert f"notification begin for maintenance {name} not delivered after 5 attempt(s)" in log
        await remove_nm(api, name)
