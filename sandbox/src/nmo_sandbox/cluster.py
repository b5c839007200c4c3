"""Run a real Kubernetes control plane with kwok nodes on this machine.

:class:`Sandbox` starts etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok from the cached binaries, on free loopback ports, and
returns only when the cluster is usable: the apiserver answers ``/readyz``, the
requested kwok nodes are Ready and schedulable, and the ``default``
ServiceAccount exists (without it pods cannot be created). A component that
exits or misses the deadline fails the start with the tail of its log, and
everything already started is stopped again.

Guarantees about leftovers: each component leads its own process group; the
state file ``DIR/state.json`` always lists what is running, so ``down`` from
another process can stop it; a non-persistent sandbox is also killed from
``atexit``, from SIGTERM/SIGHUP inside ``async with``, and by the kernel
(PDEATHSIG) if the Python process dies outright.

With ``real_nodes=M`` it also runs M real nodes ``real-1``..``real-M``: a
containerd and a kubelet each, on a bridge of the sandbox's own
(:mod:`nmo_sandbox.realnodes`, :mod:`nmo_sandbox.network`); :meth:`Sandbox.load_image`
copies an image from containers-storage into their containerd. Stopping
removes their containers, shims, mounts, network namespaces and bridge too
(:mod:`nmo_sandbox.teardown`), from the state file alone if need be.

The CLI uses the synchronous :func:`up`, :func:`down`, :func:`env` and
:func:`load_image`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import datetime as dt
import functools
import json
import os
import shlex
import shutil
import signal
import ssl
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import httpx

from nmo_sandbox import certmanager
from nmo_sandbox.binaries import Binaries, find_binaries
from nmo_sandbox.components import (
    COMPONENTS,
    Layout,
    Ports,
    command,
    component_env,
    kubeconfig_yaml,
    token_kubeconfig_yaml,
    write_audit_policy,
)
from nmo_sandbox.errors import (
    ComponentError,
    MissingBinariesError,
    SandboxAlreadyRunningError,
    SandboxError,
    SandboxNotRunningError,
)
from nmo_sandbox.images import PAUSE, build_image
from nmo_sandbox.kwok_api import crds as kwok_crds
from nmo_sandbox.network import BridgeNet, allocate_bridge, expose_apiserver
from nmo_sandbox.nodes import node_is_ready, node_manifest
from nmo_sandbox.pki import (
    PKI,
    ServingCert,
    generate_pki,
    issue_client_cert,
    issue_serving_cert,
)
from nmo_sandbox.process import (
    ProcessRef,
    free_ports,
    kill_groups,
    log_tail,
    rss_kib,
    run_command,
    spawn,
)
from nmo_sandbox.realnodes import (
    RealNode,
    check_host_tools,
    check_socket_paths,
    cni_conflist,
    containerd_command,
    containerd_config,
    containerd_env,
    kubelet_command,
    kubelet_config,
    kubelet_kubeconfig,
    prepare_dirs,
)
from nmo_sandbox.state import (
    kill_in_order,
    process_refs,
    read_state,
    refuse_if_running,
    remove_all,
    write_state,
)
from nmo_sandbox.teardown import teardown_real_nodes

# The errors are re-exported so ``cluster.SandboxError`` works for the CLI.
__all__ = [
    "DEFAULT_TIMEOUT",
    "ComponentError",
    "MissingBinariesError",
    "Sandbox",
    "SandboxAlreadyRunningError",
    "SandboxError",
    "SandboxNotRunningError",
    "down",
    "env",
    "load_image",
    "up",
]

DEFAULT_TIMEOUT = 120.0
_POLL = 0.1
_USER_AGENT = "nmo-sandbox"


class Sandbox:
    """A control plane in ``dir``; use ``async with Sandbox(dir) as sb`` or start/stop.

    ``persistent=True`` (what :func:`up` uses) lets the processes outlive this
    Python process once :meth:`start` has succeeded.
    """

    def __init__(
        self,
        dir: Path | str,
        *,
        nodes: int = 3,
        real_nodes: int = 0,
        timeout: float = DEFAULT_TIMEOUT,
        persistent: bool = False,
        binaries: Binaries | None = None,
        cert_manager: bool = False,
    ) -> None:
        self.layout = Layout(Path(dir).expanduser().resolve())
        self.nodes = nodes
        self.real_nodes = real_nodes
        self._bridge: BridgeNet | None = None
        self._kubelet_ports: dict[str, tuple[int, int]] = {}  # node -> (port, healthz)
        self.cert_manager = cert_manager
        self._cm_bins: certmanager.CertManagerBinaries | None = None
        self._cm_ports: certmanager.CertManagerPorts | None = None
        self._cm_crds: list[tuple[str, str]] = []
        self.timeout = timeout
        self.persistent = persistent
        self.timings: dict[str, float] = {}
        self._bins = binaries
        self._pki = PKI.at(self.layout.pki_dir)
        self._ports: Ports | None = None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._refs: dict[str, ProcessRef] = {}
        self._ssl: ssl.SSLContext | None = None
        self._atexit = False
        self._old_handlers: dict[int, Any] = {}
        self._owns_dir = False  # set once start() has claimed the directory

    # -- where things are -------------------------------------------------

    @property
    def dir(self) -> Path:
        return self.layout.dir

    @property
    def kubeconfig(self) -> Path:
        return self.layout.kubeconfig

    @property
    def ca_file(self) -> Path:
        return self._pki.ca_file

    @property
    def pki(self) -> PKI:
        return self._pki

    @property
    def audit_log(self) -> Path:
        return self.layout.audit_log

    @property
    def bin_dir(self) -> Path:
        return self._binaries().bin_dir

    @property
    def ports(self) -> Ports:
        if self._ports is None:
            raise SandboxError("the sandbox has not been started")
        return self._ports

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def node_names(self) -> list[str]:
        return [f"node-{i}" for i in range(1, self.nodes + 1)]

    @property
    def real_node_names(self) -> list[str]:
        return [n.name for n in self._real()]

    @property
    def bridge(self) -> BridgeNet:
        """The real nodes' bridge (name, subnet, gateway), once started."""
        if self._bridge is None:
            raise SandboxError("the sandbox has no real nodes (or has not been started)")
        return self._bridge

    @property
    def pids(self) -> dict[str, int]:
        return {name: ref.pid for name, ref in self._refs.items()}

    def log_file(self, component: str) -> Path:
        return self.layout.log(component)

    # -- lifecycle ----------------------------------------------------------

    async def __aenter__(self) -> Sandbox:
        self._install_signal_handlers()
        try:
            await self.start()
        except BaseException:
            self._restore_signal_handlers()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.stop()
        finally:
            self._restore_signal_handlers()

    async def start(self) -> None:
        """Start every component and wait until the cluster is usable."""
        if self._procs:
            raise SandboxError(f"the sandbox in {self.dir} is already started")
        bins = self._binaries()
        if self.real_nodes:
            bins.check_real_nodes()
            check_host_tools()
            for node in self._real():
                check_socket_paths(node)
        if self.cert_manager:
            self._cm_bins = certmanager.find_cert_manager()
        refuse_if_running(self.layout)
        t0 = time.monotonic()
        deadline = t0 + self.timeout
        self._prepare()
        self.timings = {"pki": time.monotonic() - t0}
        atexit.register(self._kill_sync)
        self._atexit = True
        try:
            if self.real_nodes:
                # containerd needs no apiserver: start it while the control plane starts.
                await self._start_containerds()
                self.timings["containerd-spawned"] = time.monotonic() - t0
            await self._start_component("etcd", bins, deadline, self._etcd_healthy)
            self.timings["etcd"] = time.monotonic() - t0
            await self._start_component("kube-apiserver", bins, deadline, self._apiserver_ready)
            self.timings["kube-apiserver"] = time.monotonic() - t0
            if self.real_nodes:
                await asyncio.to_thread(expose_apiserver, self.bridge, self.ports.apiserver)
                await self._start_kubelets(bins, deadline)
                self.timings["kubelets-spawned"] = time.monotonic() - t0
            # kwok watches its debugging resources from the start (kwok_api.py).
            async with self.client() as http:
                await _create_kwok_crds(http)
            for name in COMPONENTS[2:]:
                self._spawn(name, bins)
            if self.cert_manager:  # starts while the rest comes up; probed at the end
                await self._start_cert_manager(deadline)
                self.timings["cert-manager-started"] = time.monotonic() - t0
            await self._wait(
                "kube-controller-manager",
                "kube-controller-manager /healthz",
                lambda: self._healthz(self.ports.controller_manager),
                deadline,
            )
            await self._wait(
                "kube-scheduler",
                "kube-scheduler /healthz",
                lambda: self._healthz(self.ports.scheduler),
                deadline,
            )
            self.timings["controllers"] = time.monotonic() - t0
            async with self.client() as http:
                for name in self.node_names:
                    await _create_node(http, name, {})
            await self._wait_nodes(self.node_names, deadline)
            self.timings["nodes"] = time.monotonic() - t0
            if self.real_nodes:
                await self._wait_nodes(self.real_node_names, deadline, component="kubelet-real-1")
                self.timings["real-nodes"] = time.monotonic() - t0
            await self._wait(
                "kwok",
                "kwok's kubelet API /healthz",
                lambda: self._healthz(self.ports.kwok),
                deadline,
            )
            await self._wait(
                "kube-apiserver", "kwok's CRDs to be established", self._kwok_crds_ready, deadline
            )
            await self._wait(
                "kube-controller-manager",
                "the default ServiceAccount",
                self._default_sa_exists,
                deadline,
            )
            self.timings["ready"] = time.monotonic() - t0
            if self.cert_manager:
                await self._probe_cert_manager(deadline)
                self.timings["cert-manager"] = time.monotonic() - t0
            self._write_state()
        except BaseException:
            await self.stop()
            raise
        if self.persistent:
            self._unregister_atexit()

    async def stop(self) -> None:
        """Stop every component (SIGTERM, then SIGKILL) and drop the state file.

        Logs, PKI and kubeconfig stay for inspection; :func:`down` removes all.
        """
        refs = dict(self._refs)
        self._procs.clear()
        self._refs.clear()
        if refs:
            await asyncio.to_thread(kill_in_order, refs)
        if self._owns_dir and self.real_nodes:
            await asyncio.to_thread(self._teardown_real)
        self._unregister_atexit()
        if self._owns_dir:
            self.layout.state_file.unlink(missing_ok=True)
            shutil.rmtree(self.layout.etcd_dir, ignore_errors=True)

    def check_alive(self) -> None:
        """Raise :class:`ComponentError` if any started component has exited."""
        for name, proc in self._procs.items():
            code = proc.poll()
            if code is not None:
                raise ComponentError(
                    name, f"{name} exited with code {code}", log_tail(self.log_file(name))
                )

    def container_memory(self, container_id: str) -> dict[str, int]:
        """A real-node container's memory cgroup figures in bytes: rss, usage,
        peak (the highest usage since the container started), limit.

        ``container_id`` as in a pod's ``status.containerStatuses[].containerID``
        (``containerd://<id>``) or bare. cgroup v1: ``/sys/fs/cgroup/memory/k8s.io/<id>``.
        """
        cid = container_id.rsplit("://", 1)[-1]
        cgroup = Path("/sys/fs/cgroup/memory/k8s.io") / cid
        try:
            stat = dict(line.split() for line in (cgroup / "memory.stat").read_text().splitlines())
            usage = int((cgroup / "memory.usage_in_bytes").read_text())
            peak = int((cgroup / "memory.max_usage_in_bytes").read_text())
            limit = int((cgroup / "memory.limit_in_bytes").read_text())
        except OSError as exc:
            raise SandboxError(f"no memory cgroup for container {cid}: {exc}") from exc
        return {
            "rss": int(stat.get("total_rss", stat.get("rss", 0))),
            "usage": usage,
            "peak": peak,
            "limit": limit,
        }

    def rss_kib(self) -> dict[str, int]:
        """Resident memory of each running component in KiB (from /proc)."""
        out: dict[str, int] = {}
        for name, ref in self._refs.items():
            rss = rss_kib(ref.pid)
            if rss is not None:
                out[name] = rss
        return out

    async def stop_apiserver(self, *, grace: float = 2.0) -> None:
        """Stop kube-apiserver only (the other components keep retrying).

        SIGTERM, then SIGKILL after ``grace`` s: with watches open the
        apiserver's graceful shutdown otherwise lingers for 5 s or more.
        """
        ref = self._refs.pop("kube-apiserver", None)
        self._procs.pop("kube-apiserver", None)
        if ref is not None:
            await asyncio.to_thread(kill_groups, [ref], grace=grace)
        self._write_state()

    async def start_apiserver(self, *, timeout: float | None = None) -> None:
        """Start kube-apiserver again on the same port and wait for /readyz."""
        if "kube-apiserver" in self._procs:
            raise SandboxError("kube-apiserver is already running")
        deadline = time.monotonic() + (timeout or self.timeout)
        await self._start_component(
            "kube-apiserver", self._binaries(), deadline, self._apiserver_ready
        )
        self._write_state()

    async def restart_apiserver(self, *, downtime: float = 0.0) -> None:
        """Stop kube-apiserver, stay down ``downtime`` seconds, start it again."""
        await self.stop_apiserver()
        if downtime > 0:
            await asyncio.sleep(downtime)
        await self.start_apiserver()

    # -- using the cluster --------------------------------------------------

    async def load_image(self, ref: str, *, timeout: float = 300.0) -> None:
        """Copy image ``ref`` from containers-storage (podman) into every real node.

        Pods then use it with ``imagePullPolicy: Never`` or ``IfNotPresent``.
        """
        sockets = [n.socket for n in self._real()]
        if not sockets:
            raise SandboxError("load_image: this sandbox has no real nodes (real_nodes=0)")
        await _load_image(sockets, ref, self.layout.run_dir, timeout=timeout)

    def client(self, *, timeout: float = 30.0, user_agent: str = _USER_AGENT) -> httpx.AsyncClient:
        """An httpx client for the apiserver, authenticated as the admin (system:masters)."""
        return httpx.AsyncClient(
            base_url=self.server,
            verify=self._ssl_context(),
            timeout=timeout,
            headers={"User-Agent": user_agent},
        )

    async def kubectl(
        self, *args: str, input: str | None = None, check: bool = False, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the cached kubectl against this sandbox and capture its output."""
        argv = [str(self._binaries().path("kubectl")), f"--kubeconfig={self.kubeconfig}", *args]
        result = await run_command(argv, input=input, timeout=timeout)
        if check:
            result.check_returncode()
        return result

    async def create_node(
        self, name: str, *, labels: dict[str, str] | None = None, wait: bool = True
    ) -> dict[str, Any]:
        """Create a kwok node (idempotent) and, with ``wait``, wait until it is Ready."""
        async with self.client() as http:
            node = await _create_node(http, name, labels or {})
        if wait:
            await self.wait_nodes_ready([name])
        return node

    async def delete_node(self, name: str) -> None:
        """Delete a node; a node that is already gone is fine."""
        async with self.client() as http:
            resp = await http.delete(f"/api/v1/nodes/{name}")
        if resp.status_code not in (200, 202, 404):
            raise SandboxError(f"deleting node {name}: HTTP {resp.status_code} {resp.text}")

    async def wait_nodes_ready(self, names: Iterable[str], *, timeout: float | None = None) -> None:
        """Wait until every named node is Ready and schedulable."""
        deadline = time.monotonic() + (timeout or self.timeout)
        await self._wait_nodes(list(names), deadline)

    async def service_account_kubeconfig(
        self, namespace: str, name: str, path: Path | str, *, expiration: int = 3600
    ) -> Path:
        """A kubeconfig that authenticates as a ServiceAccount (TokenRequest API).

        Used to run nmo outside the cluster with exactly the chart's RBAC.
        """
        async with self.client() as http:
            resp = await http.post(
                f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                json={
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenRequest",
                    "spec": {"expirationSeconds": expiration},
                },
            )
        if resp.status_code != 201:
            raise SandboxError(
                f"token request for {namespace}/{name}: {resp.status_code} {resp.text}"
            )
        token = str(resp.json()["status"]["token"])
        text = token_kubeconfig_yaml(self.server, self.ca_file, f"{namespace}:{name}", token)
        return _write_private(Path(path), text)

    async def helm(
        self, *args: str, home: Path | str | None = None, timeout: float = 300.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the cached helm against this sandbox (its own cache/config dirs)."""
        base = Path(home) if home is not None else self.dir / "helm"
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(base / "cache"),
            "HELM_CONFIG_HOME": str(base / "config"),
            "HELM_DATA_HOME": str(base / "data"),
        }
        argv = [str(self._binaries().path("helm")), f"--kubeconfig={self.kubeconfig}", *args]
        return await run_command(argv, env=env, timeout=timeout)

    def issue_serving_cert(
        self, dir: Path | str, sans: Sequence[str], *, name: str = "webhook"
    ) -> ServingCert:
        """A serving certificate for ``sans`` signed by the sandbox CA, written to ``dir``."""
        return issue_serving_cert(self.layout.pki_dir, sans, out_dir=Path(dir), name=name)

    # -- internals ----------------------------------------------------------

    def _binaries(self) -> Binaries:
        if self._bins is None:
            self._bins = find_binaries()
        return self._bins

    def _real(self) -> list[RealNode]:
        return [RealNode(self.layout.real_dir, k) for k in range(1, self.real_nodes + 1)]

    def _prepare(self) -> None:
        layout = self.layout
        self._owns_dir = True
        if layout.real_dir.exists():
            # A crashed sandbox's containers and mounts must go before its files.
            teardown_real_nodes(layout.real_dir, _recorded_bridge(layout))
        for stale in (layout.etcd_dir, layout.run_dir, layout.logs_dir, layout.real_dir):
            shutil.rmtree(stale, ignore_errors=True)
        for d in (layout.dir, layout.logs_dir, layout.run_dir / "kwok"):
            d.mkdir(parents=True, exist_ok=True)
        self._pki = generate_pki(layout.pki_dir)
        self._ssl = None
        self._ports = Ports(*free_ports(6))
        layout.kubeconfig.write_text(kubeconfig_yaml(self.server, self._pki))
        layout.kubeconfig.chmod(0o600)
        write_audit_policy(layout)

    def _spawn(self, name: str, bins: Binaries) -> None:
        argv = command(name, bins=bins, layout=self.layout, ports=self.ports, pki=self._pki)
        proc = spawn(
            argv,
            log_file=self.log_file(name),
            env=component_env(name, self.layout),
            die_with_parent=not self.persistent,
        )
        self._procs[name] = proc
        self._refs[name] = ProcessRef.of(proc.pid)
        self._write_state()

    async def _start_containerds(self) -> None:
        """Build/cache the pause image, create the bridge, start one containerd per node."""
        await asyncio.to_thread(build_image, PAUSE)  # compiled once, then cached
        default = await run_command(["containerd", "config", "default"], timeout=30)
        if default.returncode != 0:
            raise SandboxError(f"containerd config default: {default.stderr.strip()}")
        self._bridge = await asyncio.to_thread(allocate_bridge, str(self.dir), self.real_nodes)
        self._write_state()  # the bridge is recorded before anything can leak
        ports = free_ports(2 * self.real_nodes)
        for node in self._real():
            prepare_dirs(node)
            node.containerd_config.write_text(
                containerd_config(default.stdout, node, pause_ref=PAUSE.ref)
            )
            conflist = cni_conflist(self._bridge, node)
            (node.cni_conf_dir / "10-nmo-sandbox.conflist").write_text(
                json.dumps(conflist, indent=2) + "\n"
            )
            self._kubelet_ports[node.name] = (ports.pop(), ports.pop())
            self._spawn_argv(
                node.containerd_component, containerd_command(node), env=containerd_env()
            )

    async def _start_kubelets(self, bins: Binaries, deadline: float) -> None:
        """Import the pause image into each containerd, then start the kubelets."""
        net = self.bridge
        pause_tar = await asyncio.to_thread(build_image, PAUSE)  # cached by _start_containerds
        for node in self._real():
            await self._wait(
                node.containerd_component,
                f"{node.containerd_component}'s socket",
                functools.partial(_socket_answers, node.socket),
                deadline,
            )
            res = await _ctr_import(
                node.socket, pause_tar, timeout=max(5.0, deadline - time.monotonic())
            )
            if res.returncode != 0:
                raise ComponentError(
                    node.containerd_component,
                    f"importing the pause image into {node.name}: {res.stderr.strip()}",
                    log_tail(self.log_file(node.containerd_component)),
                )
            node_ip = net.node_ip(node.k)
            cert, key = issue_client_cert(
                self.layout.pki_dir,
                f"system:node:{node.name}",
                "system:nodes",
                out_dir=node.pki_dir,
                name="kubelet-client",
            )
            serving = issue_serving_cert(
                self.layout.pki_dir, [node_ip, node.name], out_dir=node.pki_dir, name="kubelet"
            )
            node.kubeconfig.write_text(
                kubelet_kubeconfig(self.server, self.ca_file, cert, key, f"system:node:{node.name}")
            )
            node.kubeconfig.chmod(0o600)
            port, healthz = self._kubelet_ports[node.name]
            config = kubelet_config(
                node,
                node_ip=node_ip,
                port=port,
                healthz_port=healthz,
                ca_file=self.ca_file,
                serving_cert=serving.cert_file,
                serving_key=serving.key_file,
            )
            node.kubelet_config.write_text(json.dumps(config, indent=2) + "\n")
            self._spawn_argv(
                node.kubelet_component, kubelet_command(bins.path("kubelet"), node, node_ip=node_ip)
            )

    def _teardown_real(self) -> None:
        bridge = self._bridge.name if self._bridge else _recorded_bridge(self.layout)
        teardown_real_nodes(self.layout.real_dir, bridge)
        self._bridge = None

    def _spawn_argv(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> None:
        proc = spawn(
            argv, log_file=self.log_file(name), env=env, die_with_parent=not self.persistent
        )
        self._procs[name] = proc
        self._refs[name] = ProcessRef.of(proc.pid)
        self._write_state()

    async def _start_component(
        self,
        name: str,
        bins: Binaries,
        deadline: float,
        probe: Callable[[], Awaitable[bool]],
    ) -> None:
        self._spawn(name, bins)
        await self._wait(name, f"{name} readiness", probe, deadline)

    async def _wait(
        self,
        component: str,
        what: str,
        probe: Callable[[], Awaitable[bool]],
        deadline: float,
    ) -> None:
        """Poll ``probe`` until true; fail fast if any component dies."""
        began = time.monotonic()
        while True:
            self.check_alive()
            try:
                if await probe():
                    return
            except (httpx.TransportError, ssl.SSLError):
                pass
            if time.monotonic() >= deadline:
                raise ComponentError(
                    component,
                    f"timed out waiting for {what} (waited {time.monotonic() - began:.0f}s)",
                    log_tail(self.log_file(component)),
                )
            await asyncio.sleep(_POLL)

    async def _start_cert_manager(self, deadline: float) -> None:
        """Apply cert-manager's CRDs, start its controller and cainjector once they are served."""
        assert self._cm_bins is not None
        self._cm_crds = certmanager.crds(self._cm_bins)
        path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
        apply = {"Content-Type": "application/apply-patch+yaml"}
        query = {"fieldManager": "nmo-sandbox", "force": "true"}
        async with self.client() as http:
            answers = await asyncio.gather(
                *(
                    http.patch(path + name, content=text, headers=apply, params=query)
                    for name, text in self._cm_crds
                )
            )
        for (name, _), resp in zip(self._cm_crds, answers, strict=True):
            if resp.status_code not in (200, 201):
                raise SandboxError(f"applying CRD {name}: HTTP {resp.status_code} {resp.text}")
        # Started earlier, the controller's informers back off for seconds.
        await self._wait(
            "kube-apiserver",
            "cert-manager's CRDs to be established",
            lambda: self._crds_established(name for name, _ in self._cm_crds),
            deadline,
        )
        self._cm_ports = certmanager.CertManagerPorts(*free_ports(3))
        argvs = certmanager.commands(
            self._cm_bins, kubeconfig=self.kubeconfig, ports=self._cm_ports
        )
        for name, argv in argvs.items():
            self._spawn_argv(name, argv, env=certmanager.environment(self.kubeconfig))

    async def _probe_cert_manager(self, deadline: float) -> None:
        """Wait until cert-manager issues a Certificate and cainjector injects its CA."""
        assert self._cm_ports is not None
        ports = self._cm_ports
        await self._wait(
            certmanager.CONTROLLER,
            "cert-manager's controller /livez",
            lambda: _http_ok(f"http://127.0.0.1:{ports.controller_healthz}/livez"),
            deadline,
        )
        await self._wait(
            certmanager.CAINJECTOR,
            "cert-manager's cainjector /metrics",
            lambda: _http_ok(f"http://127.0.0.1:{ports.cainjector_metrics}/metrics"),
            deadline,
        )
        async with self.client(timeout=5.0) as http:
            for collection, obj in certmanager.probe_objects():
                resp = await http.post(collection, json=obj)
                if resp.status_code not in (201, 409):
                    raise SandboxError(
                        f"creating cert-manager's probe {obj['kind']}: "
                        f"HTTP {resp.status_code} {resp.text}"
                    )
            paths = certmanager.probe_paths()

            async def ready(path: str, test: Callable[[dict[str, Any]], bool]) -> bool:
                resp = await http.get(path)
                return resp.status_code == 200 and test(resp.json())

            await self._wait(
                certmanager.CONTROLLER,
                "cert-manager to issue its probe Certificate",
                lambda: ready(paths["certificate"], certmanager.certificate_ready),
                deadline,
            )
            await self._wait(
                certmanager.CAINJECTOR,
                "cainjector to inject the probe's CA into a webhook configuration",
                lambda: ready(paths["webhook"], certmanager.injected),
                deadline,
            )
            for kind in ("webhook", "certificate", "issuer", "secret"):
                await http.delete(paths[kind])

    async def _etcd_healthy(self) -> bool:
        async with httpx.AsyncClient(timeout=2.0) as http:
            resp = await http.get(f"http://127.0.0.1:{self.ports.etcd}/health")
        return resp.status_code == 200 and resp.json().get("health") == "true"

    async def _apiserver_ready(self) -> bool:
        async with self.client(timeout=5.0) as http:
            resp = await http.get("/readyz")
        return resp.status_code == 200

    async def _healthz(self, port: int) -> bool:
        async with httpx.AsyncClient(verify=self._ssl_context(), timeout=2.0) as http:
            resp = await http.get(f"https://127.0.0.1:{port}/healthz")
        return resp.status_code == 200

    async def _kwok_crds_ready(self) -> bool:
        return await self._crds_established(crd["metadata"]["name"] for crd in kwok_crds())

    async def _crds_established(self, names: Iterable[str]) -> bool:
        async with self.client(timeout=5.0) as http:
            for name in names:
                resp = await http.get(
                    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + name
                )
                if resp.status_code != 200:
                    return False
                conditions = (resp.json().get("status") or {}).get("conditions") or []
                if not any(
                    c.get("type") == "Established" and c.get("status") == "True" for c in conditions
                ):
                    return False
        return True

    async def _default_sa_exists(self) -> bool:
        async with self.client(timeout=5.0) as http:
            resp = await http.get("/api/v1/namespaces/default/serviceaccounts/default")
        return resp.status_code == 200

    async def _wait_nodes(
        self, names: list[str], deadline: float, *, component: str = "kwok"
    ) -> None:
        wanted = set(names)
        async with self.client(timeout=5.0) as http:

            async def all_ready() -> bool:
                resp = await http.get("/api/v1/nodes")
                if resp.status_code != 200:
                    return False
                ready = {
                    n["metadata"]["name"] for n in resp.json().get("items", []) if node_is_ready(n)
                }
                return wanted <= ready

            await self._wait(component, f"nodes {sorted(wanted)} to be Ready", all_ready, deadline)

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            ctx = ssl.create_default_context(cafile=str(self._pki.ca_file))
            ctx.load_cert_chain(self._pki.admin_cert_file, self._pki.admin_key_file)
            self._ssl = ctx
        return self._ssl

    def _write_state(self) -> None:
        write_state(
            self.layout,
            {
                "dir": str(self.dir),
                "server": self.server,
                "kubeconfig": str(self.kubeconfig),
                "bin_dir": str(self.bin_dir),
                "ports": self.ports.to_json(),
                "nodes": self.node_names,
                "real_nodes": {
                    "names": self.real_node_names,
                    "bridge": self._bridge.to_json() if self._bridge else None,
                    "sockets": [str(n.socket) for n in self._real()],
                    "kubelet_ports": self._kubelet_ports,
                },
                "persistent": self.persistent,
                "owner_pid": os.getpid(),
                "written_at": dt.datetime.now(dt.UTC).isoformat(),
                "timings": self.timings,
                **self._cert_manager_state(),
                "components": {
                    name: {**ref.to_json(), "log": str(self.log_file(name))}
                    for name, ref in self._refs.items()
                },
            },
        )

    def _cert_manager_state(self) -> dict[str, Any]:
        if self._cm_ports is None:
            return {}
        return {"cert_manager": {"version": certmanager.VERSION, "ports": self._cm_ports.to_json()}}

    def _kill_sync(self) -> None:
        """Last-resort cleanup for atexit and signal handlers (no event loop)."""
        refs = dict(self._refs)
        self._procs.clear()
        self._refs.clear()
        if refs:
            kill_in_order(refs, grace=3.0)
        if self._owns_dir and self.real_nodes:
            with contextlib.suppress(SandboxError):
                self._teardown_real()
        if refs:
            self.layout.state_file.unlink(missing_ok=True)

    def _unregister_atexit(self) -> None:
        if self._atexit:
            atexit.unregister(self._kill_sync)
            self._atexit = False

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _restore_signal_handlers(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._kill_sync()
        previous = self._old_handlers.get(signum, signal.SIG_DFL)
        self._restore_signal_handlers()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.raise_signal(signum)


def _write_private(path: Path, text: str) -> Path:
    """Write a credential file readable only by its owner."""
    path.write_text(text)
    path.chmod(0o600)
    return path


# -- the CLI's entry points ---------------------------------------------------


def up(
    dir: Path | str,
    nodes: int = 3,
    *,
    real_nodes: int = 0,
    cert_manager: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
) -> Sandbox:
    """Start a persistent sandbox in ``dir`` that outlives this process.

    Synchronous (it runs its own event loop); async code should use
    ``Sandbox(dir, persistent=True).start()`` instead.
    """
    sandbox = Sandbox(
        dir,
        nodes=nodes,
        real_nodes=real_nodes,
        timeout=timeout,
        persistent=True,
        cert_manager=cert_manager,
    )
    asyncio.run(sandbox.start())
    return sandbox


def down(dir: Path | str) -> None:
    """Stop the sandbox recorded in ``dir`` and remove everything it wrote there.

    Raises :class:`SandboxNotRunningError` (touching nothing) without a state file.
    """
    layout = Layout(Path(dir).expanduser().resolve())
    state = read_state(layout)
    kill_in_order(process_refs(state))
    if layout.real_dir.exists():
        teardown_real_nodes(layout.real_dir, _recorded_bridge(layout))
    remove_all(layout)


def load_image(dir: Path | str, ref: str, *, timeout: float = 300.0) -> None:
    """Copy image ``ref`` from containers-storage into the real nodes of the sandbox in ``dir``."""
    layout = Layout(Path(dir).expanduser().resolve())
    sockets = [Path(s) for s in (read_state(layout).get("real_nodes") or {}).get("sockets", [])]
    if not sockets:
        raise SandboxError(f"the sandbox in {layout.dir} has no real nodes (up --real-nodes M)")
    asyncio.run(_load_image(sockets, ref, layout.run_dir, timeout=timeout))


async def _load_image(sockets: Sequence[Path], ref: str, tmp_dir: Path, *, timeout: float) -> None:
    """``podman save`` once, ``ctr -n k8s.io images import`` into each containerd."""
    if shutil.which("podman") is None:
        raise SandboxError("load_image needs podman (apt-get install podman)")
    exists = await run_command(["podman", "image", "exists", ref], timeout=60)
    if exists.returncode != 0:
        raise SandboxError(
            f"image {ref} is not in containers-storage (`podman images`); "
            "build it first (`make image` for localhost/nmo:dev)"
        )
    await asyncio.to_thread(tmp_dir.mkdir, parents=True, exist_ok=True)
    archive = tmp_dir / f"load-{os.getpid()}-{time.monotonic_ns()}.tar"
    try:
        res = await run_command(
            ["podman", "save", "--format", "docker-archive", "-o", str(archive), ref],
            timeout=timeout,
        )
        if res.returncode != 0:
            raise SandboxError(f"podman save {ref}: {res.stderr.strip()}")
        for sock in sockets:
            res = await _ctr_import(sock, archive, timeout=timeout)
            if res.returncode != 0:
                raise SandboxError(f"importing {ref} into {sock}: {res.stderr.strip()}")
    finally:
        archive.unlink(missing_ok=True)


async def _ctr_import(
    socket: Path, archive: Path, *, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Import an image archive into a real node's containerd (the CRI's ``k8s.io`` namespace)."""
    argv = ["ctr", f"--address={socket}", "-n", "k8s.io", "images", "import", str(archive)]
    return await run_command(argv, timeout=timeout)


def _recorded_bridge(layout: Layout) -> str | None:
    """The bridge name in the state file (None without one)."""
    try:
        state = read_state(layout)
    except SandboxError:
        return None
    bridge = (state.get("real_nodes") or {}).get("bridge")
    return str(bridge["name"]) if isinstance(bridge, dict) else None


async def _socket_answers(path: Path) -> bool:
    """True once something accepts connections on the unix socket ``path``."""
    try:
        _reader, writer = await asyncio.open_unix_connection(str(path))
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def env(dir: Path | str) -> str:
    """Shell lines that point kubectl (and PATH) at the sandbox in ``dir``."""
    layout = Layout(Path(dir).expanduser().resolve())
    state = read_state(layout)
    return (
        f"export KUBECONFIG={shlex.quote(state['kubeconfig'])}\n"
        f"export PATH={shlex.quote(state['bin_dir'])}:$PATH\n"
    )


async def _http_ok(url: str) -> bool:
    async with httpx.AsyncClient(timeout=2.0) as http:
        resp = await http.get(url)
    return resp.status_code == 200


async def _create_kwok_crds(http: httpx.AsyncClient) -> None:
    for crd in kwok_crds():
        resp = await http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
        if resp.status_code not in (201, 409):
            raise SandboxError(
                f"creating CRD {crd['metadata']['name']}: HTTP {resp.status_code} {resp.text}"
            )


async def _create_node(
    http: httpx.AsyncClient, name: str, labels: dict[str, str]
) -> dict[str, Any]:
    resp = await http.post("/api/v1/nodes", json=node_manifest(name, labels=labels))
    if resp.status_code == 409:
        resp = await http.get(f"/api/v1/nodes/{name}")
    if resp.status_code not in (200, 201):
        raise SandboxError(f"creating node {name}: HTTP {resp.status_code} {resp.text}")
    node: dict[str, Any] = resp.json()
    return node
