"""The fleet budget and the maintenance window on the real sandbox (issue 13).

The budget must hold whatever the timing: 100 CRs created at once, two nmo
replicas with leader election, the leader killed in the middle. What is
measured comes from a watch on the Nodes opened before the first CR: every
change of every node is seen, so the highest number of nodes under nmo's
maintenance taint at any instant is exact, not sampled.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from chart_identity import RELEASE_NAMESPACE, Identity, reset_leader_leases
from objects import NM, Api
from operator_fixtures import CURRENT, Operator, probe_synced, wait_for, wait_until_up

from nmo.controller.ledger import ANNOTATION as LEDGER_ANNOTATION
from nmo.controller.ledger import LEDGER_NAME
from nmo_sandbox import Sandbox

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("sole_operator")]

TAINT = "medik8s.io/drain"
# Leader election and the budget ledger: the chart's release namespace, as a
# chart install passes it (the chart's leader-election Role allows no other).
LEADER_NS = RELEASE_NAMESPACE
LEADER_FLAGS = [
    "--leader-elect",
    "--leader-lease-duration",
    "4",
    "--leader-renew-deadline",
    "3",
    "--leader-retry-period",
    "0.5",
]


class Replica(Operator):
    """An nmo that may be a standby: up once its caches synced, leading or not."""

    async def start(self) -> None:
        await self.ensure_identity()
        self.starts += 1
        with self.log_file.open("wb") as out:
            self.proc = subprocess.Popen(self.args(), stdout=out, stderr=subprocess.STDOUT)  # noqa: ASYNC220
        await wait_until_up(
            self.proc,
            lambda: probe_synced(self.probe_port),
            log=self.log_file.read_text,
            what="synced",
        )


@pytest.fixture
async def api(kube: httpx.AsyncClient) -> Api:
    return Api(kube)


@pytest.fixture
async def leader_namespace(sandbox: Sandbox) -> AsyncIterator[str]:
    """The namespace of the replicas' leader election and budget ledger, with
    neither Lease in it before the test or after it."""
    await reset_leader_leases(sandbox)
    yield LEADER_NS
    await reset_leader_leases(sandbox)


async def replicas(
    sandbox: Sandbox, tmp_path: Path, count: int, extra: list[str]
) -> AsyncIterator[list[Replica]]:
    """``count`` replicas as the chart's ServiceAccount (leader Lease and ledger in LEADER_NS)."""
    ops = [Replica(sandbox, tmp_path / f"r{i}", extra=extra) for i in range(count)]
    try:
        for op in ops:
            op.log_dir.mkdir(parents=True)
            CURRENT.append(op)
            await op.start()
        yield ops
    finally:
        for op in ops:
            op.kill(signal.SIGTERM)
            if op in CURRENT:
                CURRENT.remove(op)


class Watch:
    """Every change of one collection, from a watch opened before the test acts."""

    path = ""

    def __init__(self, client: httpx.AsyncClient, prefix: str) -> None:
        self.client, self.prefix = client, prefix
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        listing = (await self.client.get(self.path)).json()
        for item in listing["items"]:
            self._see(item)
        ready = asyncio.Event()
        self.task = asyncio.create_task(self._run(listing["metadata"]["resourceVersion"], ready))
        await ready.wait()

    def _see(self, obj: dict[str, Any]) -> None:
        raise NotImplementedError

    async def _run(self, rv: str, ready: asyncio.Event) -> None:
        params = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "false"}
        async with self.client.stream("GET", self.path, params=params, timeout=None) as resp:
            assert resp.status_code == 200
            ready.set()
            async for line in resp.aiter_lines():
                if line.strip():
                    event = json.loads(line)
                    assert event["type"] != "ERROR", event
                    self._see(event["object"])

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()


class NodeWatch(Watch):
    """Which nodes carry nmo's maintenance taint, and the most at once."""

    path = "/api/v1/nodes"

    def __init__(self, client: httpx.AsyncClient, prefix: str) -> None:
        super().__init__(client, prefix)
        self.tainted: dict[str, bool] = {}
        self.peak = 0
        self.changes: list[tuple[float, str, bool]] = []  # (monotonic, node, tainted)

    def _see(self, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        if not name.startswith(self.prefix):
            return
        now = any(t.get("key") == TAINT for t in node["spec"].get("taints") or [])
        if self.tainted.get(name) != now:
            self.changes.append((time.monotonic(), name, now))
        self.tainted[name] = now
        self.peak = max(self.peak, sum(self.tainted.values()))


class LedgerWatch(Watch):
    """The order in which CRs entered the budget ledger, from a watch on its Lease.

    Admission is what "start" means for the queue: every admission is one
    compare-and-swap of the ledger, so each one is a write this watch sees.
    (What follows on the node and in the status is per CR and may overtake.)
    """

    path = f"/apis/coordination.k8s.io/v1/namespaces/{LEADER_NS}/leases"

    def __init__(self, client: httpx.AsyncClient, prefix: str) -> None:
        super().__init__(client, prefix)
        self.admitted: list[str] = []

    def _see(self, lease: dict[str, Any]) -> None:
        if lease["metadata"]["name"] != LEDGER_NAME:
            return
        raw = (lease["metadata"].get("annotations") or {}).get(LEDGER_ANNOTATION) or "{}"
        for name in sorted(json.loads(raw)):
            if name.startswith(self.prefix) and name not in self.admitted:
                self.admitted.append(name)


def cr(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "reason": "fleet test"},
    }


async def phases(api: Api, prefix: str) -> dict[str, dict[str, Any]]:
    items = (await api.c.get(NM)).json()["items"]
    return {o["metadata"]["name"]: o for o in items if o["metadata"]["name"].startswith(prefix)}


def queue_order(objs: dict[str, dict[str, Any]]) -> list[str]:
    return sorted(objs, key=lambda n: (objs[n]["metadata"]["creationTimestamp"], n))


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


async def leader_of(ops: list[Replica]) -> Replica:
    async def find() -> Replica | None:
        for op in ops:
            if op.proc is not None and await op.leading():
                return op
        return None

    return await wait_for(find, timeout=30, what="a leader")


@pytest.mark.solo
async def test_budget_holds_for_100_crs_across_a_leader_change(
    sandbox: Sandbox,
    api: Api,
    kube: httpx.AsyncClient,
    node_factory: Any,
    tmp_path: Path,
    leader_namespace: str,
) -> None:
    budget = 10
    nodes = await node_factory(100)
    async with sandbox.client() as watch_client:
        watch = NodeWatch(watch_client, node_factory.prefix)
        await watch.start()
        ledger = LedgerWatch(watch_client, f"fl-{node_factory.prefix}-")
        await ledger.start()
        gen = replicas(
            sandbox, tmp_path, 2, [*LEADER_FLAGS, "--max-parallel-maintenances", str(budget)]
        )
        ops = await gen.__anext__()
        try:
            prefix = f"fl-{node_factory.prefix}-"
            names = [f"{prefix}{i:03d}" for i in range(100)]
            created = await asyncio.gather(
                *(api.c.post(NM, json=cr(n, nodes[i])) for i, n in enumerate(names))
            )
            assert all(r.status_code == 201 for r in created), [
                r.text for r in created if r.status_code != 201
            ]

            async def started() -> dict[str, dict[str, Any]] | None:
                objs = await phases(api, prefix)
                begun = [
                    n
                    for n, o in objs.items()
                    if (o.get("status") or {}).get("phase") in ("Running", "Succeeded")
                ]
                pending = [
                    n for n, o in objs.items() if (o.get("status") or {}).get("phase") == "Pending"
                ]
                return objs if len(begun) == budget and len(pending) == 100 - budget else None

            objs = await wait_for(started, timeout=90, what=f"{budget} started, the rest Pending")
            # The first ten were admitted while the others were still being created
            # (first come, first served); from then on every CR exists, so the rest
            # must start in the queue's order: creationTimestamp, then name.
            first = [n for n in queue_order(objs) if objs[n]["status"]["phase"] != "Pending"]
            order = first + [n for n in queue_order(objs) if n not in first]
            done: list[str] = []
            waits: list[float] = []
            killed = False
            while len(done) < 100:
                objs = await phases(api, prefix)
                status = {n: (o.get("status") or {}).get("phase") for n, o in objs.items()}
                begun = sorted(
                    (n for n, p in status.items() if p in ("Running", "Succeeded")),
                    key=order.index,
                )
                assert len(begun) <= budget, begun
                if len(begun) < min(budget, 100 - len(done)) or any(
                    status[n] != "Succeeded" for n in begun
                ):
                    await asyncio.sleep(0.1)
                    continue
                queued = [n for n in order if n not in done and n not in begun]
                if queued:
                    head = queued[0]

                    async def head_says_first(head: str = head, n: int = len(queued)) -> bool:
                        obj = await api.nm(head)
                        cond = condition(obj or {}, "Queued")
                        return (
                            (obj or {}).get("status", {}).get("phase") == "Pending"
                            and cond.get("status") == "True"
                            and cond.get("reason") == "BudgetExhausted"
                            and cond["message"]
                            == f"position 1 of {n} in the queue: {budget} of {budget} "
                            "maintenances running (--max-parallel-maintenances)"
                        )

                    await wait_for(head_says_first, what=f"{head}: Queued, position 1")
                if len(done) >= 50 and not killed:
                    leader = await leader_of(ops)
                    leader.kill()  # SIGKILL, in the middle: the standby takes over
                    killed = True
                await asyncio.gather(*(api.delete(f"{NM}/{n}") for n in begun))
                await asyncio.gather(
                    *(
                        wait_for(lambda n=n: _gone(api, n), timeout=60, what=f"{n} removed")
                        for n in begun
                    )
                )
                freed = time.monotonic()
                done.extend(begun)
                if len(done) < 100:
                    nxt = next(n for n in order if n not in done)
                    idx = names.index(nxt)

                    async def tainted(node: str = nodes[idx]) -> bool:
                        return watch.tainted.get(node, False)

                    await wait_for(
                        tainted,
                        timeout=60,
                        interval=0.01,
                        what=f"{nxt} admitted after a slot freed",
                    )
                    waits.append(time.monotonic() - freed)
            waits.sort()
            print(
                f"budget {budget}: peak {watch.peak} nodes in maintenance at once over "
                f"{len(watch.changes)} taint changes; a queued CR started "
                f"{waits[len(waits) // 2]:.2f}s (median), {waits[-1]:.2f}s (max) "
                "after its slot freed "
                f"({len(waits)} batches, leader killed after 50)"
            )
            assert watch.peak == budget, watch.peak
            assert killed
            # Admitted in creation order, as the ledger's own writes show.
            admitted = ledger.admitted
            assert sorted(admitted) == sorted(names), admitted  # every admission was seen
            assert set(admitted[:budget]) == set(order[:budget]), admitted
            assert admitted[budget:] == order[budget:], (
                f"admitted out of creation order: {admitted[budget:]} vs {order[budget:]}"
            )
        finally:
            watch.stop()
            ledger.stop()
            try:
                await _remove_all(api, prefix)  # a failure leaves nothing to later tests
            finally:
                await gen.aclose()


async def _remove_all(api: Api, prefix: str) -> None:
    left = list(await phases(api, prefix))
    await asyncio.gather(*(api.delete(f"{NM}/{n}") for n in left))
    await asyncio.gather(
        *(wait_for(lambda n=n: _gone(api, n), timeout=60, what=f"{n} removed") for n in left)
    )


async def _gone(api: Api, name: str) -> bool:
    return await api.nm(name) is None


async def test_max_unavailable_counts_nodes_already_out(
    sandbox: Sandbox, api: Api, node_factory: Any, tmp_path: Path, leader_namespace: str
) -> None:
    """--max-unavailable 2 with one node cordoned by hand: one maintenance at a time,
    and a maintenance of the cordoned node itself needs no extra slot."""
    cordoned, a, b = await node_factory(3)
    await api.merge(f"/api/v1/nodes/{cordoned}", {"spec": {"unschedulable": True}})
    # The limit is against all the cluster's nodes: size it so that only 2 may be out.
    total = len((await api.c.get("/api/v1/nodes")).json()["items"])
    others = [
        n["metadata"]["name"]
        for n in (await api.c.get("/api/v1/nodes")).json()["items"]
        if n["spec"].get("unschedulable") and n["metadata"]["name"] != cordoned
    ]
    cap = 2 + len(others)
    gen = replicas(sandbox, tmp_path, 1, ["--max-unavailable", str(cap)])
    await gen.__anext__()
    try:
        prefix = f"mu-{node_factory.prefix}-"
        for suffix, node in (("1", a), ("2", b), ("3", cordoned)):
            await api.create(NM, cr(f"{prefix}{suffix}", node))
            await asyncio.sleep(1.1)  # distinct creationTimestamps: the queue order is theirs

        async def settled() -> dict[str, str] | None:
            objs = await phases(api, prefix)
            got = {n: (o.get("status") or {}).get("phase", "") for n, o in objs.items()}
            return got if len(got) == 3 and all(got.values()) else None

        got = await wait_for(settled, what="three CRs decided")
        assert got == {
            f"{prefix}1": "Succeeded",
            f"{prefix}2": "Pending",
            f"{prefix}3": "Pending",
        }, (got, total)
        second = (await phases(api, prefix))[f"{prefix}2"]
        cond = condition(second, "Queued")
        assert cond["reason"] == "MaxUnavailable", cond
        assert f"of {cap} nodes unavailable (--max-unavailable {cap})" in cond["message"], cond
        # Freeing the slot admits the next one in order; the cordoned node's CR follows
        # without a slot of its own (its node is out already).
        await api.delete(f"{NM}/{prefix}1")
        await wait_for(lambda: _phase_is(api, f"{prefix}2", "Succeeded"), what="second admitted")
        await wait_for(
            lambda: _phase_is(api, f"{prefix}3", "Succeeded"), what="cordoned node's CR admitted"
        )
        for suffix in ("2", "3"):
            await api.delete(f"{NM}/{prefix}{suffix}")
            await wait_for(lambda s=suffix: _gone(api, f"{prefix}{s}"), what="removed")
        node = await api.node(cordoned)
        assert node["spec"].get("unschedulable") is True  # its own cordon is kept
    finally:
        await gen.aclose()


async def _phase_is(api: Api, name: str, phase: str) -> bool:
    return await api.phase(name) == phase


async def test_outside_the_window_nothing_starts(
    sandbox: Sandbox, api: Api, node_factory: Any, tmp_path: Path, leader_namespace: str
) -> None:
    (node,) = await node_factory(1)
    now = datetime.now(UTC)
    tomorrow = (now + timedelta(days=1)).strftime("%a")
    closed = ["--window-days", tomorrow, "--window-start", "00:00", "--window-end", "23:59"]
    name = f"win-{node_factory.prefix}"
    gen = replicas(sandbox, tmp_path / "closed", 1, closed)
    await gen.__anext__()
    try:
        await api.create(NM, cr(name, node))

        async def queued() -> dict[str, Any] | None:
            obj = await api.nm(name)
            return obj if condition(obj or {}, "Queued").get("reason") == "OutsideWindow" else None

        obj = await wait_for(queued, what="Queued OutsideWindow")
        assert obj["status"]["phase"] == "Pending"
        message = condition(obj, "Queued")["message"]
        assert (
            f"outside the maintenance window ({tomorrow} 00:00-23:59 UTC); it opens at " in message
        )
        assert c_finalizers(obj) == []  # nothing done, not even the finalizer
        n = await api.node(node)
        assert not n["spec"].get("unschedulable") and not n["spec"].get("taints")
    finally:
        await gen.aclose()
    # An operator whose window is open now starts it.
    today = now.strftime("%a")
    gen = replicas(
        sandbox,
        tmp_path / "open",
        1,
        [
            "--window-days",
            f"{today},{tomorrow}",
            "--window-start",
            "00:00",
            "--window-end",
            "23:59",
        ],
    )
    await gen.__anext__()
    try:
        if now.strftime("%H:%M") >= "23:59":
            pytest.fail("the test ran at 23:59 UTC, outside its own window; run it again")
        await wait_for(lambda: _phase_is(api, name, "Succeeded"), what="started inside the window")
        obj = await api.nm(name)
        assert condition(obj or {}, "Queued").get("reason") == "Admitted"
        await api.delete(f"{NM}/{name}")
        await wait_for(lambda: _gone(api, name), what="removed")
    finally:
        await gen.aclose()


def c_finalizers(obj: dict[str, Any]) -> list[str]:
    return list(obj["metadata"].get("finalizers") or [])


async def test_a_missing_ledger_namespace_is_named_with_what_to_do(
    sandbox: Sandbox, api: Api, node_factory: Any, tmp_path: Path
) -> None:
    """A budget whose ledger namespace does not exist (an out-of-cluster run with
    the defaults has no node-maintenance-operator-system): lastError names it and
    what to do, nothing is done to the node, and creating it lets the CR start."""
    (node,) = await node_factory(1)
    missing = f"nmo-ledger-{node_factory.prefix}"
    flags = ["--max-parallel-maintenances", "1", "--budget-namespace", missing]
    admin = Identity.admin(
        sandbox,
        why="only an identity that may create Leases in any namespace hears that one does "
        "not exist; the chart's is refused there (403) before the API server looks",
    )
    op = Replica(sandbox, tmp_path / "r", extra=flags, identity=admin)
    op.log_dir.mkdir(parents=True)
    CURRENT.append(op)
    name = f"ledger-{node_factory.prefix}"
    try:
        await op.start()
        await api.create(NM, cr(name, node))

        async def explained() -> dict[str, Any] | None:
            obj = await api.nm(name)
            error = ((obj or {}).get("status") or {}).get("lastError") or ""
            return obj if "does not exist" in error else None

        obj = await wait_for(explained, what="the missing ledger namespace in lastError")
        assert obj["status"]["lastError"] == (
            f'namespace "{missing}" does not exist, so the fleet budget\'s ledger, Lease '
            f"{missing}/{LEDGER_NAME}, cannot be created: create it (kubectl create namespace "
            f"{missing}) or pass --budget-namespace=<namespace> (default: the leader election "
            "namespace)"
        )
        assert obj["status"].get("phase") in (None, "Pending"), obj["status"]
        n = await api.node(node)
        assert not n["spec"].get("unschedulable") and not n["spec"].get("taints"), n["spec"]
        assert await api.lease(node) is None
        assert "the fleet budget's ledger" in op.logs()

        await api.create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": missing}},
        )

        async def succeeded() -> dict[str, Any] | None:
            obj = await api.nm(name)
            return obj if ((obj or {}).get("status") or {}).get("phase") == "Succeeded" else None

        done = await wait_for(succeeded, timeout=60, what=f"{name} Succeeded")
        assert "lastError" not in done["status"], done["status"]
        await api.delete(f"{NM}/{name}")
        await wait_for(lambda: _gone(api, name), what=f"{name} removed")
    finally:
        op.kill(signal.SIGTERM)
        CURRENT.remove(op)
        await api.delete(f"/api/v1/namespaces/{missing}")
