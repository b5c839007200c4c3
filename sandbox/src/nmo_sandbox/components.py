"""How each control-plane component of the sandbox is configured.

Pure data: the directory layout of a sandbox, the ports it uses, the command
line of every component and the files they read (kubeconfig, audit policy,
kwok stages). Nothing here starts a process, so the flags can be read and
tested on their own; :mod:`nmo_sandbox.cluster` runs them.

The flags follow controller-runtime's envtest and kwokctl's binary runtime,
trimmed to one machine: everything binds to 127.0.0.1, one throw-away CA,
admin client-certificate auth for every component, no leader election.

kwok also plays the kubelet of every kwok node for ``kubectl logs`` and ``kubectl
exec`` (see :mod:`nmo_sandbox.kwok_api`): it serves the kubelet API on
``127.0.0.1:<ports.kwok>`` with the apiserver's 127.0.0.1 certificate, and
gives every node that address (``--node-ip``) and port (``--node-port``,
written to ``status.daemonEndpoints``). The apiserver dials a node's
InternalIP, verifies it against the sandbox CA and authenticates with the
admin client certificate, as kubeadm's apiserver-kubelet-client does.
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from nmo_sandbox.binaries import Binaries
from nmo_sandbox.kwok_api import KINDS as KWOK_KINDS
from nmo_sandbox.pki import PKI

__all__ = [
    "COMPONENTS",
    "KWOK_NODE_ANNOTATION",
    "NODE_IP",
    "POD_CIDR",
    "SERVICE_CIDR",
    "Layout",
    "Ports",
    "command",
    "component_env",
    "kubeconfig_yaml",
    "stage_files",
    "token_kubeconfig_yaml",
    "write_audit_policy",
]

# Start order; stop order is the reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
# Every kwok node's InternalIP: where the apiserver finds kwok's kubelet API.
NODE_IP = "127.0.0.1"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
_STAGES_DIR = Path(__file__).parent / "stages"

AUDIT_LOG_MAX_MB = 1 << 20  # 1 TiB: in practice, never rotated

# Log request metadata (user, user agent, verb, resource, status) for every
# request, once per request: the ResponseComplete stage only.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Metadata
"""


@dataclass(frozen=True)
class Layout:
    """Where a sandbox keeps its files, all below one directory."""

    dir: Path

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def pki_dir(self) -> Path:
        return self.dir / "pki"

    @property
    def logs_dir(self) -> Path:
        return self.dir / "logs"

    @property
    def etcd_dir(self) -> Path:
        return self.dir / "etcd"

    @property
    def run_dir(self) -> Path:
        """Scratch space the components insist on having (cert dirs, kwok workdir)."""
        return self.dir / "run"

    @property
    def real_dir(self) -> Path:
        """Real nodes' containerd, kubelet, mounts and network namespaces (realnodes.py)."""
        return self.dir / "real"

    @property
    def audit_policy(self) -> Path:
        return self.dir / "audit-policy.yaml"

    @property
    def audit_log(self) -> Path:
        return self.logs_dir / "audit.log"

    def log(self, component: str) -> Path:
        return self.logs_dir / f"{component}.log"

    def owned(self) -> list[Path]:
        """Every path the sandbox creates in ``dir`` (what ``down`` removes)."""
        return [
            self.state_file,
            self.kubeconfig,
            self.pki_dir,
            self.logs_dir,
            self.etcd_dir,
            self.run_dir,
            self.real_dir,
            self.audit_policy,
        ]


@dataclass(frozen=True)
class Ports:
    """The loopback ports of one sandbox."""

    etcd: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int  # kwok's kubelet API (kubectl logs/exec)

    def to_json(self) -> dict[str, int]:
        return asdict(self)


def command(name: str, *, bins: Binaries, layout: Layout, ports: Ports, pki: PKI) -> list[str]:
    """The full command line of component ``name`` (one of :data:`COMPONENTS`)."""
    kubeconfig = str(layout.kubeconfig)
    if name == "etcd":
        client = f"http://127.0.0.1:{ports.etcd}"
        peer = f"http://127.0.0.1:{ports.etcd_peer}"
        return [
            str(bins.path("etcd")),
            "--name=sandbox",
            f"--data-dir={layout.etcd_dir}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=sandbox={peer}",
            "--initial-cluster-state=new",
            "--unsafe-no-fsync=true",
            "--auto-compaction-retention=1",
            "--quota-backend-bytes=8589934592",
            "--log-level=warn",
        ]
    if name == "kube-apiserver":
        return [
            str(bins.path("kube-apiserver")),
            f"--etcd-servers=http://127.0.0.1:{ports.etcd}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={ports.apiserver}",
            f"--cert-dir={layout.run_dir / 'kube-apiserver'}",
            f"--tls-cert-file={pki.serving_cert_file}",
            f"--tls-private-key-file={pki.serving_key_file}",
            f"--client-ca-file={pki.ca_file}",
            "--authorization-mode=Node,RBAC",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-account-key-file={pki.sa_pub_file}",
            f"--service-account-signing-key-file={pki.sa_key_file}",
            "--allow-privileged=true",
            "--endpoint-reconciler-type=none",
            # Webhook (and aggregated API) Services resolve to an endpoint's pod IP
            # instead of the ClusterIP: there is no kube-proxy.
            "--enable-aggregator-routing=true",
            # kubectl logs/exec: the apiserver calls kwok as each node's kubelet.
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-certificate-authority={pki.ca_file}",
            f"--kubelet-client-certificate={pki.admin_cert_file}",
            f"--kubelet-client-key={pki.admin_key_file}",
            f"--audit-policy-file={layout.audit_policy}",
            f"--audit-log-path={layout.audit_log}",
            # Never rotated: 0 is not "no limit" but lumberjack's default of
            # 100 MB, which a big benchmark cluster passes within minutes, and
            # a reader holding the old file then never sees the next request.
            f"--audit-log-maxsize={AUDIT_LOG_MAX_MB}",
            "--profiling=false",
        ]
    if name == "kube-controller-manager":
        return [
            str(bins.path("kube-controller-manager")),
            *_client_flags(kubeconfig),
            *_serving_flags(layout, "kube-controller-manager", ports.controller_manager, pki),
            "--controllers=*",
            "--leader-elect=false",
            f"--root-ca-file={pki.ca_file}",
            f"--service-account-private-key-file={pki.sa_key_file}",
            "--use-service-account-credentials=false",
            f"--cluster-signing-cert-file={pki.ca_file}",
            f"--cluster-signing-key-file={pki.ca_key_file}",
            # Defaults (20/30) make a ReplicaSet of 1000 pods take about a minute.
            "--kube-api-qps=200",
            "--kube-api-burst=400",
        ]
    if name == "kube-scheduler":
        return [
            str(bins.path("kube-scheduler")),
            *_client_flags(kubeconfig),
            *_serving_flags(layout, "kube-scheduler", ports.scheduler, pki),
            "--leader-elect=false",
            "--kube-api-qps=200",
            "--kube-api-burst=400",
        ]
    if name == "kwok":
        annotation = "=".join(KWOK_NODE_ANNOTATION)
        return [
            str(bins.path("kwok")),
            f"--kubeconfig={kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={annotation}",
            "--node-lease-duration-seconds=40",
            f"--cidr={POD_CIDR}",
            f"--node-ip={NODE_IP}",
            f"--node-port={ports.kwok}",
            f"--server-address={NODE_IP}:{ports.kwok}",
            f"--tls-cert-file={pki.serving_cert_file}",
            f"--tls-private-key-file={pki.serving_key_file}",
            f"--enable-crds={','.join(KWOK_KINDS)}",
            *(f"--config={p}" for p in stage_files(bins)),
        ]
    raise ValueError(f"unknown sandbox component {name!r}")


def component_env(name: str, layout: Layout) -> dict[str, str]:
    """Extra environment of a component."""
    if name == "kwok":
        # Keep kwok from also loading ~/.kwok/kwok.yaml.
        return {"KWOK_WORKDIR": str(layout.run_dir / "kwok")}
    return {}


def stage_files(bins: Binaries) -> list[Path]:
    """kwok stages: its shipped ``fast`` node stages plus nmo's own pod stages.

    nmo's pod-delete waits for the pod's grace period (see stages/pod-delete.yaml).
    """
    node = [
        bins.kwok_stage_dir / "node" / "fast" / "node-initialize.yaml",
        bins.kwok_stage_dir / "node" / "heartbeat-with-lease" / "node-heartbeat-with-lease.yaml",
    ]
    return [*node, *sorted(_STAGES_DIR.glob("*.yaml"))]


def token_kubeconfig_yaml(server: str, ca_file: Path, user: str, token: str) -> str:
    """A kubeconfig that authenticates with a bearer token (JSON is valid YAML)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "nmo-sandbox",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_file.read_bytes()).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "nmo-sandbox", "context": {"cluster": "nmo-sandbox", "user": user}}],
        "current-context": "nmo-sandbox",
    }
    return json.dumps(config, indent=2)


def kubeconfig_yaml(server: str, pki: PKI, *, user: str = "nmo-admin") -> str:
    """An admin kubeconfig with the CA and client certificate embedded.

    JSON is valid YAML, so no YAML writer is needed.
    """

    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "nmo-sandbox",
                "cluster": {"server": server, "certificate-authority-data": b64(pki.ca_file)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(pki.admin_cert_file),
                    "client-key-data": b64(pki.admin_key_file),
                },
            }
        ],
        "contexts": [{"name": "nmo-sandbox", "context": {"cluster": "nmo-sandbox", "user": user}}],
        "current-context": "nmo-sandbox",
        "preferences": {},
    }
    return json.dumps(config, indent=2) + "\n"


def write_audit_policy(layout: Layout) -> None:
    layout.audit_policy.write_text(AUDIT_POLICY)


def _client_flags(kubeconfig: str) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
    ]


def _serving_flags(layout: Layout, name: str, port: int, pki: PKI) -> list[str]:
    # The apiserver's 127.0.0.1 certificate lets /healthz be checked against the CA.
    return [
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={layout.run_dir / name}",
        f"--tls-cert-file={pki.serving_cert_file}",
        f"--tls-private-key-file={pki.serving_key_file}",
    ]
