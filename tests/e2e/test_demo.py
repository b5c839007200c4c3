"""End to end: ``nmo-sandbox demo`` is the README's main-job command and must pass.

It builds (or reuses) the image, starts its own sandbox with a real node and
cert-manager, installs the Helm chart in-cluster, shows the webhook refusing
a bad CR through its Service, drains a node behind a PDB and takes it out of
maintenance, then uninstalls; it exits 0 only if every step behaved.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_make_demo_story_passes() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "nmo_sandbox.cli", "demo"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "every step behaved" in out
    for step in (
        "localhost/nmo:dev ready in",
        "loaded into real-1's containerd",
        "chart installed in",
        "2 replicas Ready through the kubelet's /readyz probe",
        "leader: node-maintenance-operator-controller-manager-",
        "tls.crt",
        "refused, nothing created",
        "phase=Succeeded progress=100%",
        "is schedulable again",
        "uninstalled, pods gone",
    ):
        assert step in out, f"missing demo step: {step}\n{out[-3000:]}"
