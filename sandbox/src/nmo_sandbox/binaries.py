"""Find the cached control-plane binaries the sandbox runs.

The binaries are never committed: ``hack/sandbox-bin.sh`` (``make sandbox-bin``)
builds them from their Go modules into a per-version cache directory. This
module finds that directory the same way the script does, so Python and the
script can never disagree, and fails with a message that says how to build the
binaries when one is missing.

Resolution order: ``$NMO_SANDBOX_BIN``; else ``hack/sandbox-bin.sh --print-dir``
from the repository root (when running from a checkout); else the script's
formula, ``${NMO_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/nmo}/sandbox/<versions>/bin``.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from nmo_sandbox.errors import MissingBinariesError

__all__ = [
    "BINARIES",
    "REAL_NODE_BINARIES",
    "VERSIONS",
    "Binaries",
    "MissingBinariesError",
    "cache_root",
    "find_binaries",
    "repo_root",
]

VERSIONS = {"k8s": "v1.35.4", "etcd": "v3.6.16", "kwok": "v0.8.0", "helm": "v3.20.2"}
BINARIES = (
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "etcd",
    "kwok",
    "helm",
)
# Built by the same script, needed only by a sandbox with real nodes, so a
# cache from before they existed still runs kwok-only sandboxes.
REAL_NODE_BINARIES = ("kubelet",)
_SCRIPT = Path("hack") / "sandbox-bin.sh"


@dataclass(frozen=True)
class Binaries:
    """The cache directory and the paths of the tools in it."""

    bin_dir: Path

    def path(self, name: str) -> Path:
        return self.bin_dir / name

    @property
    def kwok_stage_dir(self) -> Path:
        """kwok's shipped kustomize stage sets, copied beside ``bin/`` by the build."""
        return self.bin_dir.parent / "kwok-stage"

    def missing(self) -> list[str]:
        out = [b for b in BINARIES if not os.access(self.path(b), os.X_OK)]
        if not self.kwok_stage_dir.is_dir():
            out.append("../kwok-stage/")
        return out

    def check(self) -> Binaries:
        """Return self, or raise :class:`MissingBinariesError` naming what is missing."""
        missing = self.missing()
        if missing:
            raise MissingBinariesError(
                f"sandbox binaries missing in {self.bin_dir}: {', '.join(missing)}. "
                "Build them with `make sandbox-bin` (or `hack/sandbox-bin.sh`); the first "
                "build takes tens of minutes and is cached per version."
            )
        return self

    def check_real_nodes(self) -> Binaries:
        """Return self, or raise naming the missing kubelet and how to build it."""
        missing = [b for b in REAL_NODE_BINARIES if not os.access(self.path(b), os.X_OK)]
        if missing:
            raise MissingBinariesError(
                f"real nodes need {', '.join(missing)}, missing in {self.bin_dir}. "
                "Build it with `make sandbox-bin` (or `hack/sandbox-bin.sh`; about a minute "
                "when the other Kubernetes binaries are already cached)."
            )
        return self


def repo_root() -> Path | None:
    """The checkout this module runs from, if it is one (has hack/sandbox-bin.sh)."""
    for parent in Path(__file__).resolve().parents:
        if (parent / _SCRIPT).is_file():
            return parent
    return None


def cache_root() -> Path:
    """``${NMO_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/nmo}``, as the script computes it."""
    root = os.environ.get("NMO_CACHE_DIR")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "nmo")
    return Path(root)


def default_bin_dir() -> Path:
    """The cache path ``hack/sandbox-bin.sh`` uses, computed without running it."""
    v = VERSIONS
    tag = f"k8s-{v['k8s']}-etcd-{v['etcd']}-kwok-{v['kwok']}-helm-{v['helm']}"
    return cache_root() / "sandbox" / tag / "bin"


def find_binaries(*, check: bool = True) -> Binaries:
    """Locate the sandbox binaries; with ``check`` raise if any is missing."""
    override = os.environ.get("NMO_SANDBOX_BIN")
    if override:
        found = Binaries(Path(override).expanduser().resolve())
    else:
        found = Binaries(script_bin_dir(_SCRIPT) or default_bin_dir())
    return found.check() if check else found


def script_bin_dir(script: Path) -> Path | None:
    """The directory a build script (``hack/<x>-bin.sh --print-dir``) caches its
    binaries in, when running from a checkout that has it; else None."""
    root = repo_root()
    if root is None or not (root / script).is_file():
        return None
    try:
        res = subprocess.run(
            ["bash", str(root / script), "--print-dir"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    line = res.stdout.strip().splitlines()
    return Path(line[-1]) if line else None
