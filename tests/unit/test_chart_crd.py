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


def test_drain_fields_keep_their_shape_in_the_schema() -> None:
    """Maps keep their keys (a structural schema prunes unknown properties) and
    bounds reach the apiserver."""
    version = crd()["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    drain = spec["drain"]["properties"]
    assert drain["timeoutSeconds"] == {**drain["timeoutSeconds"], "type": "integer", "minimum": 0}
    assert drain["onTimeout"]["enum"] == ["Report", "Delete", "Abort"]
    labels = drain["podSelector"]["properties"]["matchLabels"]
    assert labels["type"] == "object" and labels["additionalProperties"] == {"type": "string"}
    assert "properties" not in labels
    columns = {col["name"]: col for col in version["additionalPrinterColumns"]}
    assert columns["Drain"]["jsonPath"] == '.status.conditions[?(@.type=="Drained")].reason'
    assert list(columns)[:5] == ["Node", "Phase", "Progress", "Drain", "Reason"]


def test_node_name_is_immutable_in_the_schema() -> None:
    """A CEL transition rule, so an UPDATE is refused even where the webhook's
    UPDATE rule fails open (before 1.28) or no webhook is installed."""
    version = crd()["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["nodeName"]["x-kubernetes-validations"] == [
        {"rule": "self == oldSelf", "message": "updating spec.NodeName isn't allowed"}
    ]
