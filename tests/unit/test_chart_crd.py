"""The chart's CRD is the one nmo generates (one source of truth: nmo.api.crd)."""

from __future__ import annotations

from pathlib import Path

import yaml

from nmo.api.crd import crd

RELATIVE = "charts/node-maintenance-operator/crds/nodemaintenance.medik8s.io_nodemaintenances.yaml"
CHART_CRD = Path(__file__).resolve().parents[2] / RELATIVE
REGENERATE = f"regenerate it with: .venv/bin/nmo crd > {RELATIVE}"


def test_chart_crd_is_generated_from_the_models() -> None:
    text = CHART_CRD.read_text()
    assert yaml.safe_load(text) == crd(), f"the chart's CRD is stale; {REGENERATE}"
    assert text == yaml.safe_dump(crd(), sort_keys=False), f"not `nmo crd` output; {REGENERATE}"
