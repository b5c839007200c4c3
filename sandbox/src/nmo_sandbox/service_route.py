"""The ``kubernetes`` Service for pods on real nodes: what kube-proxy would do for it.

A pod's in-cluster client (nmo's ``--in-cluster``, kr8s, client-go) dials
``KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT``, the cluster IP of
Service ``default/kubernetes`` (the first address of the service range,
``10.96.0.1:443``, which is in the apiserver's certificate). The sandbox runs
no kube-proxy and its apiserver listens on loopback only, so one NAT rule
stands in: TCP from the sandbox's bridge to ``10.96.0.1:443`` is redirected
to ``127.0.0.1:<apiserver port>``. The kernel delivers a redirected packet to
a loopback address only with ``route_localnet`` on the incoming interface,
set on the bridge alone. Traffic stays between the sandbox's pods and this
machine's loopback.

Each rule carries the comment ``nmo-sandbox:<bridge>``: :func:`route` first
drops rules left for the same bridge by a sandbox that died, and
:func:`unroute` removes them (``down`` and ``stop`` call it).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from nmo_sandbox.errors import SandboxError

__all__ = ["KUBERNETES_SERVICE_IP", "route", "rules_for", "unroute"]

KUBERNETES_SERVICE_IP = "10.96.0.1"
KUBERNETES_SERVICE_PORT = 443
_CHAIN = ("-t", "nat")


def _iptables() -> str:
    path = shutil.which("iptables") or next(
        (p for p in ("/usr/sbin/iptables", "/sbin/iptables") if Path(p).exists()), None
    )
    if path is None:
        raise SandboxError(
            "iptables not found: real nodes need it for the kubernetes Service "
            "(Debian/Ubuntu: apt-get install iptables)"
        )
    return path


def _comment(bridge: str) -> str:
    return f"nmo-sandbox:{bridge}"


def _rule(bridge: str, apiserver_port: int) -> list[str]:
    return [
        "PREROUTING", "-i", bridge, "-d", f"{KUBERNETES_SERVICE_IP}/32", "-p", "tcp",
        "--dport", str(KUBERNETES_SERVICE_PORT), "-m", "comment", "--comment", _comment(bridge),
        "-j", "DNAT", "--to-destination", f"127.0.0.1:{apiserver_port}",
    ]  # fmt: skip


def rules_for(bridge: str) -> list[list[str]]:
    """The NAT rules (``iptables -S`` argument lists) tagged for ``bridge``."""
    listed = subprocess.run(
        [_iptables(), *_CHAIN, "-S", "PREROUTING"], capture_output=True, text=True, check=False
    )
    if listed.returncode != 0:
        raise SandboxError(f"iptables -t nat -S failed: {listed.stderr.strip()}")
    tag = _comment(bridge)
    out = []
    for line in listed.stdout.splitlines():
        parts = line.split()
        if parts[:1] == ["-A"] and tag in (p.strip('"') for p in parts):
            out.append([p.strip('"') for p in parts[1:]])
    return out


def route(bridge: str, apiserver_port: int) -> None:
    """Make ``10.96.0.1:443`` reach the apiserver from pods on ``bridge``."""
    unroute(bridge)
    sysctl = Path(f"/proc/sys/net/ipv4/conf/{bridge}/route_localnet")
    try:
        sysctl.write_text("1\n")
    except OSError as exc:
        raise SandboxError(f"cannot set route_localnet on {bridge}: {exc}") from exc
    added = subprocess.run(
        [_iptables(), *_CHAIN, "-A", *_rule(bridge, apiserver_port)],
        capture_output=True,
        text=True,
        check=False,
    )
    if added.returncode != 0:
        raise SandboxError(f"adding the kubernetes Service rule failed: {added.stderr.strip()}")


def unroute(bridge: str) -> None:
    """Remove every rule tagged for ``bridge`` (none is fine)."""
    for rule in rules_for(bridge):
        subprocess.run(
            [_iptables(), *_CHAIN, "-D", *rule], capture_output=True, text=True, check=False
        )
