"""Tiny images built here from C: the pause image and a test probe.

No registry is reachable, so ``registry.k8s.io/pause`` cannot be pulled. The
sandbox compiles ``images/pause.c`` (``gcc -static -Os``) and wraps the binary
in a one-layer image ``FROM scratch``, written directly as a docker-archive
tarball (``manifest.json`` + config + layer) that both ``ctr images import``
and ``podman load`` read. No build tool or containers-storage is involved.

Tarballs are cached in ``<nmo cache>/images/<name>-<hash>.tar``, the hash
covering the C source and the compiler flags, so a changed source makes a new
image and an unchanged one is built once per machine (written to a temporary
name, then renamed; the previous source's tarball is removed).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from nmo_sandbox.binaries import cache_root
from nmo_sandbox.errors import SandboxError

__all__ = ["PAUSE", "PROBE", "StaticImage", "build_image"]

_SOURCES = Path(__file__).parent / "images"
_CFLAGS = ("-static", "-Os", "-s", "-Wall", "-Wextra", "-Werror")


@dataclass(frozen=True)
class StaticImage:
    """One static C program as an image: its repository and the binary's name in it."""

    repository: str
    source: str  # file name in nmo_sandbox/images/
    binary: str

    @property
    def tag(self) -> str:
        digest = hashlib.sha256((_SOURCES / self.source).read_bytes())
        digest.update(" ".join(_CFLAGS).encode())
        return digest.hexdigest()[:12]

    @property
    def ref(self) -> str:
        return f"{self.repository}:{self.tag}"


PAUSE = StaticImage("localhost/nmo-sandbox-pause", "pause.c", "pause")
PROBE = StaticImage("localhost/nmo-sandbox-probe", "probe.c", "probe")


def build_image(image: StaticImage, *, cache_dir: Path | None = None) -> Path:
    """The docker-archive tarball of ``image``, built (and cached) if missing."""
    out_dir = cache_dir or cache_root() / "images"
    name = image.repository.rsplit("/", 1)[-1]
    target = out_dir / f"{name}-{image.tag}.tar"
    if target.is_file():
        return target
    gcc = shutil.which("gcc")
    if gcc is None:
        raise SandboxError(
            "gcc is not installed; real nodes build their pause image with it: "
            "apt-get install gcc libc6-dev"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nmo-image-") as tmp:
        binary = Path(tmp) / image.binary
        res = subprocess.run(
            [gcc, *_CFLAGS, "-o", str(binary), str(_SOURCES / image.source)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if res.returncode != 0:
            raise SandboxError(
                f"compiling {image.source} failed (static glibc: apt-get install libc6-dev):\n"
                + res.stderr[-2000:]
            )
        partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        partial.write_bytes(_docker_archive(image, binary.read_bytes()))
        partial.replace(target)
    for old in out_dir.glob(f"{name}-*.tar"):
        if old != target:
            old.unlink(missing_ok=True)  # an earlier source's image
    return target


def _docker_archive(image: StaticImage, binary: bytes) -> bytes:
    layer = _tar({image.binary: (binary, 0o755)})
    layer_digest = hashlib.sha256(layer).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {"Entrypoint": [f"/{image.binary}"], "User": "0"},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
            "history": [
                {"created": "1970-01-01T00:00:00Z", "created_by": f"nmo-sandbox {image.source}"}
            ],
        },
        sort_keys=True,
    ).encode()
    config_name = f"{hashlib.sha256(config).hexdigest()}.json"
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": [image.ref], "Layers": [f"{layer_digest}/layer.tar"]}]
    ).encode()
    return _tar(
        {
            f"{layer_digest}/layer.tar": (layer, 0o644),
            config_name: (config, 0o644),
            "manifest.json": (manifest, 0o644),
        }
    )


def _tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
