"""A real Kubernetes control plane with kwok nodes, for tests, demos and benchmarks.

Public surface (everything else in this package is an implementation detail)::

    async with Sandbox(dir, nodes=3) as sb:      # or: await sb.start() / sb.stop()
        async with sb.client() as http: ...       # httpx, admin client certificate
        await sb.kubectl("get", "nodes")
    Sandbox(dir, nodes=1, real_nodes=1)          # + real-1: kubelet, containerd, bridge
        await sb.load_image("localhost/nmo:dev")  # containers-storage -> real nodes
    Sandbox(dir, cert_manager=True)              # + cert-manager controller, cainjector

    up(dir, nodes, real_nodes=M) / down(dir) / env(dir) / load_image(dir, ref)   # CLI

The binaries come from ``make sandbox-bin`` (see :mod:`nmo_sandbox.binaries`),
cert-manager's from ``make cert-manager-bin`` (:mod:`nmo_sandbox.certmanager`).
A Prometheus server beside it (``running_prometheus``, with rule files and
scrape configs) and the chart's alert rules are :mod:`nmo_sandbox.prometheus`'s
(``make prometheus-bin``).
This package never imports kr8s: it is the cluster nmo is tested against, not
a client of nmo's boundary.
"""

from nmo_sandbox.binaries import Binaries, find_binaries
from nmo_sandbox.cluster import Sandbox, down, env, load_image, up
from nmo_sandbox.errors import (
    ComponentError,
    MissingBinariesError,
    SandboxAlreadyRunningError,
    SandboxError,
    SandboxNotRunningError,
)
from nmo_sandbox.pki import PKI, ServingCert, generate_pki, issue_serving_cert

__all__ = [
    "PKI",
    "Binaries",
    "ComponentError",
    "MissingBinariesError",
    "Sandbox",
    "SandboxAlreadyRunningError",
    "SandboxError",
    "SandboxNotRunningError",
    "ServingCert",
    "down",
    "env",
    "find_binaries",
    "generate_pki",
    "issue_serving_cert",
    "load_image",
    "up",
]
