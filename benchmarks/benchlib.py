"""The benchmarks' shared harness: the operators as processes, watches, audit windows, drains.

Not a benchmark itself. ``drain_bench.py`` and ``scale_bench.py`` import it:

* :class:`Nmo` starts ``.venv/bin/nmo run`` against a sandbox as the chart's
  ServiceAccount (nmo_sandbox.identity: the chart's RBAC and namespace flags,
  never the admin's), without leader election, webhook or TLS metrics, waits
  for ``/readyz`` (caches synced) and samples its RSS (:class:`RssSampler`);
* :class:`GoNmo` does the same for the Go medik8s NMO's manager, built from
  ``../shared/third_party``'s snapshot by ``hack/go-nmo-bin.sh manager``
  (``make go-nmo-bin``, cached in ``~/.cache/nmo/build``), run with the
  sandbox's admin kubeconfig (see its docstring for the flags, the webhook
  certificate and when it counts as ready);
* :class:`Mirror` is a list+watch of one resource kept in memory; any change
  wakes :meth:`Hub.wait`, which returns the moment a predicate over one or
  more mirrors first holds (no polling);
* :class:`AuditWindow` reads the requests each client made between two
  points in the apiserver's audit log, closed by a marker request so the
  count never depends on a sleep; ``auditlog.tally`` counts one client's
  requests by verb, its status writes and its evictions by answer;
* :func:`run_drain` drains one fresh, identical node with one tool (nmo,
  the Go NMO, the raw ceiling of ``ceiling.py`` or ``kubectl drain``) and
  then cleans the cluster (the tool's namespace deleted and its pods gone,
  the node deleted), so every tool runs alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from auditlog import Request, Tally, parse_line, tally
from ceiling import (
    client_from_kubeconfig,
    drain_ceiling_detailed,
    evictable,
    list_node_pods,
    wait_node_empty,
)
from procstats import cpu_seconds, free_port, rss_mib

import nmo
from nmo.api import constants as c
from nmo.api.crd import crd
from nmo_sandbox import Sandbox
from nmo_sandbox.identity import Identity, apply_chart_identity
from nmo_sandbox.manifests import deployment, pod_spec
from nmo_sandbox.nodes import node_is_ready, node_manifest

NM = f"/apis/{c.API_VERSION}/{c.PLURAL}"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{c.LEASE_NAMESPACE_DEFAULT}/leases"
MERGE = {"Content-Type": "application/merge-patch+json"}
Obj = dict[str, Any]
TOOLS = ("ceiling", "nmo", "gonmo", "kubectl")


# -- small waits and cluster helpers ---------------------------------------


async def until(
    check: Callable[[], Awaitable[Any]], timeout: float, what: str, interval: float = 0.2
) -> Any:
    """Poll ``check`` until it returns something truthy (setup only, never timed)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


async def ok(resp: Awaitable[httpx.Response], *codes: int) -> Obj:
    """The JSON body of a response that must have one of ``codes`` (default 2xx)."""
    r = await resp
    if (codes and r.status_code not in codes) or (not codes and not r.is_success):
        raise RuntimeError(f"{r.request.method} {r.request.url}: HTTP {r.status_code} {r.text}")
    body: Obj = r.json() if r.content else {}
    return body


async def install_crd(http: httpx.AsyncClient) -> None:
    await ok(http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd()))

    async def served() -> bool:
        return (await http.get(NM)).status_code == 200

    await until(served, 60, "the NodeMaintenance CRD to be served")


async def create_nodes(
    http: httpx.AsyncClient,
    names: Iterable[str],
    *,
    labels: Mapping[str, str] | None = None,
    pods_capacity: int = 1000,
) -> list[str]:
    """Create kwok nodes (``pods_capacity`` pods each) and wait until all are Ready."""
    names = list(names)
    sem = asyncio.Semaphore(20)

    async def one(name: str) -> None:
        body = node_manifest(name, labels=labels)
        for key in ("allocatable", "capacity"):
            body["status"][key]["pods"] = str(pods_capacity)
        async with sem:
            await ok(http.post("/api/v1/nodes", json=body), 201, 409)

    await asyncio.gather(*(one(n) for n in names))
    wanted = set(names)

    async def all_ready() -> bool:
        items = (await ok(http.get("/api/v1/nodes")))["items"]
        return wanted <= {n["metadata"]["name"] for n in items if node_is_ready(n)}

    await until(
        all_ready,
        max(120.0, len(names) * 0.5),
        f"{len(names)} nodes to be Ready",
        interval=0.1 if len(names) < 50 else 0.5,
    )
    return names


async def delete_nodes(http: httpx.AsyncClient, names: Iterable[str]) -> None:
    sem = asyncio.Semaphore(20)

    async def one(name: str) -> None:
        async with sem:
            await ok(http.delete(f"/api/v1/nodes/{name}"), 200, 202, 404)

    await asyncio.gather(*(one(n) for n in names))


async def label_node(http: httpx.AsyncClient, node: str, labels: Mapping[str, str | None]) -> None:
    """Merge labels into a node (a ``None`` value removes the label)."""
    await ok(
        http.patch(f"/api/v1/nodes/{node}", json={"metadata": {"labels": labels}}, headers=MERGE)
    )


async def create_namespace(http: httpx.AsyncClient, ns: str) -> None:
    await ok(http.post("/api/v1/namespaces", json={"metadata": {"name": ns}}))

    async def sa() -> bool:
        return (
            await http.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default")
        ).status_code == 200

    await until(sa, 60, f"the default ServiceAccount of {ns}", interval=0.1)


async def delete_namespace(http: httpx.AsyncClient, ns: str, timeout: float = 1800.0) -> None:
    """Delete ``ns`` and wait until it is gone (so are all its pods)."""
    await ok(http.delete(f"/api/v1/namespaces/{ns}"), 200, 202, 404)

    async def gone() -> bool:
        return (await http.get(f"/api/v1/namespaces/{ns}")).status_code == 404

    await until(gone, timeout, f"namespace {ns} to be deleted", interval=0.5)


def pool_key(node: str) -> str:
    """The label that lets a benchmark Deployment's pods onto ``node`` (and the spares)."""
    return f"bench-pool-{node}"


async def create_deployment(
    http: httpx.AsyncClient,
    ns: str,
    name: str,
    replicas: int,
    node_selector: Mapping[str, str],
) -> None:
    body = deployment(name, replicas, pod_spec(node_selector=dict(node_selector)))
    await ok(http.post(f"/apis/apps/v1/namespaces/{ns}/deployments", json=body))


async def ready_replicas(http: httpx.AsyncClient, ns: str) -> int:
    """Sum of readyReplicas over the namespace's Deployments (a cheap pod count)."""
    items = (await ok(http.get(f"/apis/apps/v1/namespaces/{ns}/deployments")))["items"]
    return sum(int((d.get("status") or {}).get("readyReplicas") or 0) for d in items)


async def wait_ready_replicas(
    http: httpx.AsyncClient, ns: str, want: int, timeout: float = 1800.0
) -> None:
    async def done() -> bool:
        return await ready_replicas(http, ns) >= want

    await until(done, timeout, f"{want} ready pods in {ns}", interval=0.5)


async def create_pdb(
    http: httpx.AsyncClient, ns: str, name: str, app: str, budget: Mapping[str, int | str]
) -> None:
    body = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {**budget, "selector": {"matchLabels": {"app": app}}},
    }
    await ok(http.post(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", json=body))


async def wait_pdb_current(
    http: httpx.AsyncClient, ns: str, name: str, healthy: int, timeout: float = 300.0
) -> Obj:
    """Wait until the disruption controller has computed the PDB over ``healthy`` pods."""

    async def current() -> Obj | None:
        pdb = await ok(http.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}"))
        st = pdb.get("status") or {}
        fresh = int(st.get("observedGeneration") or 0) >= int(pdb["metadata"]["generation"])
        if fresh and st.get("currentHealthy") == healthy and st.get("expectedPods") == healthy:
            return pdb
        return None

    result: Obj = await until(current, timeout, f"PDB {ns}/{name} status", interval=0.2)
    return result


def metrics_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """``after - before`` for each of nmo's counters (rounded for printing)."""
    return {k: round(v - before.get(k, 0.0), 3) for k, v in after.items()}


def maintenance(name: str, node: str) -> Obj:
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND,
        "metadata": {"name": name},
        "spec": {"nodeName": node, "reason": "benchmark"},
    }


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile (p99 of 50 samples is the largest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


# -- watches ----------------------------------------------------------------


class Hub:
    """Wakes waiters whenever any attached :class:`Mirror` changes."""

    def __init__(self) -> None:
        self._changed = asyncio.Event()

    def notify(self) -> None:
        self._changed.set()

    async def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> float:
        """``time.monotonic()`` at the first change after which ``predicate()`` holds."""
        deadline = time.monotonic() + timeout
        while True:
            if predicate():
                return time.monotonic()
            self._changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)


class Mirror:
    """list+watch of one collection; ``store`` maps ``namespace/name`` to the object."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        path: str,
        hub: Hub,
        params: Mapping[str, str] | None = None,
    ) -> None:
        self.http = http
        self.path = path
        self.hub = hub
        self.params = dict(params or {})
        self.store: dict[str, Obj] = {}
        self.synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @staticmethod
    def key(obj: Obj) -> str:
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace")
        return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))

    async def __aenter__(self) -> Mirror:
        self._task = asyncio.create_task(self._run(), name=f"mirror:{self.path}")
        waiter = asyncio.create_task(self.synced.wait())
        await asyncio.wait({self._task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if self._task.done():
            waiter.cancel()
            self._task.result()
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _list(self) -> str:
        body = await ok(self.http.get(self.path, params=self.params))
        store = {}
        for obj in body.get("items") or []:
            (obj.get("metadata") or {}).pop("managedFields", None)
            store[self.key(obj)] = obj
        self.store = store
        self.synced.set()
        self.hub.notify()
        return str(body["metadata"]["resourceVersion"])

    async def _run(self) -> None:
        rv = await self._list()
        while True:
            params = {
                **self.params,
                "watch": "1",
                "allowWatchBookmarks": "true",
                "resourceVersion": rv,
                "timeoutSeconds": "300",
            }
            relist = False
            try:
                async with self.http.stream(
                    "GET", self.path, params=params, timeout=httpx.Timeout(30.0, read=330.0)
                ) as resp:
                    if resp.status_code != 200:
                        await resp.aread()
                        relist = True
                    else:
                        async for line in resp.aiter_lines():
                            if not line.strip():
                                continue
                            event = json.loads(line)
                            kind, obj = event.get("type"), event.get("object") or {}
                            if kind == "ERROR":
                                relist = True
                                break
                            meta = obj.get("metadata") or {}
                            rv = str(meta.get("resourceVersion") or rv)
                            if kind == "BOOKMARK":
                                continue
                            meta.pop("managedFields", None)
                            if kind == "DELETED":
                                self.store.pop(self.key(obj), None)
                            else:
                                self.store[self.key(obj)] = obj
                            self.hub.notify()
            except httpx.TransportError:
                relist = True
                await asyncio.sleep(0.2)
            if relist:
                rv = await self._list()


# -- nmo as a process -------------------------------------------------------


def nmo_commit() -> str:
    """The commit the benchmarked nmo was installed from (this checkout's HEAD)."""
    here = Path(__file__).resolve().parent
    result = subprocess.run(
        ["git", "-C", str(here), "log", "-1", "--format=%h %s"],
        capture_output=True,
        text=True,
        check=False,
    )
    dirty = subprocess.run(
        ["git", "-C", str(here), "status", "--porcelain", "--", "../src"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    where = Path(nmo.__file__).resolve().parent
    return f"{result.stdout.strip()}{' (src modified)' if dirty else ''} [nmo from {where}]"


_IDENTITIES: dict[str, Identity] = {}


async def bench_identity(sb: Sandbox) -> Identity:
    """The chart's identity for the benchmarks' nmo (release nmo-bench), once per sandbox."""
    key = str(sb.dir)
    if key not in _IDENTITIES:
        _IDENTITIES[key] = await apply_chart_identity(
            sb,
            release="nmo-bench",
            namespace="nmo-bench-system",
            fullname="nmo-bench",
            kubeconfig=sb.dir / "identities" / "nmo-bench.kubeconfig",
        )
    return _IDENTITIES[key]


class OperatorProcess:
    """An operator run out of cluster as a local process: start, wait until ready, stop.

    Subclasses say how to run it (:meth:`argv`, :meth:`env`), what to prepare
    first (:meth:`prepare`) and what, besides ``/readyz`` on the loopback
    health probe port, says it is ready (:meth:`started`). Its RSS and CPU
    time come from ``/proc`` (``procstats``), the same way for every operator.
    """

    name = "operator"
    ready_means = "/readyz"

    def __init__(self, sb: Sandbox, log_file: Path) -> None:
        self.sb = sb
        self.log_file = log_file
        self.probe_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_after = 0.0
        self.startup_peak_rss = 0.0
        self.startup_cpu = 0.0
        self._log_start = 0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rss(self) -> float:
        return rss_mib(self.pid)

    def argv(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str] | None:
        """The process's environment (``None``: the benchmark's own)."""
        return None

    async def prepare(self) -> None:
        """Whatever must exist before the process starts."""

    def started(self) -> bool:
        """Besides ``/readyz``: whether the process says it is ready."""
        return True

    def log_since_start(self) -> str:
        with self.log_file.open("rb") as f:
            f.seek(self._log_start)
            return f.read().decode(errors="replace")

    async def start(self, timeout: float = 600.0) -> float:
        """Start the operator and wait until it is ready; returns seconds."""
        await self.prepare()
        self._log_start = self.log_file.stat().st_size if self.log_file.exists() else 0
        started = time.monotonic()
        with self.log_file.open("ab") as out:
            self.proc = subprocess.Popen(  # noqa: ASYNC220
                self.argv(), stdout=out, stderr=subprocess.STDOUT, env=self.env()
            )
        async with httpx.AsyncClient(timeout=2.0) as probe:

            async def ready() -> bool:
                assert self.proc is not None
                self.startup_peak_rss = max(self.startup_peak_rss, rss_mib(self.proc.pid))
                if self.proc.poll() is not None:
                    tail = self.log_since_start()[-3000:]
                    raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")
                try:
                    resp = await probe.get(f"http://127.0.0.1:{self.probe_port}/readyz")
                except httpx.TransportError:
                    return False
                return resp.status_code == 200 and self.started()

            await until(ready, timeout, f"{self.name} to be ready ({self.ready_means})", 0.05)
        self.ready_after = time.monotonic() - started
        self.startup_cpu = cpu_seconds(self.pid)
        return self.ready_after

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(proc.wait, 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait, 10)

    async def __aenter__(self) -> OperatorProcess:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()


class Nmo(OperatorProcess):
    """``nmo run`` against the sandbox: start, wait for caches, sample RSS, stop."""

    name = "nmo"
    ready_means = "caches synced"
    agent = "nmo/"

    def __init__(self, sb: Sandbox, log_file: Path, *, log_level: str = "warning") -> None:
        super().__init__(sb, log_file)
        self.log_level = log_level
        self.metrics_port = free_port()
        self.identity: Identity | None = None  # the chart's, found at start

    async def prepare(self) -> None:
        self.identity = self.identity or await bench_identity(self.sb)

    def env(self) -> dict[str, str] | None:
        """``NMO_BENCH_SRC``: run nmo from that source tree (``git worktree add``
        of another commit's ``src``), for a before/after comparison in one run."""
        src = os.environ.get("NMO_BENCH_SRC")
        return None if not src else {**os.environ, "PYTHONPATH": src}

    def argv(self) -> list[str]:
        assert self.identity is not None, "start() finds the identity"
        script = Path(sys.executable).with_name("nmo")
        head = [str(script)] if script.exists() else [sys.executable, "-m", "nmo"]
        return [
            *head, "run", "--kubeconfig", str(self.identity.kubeconfig), *self.identity.flags,
            "--no-leader-elect", "--no-enable-webhook", "--bind-address", "127.0.0.1",
            "--health-probe-port", str(self.probe_port), "--metrics-port", str(self.metrics_port),
            "--no-metrics-secure", "--log-level", self.log_level,
        ]  # fmt: skip

    async def metrics(self) -> dict[str, float]:
        """nmo's own counters: reconcile passes and time, evictions by outcome."""
        async with httpx.AsyncClient(timeout=10.0) as client:
            text = (await client.get(f"http://127.0.0.1:{self.metrics_port}/metrics")).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, _, value = line.rpartition(" ")
            if name.startswith("nmo_reconcile_total"):
                out["reconciles"] = out.get("reconciles", 0.0) + float(value)
            elif name == "nmo_reconcile_duration_seconds_sum":
                out["reconcile_s"] = float(value)
            elif name.startswith("nmo_evictions_total{"):
                outcome = name.split('outcome="', 1)[1].split('"', 1)[0]
                out[f"evictions_{outcome}"] = float(value)
        return out

    async def __aenter__(self) -> Nmo:
        await self.start()
        return self


REPO = Path(__file__).resolve().parents[1]
GO_NMO_SCRIPT = REPO / "hack" / "go-nmo-bin.sh"
# controller-runtime's webhook server listens on all addresses at its
# DefaultPort; the Go NMO's main has no flag or environment variable for it.
GO_NMO_WEBHOOK_PORT = 9443


@functools.cache
def go_nmo_binary() -> Path:
    """The Go NMO's manager, built from ../shared/third_party when not cached yet.

    ``hack/go-nmo-bin.sh manager`` (``make go-nmo-bin``): its ``./cmd``
    unchanged, cached as ``~/.cache/nmo/build/go-nmo-<commit>/go-nmo-manager``.
    The build's progress goes to this process's stderr.
    """
    done = subprocess.run(
        [str(GO_NMO_SCRIPT), "manager"], stdout=subprocess.PIPE, text=True, check=False
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{GO_NMO_SCRIPT} manager failed (exit {done.returncode})")
    return Path(lines[-1])


def port_in_use(port: int) -> bool:
    """Whether a listener on every address at ``port`` (as Go's ``:port``) would fail."""
    family = socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Go's listeners
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        try:
            s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
        except OSError:
            return True
    return False


class GoNmo(OperatorProcess):
    """The Go medik8s NMO's manager (``go_nmo_binary``) out of cluster, as an admin.

    Started as upstream's Deployment starts ``/manager``, but without leader
    election (as nmo here), with metrics off (``--metrics-bind-address=0``;
    they would need the apiserver's authentication and authorization), the
    health probe on a free loopback port and ``KUBECONFIG`` the sandbox's
    admin kubeconfig (upstream's RBAC is a ClusterRole the benchmark does not
    install). Its webhook server always starts, on every address at
    :data:`GO_NMO_WEBHOOK_PORT`, reading ``tls.crt``/``tls.key`` from
    controller-runtime's default directory ``$TMPDIR/k8s-webhook-server/serving-certs``:
    ``TMPDIR`` is a directory of this run holding a certificate from the
    sandbox CA. No ValidatingWebhookConfiguration points at it. The lease
    namespace ``medik8s-leases`` is created by the Go NMO itself when missing
    (medik8s/common's lease manager).

    Ready: ``/readyz`` answers (a ping, even before the caches sync) and the
    controller logged ``Starting workers`` (after its caches synced), so
    ``log_level`` is ``info`` (upstream has no warning level; its default is
    ``debug``) or ``debug``. Its drain logs one klog line per pod whatever the
    level.
    """

    name = "the Go NMO"
    ready_means = "/readyz and 'Starting workers'"
    agent = "go-nmo-manager/"

    def __init__(self, sb: Sandbox, log_file: Path, *, log_level: str = "info") -> None:
        if log_level not in ("debug", "info"):
            raise ValueError(f"the Go NMO's log level must be debug or info, not {log_level!r}")
        super().__init__(sb, log_file)
        self.log_level = log_level
        self.binary: Path | None = None
        self.tmpdir = log_file.with_name(f"{log_file.stem}.tmp")

    async def prepare(self, port_timeout: float = 300.0) -> None:
        self.binary = self.binary or await asyncio.to_thread(go_nmo_binary)
        certs = self.tmpdir / "k8s-webhook-server" / "serving-certs"
        self.sb.issue_serving_cert(certs, ["127.0.0.1", "localhost"], name="tls")

        async def port_free() -> bool:
            return not port_in_use(GO_NMO_WEBHOOK_PORT)

        await until(
            port_free,
            port_timeout,
            f"port {GO_NMO_WEBHOOK_PORT} to be free (the Go NMO's webhook server cannot move; "
            "something else listens there)",
            interval=1.0,
        )

    def argv(self) -> list[str]:
        assert self.binary is not None, "start() finds the binary"
        return [
            str(self.binary),
            "--metrics-bind-address=0",
            f"--health-probe-bind-address=127.0.0.1:{self.probe_port}",
            f"--zap-log-level={self.log_level}",
        ]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "LEASE_NAMESPACE"}
        return env | {"KUBECONFIG": str(self.sb.kubeconfig), "TMPDIR": str(self.tmpdir)}

    def started(self) -> bool:
        return "Starting workers" in self.log_since_start()

    async def __aenter__(self) -> GoNmo:
        await self.start()
        return self


class RssSampler:
    """Samples a process's RSS every ``interval`` seconds while in use; keeps the peak.

    Also records the CPU time the process used inside the block (``cpu``).
    """

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.peak = rss_mib(pid)
        self.last = self.peak
        self.cpu = 0.0
        self._cpu0 = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.last = rss_mib(self.pid)
            self.peak = max(self.peak, self.last)
            await asyncio.sleep(self.interval)

    async def __aenter__(self) -> RssSampler:
        self._cpu0 = cpu_seconds(self.pid)
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.last = rss_mib(self.pid)
        self.peak = max(self.peak, self.last)
        self.cpu = cpu_seconds(self.pid) - self._cpu0


# -- audit log ----------------------------------------------------------------


@dataclass
class AuditWindow:
    """Requests in the audit log between :meth:`open` and :meth:`close`, by user agent."""

    path: Path
    start: int = 0
    requests: list[Request] = field(default_factory=list)

    @classmethod
    def open(cls, sb: Sandbox) -> AuditWindow:
        return cls(sb.audit_log, sb.audit_log.stat().st_size)

    async def close(self, http: httpx.AsyncClient, timeout: float = 60.0) -> AuditWindow:
        """Send a marker request and read the log up to it (so nothing is still unwritten).

        ``timeout`` bounds the wait for the marker once the reader has caught up
        with the log: in a big cluster reading the window itself (kwok's pod
        status writes: hundreds of MB) can take longer than that.
        """
        marker = f"bench-marker/{uuid.uuid4()}"
        await http.get("/api/v1/namespaces/default", headers={"User-Agent": marker})
        deadline = time.monotonic() + timeout
        pos, tail = self.start, b""
        with self.path.open("rb") as f:
            while True:
                f.seek(pos)
                chunk = f.read()
                pos += len(chunk)
                *complete, tail_new = (tail + chunk).split(b"\n")
                tail = tail_new
                for raw in complete:
                    req = parse_line(raw)
                    if req is None:
                        continue
                    if req.agent == marker:
                        return self
                    self.requests.append(req)
                if chunk:
                    deadline = time.monotonic() + timeout  # still catching up
                elif time.monotonic() > deadline:
                    raise TimeoutError(
                        f"the audit marker never appeared in the audit log {self.path} "
                        f"within {timeout:g}s of reading it all"
                    )
                if not chunk:
                    await asyncio.sleep(0.05)

    def count(self, agent_prefix: str) -> tuple[int, dict[str, int]]:
        t = self.tally(agent_prefix)
        return t.requests, t.by_verb

    def tally(self, agent_prefix: str) -> Tally:
        """Requests by verb, status writes and evictions by answer (``auditlog.tally``)."""
        return tally(self.requests, agent_prefix)


def request_figures(t: Tally, crs: int = 1) -> Obj:
    """A tool's audit figures as a benchmark record's fields."""
    return {
        "requests": t.requests,
        "requests_by_verb": t.by_verb,
        "status_writes": t.status_writes,
        "status_writes_per_cr": round(t.status_writes_per_cr(crs), 2),
        "eviction_requests": t.evictions,
        "refused_evictions": t.refused_evictions,
        "eviction_answers": t.eviction_answers,
    }


# -- one drain with one tool ----------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    pods: int
    pdb: Mapping[str, int | str] | None = None  # PDB spec (maxUnavailable / minAvailable)


@dataclass
class DrainContext:
    sb: Sandbox
    http: httpx.AsyncClient
    work: Path
    spares: list[str]
    nmo_log_level: str = "warning"
    gonmo_log_level: str = "info"
    timeout: float = 1800.0
    ceiling_parallel: int = 100
    profile: Path | None = None  # py-spy's stacks of nmo during each drain go here


@contextlib.asynccontextmanager
async def profiled(pid: int, out: Path | None) -> AsyncIterator[None]:
    """py-spy samples the process inside the block (100 Hz, collapsed stacks to
    ``out``, drawn by ``benchmarks/flame.py``); nothing when ``out`` is None."""
    if out is None:
        yield
        return
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        raise RuntimeError("--profile needs py-spy: pip install py-spy (into the venv)")
    out.parent.mkdir(parents=True, exist_ok=True)  # once, before the drain
    proc = await asyncio.create_subprocess_exec(
        spy, "record", "--pid", str(pid), "--rate", "100", "--format", "raw",
        "--nonblocking", "--output", str(out),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)  # py-spy writes its stacks and exits
        await proc.wait()


async def make_spares(ctx: DrainContext, count: int, capacity: int = 1000) -> None:
    """Nodes that receive the drained pods' replacements (labelled per run)."""
    names = [f"spare-{i}" for i in range(count)]
    await create_nodes(ctx.http, names, labels={"bench-spare": "yes"}, pods_capacity=capacity)
    ctx.spares.extend(names)


async def prepare_workload(
    ctx: DrainContext, ns: str, nodes: list[str], pods: int, pdb: Mapping[str, int | str] | None
) -> None:
    """``pods`` Deployment pods on each node (pool-labelled), Ready; PDB (first node) current."""
    http = ctx.http
    for spare in ctx.spares:  # nothing may start on a spare
        await label_node(http, spare, {pool_key(n): None for n in nodes})
    for node in nodes:
        await label_node(http, node, {pool_key(node): "yes"})
    await create_namespace(http, ns)
    for node in nodes:
        await create_deployment(http, ns, f"app-{node}", pods, {pool_key(node): "yes"})
    if pdb is not None:
        await create_pdb(http, ns, "bench", f"app-{nodes[0]}", pdb)
    await wait_ready_replicas(http, ns, pods * len(nodes), timeout=ctx.timeout)
    if pdb is not None:
        await wait_pdb_current(http, ns, "bench", pods)
    # Replacements may now go to the spares, and only there (the nodes get cordoned).
    for spare in ctx.spares:
        await label_node(http, spare, {pool_key(n): "yes" for n in nodes})


async def run_drain(ctx: DrainContext, scenario: Scenario, tool: str, tag: str = "") -> Obj:
    """Drain a fresh node holding ``scenario.pods`` pods with ``tool``; then clean up."""
    http = ctx.http
    node = f"{scenario.name}-{tool}{'-' + tag if tag else ''}"
    ns = f"bench-{node}"
    await create_nodes(http, [node])
    await prepare_workload(ctx, ns, [node], scenario.pods, scenario.pdb)
    result: Obj = {"scenario": scenario.name, "pods": scenario.pods, "tool": tool}
    try:
        if tool in ("nmo", "gonmo"):
            result |= await _drain_operator(ctx, node, tool, scenario.pods)
        elif tool == "ceiling":
            result |= await _drain_ceiling(ctx, node)
        elif tool == "kubectl":
            result |= await _drain_kubectl(ctx, node)
        else:
            raise ValueError(f"unknown tool {tool!r}")
    finally:
        cleanup = time.monotonic()
        await delete_namespace(http, ns, timeout=ctx.timeout)
        await delete_nodes(http, [node])
        result["cleanup_s"] = round(time.monotonic() - cleanup, 1)
    return result


async def _observe_empty(http: httpx.AsyncClient, node: str, timeout: float) -> asyncio.Task[float]:
    pods, rv = await _list(http, node)
    return asyncio.create_task(
        wait_node_empty(http, node, present=pods, resource_version=rv, timeout=timeout)
    )


async def _list(http: httpx.AsyncClient, node: str) -> tuple[set[str], str]:
    pods, rv = await list_node_pods(http, node)
    return {str(p["metadata"]["uid"]) for p in pods if evictable(p)}, rv


def operator(ctx: DrainContext, tool: str, log_file: Path) -> Nmo | GoNmo:
    """The operator process of ``tool`` (``nmo`` or ``gonmo``), not started yet."""
    if tool == "nmo":
        return Nmo(ctx.sb, log_file, log_level=ctx.nmo_log_level)
    if tool == "gonmo":
        return GoNmo(ctx.sb, log_file, log_level=ctx.gonmo_log_level)
    raise ValueError(f"{tool!r} is no operator")


def per_1000(value: float, pods: int) -> float | None:
    """``value`` per 1,000 pods (CPU-seconds per 1,000 evicted pods)."""
    return round(value * 1000 / pods, 2) if pods else None


async def _drain_operator(ctx: DrainContext, node: str, tool: str, pods: int) -> Obj:
    """A fresh operator (nmo or the Go NMO) drains ``node``: create the CR, wait for Succeeded."""
    http = ctx.http
    name = f"bench-{node}"
    op = operator(ctx, tool, ctx.work / f"{tool}-{node}.log")
    hub = Hub()
    await op.start()
    counters: dict[str, float] = {}
    try:
        idle = op.rss()
        async with Mirror(http, NM, hub, {"fieldSelector": f"metadata.name={name}"}) as crs:

            def succeeded() -> bool:
                obj = crs.store.get(name) or {}
                return (obj.get("status") or {}).get("phase") == "Succeeded"

            empty = await _observe_empty(http, node, ctx.timeout)
            window = AuditWindow.open(ctx.sb)
            if isinstance(op, Nmo):
                counters = await op.metrics()
            try:
                profile = None
                if ctx.profile is not None and isinstance(op, Nmo):
                    profile = ctx.profile / f"{tool}-{node}.txt"
                async with RssSampler(op.pid) as rss, profiled(op.pid, profile):
                    started = time.monotonic()
                    await ok(http.post(NM, json=maintenance(name, node)))
                    done = await hub.wait(succeeded, ctx.timeout, f"{name} to succeed")
                    emptied = await empty
            finally:
                empty.cancel()
            if isinstance(op, Nmo):
                counters = metrics_delta(counters, await op.metrics())
            await window.close(http)
            await ok(http.delete(f"{NM}/{name}"), 200, 202, 404)
            await hub.wait(lambda: name not in crs.store, 120, f"{name} to be removed")
    finally:
        await op.stop()
    result: Obj = {
        "seconds": round(done - started, 2),
        "node_empty_s": round(emptied - started, 2),
        **request_figures(window.tally(op.agent)),
        "ready_s": round(op.ready_after, 2),
        "idle_rss_mib": round(idle, 1),
        "peak_rss_mib": round(rss.peak, 1),
        "cpu_s": round(rss.cpu, 2),
        "cpu_s_per_1000_pods": per_1000(rss.cpu, pods),
    }
    if isinstance(op, Nmo):
        result |= {"nmo_reconciles": int(counters.get("reconciles", 0)), "nmo_metrics": counters}
    return result


async def _drain_ceiling(ctx: DrainContext, node: str) -> Obj:
    window = AuditWindow.open(ctx.sb)
    cpu = time.process_time()
    async with client_from_kubeconfig(ctx.sb.kubeconfig) as client:
        res = await drain_ceiling_detailed(
            client, node, parallel=ctx.ceiling_parallel, timeout=ctx.timeout
        )
    cpu = time.process_time() - cpu
    await window.close(ctx.http)
    return {
        "seconds": round(res.seconds, 2),
        "node_empty_s": round(res.seconds, 2),
        "evictions_done_after_s": round(res.evictions_done_after, 2),
        **request_figures(window.tally("raw-ceiling/")),
        "ceiling_eviction_answers": {str(k): v for k, v in sorted(res.answers.items())},
        # The benchmark's whole process (its own watches included): an upper bound.
        "client_cpu_s": round(cpu, 2),
    }


async def _drain_kubectl(ctx: DrainContext, node: str, attempts: int = 50) -> Obj:
    """``kubectl drain``, run again while it fails, as a user's retry loop would.

    kubectl retries only 429 on its own: a 409 (the PDB's status changed
    under a concurrent eviction) makes it give up on that pod and exit 1
    after the others are done.
    """
    empty = await _observe_empty(ctx.http, node, ctx.timeout)
    window = AuditWindow.open(ctx.sb)
    cpu0 = _children_cpu()
    started = time.monotonic()
    failures: list[str] = []
    try:
        for _ in range(attempts):
            result = await ctx.sb.kubectl(
                "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--force",
                f"--timeout={int(ctx.timeout)}s", timeout=ctx.timeout + 60,
            )  # fmt: skip
            if result.returncode == 0:
                break
            failures.append(result.stderr.strip().splitlines()[-1][:300] if result.stderr else "")
        else:
            raise RuntimeError(f"kubectl drain failed {attempts} times: {failures[-1]}")
        seconds = time.monotonic() - started
        cpu = _children_cpu() - cpu0
        emptied = await empty
    finally:
        empty.cancel()
    await window.close(ctx.http)
    return {
        "seconds": round(seconds, 2),
        "node_empty_s": round(emptied - started, 2),
        "kubectl_runs": len(failures) + 1,
        "kubectl_first_error": failures[0] if failures else None,
        **request_figures(window.tally("kubectl")),
        "cpu_s": round(cpu, 2),
    }


def _children_cpu() -> float:
    """User + system CPU time of this process's waited-for children (the kubectl runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def environment_note() -> str:
    load = os.getloadavg()
    return (
        f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
        "(the sandbox, the operators and the load generator share these cores; "
        "other work may run)"
    )
