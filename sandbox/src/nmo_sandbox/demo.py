"""``nmo-sandbox demo``: the whole maintenance story on a local sandbox.

It builds (or reuses) the operator image, brings up the sandbox (real etcd,
kube-apiserver, controllers, kwok nodes, one real kubelet node and
cert-manager), loads the image into the real node's containerd and installs
the Helm chart in-cluster as a user does (cert-manager issues the webhook
certificate; the two replicas run on the real node), deploys workloads on a
kwok node (one protected by a PodDisruptionBudget), shows the webhook
refusing a bad CR through its Service, puts the node into maintenance with a
live progress view, takes it out again, uninstalls the chart and tears
everything down. Every step is checked:
the command exits 0 only when every step behaved.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from nmo.api import constants as c
from nmo_sandbox import Sandbox, SandboxError
from nmo_sandbox.manifests import deployment, pod_spec, prefer_node
from nmo_sandbox.release import RELEASE, ensure_image, install_args

T = TypeVar("T")
NM_PATH = f"/apis/{c.API_VERSION}/{c.PLURAL}"
NODE = "node-1"
REAL_NODES = 1
REAL_NODE = "real-1"
CERT_SECRET = "node-maintenance-operator-webhook-server-cert"
VWC = "node-maintenance-operator-validating-webhook-configuration"
console = Console(highlight=False, width=130)


class DemoFailed(Exception):
    """A step did not behave; the message says which and why."""


def step(title: str) -> None:
    console.print(f"\n[bold cyan]==> {title}[/]")


def ok(text: str) -> None:
    console.print(f"    [green]ok[/] {text}")


async def until(check: Callable[[], Awaitable[T | None]], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.25)
    raise DemoFailed(f"timed out after {timeout:.0f}s waiting for {what}")


async def expect(resp: httpx.Response, *codes: int) -> dict[str, Any]:
    if resp.status_code not in codes:
        raise DemoFailed(
            f"{resp.request.method} {resp.request.url.path}: {resp.status_code} {resp.text}"
        )
    data: dict[str, Any] = resp.json() if resp.content else {}
    return data


def workloads() -> list[tuple[str, dict[str, Any]]]:
    def deploy(name: str, replicas: int) -> dict[str, Any]:
        # kwok nodes only: their pods are simulated (the real node would try to run them).
        spec = pod_spec(grace=4, node_selector={"type": "kwok"}, affinity=prefer_node(NODE))
        return deployment(name, replicas, spec)

    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "db"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "db"}}},
    }
    base = "/apis/apps/v1/namespaces/demo/deployments"
    return [
        (base, deploy("web", 8)),
        (base, deploy("db", 3)),
        ("/apis/policy/v1/namespaces/demo/poddisruptionbudgets", pdb),
    ]


class Demo:
    def __init__(self, sandbox: Sandbox, http: httpx.AsyncClient) -> None:
        self.sb = sandbox
        self.http = http

    async def kubectl(self, *args: str, show: bool = True, expect_ok: bool = True) -> str:
        result = await self.sb.kubectl(*args)
        if show:
            console.print(f"    [dim]$ kubectl {' '.join(args)}[/]")
            for line in (result.stdout or result.stderr).rstrip().splitlines():
                console.print(f"    {line}", markup=False)
        if expect_ok and result.returncode != 0:
            raise DemoFailed(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout + result.stderr

    async def install(self, image: str) -> None:
        step(f"Install the Helm chart in-cluster: image {image} on {REAL_NODE}, cert-manager TLS")
        args = install_args(image)
        started = time.monotonic()
        result = await self.sb.helm("install", *args, "--wait", "--timeout", "180s")
        console.print(f"    [dim]$ helm install {' '.join(args[:5])} --set image.* ...[/]")
        if result.returncode != 0:
            listing = await self.sb.kubectl("get", "pods", "-A", "-o", "wide")
            raise DemoFailed(f"helm install failed: {result.stderr.strip()}\n{listing.stdout}")

        async def ready() -> list[dict[str, Any]] | None:
            pods = await self._operator_pods()
            ready = [p for p in pods if _pod_ready(p)]
            return ready if len(ready) == len(pods) == 2 else None

        pods = await until(ready, 60, "two Ready operator pods")
        await self._check_certificate()
        ok(
            f"chart installed in {time.monotonic() - started:.1f}s: 2 replicas Ready through the "
            "kubelet's /readyz probe, certificate issued by cert-manager"
        )
        await self.kubectl("get", "pods", "-n", c.OPERATOR_NAMESPACE, "-o", "wide")
        lease = await expect(
            await self.http.get(
                f"/apis/coordination.k8s.io/v1/namespaces/{c.OPERATOR_NAMESPACE}/leases/"
                + c.LEADER_ELECTION_ID
            ),
            200,
        )
        holder = str(lease["spec"].get("holderIdentity") or "")
        names = [p["metadata"]["name"] for p in pods]
        if holder not in names:
            raise DemoFailed(f"the leader lease names {holder!r}, not one of {names}")
        ok(f"leader: {holder}")
        await self.kubectl(
            "exec", "-n", c.OPERATOR_NAMESPACE, names[0], "--", "ls", c.DEFAULT_CERT_DIR + "/"
        )

    async def _check_certificate(self) -> None:
        """cert-manager wrote the Secret and cainjector put its CA into the webhook config."""
        ns = c.OPERATOR_NAMESPACE
        secret = await expect(
            await self.http.get(f"/api/v1/namespaces/{ns}/secrets/{CERT_SECRET}"), 200
        )
        vwc = await expect(
            await self.http.get(
                f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{VWC}"
            ),
            200,
        )
        ca = secret["data"].get("ca.crt")
        bundles = {hook["clientConfig"].get("caBundle") for hook in vwc["webhooks"]}
        if not ca or bundles != {ca}:
            raise DemoFailed("cainjector did not put cert-manager's CA into the webhook config")

    async def uninstall(self) -> None:
        for pod in await self._operator_pods():
            name = pod["metadata"]["name"]
            resp = await self.http.get(f"/api/v1/namespaces/{c.OPERATOR_NAMESPACE}/pods/{name}/log")
            refused = [line for line in resp.text.splitlines() if "forbidden" in line.lower()]
            if resp.status_code != 200 or refused:
                raise DemoFailed(
                    f"pod {name}: nmo was refused something by the chart's RBAC: "
                    f"{refused[:1] or resp.text[:300]}"
                )
        step("Uninstall the chart")
        result = await self.sb.helm("uninstall", RELEASE, "-n", c.OPERATOR_NAMESPACE, "--wait")
        if result.returncode != 0:
            raise DemoFailed(f"helm uninstall failed: {result.stderr.strip()}")

        async def no_pods() -> bool:
            return not await self._operator_pods(terminating=True)

        await until(no_pods, 60, "the operator's pods to be gone")
        ok(
            "uninstalled, pods gone (the CRD stays, as Helm does); "
            "nmo needed nothing beyond its RBAC"
        )

    async def show_operator_logs(self) -> None:
        console.print("[dim]last lines of the operator's logs:[/]")
        result = await self.sb.kubectl(
            "logs", "-n", c.OPERATOR_NAMESPACE, "-l", "=".join(c.OPERATOR_POD_LABEL), "--tail=20"
        )
        console.print((result.stdout + result.stderr).rstrip(), markup=False)

    async def _operator_pods(self, *, terminating: bool = False) -> list[dict[str, Any]]:
        resp = await self.http.get(
            f"/api/v1/namespaces/{c.OPERATOR_NAMESPACE}/pods",
            params={"labelSelector": "=".join(c.OPERATOR_POD_LABEL)},
        )
        items = await expect(resp, 200)
        return [
            p
            for p in items.get("items", [])
            if terminating or not p["metadata"].get("deletionTimestamp")
        ]

    async def deploy(self) -> None:
        step(f"Deploy workloads preferring {NODE}: web (8 pods), db (3 pods, PDB maxUnavailable 1)")
        await expect(
            await self.http.post("/api/v1/namespaces", json={"metadata": {"name": "demo"}}), 201
        )

        async def sa() -> bool:
            return (
                await self.http.get("/api/v1/namespaces/demo/serviceaccounts/default")
            ).status_code == 200

        await until(sa, 30, "the demo namespace's ServiceAccount")
        for path, body in workloads():
            await expect(await self.http.post(path, json=body), 201)

        async def running() -> bool:
            pods = (await self.http.get("/api/v1/namespaces/demo/pods")).json()["items"]
            return len(pods) == 11 and all(p["status"].get("phase") == "Running" for p in pods)

        await until(running, 60, "11 running pods")
        await self.kubectl("get", "pods", "-n", "demo", "-o", "wide")

    async def refused(self) -> None:
        step("The webhook refuses a NodeMaintenance for a node that does not exist")
        manifest = _nm_yaml("nm-typo", "node-404")
        out = await self.sb.kubectl("create", "-f", "-", input=manifest)
        console.print("    [dim]$ kubectl create -f nm-typo.yaml[/]")
        console.print(f"    {out.stderr.strip()}", markup=False)
        expected = (
            f'admission webhook "{c.WEBHOOK_NAME}" denied the request: '
            "invalid nodeName, no node with name node-404 found"
        )
        if out.returncode == 0 or expected not in out.stderr:
            raise DemoFailed(f"the webhook did not refuse the CR as expected: {out.stderr!r}")
        ok("refused, nothing created")

    async def maintain(self) -> None:
        step(f"Put {NODE} into maintenance and watch the drain")
        await self.sb.kubectl("create", "-f", "-", input=_nm_yaml("nm-demo", NODE), check=True)
        started = time.monotonic()
        final: dict[str, Any] = {}
        fewest_db = 3
        with Live(console=console, refresh_per_second=8) as live:
            while time.monotonic() - started < 180:
                obj = await expect(await self.http.get(f"{NM_PATH}/nm-demo"), 200)
                events = await self._events("nm-demo")
                fewest_db = min(fewest_db, await self._db_available())
                live.update(_render(obj, events, time.monotonic() - started))
                final = obj
                if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    break
                await asyncio.sleep(0.25)
        st = final.get("status") or {}
        if st.get("phase") != "Succeeded":
            raise DemoFailed(f"maintenance did not succeed: {st}")
        if fewest_db < 2:
            raise DemoFailed(f"the db PDB was violated: only {fewest_db} of 3 pods available")
        took = time.monotonic() - started
        ok(f"drained in {took:.1f}s; db never had fewer than {fewest_db} of 3 pods ready")
        await self.kubectl("get", "nm")
        node = await expect(await self.http.get(f"/api/v1/nodes/{NODE}"), 200)
        keys = {t["key"] for t in node["spec"].get("taints") or []}
        if not node["spec"].get("unschedulable") or not set(c.MAINTENANCE_TAINT_KEYS) <= keys:
            raise DemoFailed(f"{NODE} is not cordoned and tainted: {node['spec']}")
        await self.kubectl("get", "nodes")
        lease = await expect(
            await self.http.get(
                f"/apis/coordination.k8s.io/v1/namespaces/{c.LEASE_NAMESPACE_DEFAULT}/leases/node-{NODE}"
            ),
            200,
        )
        holder = lease["spec"]["holderIdentity"]
        ok(f"lease {c.LEASE_NAMESPACE_DEFAULT}/node-{NODE} held by {holder}")
        pods = (
            await self.http.get(
                "/api/v1/namespaces/demo/pods", params={"fieldSelector": f"spec.nodeName={NODE}"}
            )
        ).json()
        if pods["items"]:
            raise DemoFailed(
                f"pods still on {NODE}: {[p['metadata']['name'] for p in pods['items']]}"
            )

    async def finish(self) -> None:
        step(f"Take {NODE} out of maintenance")
        await self.kubectl("delete", "nm", "nm-demo")

        async def gone() -> bool:
            return (await self.http.get(f"{NM_PATH}/nm-demo")).status_code == 404

        await until(gone, 30, "the NodeMaintenance to be removed")
        node = await expect(await self.http.get(f"/api/v1/nodes/{NODE}"), 200)
        if node["spec"].get("unschedulable"):
            raise DemoFailed(f"{NODE} is still cordoned")
        await self.kubectl("get", "nodes")
        await self.kubectl(
            "get", "events", "-n", "default", "--sort-by=.lastTimestamp",
            "--field-selector", "source=NodeMaintenance",
        )  # fmt: skip
        ok(f"{NODE} is schedulable again; each transition recorded once as an event")

    async def _db_available(self) -> int:
        resp = await self.http.get(
            "/api/v1/namespaces/demo/pods", params={"labelSelector": "app=db"}
        )
        ready = 0
        for pod in resp.json().get("items", []):
            conditions = (pod.get("status") or {}).get("conditions") or []
            if not pod["metadata"].get("deletionTimestamp") and any(
                c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
            ):
                ready += 1
        return ready

    async def _events(self, name: str) -> list[dict[str, Any]]:
        resp = await self.http.get(
            "/api/v1/namespaces/default/events",
            params={"fieldSelector": f"involvedObject.name={name}"},
        )
        return list(resp.json().get("items", [])) if resp.status_code == 200 else []


def _pod_ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(x.get("type") == "Ready" and x.get("status") == "True" for x in conditions)


def _nm_yaml(name: str, node: str) -> str:
    return (
        f"apiVersion: {c.API_VERSION}\nkind: {c.KIND}\nmetadata:\n  name: {name}\n"
        f"spec:\n  nodeName: {node}\n  reason: nmo demo\n"
    )


def _render(obj: dict[str, Any], events: list[dict[str, Any]], elapsed: float) -> Group:
    st = obj.get("status") or {}
    progress = int(st.get("drainProgress") or 0)
    head = Text.assemble(
        ("nm-demo ", "bold"), (f"phase={st.get('phase', '-')} ", "yellow"),
        (f"progress={progress}% ", "green"),
        f"evictionPods={st.get('evictionPods', '-')} pending={len(st.get('pendingPods') or [])} ",
        (f"t={elapsed:.1f}s", "dim"),
    )  # fmt: skip
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("pending pod")
    table.add_column("why")
    for d in (st.get("pendingPodsDetails") or [])[:8]:
        why = d.get("reason", "")
        if d.get("disruptionBudget"):
            why += f" (PDB {d['disruptionBudget']})"
        table.add_row(f"{d['namespace']}/{d['name']}", why)
    lines = [f"{e['reason']}: {e['message']}" for e in events]
    return Group(
        head,
        ProgressBar(total=100, completed=progress, width=50),
        table,
        Text("events: " + ("; ".join(lines) or "-"), style="dim"),
    )


@contextlib.asynccontextmanager
async def _sandbox(directory: Path | None) -> AsyncIterator[Sandbox]:
    with tempfile.TemporaryDirectory(prefix="nmo-demo-") as tmp:
        root = directory or Path(tmp)
        async with Sandbox(
            root / "sandbox", nodes=3, real_nodes=REAL_NODES, cert_manager=True
        ) as sb:
            yield sb


async def _story(demo: Demo, image: str) -> None:
    await demo.install(image)
    await demo.deploy()
    await demo.refused()
    await demo.maintain()
    await demo.finish()
    await demo.uninstall()


async def main(directory: Path | None, *, keep: bool = False) -> int:
    started = time.monotonic()
    try:
        step("Build the operator image (make image; reused when nothing changed)")
        image = await ensure_image()
        ok(f"{image.ref} ready in {image.seconds:.1f}s")
        step(
            f"Start the sandbox: etcd, kube-apiserver, controller-manager, scheduler, "
            f"3 kwok nodes, real node {REAL_NODE} (kubelet, containerd), cert-manager"
        )
        up = time.monotonic()
        async with _sandbox(directory) as sb, sb.client(user_agent="nmo-demo") as http:
            ok(f"control plane ready at {sb.server} in {time.monotonic() - up:.1f}s")
            loading = time.monotonic()
            await sb.load_image(image.ref)
            ok(
                f"{image.ref} loaded into {REAL_NODE}'s containerd "
                f"in {time.monotonic() - loading:.1f}s"
            )
            demo = Demo(sb, http)
            try:
                await _story(demo, image.ref)
            except DemoFailed:
                await demo.show_operator_logs()
                raise
            if keep:
                console.print(f"\n--keep: sandbox left running in {sb.dir}; stop it with Ctrl-C")
                await asyncio.Event().wait()
    except DemoFailed as exc:
        console.print(f"\n[bold red]demo failed:[/] {exc}")
        return 1
    except SandboxError as exc:
        console.print(f"\n[bold red]sandbox failed:[/] {exc}")
        return 1
    console.print(
        f"\n[bold green]demo complete in {time.monotonic() - started:.1f}s: every step behaved[/]"
    )
    return 0
