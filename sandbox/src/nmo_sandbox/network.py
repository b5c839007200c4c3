"""The Linux bridge of a sandbox's real nodes: its name, subnet and addresses.

Several sandboxes may run on one machine at once (a test session's, a demo's,
a benchmark's), so each gets a bridge of its own, ``nmo-sb<i>`` with subnet
``10.<160+i>.0.0/16``. Creating the bridge is the allocation: the kernel
refuses a second interface of the same name, so two sandboxes starting
together can never take the same index. An index whose subnet overlaps an
address or route already on the machine is skipped.

Inside the subnet: ``.0.1`` is the gateway (the bridge's own address),
``.0.<1+k>`` is the node IP of ``real-k`` (also on the bridge: the kubelet
needs a non-loopback address of this machine, and the apiserver dials it for
``kubectl logs``/``exec``), and ``.<k>.2``-``.<k>.254`` are ``real-k``'s pod
addresses (host-local IPAM, one range per node on the shared bridge).

The bridge's alias records the sandbox directory, so ``down`` (and a human
with ``ip -d link``) can tell whose bridge it is. Masquerading stays off, so
the CNI bridge plugin adds no iptables rules: pods reach only the bridge.

Pods reach the apiserver as in-cluster clients do, at the ``kubernetes``
Service (``10.96.0.1:443``), without kube-proxy: one nat PREROUTING rule of
the sandbox's own (``-i <bridge>``) rewrites that destination to
``127.0.0.1:<apiserver port>``, and ``route_localnet`` on the bridge lets the
kernel route it there. The apiserver's certificate already names 10.96.0.1.
Deleting the bridge deletes that rule too.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nmo_sandbox.errors import SandboxError

__all__ = [
    "KUBERNETES_SERVICE_IP",
    "MAX_REAL_NODES",
    "BridgeNet",
    "allocate_bridge",
    "delete_bridge",
    "expose_apiserver",
    "ip_command",
]

KUBERNETES_SERVICE_IP = "10.96.0.1"  # first address of components.SERVICE_CIDR

MAX_REAL_NODES = 200
_FIRST_OCTET2 = 160
_SLOTS = 64  # 10.160.0.0/16 .. 10.223.0.0/16
_PREFIX = "nmo-sb"


@dataclass(frozen=True)
class BridgeNet:
    """One sandbox's bridge: name, /16 subnet and the addresses derived from it."""

    name: str
    index: int

    @property
    def subnet(self) -> str:
        return f"10.{_FIRST_OCTET2 + self.index}.0.0/16"

    def _host(self, third: int, fourth: int) -> str:
        return f"10.{_FIRST_OCTET2 + self.index}.{third}.{fourth}"

    @property
    def gateway(self) -> str:
        return self._host(0, 1)

    def node_ip(self, k: int) -> str:
        """The node IP of ``real-k`` (k >= 1)."""
        return self._host(0, 1 + k)

    def pod_range(self, k: int) -> tuple[str, str]:
        """First and last pod address of ``real-k``."""
        return self._host(k, 2), self._host(k, 254)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BridgeNet:
        return cls(name=str(data["name"]), index=int(data["index"]))


def ip_command(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS``; a failure with ``check`` raises :class:`SandboxError`."""
    try:
        res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise SandboxError(
            "`ip` (iproute2) is not installed; real nodes need it: apt-get install iproute2"
        ) from None
    if check and res.returncode != 0:
        raise SandboxError(f"ip {' '.join(args)}: {res.stderr.strip()}")
    return res


def allocate_bridge(owner: str, node_count: int) -> BridgeNet:
    """Create a free ``nmo-sb<i>`` bridge, up, with the gateway and ``node_count`` node IPs."""
    if not 1 <= node_count <= MAX_REAL_NODES:
        raise SandboxError(f"real nodes: 1 to {MAX_REAL_NODES}, not {node_count}")
    taken = _networks_in_use()
    for index in range(_SLOTS):
        net = BridgeNet(name=f"{_PREFIX}{index}", index=index)
        subnet = ipaddress.ip_network(net.subnet)
        if any(subnet.overlaps(other) for other in taken):
            continue
        res = ip_command("link", "add", "name", net.name, "type", "bridge", check=False)
        if res.returncode != 0:
            if "exists" in res.stderr:
                continue  # another sandbox's bridge (or one a crash left behind)
            raise SandboxError(f"creating bridge {net.name}: {res.stderr.strip()}")
        try:
            ip_command("link", "set", "dev", net.name, "alias", f"nmo-sandbox {owner}"[:250])
            ip_command("addr", "add", f"{net.gateway}/16", "dev", net.name)
            for k in range(1, node_count + 1):
                ip_command("addr", "add", f"{net.node_ip(k)}/16", "dev", net.name)
            ip_command("link", "set", "dev", net.name, "up")
        except BaseException:
            delete_bridge(net.name)
            raise
        return net
    raise SandboxError(
        f"no free sandbox bridge: {_PREFIX}0..{_PREFIX}{_SLOTS - 1} all exist or overlap "
        "this machine's networks; stop other sandboxes (`nmo-sandbox down --dir DIR`) or "
        f"delete stale bridges (`ip link show type bridge`, names {_PREFIX}*)"
    )


def expose_apiserver(net: BridgeNet, port: int) -> None:
    """Send pods' ``10.96.0.1:443`` to the apiserver on ``127.0.0.1:port``."""
    try:
        Path(f"/proc/sys/net/ipv4/conf/{net.name}/route_localnet").write_text("1\n")
    except OSError as exc:
        raise SandboxError(f"enabling route_localnet on {net.name}: {exc}") from exc
    _iptables("-A", *_dnat_rule(net.name, port))


def delete_bridge(name: str) -> None:
    """Delete the bridge, any veth still attached to it and its nat rule (absent is fine)."""
    for rule in _nat_rules_of(name):
        _iptables("-D", *rule, check=False)
    for port in _ports_of(name):
        ip_command("link", "del", "dev", port, check=False)
    ip_command("link", "del", "dev", name, check=False)


def _dnat_rule(bridge: str, port: int) -> list[str]:
    return [
        "PREROUTING",
        "-i", bridge,
        "-d", f"{KUBERNETES_SERVICE_IP}/32",
        "-p", "tcp",
        "-m", "tcp",
        "--dport", "443",
        "-m", "comment",
        "--comment", f"nmo-sandbox {bridge}",
        "-j", "DNAT",
        "--to-destination", f"127.0.0.1:{port}",
    ]  # fmt: skip


def _nat_rules_of(bridge: str) -> list[list[str]]:
    """The nat PREROUTING rules on ``-i bridge``, as argument lists for ``-D``."""
    res = _iptables("-S", "PREROUTING", check=False)
    rules = []
    for line in res.stdout.splitlines():
        args = shlex.split(line)
        if args[:1] == ["-A"] and f"-i {bridge} " in f"{line} ":
            rules.append(args[1:])
    return rules


def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        res = subprocess.run(
            ["iptables", "-w", "5", "-t", "nat", *args], capture_output=True, text=True, timeout=30
        )
    except FileNotFoundError:
        raise SandboxError(
            "iptables is not installed; real nodes need it: apt-get install iptables"
        ) from None
    if check and res.returncode != 0:
        raise SandboxError(f"iptables -t nat {' '.join(args)}: {res.stderr.strip()}")
    return res


def bridge_exists(name: str) -> bool:
    return ip_command("link", "show", "dev", name, check=False).returncode == 0


def _ports_of(bridge: str) -> Sequence[str]:
    res = ip_command("-j", "link", "show", "master", bridge, check=False)
    if res.returncode != 0 or not res.stdout.strip():
        return []
    return [str(link["ifname"]) for link in json.loads(res.stdout)]


def _networks_in_use() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network on this machine: interface addresses and routes."""
    nets: list[ipaddress.IPv4Network] = []
    addrs = json.loads(ip_command("-j", "-4", "addr").stdout or "[]")
    for link in addrs:
        if str(link.get("ifname", "")).startswith(_PREFIX):
            continue  # other sandboxes' bridges: their names already guard them
        for a in link.get("addr_info", []):
            nets.append(ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False))
    for route in json.loads(ip_command("-j", "-4", "route").stdout or "[]"):
        dst = route.get("dst")
        if dst and dst != "default" and not str(route.get("dev", "")).startswith(_PREFIX):
            nets.append(ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False))
    return nets
