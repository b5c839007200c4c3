"""Real nodes in the sandbox: a kubelet on a containerd of the sandbox's own.

One sandbox of this module's own (one kwok node, one real node), not the
session's: a real node Ready and left alone by kwok, pods with a bridge IP on
the locally built pause image and on an image loaded from containers-storage,
``kubectl logs``/``exec`` through the kubelet, a memory limit the kernel
enforces, and a ``stop``/``down`` that leaves no process, mount, network
namespace, bridge or cgroup behind, also after the sandbox's Python process
was SIGKILLed. Missing host tools FAIL with one line (never skip).
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from operator_fixtures import wait_for

from nmo_sandbox import Sandbox, SandboxError, find_binaries
from nmo_sandbox.images import PAUSE, PROBE, build_image
from nmo_sandbox.realnodes import check_host_tools
from nmo_sandbox.teardown import find_shims, mounts_under

pytestmark = pytest.mark.integration

Json = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]


def _prerequisites() -> None:
    try:
        find_binaries().check_real_nodes()
        check_host_tools()
        if subprocess.run(["podman", "--version"], capture_output=True).returncode != 0:
            raise SandboxError("podman does not run: apt-get install podman")
    except (SandboxError, FileNotFoundError) as exc:
        pytest.fail(f"real nodes cannot run here: {exc}", pytrace=False)


@pytest.fixture(scope="module")
async def probe_image() -> str:
    """The probe image, built here and put into containers-storage (as `make image` would)."""
    _prerequisites()
    probe_tar = await asyncio.to_thread(build_image, PROBE)
    loaded = await asyncio.create_subprocess_exec(
        "podman", "load", "-q", "-i", str(probe_tar), stdout=subprocess.DEVNULL
    )
    assert await loaded.wait() == 0
    return PROBE.ref


@pytest.fixture(scope="module")
async def real(
    tmp_path_factory: pytest.TempPathFactory, probe_image: str
) -> AsyncIterator[Sandbox]:
    """A sandbox with node-1 (kwok) and real-1, the probe image loaded into real-1."""
    sb = Sandbox(tmp_path_factory.mktemp("real"), nodes=1, real_nodes=1)
    async with sb:
        await sb.load_image(probe_image)
        yield sb


@pytest.fixture
async def kube(real: Sandbox) -> AsyncIterator[httpx.AsyncClient]:
    async with real.client(user_agent="nmo-real-node-tests") as client:
        yield client


@pytest.fixture
async def ns(real: Sandbox, kube: httpx.AsyncClient) -> AsyncIterator[str]:
    name = f"r-{uuid.uuid4().hex[:8]}"
    resp = await kube.post(
        "/api/v1/namespaces",
        json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )
    resp.raise_for_status()

    async def sa() -> bool:
        return (
            await kube.get(f"/api/v1/namespaces/{name}/serviceaccounts/default")
        ).status_code == 200

    await wait_for(sa, timeout=30, what="the default ServiceAccount")
    yield name
    await kube.delete(f"/api/v1/namespaces/{name}", params={"gracePeriodSeconds": "0"})


def pod(name: str, image: str, *, args: list[str] | None = None, memory: str = "32Mi") -> Json:
    container: Json = {
        "name": "c",
        "image": image,
        "imagePullPolicy": "Never",
        "resources": {"limits": {"memory": memory}},
    }
    if args:
        container["args"] = args
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            # The scheduler places it: only real nodes carry type=real.
            "nodeSelector": {"type": "real"},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
        },
    }


async def run_pod(kube: httpx.AsyncClient, ns: str, body: Json, *, until: str = "Running") -> Json:
    resp = await kube.post(f"/api/v1/namespaces/{ns}/pods", json=body)
    assert resp.status_code == 201, resp.text
    name = body["metadata"]["name"]

    async def phase() -> Json | None:
        got: Json = (await kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")).json()
        return got if got.get("status", {}).get("phase") == until else None

    return await wait_for(phase, timeout=60, what=f"pod {ns}/{name} {until}")


def in_bridge(sb: Sandbox, ip: str) -> bool:
    first, last = sb.bridge.pod_range(1)
    return ipaddress.ip_address(first) <= ipaddress.ip_address(ip) <= ipaddress.ip_address(last)


def managers(obj: Json) -> set[str]:
    return {str(m.get("manager")) for m in obj["metadata"].get("managedFields") or []}


async def test_real_node_is_ready_and_left_to_its_kubelet(
    real: Sandbox, kube: httpx.AsyncClient
) -> None:
    node: Json = (await kube.get("/api/v1/nodes/real-1")).json()
    conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conditions["Ready"] == "True"
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.35.4"
    assert info["containerRuntimeVersion"].startswith("containerd://")
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == real.bridge.node_ip(1)
    assert node["metadata"]["labels"]["type"] == "real"
    assert "kwok.x-k8s.io/node" not in (node["metadata"].get("annotations") or {})
    # kwok writes the status of the nodes it manages; here only the kubelet does.
    kwok_node: Json = (await kube.get("/api/v1/nodes/node-1")).json()
    assert "kwok" in managers(kwok_node), managers(kwok_node)
    assert "kwok" not in managers(node), managers(node)
    assert "kubelet" in managers(node)


async def test_pause_pod_gets_a_bridge_ip(real: Sandbox, kube: httpx.AsyncClient, ns: str) -> None:
    got = await run_pod(kube, ns, pod("pause", PAUSE.ref))
    assert got["spec"]["nodeName"] == "real-1"
    assert in_bridge(real, got["status"]["podIP"]), got["status"]["podIP"]
    assert got["status"]["hostIP"] == real.bridge.node_ip(1)
    assert "kwok" not in managers(got), managers(got)


async def test_logs_and_exec_reach_the_kubelet(
    real: Sandbox, kube: httpx.AsyncClient, ns: str
) -> None:
    line = f"probe-{uuid.uuid4().hex[:6]}"
    await run_pod(kube, ns, pod("probe", PROBE.ref, args=["serve", line]))
    logs = await real.kubectl("logs", "-n", ns, "probe")
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.splitlines() == [line]
    ls = await real.kubectl(
        "exec",
        "-n",
        ns,
        "probe",
        "--",
        "/probe",
        "ls",
        "/var/run/secrets/kubernetes.io/serviceaccount",
    )
    assert ls.returncode == 0, ls.stderr
    assert sorted(ls.stdout.split()) == ["ca.crt", "namespace", "token"]
    ns_file = await real.kubectl(
        "exec",
        "-n",
        ns,
        "probe",
        "--",
        "/probe",
        "cat",
        "/var/run/secrets/kubernetes.io/serviceaccount/namespace",
    )
    assert ns_file.stdout == ns


async def test_pods_reach_the_apiserver_at_its_service_ip(
    real: Sandbox, kube: httpx.AsyncClient, ns: str
) -> None:
    """No kube-proxy: the sandbox's own nat rule sends 10.96.0.1:443 to the apiserver."""
    got = await run_pod(
        kube, ns, pod("dial", PROBE.ref, args=["connect", "10.96.0.1", "443"]), until="Succeeded"
    )
    assert got["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    logs = await real.kubectl("logs", "-n", ns, "dial")
    assert logs.stdout.strip() == "connected", (logs.stdout, logs.stderr)
    # Nothing else is reachable: the pod has no default route, only its subnet
    # and the service range (read from the pod's /proc, nothing is dialled).
    await run_pod(
        kube, ns, pod("routes", PROBE.ref, args=["cat", "/proc/net/route"]), until="Succeeded"
    )
    table = (await real.kubectl("logs", "-n", ns, "routes")).stdout.splitlines()[1:]
    destinations = {ipaddress.IPv4Address(bytes.fromhex(r.split()[1])[::-1]) for r in table}
    assert destinations == {
        ipaddress.IPv4Address("10.96.0.0"),
        ipaddress.IPv4Address(real.bridge.subnet.split("/")[0]),
    }, table


async def test_the_apiserver_calls_a_webhook_service_at_its_pod_ip(
    real: Sandbox, kube: httpx.AsyncClient, ns: str
) -> None:
    """--enable-aggregator-routing: a webhook Service resolves to its endpoint's pod IP.

    The probe only accepts TCP (the TLS handshake then fails and
    ``failurePolicy: Ignore`` lets the request through); its log shows that
    the apiserver connected to the pod behind the Service.
    """
    body = pod("hook", PROBE.ref, args=["listen", "8443"])
    body["metadata"]["labels"] = {"app": "hook"}
    got = await run_pod(kube, ns, body)

    async def ready() -> bool:
        p: Json = (await kube.get(f"/api/v1/namespaces/{ns}/pods/hook")).json()
        return any(
            c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"]
        )

    await wait_for(ready, timeout=30, what="pod hook Ready")
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "hook"},
        "spec": {"selector": {"app": "hook"}, "ports": [{"port": 443, "targetPort": 8443}]},
    }
    resp = await kube.post(f"/api/v1/namespaces/{ns}/services", json=service)
    assert resp.status_code == 201, resp.text

    async def endpoint() -> bool:
        eps = await kube.get(f"/api/v1/namespaces/{ns}/endpoints/hook")
        subsets = eps.json().get("subsets") or [] if eps.status_code == 200 else []
        return any(a["ip"] == got["status"]["podIP"] for s in subsets for a in s["addresses"])

    await wait_for(endpoint, timeout=30, what="the Service's endpoint")
    name = f"hook-{ns}"
    webhook = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "hook.nmo-sandbox.test",
                "clientConfig": {
                    "service": {"namespace": ns, "name": "hook", "port": 443, "path": "/"},
                    "caBundle": base64.b64encode(real.ca_file.read_bytes()).decode(),
                },
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["configmaps"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "failurePolicy": "Ignore",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
            }
        ],
    }
    path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    resp = await kube.post(path, json=webhook)
    assert resp.status_code == 201, resp.text
    try:

        async def called() -> bool:
            cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "c-"}}
            created = await kube.post(f"/api/v1/namespaces/{ns}/configmaps", json=cm)
            assert created.status_code == 201, created.text
            logs = await real.kubectl("logs", "-n", ns, "hook")
            return "accepted " in logs.stdout

        # The webhook configuration reaches the apiserver's informer within a second or so.
        await wait_for(called, timeout=30, interval=0.5, what="the apiserver to dial the pod")
    finally:
        await kube.delete(f"{path}/{name}")


async def test_an_image_not_loaded_is_never_pulled_from_off_the_machine(
    kube: httpx.AsyncClient, ns: str
) -> None:
    """containerd's registry traffic goes to a closed loopback port (realnodes.NO_PULL_PROXY)."""
    body = pod("pull", "registry.example/never/loaded:1")
    body["spec"]["containers"][0]["imagePullPolicy"] = "IfNotPresent"
    resp = await kube.post(f"/api/v1/namespaces/{ns}/pods", json=body)
    assert resp.status_code == 201, resp.text

    async def pull_error() -> str:
        got: Json = (await kube.get(f"/api/v1/namespaces/{ns}/pods/pull")).json()
        for status in got.get("status", {}).get("containerStatuses") or []:
            waiting = status.get("state", {}).get("waiting") or {}
            if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff"):
                return str(waiting.get("message", ""))
        return ""

    message = await wait_for(pull_error, timeout=60, what="ErrImagePull")
    assert "127.0.0.1:9" in message, message


async def test_memory_limit_is_enforced(real: Sandbox, kube: httpx.AsyncClient, ns: str) -> None:
    held = await run_pod(kube, ns, pod("holder", PROBE.ref, args=["alloc", "8"], memory="32Mi"))

    async def allocated() -> bool:
        return "allocated 8 MiB" in (await real.kubectl("logs", "-n", ns, "holder")).stdout

    await wait_for(allocated, timeout=30, what="the probe's allocation")
    memory = real.container_memory(held["status"]["containerStatuses"][0]["containerID"])
    assert memory["limit"] == 32 * 2**20, memory
    assert 8 * 2**20 <= memory["rss"] < 16 * 2**20, memory
    got = await run_pod(
        kube, ns, pod("hog", PROBE.ref, args=["alloc", "64"], memory="16Mi"), until="Failed"
    )
    state = got["status"]["containerStatuses"][0]["state"]["terminated"]
    assert state["reason"] == "OOMKilled", state
    assert state["exitCode"] == 137


async def test_load_image_names_make_image_when_missing(real: Sandbox) -> None:
    with pytest.raises(SandboxError, match=r"not in containers-storage.*make image"):
        await real.load_image("localhost/nmo-missing:never-built")


def leftovers(directory: Path, bridge: str, recorded: Json) -> list[str]:
    """What of a stopped sandbox is still on the machine (empty when clean)."""
    found: list[str] = []
    prefix = str(directory) + "/"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if prefix in cmdline.replace("\0", " ") and state not in ("Z", "X"):
            found.append(f"process {entry.name}: {cmdline[:120]!r}")
    for pid in recorded["container_pids"]:
        if Path(f"/proc/{pid}").exists() and _state(pid) not in ("Z", "X", ""):
            found.append(f"container process {pid}")
    found += [f"mount {m}" for m in mounts_under(directory)]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    # Bridge names are reused (the lowest free nmo-sb<i>): another sandbox
    # started meanwhile may own this name now; its alias names its directory.
    owners = {f"nmo-sandbox {directory}", f"nmo-sandbox {directory.resolve()}"}
    reused = any(
        f": {bridge}:" in line and not any(owner in line for owner in owners)
        for line in links.splitlines()
    )
    for name in [bridge, *recorded["veths"]]:
        if name == bridge and reused:
            continue
        if f": {name}:" in links or f": {name}@" in links:
            found.append(f"link {name}")
    for cid in recorded["container_ids"]:
        found += [f"cgroup {p}" for p in Path("/sys/fs/cgroup").glob(f"*/k8s.io/{cid}")]
    nat = subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True).stdout
    found += [
        f"iptables {rule}" for rule in nat.splitlines() if f"-i {bridge} " in rule and not reused
    ]
    found += [f"shim {s.pid}" for s in find_shims(directory)]
    kubelets = [
        e for e in Path("/proc").glob("[0-9]*/comm") if _read(e).strip() == "kubelet"
    ]  # another sandbox's kubelet shares the socket (teardown.py)
    sock = Path("/var/lib/kubelet/device-plugins/kubelet.sock")
    if not kubelets and sock.exists():
        found.append(f"socket {sock}")
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def record(directory: Path, bridge: str) -> Json:
    """Container pids and veths of a running sandbox, to check for after it stops."""
    pids, ids = [], []
    for state in directory.glob("real/*/runc/*/*/state.json"):
        pids.append(int(json.loads(state.read_text())["init_process_pid"]))
        ids.append(state.parent.name)
    cgroups = [p for cid in ids for p in Path("/sys/fs/cgroup").glob(f"memory/k8s.io/{cid}")]
    out = subprocess.run(
        ["ip", "-j", "link", "show", "master", bridge], capture_output=True, text=True
    )
    veths = [link["ifname"] for link in json.loads(out.stdout or "[]")]
    # The checks after the stop must have something to miss.
    assert pids and veths and len(cgroups) == len(ids), (pids, veths, cgroups)
    return {"container_pids": pids, "container_ids": ids, "veths": veths}


async def test_stop_leaves_nothing_behind(real: Sandbox, kube: httpx.AsyncClient) -> None:
    """Last in this module: stops the module's sandbox with pods still running."""
    await run_pod(kube, "default", pod("left-running", PAUSE.ref))
    bridge = real.bridge.name
    recorded = record(real.dir, bridge)
    before = leftovers(real.dir, bridge, recorded)
    assert any(x.startswith("iptables") for x in before), before  # the check can fail
    assert any(x.startswith("mount") for x in before), before
    started = time.monotonic()
    await real.stop()
    took = time.monotonic() - started
    assert leftovers(real.dir, bridge, recorded) == []
    assert took < 20, f"stop took {took:.1f}s"


_KILLED_SANDBOX = textwrap.dedent(
    """
    import asyncio, sys
    from nmo_sandbox import Sandbox
    from nmo_sandbox.images import PAUSE

    async def main() -> None:
        sb = Sandbox(sys.argv[1], nodes=0, real_nodes=1)
        await sb.start()
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
               "spec": {"nodeName": "real-1", "containers": [
                   {"name": "c", "image": PAUSE.ref, "imagePullPolicy": "Never"}]}}
        async with sb.client() as http:
            (await http.post("/api/v1/namespaces/default/pods", json=pod)).raise_for_status()
            while True:
                got = (await http.get("/api/v1/namespaces/default/pods/p")).json()
                if got.get("status", {}).get("phase") == "Running":
                    break
                await asyncio.sleep(0.2)
        print(sb.bridge.name, flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


async def test_down_cleans_a_sigkilled_sandbox(
    probe_image: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    directory = tmp_path_factory.mktemp("killed")
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO / 'sandbox' / 'src'}"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _KILLED_SANDBOX, str(directory), stdout=subprocess.PIPE, env=env
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=120)
        bridge = line.decode().strip()
        assert bridge.startswith("nmo-sb"), line
        # `nmo-sandbox load` finds the real nodes from the state file alone.
        load = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "nmo_sandbox.cli", "load", "--dir", str(directory), probe_image,
            env=env, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        assert await asyncio.wait_for(load.wait(), timeout=60) == 0
        images = await asyncio.create_subprocess_exec(
            "ctr", f"--address={directory}/real/real-1/containerd.sock", "-n", "k8s.io",
            "images", "ls", "-q", stdout=subprocess.PIPE,
        )  # fmt: skip
        listed, _ = await images.communicate()
        assert probe_image in listed.decode().split(), listed
        recorded = record(directory, bridge)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    # The kernel killed the sandbox's own processes (PDEATHSIG); shims,
    # containers, mounts and the bridge outlive them.
    assert find_shims(directory) and mounts_under(directory)
    down = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "nmo_sandbox.cli", "down", "--dir", str(directory), env=env
    )
    assert await asyncio.wait_for(down.wait(), timeout=60) == 0
    assert leftovers(directory, bridge, recorded) == []
    assert not directory.exists()
