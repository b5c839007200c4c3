"""Real nodes: a kubelet and a containerd of the sandbox's own, per node.

Configuration as data: where each real node keeps its files, the containerd
config (``containerd config default`` patched), the CNI conflist, the
KubeletConfiguration, the kubelet's kubeconfig and both command lines; plus
the checks of the host (root, tools, socket path lengths).
:mod:`nmo_sandbox.cluster` runs them; :mod:`nmo_sandbox.teardown` removes what
they leave behind.

One containerd per kubelet: a kubelet treats every pod sandbox its runtime
reports and it does not know as an orphan and kills it, and the CRI plugin's
namespace (``k8s.io``) is fixed, so two kubelets on one containerd would kill
each other's pods.

This machine's quirks (cgroup v1 without systemd, no CAP_SYS_RESOURCE, no
registry) are behind the settings: ``SystemdCgroup = false`` and
``cgroupDriver: cgroupfs``; ``restrict_oom_score_adj`` (otherwise every pod
sandbox fails with "can't get final child's PID from pipe"); ``failCgroupV1:
false``, ``cgroupsPerQOS: false`` and ``enforceNodeAllocatable: []``; the
locally built pause image (:mod:`nmo_sandbox.images`). Network namespaces,
runc state, shim bundles, overlay mounts and the kubelet's volumes all live
under ``DIR/real/<node>/`` so nothing is left outside ``DIR`` except the
bridge (``nmo-sb<i>``, see :mod:`nmo_sandbox.network`).

The kubelet authenticates with a client certificate ``system:node:<name>``
in ``system:nodes`` (the apiserver's Node authorizer), serves its API on the
node IP with a certificate the sandbox CA signed for that IP (the apiserver
checks it with ``--kubelet-certificate-authority``) and accepts the
apiserver's admin client certificate (``authentication.x509.clientCAFile``),
so ``kubectl logs`` and ``kubectl exec`` reach it.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nmo_sandbox.errors import SandboxError
from nmo_sandbox.network import BridgeNet

__all__ = [
    "CNI_BIN_DIR",
    "NO_PULL_PROXY",
    "REAL_NODE_LABEL",
    "RealNode",
    "check_host_tools",
    "check_socket_paths",
    "cni_conflist",
    "containerd_command",
    "containerd_config",
    "containerd_env",
    "kubelet_command",
    "kubelet_config",
    "kubelet_kubeconfig",
    "patch_toml",
    "prepare_dirs",
]

CNI_BIN_DIR = Path("/usr/lib/cni")
# Every real node carries type=real (kwok nodes carry type=kwok).
REAL_NODE_LABEL = ("type", "real")
_CNI_PLUGINS = ("bridge", "host-local", "loopback")
_HOST_TOOLS = {
    "containerd": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "containerd-shim-runc-v2": "containerd",
    "ip": "iproute2",
    "iptables": "iptables",
}
# Snapshotters and plugins this machine cannot use; skipping them keeps the
# containerd log free of their start-up errors.
_DISABLED_PLUGINS = (
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.tracing.processor.v1.otlp",
    "io.containerd.internal.v1.tracing",
)


@dataclass(frozen=True)
class RealNode:
    """Where real node ``real-<k>`` keeps its files, all under ``DIR/real/real-<k>/``."""

    base: Path  # DIR/real
    k: int

    @property
    def name(self) -> str:
        return f"real-{self.k}"

    @property
    def dir(self) -> Path:
        return self.base / self.name

    @property
    def containerd_config(self) -> Path:
        return self.dir / "containerd.toml"

    @property
    def containerd_root(self) -> Path:
        return self.dir / "containerd"

    @property
    def containerd_state(self) -> Path:
        """Shim bundles, overlay mounts, network namespaces (netns_mounts_under_state_dir)."""
        return self.dir / "state"

    @property
    def socket(self) -> Path:
        return self.dir / "containerd.sock"

    @property
    def runc_root(self) -> Path:
        """runc's state; the shim adds the namespace (``<root>/k8s.io/<id>``)."""
        return self.dir / "runc"

    @property
    def cni_conf_dir(self) -> Path:
        return self.dir / "cni"

    @property
    def ipam_dir(self) -> Path:
        return self.dir / "ipam"

    @property
    def opt_dir(self) -> Path:
        return self.dir / "opt"

    @property
    def kubelet_root(self) -> Path:
        return self.dir / "kubelet"

    @property
    def pod_logs(self) -> Path:
        return self.dir / "pod-logs"

    @property
    def volume_plugin_dir(self) -> Path:
        return self.dir / "volume-plugins"

    @property
    def kubelet_config(self) -> Path:
        return self.dir / "kubelet.yaml"

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def pki_dir(self) -> Path:
        return self.dir / "pki"

    @property
    def containerd_component(self) -> str:
        return f"containerd-{self.name}"

    @property
    def kubelet_component(self) -> str:
        return f"kubelet-{self.name}"


# The longest unix socket a kubelet makes below its root dir, past the root:
# "/pod-resources/" + a 10-digit temporary name (sun_path holds 107 bytes).
_SOCKET_TAIL = len("/pod-resources/") + 10
_SUN_PATH_MAX = 107


def check_socket_paths(node: RealNode) -> None:
    """Raise if the node's unix socket paths would exceed the kernel's 107 bytes."""
    longest = len(str(node.kubelet_root)) + _SOCKET_TAIL
    if longest > _SUN_PATH_MAX:
        room = len(str(node.base.parent)) - (longest - _SUN_PATH_MAX)
        raise SandboxError(
            f"the sandbox directory {node.base.parent} is too long for real nodes: their "
            f"unix sockets would need {longest} bytes of the kernel's {_SUN_PATH_MAX}; "
            f"use a directory path of at most {room} characters"
        )


def check_host_tools() -> None:
    """Raise :class:`SandboxError` naming every missing host tool and its package."""
    if os.geteuid() != 0:
        raise SandboxError("real nodes need root (containerd, runc, network namespaces, mounts)")
    missing = {tool: pkg for tool, pkg in _HOST_TOOLS.items() if shutil.which(tool) is None}
    missing.update(
        {
            f"{CNI_BIN_DIR}/{p}": "containernetworking-plugins"
            for p in _CNI_PLUGINS
            if not (CNI_BIN_DIR / p).is_file()
        }
    )
    if missing:
        pkgs = " ".join(sorted(set(missing.values())))
        raise SandboxError(f"real nodes need {', '.join(sorted(missing))}: apt-get install {pkgs}")


def containerd_config(default: str, node: RealNode, *, pause_ref: str) -> str:
    """``containerd config default`` with every path under the node dir and this machine's fixes."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    patches: dict[tuple[str, str], Any] = {
        ("", "disabled_plugins"): list(_DISABLED_PLUGINS),
        ("", "root"): str(node.containerd_root),
        ("", "state"): str(node.containerd_state),
        ("grpc", "address"): str(node.socket),
        (cri, "sandbox_image"): pause_ref,
        (cri, "restrict_oom_score_adj"): True,
        (cri, "netns_mounts_under_state_dir"): True,
        (f"{cri}.cni", "bin_dir"): str(CNI_BIN_DIR),
        (f"{cri}.cni", "conf_dir"): str(node.cni_conf_dir),
        (f"{cri}.containerd.runtimes.runc.options", "SystemdCgroup"): False,
        (f"{cri}.containerd.runtimes.runc.options", "Root"): str(node.runc_root),
        ('plugins."io.containerd.internal.v1.opt"', "path"): str(node.opt_dir),
    }
    return patch_toml(default, patches)


def patch_toml(text: str, patches: Mapping[tuple[str, str], Any]) -> str:
    """Replace ``key = value`` lines by (section, key); every patch must apply.

    Enough TOML for containerd's generated config: one ``key = value`` a line,
    ``[section]`` headers, values written as TOML strings, booleans or lists.
    """
    todo = dict(patches)
    section = ""
    out: list[str] = []
    header = re.compile(r"^\s*\[(.+)\]\s*$")
    assign = re.compile(r"^(\s*)([A-Za-z0-9_]+)\s*=")
    for line in text.splitlines():
        if m := header.match(line):
            section = m.group(1).strip()
        elif (m := assign.match(line)) and (section, m.group(2)) in todo:
            value = todo.pop((section, m.group(2)))
            line = f"{m.group(1)}{m.group(2)} = {_toml_value(value)}"
        out.append(line)
    if todo:
        missing = ", ".join(f"[{s}] {k}" for s, k in todo)
        raise SandboxError(f"containerd's default config has no {missing}; unsupported version?")
    return "\n".join(out) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


def cni_conflist(net: BridgeNet, node: RealNode) -> dict[str, Any]:
    """Bridge + host-local (this node's slice of the subnet) + loopback, no masquerading.

    Pods get a route to the service range only (``10.96.0.0/16`` via the
    gateway) and no default route: they reach their bridge and nothing else.
    """
    first, last = net.pod_range(node.k)
    return {
        "cniVersion": "1.0.0",
        "name": net.name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": net.name,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(node.ipam_dir),
                    "ranges": [
                        [
                            {
                                "subnet": net.subnet,
                                "rangeStart": first,
                                "rangeEnd": last,
                                "gateway": net.gateway,
                            }
                        ]
                    ],
                    "routes": [{"dst": "10.96.0.0/16"}],
                },
            },
            {"type": "loopback"},
        ],
    }


def kubelet_config(
    node: RealNode,
    *,
    node_ip: str,
    port: int,
    healthz_port: int,
    ca_file: Path,
    serving_cert: Path,
    serving_key: Path,
) -> dict[str, Any]:
    """The KubeletConfiguration for this machine (cgroup v1, no systemd).

    Without per-QoS cgroups the kubelet gives the runtime no cgroup parent
    (``cgroupRoot`` only names a cgroup it then fails to find stats for), so
    containerd puts each container in ``/k8s.io/<container id>``.
    """
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "address": node_ip,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "containerRuntimeEndpoint": f"unix://{node.socket}",
        "podLogsDir": str(node.pod_logs),
        "tlsCertFile": str(serving_cert),
        "tlsPrivateKeyFile": str(serving_key),
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "authentication": {
            "x509": {"clientCAFile": str(ca_file)},
            "webhook": {"enabled": True},
            "anonymous": {"enabled": False},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": "cluster.local",
        # No cluster DNS, and not the host's resolvers either (pods reach only
        # their bridge): pods get an empty resolv.conf.
        "resolvConf": "",
        # No iptables chains of the kubelet's own on this shared machine.
        "makeIPTablesUtilChains": False,
        # The sandbox shares the machine's disk with everything else: evict only
        # when it is really full, and never garbage-collect loaded images.
        "evictionHard": {"nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "nodeStatusReportFrequency": "10s",
        "serializeImagePulls": False,
        "maxPods": 110,
    }


def kubelet_kubeconfig(server: str, ca_file: Path, cert: Path, key: Path, user: str) -> str:
    """The kubelet's kubeconfig with its node client certificate embedded (JSON is YAML)."""

    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "nmo-sandbox",
                "cluster": {"server": server, "certificate-authority-data": b64(ca_file)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)},
            }
        ],
        "contexts": [{"name": "nmo-sandbox", "context": {"cluster": "nmo-sandbox", "user": user}}],
        "current-context": "nmo-sandbox",
    }
    return json.dumps(config, indent=2) + "\n"


def containerd_command(node: RealNode) -> list[str]:
    return [shutil.which("containerd") or "containerd", f"--config={node.containerd_config}"]


# Images come from `nmo-sandbox load`, never from a registry: every pull goes
# to a closed loopback port and fails at once, so a pod naming an image that
# is not loaded sends nothing off this machine (it shows ErrImagePull).
NO_PULL_PROXY = "http://127.0.0.1:9"


def containerd_env() -> dict[str, str]:
    """containerd's environment: registry traffic to a dead loopback proxy."""
    return {
        "HTTP_PROXY": NO_PULL_PROXY,
        "HTTPS_PROXY": NO_PULL_PROXY,
        "http_proxy": NO_PULL_PROXY,
        "https_proxy": NO_PULL_PROXY,
        "NO_PROXY": "",
        "no_proxy": "",
    }


def kubelet_command(kubelet: Path, node: RealNode, *, node_ip: str) -> list[str]:
    key, value = REAL_NODE_LABEL
    return [
        str(kubelet),
        f"--config={node.kubelet_config}",
        f"--kubeconfig={node.kubeconfig}",
        f"--root-dir={node.kubelet_root}",
        f"--cert-dir={node.pki_dir}",
        f"--hostname-override={node.name}",
        f"--node-ip={node_ip}",
        f"--node-labels={key}={value},nmo-sandbox/real-node=true",
        f"--volume-plugin-dir={node.volume_plugin_dir}",
    ]


def prepare_dirs(node: RealNode) -> None:
    for d in (
        node.dir,
        node.containerd_root,
        node.containerd_state,
        node.runc_root,
        node.cni_conf_dir,
        node.ipam_dir,
        node.opt_dir,
        node.kubelet_root,
        node.pod_logs,
        node.volume_plugin_dir,
        node.pki_dir,
    ):
        d.mkdir(parents=True, exist_ok=True)
