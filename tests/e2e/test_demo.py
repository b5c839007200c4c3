"""End to end: ``nmo-sandbox demo`` is the README's main-job command and must pass.

It starts its own sandbox, installs the Helm chart, runs nmo as the chart's
ServiceAccount, shows the webhook refusing a bad CR, drains a node behind a
PDB and takes it out of maintenance; it exits 0 only if every step behaved.
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
        timeout=300,
        check=False,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "every step behaved" in out
    for step in (
        "chart installed",
        "refused, nothing created",
        "phase=Succeeded progress=100%",
        "is schedulable again",
        "uninstalled",
    ):
        assert step in out, f"missing demo step: {step}\n{out[-3000:]}"
