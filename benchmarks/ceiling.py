"""Raw eviction ceiling: the fastest a minimal client can empty a node on this cluster.

The yardstick the drain benchmarks divide by. It is deliberately dumb and
greedy, with none of an operator's bookkeeping:

1. cordon the node (one merge PATCH of ``spec.unschedulable``, as ``kubectl
   drain`` does; without it the ReplicaSet's replacements may land back on
   the node and it never empties);
2. LIST the node's pods once (``fieldSelector=spec.nodeName=<node>``) and
   skip DaemonSet and mirror pods;
3. POST a ``policy/v1`` Eviction for each, 100 in flight, no client rate
   limit; 429 (PodDisruptionBudget) and 409 (the PDB's status changed under a
   concurrent eviction) are retried after a 50-100 ms sleep, 404 means gone;
4. wait until none of the node's evictable pods is left, observed by a
   WATCH with the same field selector, started from the LIST's
   resourceVersion (so no deletion is missed and nothing is polled).

The figure is the wall time from step 1 to step 4. Requests go straight to
the apiserver with httpx and the kubeconfig's client certificate, user agent
``raw-ceiling/1`` (so the audit log can tell them apart), over nmo's own
HTTP/1.1 transport (:mod:`nmo.kube.transport`): with httpx's default pool the
client used three times the CPU, taken from the apiserver on a 2-core
machine, and the yardstick was slower than it needs to be.

As a library::

    async with client_from_kubeconfig(path) as http:
        seconds = await drain_ceiling(http, "node-1")
        result = await drain_ceiling_detailed(http, "node-1")  # + counts

As a script (several nodes are drained concurrently over one client whose
connection pool, 100 connections, bounds the evictions in flight overall)::

    .venv/bin/python benchmarks/ceiling.py --kubeconfig /tmp/sbx/kubeconfig node-1 [node-2 ...]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import ssl
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from nmo.kube.transport import Transport

PARALLEL = 100
USER_AGENT = "raw-ceiling/1"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
RETRY_STATUS = (409, 429)
Pod = dict[str, Any]


class CeilingError(RuntimeError):
    """An eviction answered something a drain cannot get past."""


@dataclass
class CeilingResult:
    node: str
    seconds: float
    pods: int
    skipped: int
    evictions_done_after: float  # seconds until the last eviction was accepted
    answers: Counter[int] = field(default_factory=Counter)  # HTTP status -> count

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "seconds": round(self.seconds, 2),
            "pods": self.pods,
            "skipped": self.skipped,
            "evictions_done_after_s": round(self.evictions_done_after, 2),
            "answers": {str(k): v for k, v in sorted(self.answers.items())},
        }


def client_from_kubeconfig(
    path: Path | str,
    *,
    connections: int = PARALLEL,
    user_agent: str = USER_AGENT,
    timeout: float = 60.0,
) -> httpx.AsyncClient:
    """An httpx client for the kubeconfig's current context (client certificate auth).

    The pool has ``connections`` keep-alive connections and no pool timeout:
    requests beyond that many wait for a free connection.
    """
    config = yaml.safe_load(Path(path).read_text())
    context_name = config["current-context"]
    context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
    ctx = ssl.create_default_context(
        cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
    )
    # ssl wants the client certificate in files; they live only while loading.
    with tempfile.TemporaryDirectory(prefix="ceiling-") as tmp:
        cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        key.chmod(0o600)
        ctx.load_cert_chain(cert, key)
    return httpx.AsyncClient(
        base_url=cluster["server"],
        headers={"User-Agent": user_agent},
        timeout=httpx.Timeout(timeout, pool=None),
        transport=Transport(
            ssl_context=ctx, max_connections=connections, max_keepalive=connections
        ),
    )


def evictable(pod: Pod) -> bool:
    """Not a mirror pod and not controlled by a DaemonSet (kubectl's --ignore-daemonsets)."""
    meta = pod.get("metadata") or {}
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return False
    return not any(
        ref.get("controller") and ref.get("kind") == "DaemonSet"
        for ref in meta.get("ownerReferences") or []
    )


def _uid(pod: Pod) -> str:
    return str(pod["metadata"]["uid"])


async def list_node_pods(http: httpx.AsyncClient, node: str) -> tuple[list[Pod], str]:
    """The node's pods and the list's resourceVersion (one LIST, no pagination)."""
    resp = await http.get("/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node}"})
    resp.raise_for_status()
    body = resp.json()
    return list(body.get("items") or []), str(body["metadata"]["resourceVersion"])


async def wait_node_empty(
    http: httpx.AsyncClient,
    node: str,
    *,
    present: set[str] | None = None,
    resource_version: str | None = None,
    timeout: float = 1800.0,
) -> float:
    """Wait until no evictable pod is bound to ``node``; returns ``time.monotonic()`` then.

    ``present`` (pod UIDs) and ``resource_version`` come from a LIST made
    earlier; without them the function lists first. A WATCH from that
    resourceVersion keeps the set current; a watch that ends or expires
    (410) is followed by a fresh LIST.
    """
    deadline = time.monotonic() + timeout
    selector = f"spec.nodeName={node}"
    if present is None or resource_version is None:
        pods, resource_version = await list_node_pods(http, node)
        present = {_uid(p) for p in pods if evictable(p)}
    while present:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{len(present)} pods still on node {node}")
        params = {
            "fieldSelector": selector,
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(int(min(300, max(1, remaining)))),
        }
        relist = False
        try:
            async with http.stream(
                "GET", "/api/v1/pods", params=params, timeout=httpx.Timeout(30.0, read=330.0)
            ) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    relist = True
                else:
                    async for line in resp.aiter_lines():
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        obj = event.get("object") or {}
                        kind = event.get("type")
                        if kind == "ERROR":
                            relist = True
                            break
                        rv = (obj.get("metadata") or {}).get("resourceVersion")
                        if rv:
                            resource_version = str(rv)
                        if kind == "DELETED":
                            present.discard(_uid(obj))
                        elif kind in ("ADDED", "MODIFIED") and evictable(obj):
                            present.add(_uid(obj))
                        if not present:
                            return time.monotonic()
        except httpx.TransportError:
            relist = True
        if relist and present:
            pods, resource_version = await list_node_pods(http, node)
            present = {_uid(p) for p in pods if evictable(p)}
    return time.monotonic()


async def cordon(http: httpx.AsyncClient, node: str) -> None:
    resp = await http.patch(
        f"/api/v1/nodes/{node}",
        json={"spec": {"unschedulable": True}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    resp.raise_for_status()


async def evict(
    http: httpx.AsyncClient, pod: Pod, answers: Counter[int], *, deadline: float
) -> None:
    """Evict one pod, retrying 409/429 (and transient failures) after 50-100 ms."""
    meta = pod["metadata"]
    ns, name = meta["namespace"], meta["name"]
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": ns},
    }
    url = f"/api/v1/namespaces/{ns}/pods/{name}/eviction"
    transient = 0
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError(f"evicting {ns}/{name}: still refused at the deadline")
        try:
            resp = await http.post(url, json=body)
        except httpx.TransportError:
            transient += 1
            if transient > 20:
                raise
            answers[0] += 1
            await asyncio.sleep(random.uniform(0.05, 0.1))
            continue
        answers[resp.status_code] += 1
        if resp.status_code in (200, 201, 404):
            return
        if resp.status_code in RETRY_STATUS or resp.status_code >= 500:
            await asyncio.sleep(random.uniform(0.05, 0.1))
            continue
        raise CeilingError(f"evicting {ns}/{name}: HTTP {resp.status_code} {resp.text[:300]}")


async def drain_ceiling_detailed(
    http: httpx.AsyncClient, node: str, *, parallel: int = PARALLEL, timeout: float = 1800.0
) -> CeilingResult:
    """Drain ``node`` the raw way; see the module docstring for what is timed."""
    started = time.monotonic()
    await cordon(http, node)
    pods, rv = await list_node_pods(http, node)
    targets = [p for p in pods if evictable(p)]
    watcher = asyncio.create_task(
        wait_node_empty(
            http, node, present={_uid(p) for p in targets}, resource_version=rv, timeout=timeout
        )
    )
    answers: Counter[int] = Counter()
    slots = asyncio.Semaphore(parallel)

    async def one(pod: Pod) -> None:
        async with slots:
            await evict(http, pod, answers, deadline=started + timeout)

    try:
        await asyncio.gather(*(one(p) for p in targets))
        evicted_at = time.monotonic()
        emptied_at = await watcher
    finally:
        watcher.cancel()
    return CeilingResult(
        node=node,
        seconds=emptied_at - started,
        pods=len(targets),
        skipped=len(pods) - len(targets),
        evictions_done_after=evicted_at - started,
        answers=answers,
    )


async def drain_ceiling(http: httpx.AsyncClient, node: str) -> float:
    """Seconds from cordoning ``node`` to it holding no evictable pod."""
    return (await drain_ceiling_detailed(http, node)).seconds


async def _main(kubeconfig: str, nodes: list[str]) -> int:
    started = time.monotonic()
    async with client_from_kubeconfig(kubeconfig) as http:
        results = await asyncio.gather(*(drain_ceiling_detailed(http, n) for n in nodes))
    for result in results:
        print(json.dumps(result.to_json()))
    print(f"all {len(nodes)} node(s) empty after {time.monotonic() - started:.2f}s")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("nodes", nargs="+")
    opts = parser.parse_args()
    sys.exit(asyncio.run(_main(opts.kubeconfig, opts.nodes)))
