"""``nmo-sandbox demo``: the whole maintenance story on a local sandbox.

It brings up the sandbox (real etcd, kube-apiserver, controllers, kwok
nodes), installs the CRD and the validating webhook, starts ``nmo run``,
deploys workloads (one protected by a PodDisruptionBudget), shows the
webhook refusing a bad CR, puts a node into maintenance with a live progress
view, takes it out again and tears everything down. Every step is checked:
the command exits 0 only when every step behaved.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import subprocess
import sys
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

T = TypeVar("T")
NM_PATH = f"/apis/{c.API_VERSION}/{c.PLURAL}"
NODE = "node-1"
CHART = Path(__file__).resolve().parents[3] / "charts" / "node-maintenance-operator"
console = Console(highlight=False, width=130)


class DemoFailed(Exception):
    """A step did not behave; the message says which and why."""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        return deployment(name, replicas, pod_spec(grace=4, affinity=prefer_node(NODE)))

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
    def __init__(self, sandbox: Sandbox, http: httpx.AsyncClient, workdir: Path) -> None:
        self.sb = sandbox
        self.http = http
        self.workdir = workdir
        self.nmo: subprocess.Popen[bytes] | None = None
        self.nmo_log = workdir / "nmo.log"

    async def kubectl(self, *args: str, show: bool = True, expect_ok: bool = True) -> str:
        result = await self.sb.kubectl(*args)
        if show:
            console.print(f"    [dim]$ kubectl {' '.join(args)}[/]")
            for line in (result.stdout or result.stderr).rstrip().splitlines():
                console.print(f"    {line}", markup=False)
        if expect_ok and result.returncode != 0:
            raise DemoFailed(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout + result.stderr

    async def install(self) -> None:
        step("Install the Helm chart (webhook.url mode) and run nmo as the chart's ServiceAccount")
        certs = self.workdir / "certs"
        serving = self.sb.issue_serving_cert(certs, ["127.0.0.1", "localhost"])
        cert_dir = self.workdir / "cert-dir"
        cert_dir.mkdir()
        (cert_dir / "tls.crt").write_bytes(serving.cert_file.read_bytes())
        (cert_dir / "tls.key").write_bytes(serving.key_file.read_bytes())
        port, probes = _port(), _port()
        url = f"https://127.0.0.1:{port}{c.WEBHOOK_PATH}"
        result = await self.sb.helm(
            "install", "nmo", str(CHART), "-n", c.OPERATOR_NAMESPACE, "--create-namespace",
            "--set", "deployment.enabled=false", "--set", f"webhook.url={url}",
            "--set", f"webhook.caBundle={base64.b64encode(serving.ca_bundle).decode()}",
            "--wait", "--timeout", "60s",
        )  # fmt: skip
        console.print(f"    [dim]$ helm install nmo {CHART.name} -n {c.OPERATOR_NAMESPACE} ...[/]")
        if result.returncode != 0:
            raise DemoFailed(f"helm install failed: {result.stderr.strip()}")
        ok("chart installed: CRD, ServiceAccount, RBAC, ValidatingWebhookConfiguration")

        async def served() -> bool:
            return (await self.http.get(NM_PATH)).status_code == 200

        await until(served, 30, "the CRD to be served")
        kubeconfig = await self.sb.service_account_kubeconfig(
            c.OPERATOR_NAMESPACE, c.OPERATOR_SERVICE_ACCOUNT, self.workdir / "sa.kubeconfig"
        )
        can_i = await self.kubectl(
            "auth", "can-i", "update", "leases", "-n", c.LEASE_NAMESPACE_DEFAULT,
            f"--as=system:serviceaccount:{c.OPERATOR_NAMESPACE}:{c.OPERATOR_SERVICE_ACCOUNT}",
        )  # fmt: skip
        if can_i.strip() != "yes":
            raise DemoFailed("the chart's ServiceAccount may not update leases")
        args = [
            sys.executable, "-m", "nmo", "run", "--kubeconfig", str(kubeconfig),
            "--leader-elect", "--leader-election-namespace", c.OPERATOR_NAMESPACE,
            "--bind-address", "127.0.0.1", "--webhook-port", str(port),
            "--health-probe-port", str(probes), "--metrics-port", str(_port()),
            "--no-metrics-secure", "--cert-dir", str(cert_dir),
        ]  # fmt: skip
        with self.nmo_log.open("wb") as out:
            self.nmo = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)  # noqa: ASYNC220

        async def ready() -> bool:
            if self.nmo is not None and self.nmo.poll() is not None:
                raise DemoFailed(f"nmo exited:\n{self.nmo_log.read_text()[-2000:]}")
            try:
                async with httpx.AsyncClient() as probe:
                    ready = await probe.get(f"http://127.0.0.1:{probes}/readyz")
                    leading = await probe.get(f"http://127.0.0.1:{probes}/leaderz")
                return ready.status_code == 200 and leading.status_code == 200
            except httpx.TransportError:
                return False

        await until(ready, 60, "nmo to be ready")
        ok(
            f"nmo is leader and ready: curl -fsS http://127.0.0.1:{probes}/readyz answers ok, "
            "/leaderz answers leading"
        )

    async def uninstall(self) -> None:
        step("Uninstall the chart")
        result = await self.sb.helm("uninstall", "nmo", "-n", c.OPERATOR_NAMESPACE, "--wait")
        if result.returncode != 0:
            raise DemoFailed(f"helm uninstall failed: {result.stderr.strip()}")
        log_lines = self.nmo_log.read_text().splitlines()
        refused = [line for line in log_lines if "forbidden" in line.lower()]
        if refused:
            raise DemoFailed(f"nmo was refused something by the chart's RBAC: {refused[0]}")
        ok("uninstalled (the CRD stays, as Helm does); nmo needed nothing beyond its RBAC")

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

    async def stop(self) -> None:
        if self.nmo is not None and self.nmo.poll() is None:
            self.nmo.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.nmo.wait(timeout=15)
            if self.nmo.poll() is None:
                self.nmo.kill()


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
async def _sandbox(directory: Path | None) -> AsyncIterator[tuple[Sandbox, Path]]:
    with tempfile.TemporaryDirectory(prefix="nmo-demo-") as tmp:
        root = directory or Path(tmp)
        async with Sandbox(root / "sandbox", nodes=3) as sb:
            yield sb, root


async def main(directory: Path | None, *, keep: bool = False) -> int:
    started = time.monotonic()
    step("Start the sandbox: etcd, kube-apiserver, controller-manager, scheduler, 3 kwok nodes")
    demo: Demo | None = None
    try:
        async with _sandbox(directory) as (sb, root), sb.client(user_agent="nmo-demo") as http:
            ok(f"control plane ready at {sb.server} in {time.monotonic() - started:.1f}s")
            demo = Demo(sb, http, root)
            try:
                await demo.install()
                await demo.deploy()
                await demo.refused()
                await demo.maintain()
                await demo.finish()
            finally:
                await demo.stop()
            await demo.uninstall()
            if keep:
                console.print(f"\n--keep: sandbox left running in {sb.dir}; stop it with Ctrl-C")
                await asyncio.Event().wait()
    except DemoFailed as exc:
        console.print(f"\n[bold red]demo failed:[/] {exc}")
        if demo is not None and demo.nmo_log.exists():
            console.print("[dim]last lines of the nmo log:[/]")
            console.print("\n".join(demo.nmo_log.read_text().splitlines()[-30:]), markup=False)
        return 1
    except SandboxError as exc:
        console.print(f"\n[bold red]sandbox failed:[/] {exc}")
        return 1
    console.print(
        f"\n[bold green]demo complete in {time.monotonic() - started:.1f}s: every step behaved[/]"
    )
    return 0
