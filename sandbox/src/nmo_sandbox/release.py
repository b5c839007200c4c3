"""The chart installed in-cluster on the sandbox, as a user installs it.

Shared by ``nmo-sandbox demo`` and the in-cluster tests, so both install the
same way: the image from ``make image`` (``hack/image.sh``), loaded into the
sandbox's containerd, and the chart with its defaults except

* the image: ``localhost/nmo:dev`` with ``pullPolicy: Never`` (there is no
  registry; the image is already in the node's containerd), and
* a ``nodeSelector`` for the real nodes: the chart only *prefers*
  control-plane nodes, so without it the scheduler may place a replica on a
  kwok node, which merely pretends to run it.
"""

from __future__ import annotations

import time
from pathlib import Path

from nmo.api import constants as c
from nmo_sandbox.errors import SandboxError
from nmo_sandbox.process import run_command

__all__ = [
    "CHART",
    "IMAGE_SCRIPT",
    "RELEASE",
    "ImageBuild",
    "ensure_image",
    "install_args",
]

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "node-maintenance-operator"
IMAGE_SCRIPT = REPO / "hack" / "image.sh"
RELEASE = "nmo"


class ImageBuild:
    """The image reference and how long building (or reusing) it took."""

    def __init__(self, ref: str, seconds: float) -> None:
        self.ref = ref
        self.seconds = seconds


async def ensure_image(*, timeout: float = 1800.0) -> ImageBuild:
    """Build ``localhost/nmo:dev`` (or reuse the cached build) like ``make image``."""
    if not IMAGE_SCRIPT.exists():
        raise SandboxError(f"{IMAGE_SCRIPT} is missing: the operator image cannot be built")
    started = time.monotonic()
    built = await run_command([str(IMAGE_SCRIPT)], cwd=REPO, timeout=timeout)
    if built.returncode != 0:
        tail = (built.stderr or built.stdout).strip()[-2000:]
        raise SandboxError(
            f"make image (hack/image.sh) failed with exit {built.returncode}:\n{tail}"
        )
    printed = await run_command([str(IMAGE_SCRIPT), "--print-ref"], cwd=REPO, timeout=60)
    lines = printed.stdout.strip().splitlines()
    if printed.returncode != 0 or not lines:
        raise SandboxError(f"hack/image.sh --print-ref failed: {printed.stderr.strip()}")
    return ImageBuild(lines[-1].strip(), time.monotonic() - started)


def install_args(ref: str) -> list[str]:
    """``helm install`` arguments: the release, the chart, and the values the sandbox forces."""
    repository, _, tag = ref.rpartition(":")
    if not repository or "/" in tag:
        raise SandboxError(f"image reference {ref!r} has no tag")
    return [
        RELEASE, str(CHART), "-n", c.OPERATOR_NAMESPACE, "--create-namespace",
        "--set", f"image.repository={repository}",
        "--set", f"image.tag={tag}",
        "--set", "image.pullPolicy=Never",
        # Every real node carries type=real, every kwok node type=kwok.
        "--set-string", "deployment.nodeSelector.type=real",
    ]  # fmt: skip
