"""Remove everything real nodes leave behind once kubelet and containerd are gone.

Works from the directory alone (and the bridge name in the state file), so it
also cleans a sandbox whose Python process was SIGKILLed: the containerd
shims re-parent to init in sessions of their own and outlive everything,
containers keep running under them, and the mounts and network namespaces
stay. In order:

1. every container in the nodes' runc roots (``DIR/real/*/runc/k8s.io``) is
   force-deleted with ``runc delete --force`` (kills it, removes its cgroups);
2. every ``containerd-shim-runc-v2`` whose ``-address`` is a socket under
   ``DIR`` is SIGKILLed and its socket in ``/run/containerd/s/`` removed;
3. every mount below ``DIR`` (overlay root filesystems, pod shm, the network
   namespaces kept under the containerd state dir, the kubelet's tmpfs
   volumes) is detached, deepest first, which frees the namespaces and their
   veths;
4. the containers' cgroups (``/k8s.io/<id>``) still there are removed, the
   bridge and any veth still on it are deleted, and the CNI result cache
   entries of its pods (``/var/lib/cni/results/<network>-<id>-<ifname>``) removed;
5. the kubelet's device-plugin socket, the one path outside ``DIR`` a kubelet
   insists on, is removed once no kubelet runs on the machine any more.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nmo_sandbox.errors import SandboxError
from nmo_sandbox.network import delete_bridge

__all__ = ["Shim", "find_shims", "mounts_under", "teardown_real_nodes"]

_MNT_DETACH = 2
_SHIM_SOCKET_DIR = Path("/run/containerd/s")
_CNI_CACHE = Path("/var/lib/cni/results")
_CGROUP_ROOT = Path("/sys/fs/cgroup")
_DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
_NAMESPACE = "k8s.io"  # containerd's CRI namespace: its cgroup parent by default


@dataclass(frozen=True)
class Shim:
    pid: int
    namespace: str
    id: str
    address: str

    @property
    def socket(self) -> Path:
        """Where containerd 1.6 puts this shim's socket: sha256 of address/ns/id."""
        digest = hashlib.sha256(os.path.join(self.address, self.namespace, self.id).encode())
        return _SHIM_SOCKET_DIR / digest.hexdigest()


def teardown_real_nodes(base: Path, bridge: str | None) -> None:
    """Remove containers, shims, mounts, namespaces and the bridge of ``base`` (DIR/real)."""
    base = base.resolve()
    ids = _sandbox_ids(base)
    for root in sorted(base.glob("*/runc/*")):
        _delete_containers(root)
    shims = find_shims(base)
    for shim in shims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(shim.pid, signal.SIGKILL)
    _wait_gone([s.pid for s in shims], timeout=5.0)
    for shim in shims:
        shim.socket.unlink(missing_ok=True)
    for root in sorted(base.glob("*/runc/*")):
        _delete_containers(root)  # anything a dying shim restarted meanwhile
    _unmount_all(base)
    _remove_cgroups(ids)
    _remove_device_plugin_socket()
    if bridge:
        delete_bridge(bridge)
    if _CNI_CACHE.is_dir():
        for entry in _CNI_CACHE.iterdir():
            if (bridge and entry.name.startswith(f"{bridge}-")) or any(
                f"-{i}-" in entry.name for i in ids
            ):
                entry.unlink(missing_ok=True)
        for d in (_CNI_CACHE, _CNI_CACHE.parent):
            with contextlib.suppress(OSError):
                d.rmdir()  # only when empty (libcni makes them again as needed)
    left = mounts_under(base)
    if left:
        raise SandboxError(
            f"mounts still below {base} after unmounting: {', '.join(left[:5])}; "
            "remove them with `umount -l` before deleting the directory"
        )


def find_shims(base: Path) -> list[Shim]:
    """containerd shims whose ``-address`` is a containerd socket below ``base``."""
    prefix = str(base.resolve()) + "/"
    found: list[Shim] = []
    for pid, argv in _processes():
        if not argv or not os.path.basename(argv[0]).startswith("containerd-shim"):
            continue
        opts = _flags(argv[1:])
        address = opts.get("-address", "")
        if address.startswith(prefix):
            found.append(Shim(pid, opts.get("-namespace", ""), opts.get("-id", ""), address))
    return found


def mounts_under(base: Path) -> list[str]:
    """Mount points strictly below ``base``, deepest first."""
    prefix = str(base.resolve()) + "/"
    points: list[str] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            if len(fields) > 4:
                point = _unescape(fields[4])
                if point.startswith(prefix):
                    points.append(point)
    return sorted(set(points), key=lambda p: (-p.count("/"), p))


def _sandbox_ids(base: Path) -> set[str]:
    """Pod sandbox and container ids the nodes' containerd state knows of."""
    ids: set[str] = set()
    for pattern in (
        "*/state/io.containerd.runtime.v2.task/*/*",
        "*/state/io.containerd.grpc.v1.cri/sandboxes/*",
    ):
        ids.update(p.name for p in base.glob(pattern))
    return ids


def _delete_containers(root: Path) -> None:
    """``runc delete --force`` every container recorded in one runc root."""
    if not root.is_dir():
        return
    for entry in root.iterdir():
        if (entry / "state.json").is_file():
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(
                    ["runc", "--root", str(root), "delete", "--force", entry.name],
                    capture_output=True,
                    timeout=30,
                )


def _remove_cgroups(ids: set[str]) -> None:
    """Remove the containers' (now empty) cgroups ``/k8s.io/<id>`` in every hierarchy.

    ``runc delete`` removes them; this catches containers whose runc state was lost.
    """
    for hierarchy in _CGROUP_ROOT.iterdir():
        for cid in ids:
            with contextlib.suppress(OSError):
                (hierarchy / _NAMESPACE / cid).rmdir()


def _remove_device_plugin_socket() -> None:
    """Remove the kubelet's device-plugin socket once no kubelet runs on the machine.

    Its path is hard-coded in the kubelet (``/var/lib/kubelet/device-plugins/``,
    not below ``--root-dir``), so every real node of every sandbox shares it.
    """
    if any(os.path.basename(argv[0]) == "kubelet" for _, argv in _processes() if argv):
        return
    sock = _DEVICE_PLUGINS / "kubelet.sock"
    if sock.is_socket():
        sock.unlink(missing_ok=True)
    for d in (_DEVICE_PLUGINS, _DEVICE_PLUGINS.parent):
        with contextlib.suppress(OSError):
            d.rmdir()  # only when empty: nothing else's files are touched


def _unmount_all(base: Path) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(5):  # stacked mounts show one at a time
        points = mounts_under(base)
        if not points:
            return
        for point in points:
            libc.umount2(point.encode(), _MNT_DETACH)


def _processes() -> Iterator[tuple[int, list[str]]]:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        yield int(entry.name), [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _flags(args: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, arg in enumerate(args):
        if arg.startswith("-") and i + 1 < len(args):
            out[arg] = args[i + 1]
    return out


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _wait_gone(pids: list[int], *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]
        if pids:
            time.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2 :].startswith(("Z", "X"))
