"""Drain benchmark: nmo against ``kubectl drain`` on identical nodes, same run.

For each size (default 100 and 1000 pods) the benchmark puts that many
Deployment pods on two identical kwok nodes, then

* drains node A with nmo (time from creating the NodeMaintenance to
  ``phase=Succeeded``; the API requests nmo made in that window, counted by
  user agent in the apiserver's audit log; nmo's peak RSS), and
* drains node B with ``kubectl drain --ignore-daemonsets
  --delete-emptydir-data --force`` (wall time and its requests, counted the
  same way).

Both nodes' pods have the same 1 s grace period and the same spare nodes to
move to. Run: ``make bench`` or ``.venv/bin/python benchmarks/drain_bench.py
--sizes 100 1000``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from procstats import free_port, rss_mib

from nmo.api.crd import crd
from nmo.sandbox import Sandbox
from nmo.sandbox.manifests import deployment, pod_spec

NM = "/apis/nodemaintenance.medik8s.io/v1beta1/nodemaintenances"


def count_requests(audit: Path, offset: int, agent_prefix: str) -> tuple[int, dict[str, Any]]:
    total, verbs = 0, {}
    first = last_evict = ""
    with audit.open() as f:
        f.seek(offset)
        for line in f:
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            if str(ev.get("userAgent", "")).startswith(agent_prefix):
                total += 1
                key = ev.get("verb", "?")
                sub = (ev.get("objectRef") or {}).get("subresource")
                if sub:
                    key += f"/{sub}"
                verbs[key] = verbs.get(key, 0) + 1
                stamp = str(ev.get("requestReceivedTimestamp", ""))
                first = first or stamp
                if sub == "eviction":
                    last_evict = max(last_evict, stamp)
    if first and last_evict:
        verbs["last_eviction_after_s"] = round(_ts(last_evict) - _ts(first), 2)
    return total, verbs


def _ts(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


async def until(check: Any, timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what}")


def pool_deployment(name: str, replicas: int, pool: str) -> dict[str, Any]:
    return deployment(name, replicas, pod_spec(node_selector={f"bench-pool-{pool}": "yes"}))


async def running_on(http: httpx.AsyncClient, node: str) -> int:
    resp = await http.get(
        "/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node},status.phase=Running"}
    )
    return len(resp.json()["items"])


async def label(http: httpx.AsyncClient, node: str, labels: dict[str, str]) -> None:
    resp = await http.patch(
        f"/api/v1/nodes/{node}",
        json={"metadata": {"labels": labels}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    resp.raise_for_status()


async def run_size(sb: Sandbox, http: httpx.AsyncClient, nmo_pid: int, size: int) -> dict[str, Any]:
    tag = f"s{size}"
    a, b = f"{tag}-a", f"{tag}-b"
    spares = [f"{tag}-spare-{i}" for i in range(2)]
    for node in (a, b, *spares):
        await sb.create_node(node, wait=False)
    await sb.wait_nodes_ready([a, b, *spares])
    await label(http, a, {f"bench-pool-{a}": "yes"})
    await label(http, b, {f"bench-pool-{b}": "yes"})
    ns = f"bench-{tag}"
    (await http.post("/api/v1/namespaces", json={"metadata": {"name": ns}})).raise_for_status()
    await until(
        lambda: _ok(http.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default")), 30, "default SA"
    )
    for node in (a, b):
        resp = await http.post(
            f"/apis/apps/v1/namespaces/{ns}/deployments",
            json=pool_deployment(f"app-{node}", size, node),
        )
        resp.raise_for_status()
    for node in (a, b):
        await until(
            lambda n=node: _at_least(running_on(http, n), size), 300, f"{size} pods on {node}"
        )
    # Replacements may now land on the spares (labelled for both pools).
    for spare in spares:
        await label(http, spare, {f"bench-pool-{a}": "yes", f"bench-pool-{b}": "yes"})

    # nmo on node A
    offset = sb.audit_log.stat().st_size
    peak = rss_mib(nmo_pid)
    started = time.monotonic()
    body = {
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": f"bench-{a}"},
        "spec": {"nodeName": a, "reason": "benchmark"},
    }
    (await http.post(NM, json=body)).raise_for_status()
    while True:
        peak = max(peak, rss_mib(nmo_pid))
        obj = (await http.get(f"{NM}/bench-{a}")).json()
        if (obj.get("status") or {}).get("phase") == "Succeeded":
            break
        if time.monotonic() - started > 900:
            raise TimeoutError(f"nmo did not finish draining {a}")
        await asyncio.sleep(0.05)
    nmo_seconds = time.monotonic() - started
    await asyncio.sleep(1.0)  # let the audit log flush
    nmo_requests, nmo_verbs = count_requests(sb.audit_log, offset, "nmo/")

    # kubectl drain on node B
    offset = sb.audit_log.stat().st_size
    started = time.monotonic()
    result = await sb.kubectl(
        "drain", b, "--ignore-daemonsets", "--delete-emptydir-data", "--force",
        "--timeout=900s", timeout=960,
    )  # fmt: skip
    kubectl_seconds = time.monotonic() - started
    if result.returncode != 0:
        raise RuntimeError(f"kubectl drain failed: {result.stderr[-2000:]}")
    await asyncio.sleep(1.0)
    kubectl_requests, _ = count_requests(sb.audit_log, offset, "kubectl")
    return {
        "pods": size,
        "nmo_seconds": round(nmo_seconds, 2),
        "kubectl_seconds": round(kubectl_seconds, 2),
        "ratio_kubectl_over_nmo": round(kubectl_seconds / nmo_seconds, 2),
        "nmo_requests": nmo_requests,
        "nmo_requests_by_verb": nmo_verbs,
        "kubectl_requests": kubectl_requests,
        "nmo_peak_rss_mib": round(peak, 1),
    }


async def run_concurrent(sb: Sandbox, http: httpx.AsyncClient, count: int) -> dict[str, Any]:
    """``count`` CRs at once, one node's only pod held by a PDB that never allows eviction.

    NMO handles one CR at a time and blocks its worker 30 s per drain pass on
    the blocked node, so the last of 50 waits about half an hour; nmo's
    figure is the time until every other maintenance has Succeeded.
    """
    nodes = [f"c{count}-{i}" for i in range(count)]
    for node in nodes:
        await sb.create_node(node, wait=False)
    await sb.wait_nodes_ready(nodes)
    ns = f"bench-c{count}"
    (await http.post("/api/v1/namespaces", json={"metadata": {"name": ns}})).raise_for_status()
    await until(lambda: _ok(http.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default")), 30, "SA")
    for node in nodes:
        await label(http, node, {f"bench-pool-{node}": "yes"})
        body = pool_deployment(f"app-{node}", 1, node)
        (
            await http.post(f"/apis/apps/v1/namespaces/{ns}/deployments", json=body)
        ).raise_for_status()
    blocked = nodes[0]
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "never"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": f"app-{blocked}"}}},
    }
    (
        await http.post(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", json=pdb)
    ).raise_for_status()

    async def all_running() -> bool:
        pods = (await http.get(f"/api/v1/namespaces/{ns}/pods")).json()["items"]
        return sum(p["status"].get("phase") == "Running" for p in pods) == count

    await until(all_running, 120, f"{count} pods")
    spare = f"c{count}-spare"
    await sb.create_node(spare)
    await label(http, spare, {f"bench-pool-{n}": "yes" for n in nodes})
    started = time.monotonic()
    for node in nodes:
        body = {
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
            "kind": "NodeMaintenance",
            "metadata": {"name": f"bench-{node}"},
            "spec": {"nodeName": node},
        }
        (await http.post(NM, json=body)).raise_for_status()

    async def others_done() -> bool:
        items = (await http.get(NM)).json()["items"]
        mine = {i["metadata"]["name"]: (i.get("status") or {}).get("phase") for i in items}
        return all(mine.get(f"bench-{n}") == "Succeeded" for n in nodes[1:])

    await until(others_done, 600, f"{count - 1} maintenances", interval=0.2)
    elapsed = time.monotonic() - started
    still = (await http.get(f"{NM}/bench-{blocked}")).json().get("status", {})
    return {
        "concurrent_crs": count,
        "others_succeeded_seconds": round(elapsed, 2),
        "blocked_phase": still.get("phase"),
        "blocked_reason": ((still.get("pendingPodsDetails") or [{}])[0]).get("reason"),
    }


async def _ok(coro: Any) -> bool:
    return bool((await coro).status_code == 200)


async def _at_least(coro: Any, n: int) -> bool:
    return bool(await coro >= n)


async def main(sizes: list[int], concurrent: int) -> int:
    results = []
    with tempfile.TemporaryDirectory(prefix="nmo-bench-") as tmp:
        async with Sandbox(Path(tmp) / "sandbox", nodes=1) as sb, sb.client() as http:
            (
                await http.post(
                    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd()
                )
            ).raise_for_status()
            await until(lambda: _ok(http.get(NM)), 30, "CRD served")
            log = Path(tmp) / "nmo.log"
            args = [
                sys.executable, "-m", "nmo", "run", "--kubeconfig", str(sb.kubeconfig),
                "--no-leader-elect", "--no-enable-webhook", "--bind-address", "127.0.0.1",
                "--health-probe-port", str(free_port()), "--metrics-port", str(free_port()),
                "--no-metrics-secure", "--log-level", "warning",
            ]  # fmt: skip
            with log.open("wb") as out:
                proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)  # noqa: ASYNC220
            try:
                await asyncio.sleep(3)
                if proc.poll() is not None:
                    print(log.read_text(), file=sys.stderr)
                    return 1
                for size in sizes:
                    res = await run_size(sb, http, proc.pid, size)
                    results.append(res)
                    print(json.dumps(res), flush=True)
                if concurrent:
                    conc = await run_concurrent(sb, http, concurrent)
                    print(json.dumps(conc), flush=True)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=20)
    print(
        "\npods  nmo(s)  kubectl drain(s)  kubectl/nmo  nmo requests  kubectl requests"
        "  nmo peak RSS"
    )
    for r in results:
        print(
            f"{r['pods']:>4}  {r['nmo_seconds']:>6}  {r['kubectl_seconds']:>16}  "
            f"{r['ratio_kubectl_over_nmo']:>11}  {r['nmo_requests']:>12}  "
            f"{r['kubectl_requests']:>16}  {r['nmo_peak_rss_mib']:>8} MiB"
        )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[100, 1000])
    parser.add_argument(
        "--concurrent", type=int, default=50, help="CRs at once, one PDB-blocked (0: skip)"
    )
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    options = parser.parse_args()
    sys.exit(asyncio.run(main(options.sizes, options.concurrent)))
