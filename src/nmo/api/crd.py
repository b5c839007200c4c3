"""The CustomResourceDefinition, generated from the pydantic models.

One source of truth: the schema below is derived from
:class:`nmo.api.models.NodeMaintenanceSpec` and
:class:`nmo.api.models.NodeMaintenanceStatus`; the chart's copy is written by
``nmo crd > charts/.../crds/...`` and a unit test checks the two agree.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from nmo.api import constants as c
from nmo.api.models import NodeMaintenanceSpec, NodeMaintenanceStatus


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline $refs and turn pydantic's JSON schema into a structural one."""
    if "$ref" in schema:
        return _resolve(defs[schema["$ref"].split("/")[-1]], defs)
    if "anyOf" in schema:
        variants = [v for v in schema["anyOf"] if v.get("type") != "null"]
        merged = _resolve(variants[0], defs)
        if "description" in schema:
            merged["description"] = schema["description"]
        for bound in ("minimum", "maximum"):  # an optional number's bound (json_schema_extra)
            if bound in schema and merged.get("type") in {"integer", "number"}:
                merged[bound] = schema[bound]
        return merged
    out: dict[str, Any] = {}
    if "description" in schema:
        out["description"] = schema["description"]
    kind = schema.get("type")
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        out["type"] = "object"  # a map (e.g. matchLabels): keys are kept, not pruned
        out["additionalProperties"] = _resolve(schema["additionalProperties"], defs)
    elif kind == "object" or "properties" in schema:
        out["type"] = "object"
        props = schema.get("properties", {})
        out["properties"] = {name: _resolve(sub, defs) for name, sub in props.items()}
        if schema.get("required"):
            out["required"] = list(schema["required"])
    elif kind == "array":
        out["type"] = "array"
        out["items"] = _resolve(schema["items"], defs)
    elif kind == "string" and "enum" in schema:
        out["type"] = "string"
        out["enum"] = list(schema["enum"])
    elif kind == "string" and schema.get("format") == "date-time":
        out["type"] = "string"
        out["format"] = "date-time"
    elif kind in {"string", "integer", "boolean", "number"}:
        out["type"] = kind
        for bound in ("minLength", "minimum", "maximum"):
            if bound in schema:
                out[bound] = schema[bound]
    elif "enum" in schema:
        out["type"] = "string"
        out["enum"] = list(schema["enum"])
    else:
        raise ValueError(f"unsupported schema fragment: {schema}")
    return out


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A structural OpenAPI v3 schema for a model, by alias."""
    raw = model.model_json_schema(by_alias=True, mode="serialization")
    schema = _resolve(raw, raw.get("$defs", {}))
    schema.pop("description", None)
    return schema


_DRAIN_REASON = f'.status.conditions[?(@.type=="{c.CONDITION_DRAINED}")].reason'


def crd() -> dict[str, Any]:
    """The NodeMaintenance CRD as a Kubernetes object."""
    spec = model_schema(NodeMaintenanceSpec)
    spec["description"] = "NodeMaintenanceSpec defines the desired state of NodeMaintenance"
    # Immutable in the schema too: the webhook says so on UPDATE, but before
    # Kubernetes 1.28 its UPDATE rule fails open (issue 20).
    spec["properties"]["nodeName"]["x-kubernetes-validations"] = [
        {"rule": "self == oldSelf", "message": c.Messages.WEBHOOK_NODENAME_CHANGED}
    ]
    status = model_schema(NodeMaintenanceStatus)
    status["description"] = "NodeMaintenanceStatus defines the observed state of NodeMaintenance"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": c.CRD_NAME},
        "spec": {
            "group": c.GROUP,
            "names": {
                "kind": c.KIND,
                "listKind": c.LIST_KIND,
                "plural": c.PLURAL,
                "singular": c.SINGULAR,
                "shortNames": list(c.SHORT_NAMES),
            },
            "scope": "Cluster",
            "versions": [
                {
                    "name": c.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Node", "type": "string", "jsonPath": ".spec.nodeName"},
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {
                            "name": "Progress",
                            "type": "integer",
                            "jsonPath": ".status.drainProgress",
                            "description": "Drain progress in percent",
                        },
                        {
                            "name": "Drain",
                            "type": "string",
                            "jsonPath": _DRAIN_REASON,
                            "description": "Where the drain stands (reason of the Drained "
                            "condition): Draining, Blocked, WaitingForCompletion, TimedOut "
                            "or Drained",
                        },
                        {"name": "Reason", "type": "string", "jsonPath": ".spec.reason"},
                        {
                            "name": "Error",
                            "type": "string",
                            "jsonPath": ".status.lastError",
                            "priority": 1,
                        },
                        {
                            "name": "Age",
                            "type": "date",
                            "jsonPath": ".metadata.creationTimestamp",
                        },
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "description": "NodeMaintenance is the Schema for the "
                            "nodemaintenances API",
                            "type": "object",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }
