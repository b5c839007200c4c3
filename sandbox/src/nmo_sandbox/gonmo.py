"""The Go NMO's OLM bundle, read from ``../shared/third_party`` when it is needed.

The Go medik8s Node Maintenance Operator's tree is a ``git archive`` snapshot
(``node-maintenance-operator-<commit>.tar.gz``, listed with its checksum in
that directory's ``SHA256SUMS``) that no registry serves. Tests that compare
nmo with the Go NMO's bundle, or install its CSV with nmo's image, read
``bundle/manifests`` and ``bundle/metadata`` from the archive itself, after
checking the checksum as ``hack/cert-manager-bin.sh`` checks its snapshots;
nothing of it is ever copied into the repository. ``NMO_THIRD_PARTY_DIR``
says where the directory is when it is not ``../shared/third_party``.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nmo_sandbox.errors import SandboxError

__all__ = ["COMMIT", "GoBundle", "go_nmo_bundle", "third_party_dir"]

COMMIT = "3a54cd157723cd555ebd792c52e8d363d9df6dd3"  # main after v0.20.0
ARCHIVE = f"node-maintenance-operator-{COMMIT[:8]}.tar.gz"
_REPO = Path(__file__).resolve().parents[3]

Obj = dict[str, Any]


def third_party_dir() -> Path:
    """``$NMO_THIRD_PARTY_DIR``, else ``../shared/third_party`` beside the repository."""
    return Path(os.environ.get("NMO_THIRD_PARTY_DIR") or _REPO.parent / "shared" / "third_party")


@dataclass(frozen=True)
class GoBundle:
    """The Go NMO's bundle: each manifest by file name, and the metadata annotations."""

    manifests: dict[str, Obj]
    annotations: dict[str, str]

    @property
    def csv(self) -> Obj:
        (csv,) = [m for m in self.manifests.values() if m["kind"] == "ClusterServiceVersion"]
        return csv

    @property
    def crd(self) -> Obj:
        (crd,) = [m for m in self.manifests.values() if m["kind"] == "CustomResourceDefinition"]
        return crd

    @property
    def deployment(self) -> Obj:
        """The CSV's one install deployment (``name``, ``label``, ``spec``)."""
        (deployment,) = self.csv["spec"]["install"]["spec"]["deployments"]
        dep: Obj = deployment
        return dep


def _checked(archive: Path) -> None:
    sums = archive.parent / "SHA256SUMS"
    try:
        want = {
            name: digest
            for digest, name in (line.split() for line in sums.read_text().splitlines() if line)
        }.get(archive.name)
        digest = hashlib.sha256()
        with archive.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise SandboxError(
            f"the Go NMO's tree is not readable ({exc}): it comes from ../shared/third_party "
            f"({ARCHIVE} and SHA256SUMS; NMO_THIRD_PARTY_DIR says where else)"
        ) from exc
    if want is None:
        raise SandboxError(f"{sums} lists no checksum for {archive.name}")
    if digest.hexdigest() != want:
        raise SandboxError(
            f"checksum mismatch for {archive}: SHA256SUMS says {want}, the file is "
            f"{digest.hexdigest()} (copy ../shared/third_party again)"
        )


def go_nmo_bundle(third_party: Path | None = None) -> GoBundle:
    """The Go NMO's ``bundle/`` from the checksummed archive (about a second)."""
    archive = (third_party or third_party_dir()) / ARCHIVE
    _checked(archive)
    prefix = f"{ARCHIVE.removesuffix('.tar.gz')}/bundle/"
    manifests: dict[str, Obj] = {}
    annotations: dict[str, str] = {}
    with tarfile.open(archive) as tar:
        seen = False
        for member in tar:
            if not member.name.startswith(prefix):
                if seen:
                    break  # git archive lists a directory's files together
                continue
            seen = True
            path = member.name.removeprefix(prefix)
            if not member.isfile() or not path.endswith(".yaml"):
                continue
            f = tar.extractfile(member)
            assert f is not None
            doc = yaml.safe_load(f.read())
            if path.startswith("manifests/"):
                manifests[path.removeprefix("manifests/")] = doc
            elif path == "metadata/annotations.yaml":
                annotations = {k: str(v) for k, v in doc["annotations"].items()}
    if not manifests or not annotations:
        raise SandboxError(f"{archive} has no bundle/manifests or bundle/metadata")
    return GoBundle(manifests, annotations)
