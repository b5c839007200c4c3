"""Fixtures for tests against the real sandbox (etcd, apiserver, controllers, kwok).

One sandbox serves the whole session: starting it costs seconds, and tests
isolate themselves with a fresh namespace and their own uniquely named nodes.
Missing binaries FAIL the session instead of skipping it: a skipped
integration test is a failure that looks like a pass.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Mapping

import httpx
import pytest

from nmo_sandbox import MissingBinariesError, Sandbox, find_binaries

SANDBOX_NODES = 3


@pytest.fixture(scope="session")
async def sandbox(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Sandbox]:
    """A running sandbox with nodes node-1..node-3, stopped at the end of the session."""
    try:
        binaries = find_binaries()
    except MissingBinariesError as exc:
        problem = str(exc)
    else:
        problem = ""
    if problem:
        pytest.fail(problem, pytrace=False)
    async with Sandbox(
        tmp_path_factory.mktemp("sandbox"), nodes=SANDBOX_NODES, binaries=binaries
    ) as sb:
        yield sb


@pytest.fixture
async def kube(sandbox: Sandbox) -> AsyncIterator[httpx.AsyncClient]:
    """An admin httpx client for the sandbox's apiserver."""
    async with sandbox.client(user_agent="nmo-integration-tests") as client:
        yield client


@pytest.fixture
async def namespace(sandbox: Sandbox, kube: httpx.AsyncClient) -> AsyncIterator[str]:
    """A fresh namespace whose ``default`` ServiceAccount exists; deleted afterwards."""
    sandbox.check_alive()  # a dead component should fail here, with its log tail
    name = f"t-{uuid.uuid4().hex[:8]}"
    resp = await kube.post(
        "/api/v1/namespaces",
        json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )
    resp.raise_for_status()
    # Pods are rejected until the controller-manager has created the SA.
    deadline = time.monotonic() + 30
    while (await kube.get(f"/api/v1/namespaces/{name}/serviceaccounts/default")).status_code != 200:
        if time.monotonic() > deadline:
            pytest.fail(f"ServiceAccount default never appeared in namespace {name}")
        await asyncio.sleep(0.1)
    yield name
    await kube.delete(f"/api/v1/namespaces/{name}")


class NodeFactory:
    """Creates uniquely named kwok nodes (``t-<id>-<n>``) and waits until Ready."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sandbox = sandbox
        self.prefix = f"t-{uuid.uuid4().hex[:6]}"
        self.created: list[str] = []

    async def __call__(
        self, count: int = 1, *, labels: Mapping[str, str] | None = None
    ) -> list[str]:
        names = [f"{self.prefix}-{len(self.created) + i}" for i in range(1, count + 1)]
        for name in names:
            await self._sandbox.create_node(name, labels=dict(labels or {}), wait=False)
            self.created.append(name)
        await self._sandbox.wait_nodes_ready(names)
        return names

    async def cleanup(self) -> None:
        for name in self.created:
            await self._sandbox.delete_node(name)


@pytest.fixture
async def node_factory(sandbox: Sandbox) -> AsyncIterator[NodeFactory]:
    """``await node_factory(2, labels={...})`` -> names of new Ready nodes, deleted after."""
    sandbox.check_alive()
    factory = NodeFactory(sandbox)
    yield factory
    await factory.cleanup()


# The session's nmo process (see operator_fixtures.py).
from operator_fixtures import operator, sole_operator  # noqa: E402, F401


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """On failure, attach the tail of the nmo operator's log to the report."""
    outcome = yield
    report = outcome.get_result()
    from operator_fixtures import CURRENT

    if report.failed and CURRENT:
        op = CURRENT[-1]
        lines = op.logs().splitlines()[-80:]
        report.sections.append((f"nmo log ({op.log_dir})", "\n".join(lines)))
