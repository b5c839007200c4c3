"""What goes into a must-gather bundle, as pure functions.

A bundle is handed to people outside the cluster, so it must never carry a
credential. Two defences, because names alone miss too much (``DB_PASS``,
``postgres://user:password@host``, a PEM key in an annotation, ``--token
<value>`` in args):

- collect only what diagnosis needs: pods of other people's workloads are
  cut down to an allow-list of fields (:func:`pod_for_diagnosis`: no env,
  args, command or foreign annotations);
- redact by name *and* by shape in everything written
  (:func:`redact` for objects, :func:`redact_text` for logs, events and
  summaries; :mod:`nmo.ops.redact` says what a secret name and a secret
  shape are): values of keys, env entries, flags (``-p`` too), ``name=value``
  pairs and URL query parameters with a secret name, URL user info, PEM
  blocks, bearer tokens, JWTs and long base64/hex blobs.

Secrets themselves are never read. The other helpers decide which objects
are relevant (PDBs covering pods on maintained nodes, the webhook
configurations of ``vnodemaintenance.kb.io``, maintenance events) and how the
summary reads, so :mod:`nmo.ops.gather` only fetches and writes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nmo.api import constants as c
from nmo.core.maintenance.selectors import selector_matches

# Re-exported: what gather writes with.
from nmo.ops.redact import REDACTED as REDACTED
from nmo.ops.redact import redact as redact
from nmo.ops.redact import redact_text as redact_text

Obj = dict[str, Any]

MAINTENANCE_REASONS = tuple(
    e[0]
    for e in (
        c.EVENT_BEGIN,
        c.EVENT_SUCCEEDED,
        c.EVENT_UNCORDON,
        c.EVENT_REMOVED,
        c.EVENT_FAILED,
    )
)

# Annotations of other people's pods that diagnosis needs (the rest may hold anything).
_KNOWN_ANNOTATIONS = frozenset({c.MIRROR_POD_ANNOTATION, "kubernetes.io/config.source"})
_OWN_ANNOTATION_PREFIX = f"{c.GROUP}/"


def pod_for_diagnosis(pod: Mapping[str, Any]) -> Obj:
    """Only the fields of a workload's pod a drain diagnosis needs.

    metadata: name, namespace, uid, labels, ownerReferences,
    creationTimestamp, deletionTimestamp and nmo's own (or well-known)
    annotations; spec: nodeName, priorityClassName,
    terminationGracePeriodSeconds and the *type* of each volume; status: phase
    and conditions. No env, args, command, images' config or other
    annotations: a pod's spec is its owner's, and may carry anything.
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    out_meta: Obj = {
        k: meta[k]
        for k in (
            "name",
            "namespace",
            "uid",
            "labels",
            "ownerReferences",
            "creationTimestamp",
            "deletionTimestamp",
        )
        if k in meta
    }
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if k in _KNOWN_ANNOTATIONS or str(k).startswith(_OWN_ANNOTATION_PREFIX)
    }
    if annotations:
        out_meta["annotations"] = annotations
    out_spec: Obj = {
        k: spec[k]
        for k in ("nodeName", "priorityClassName", "terminationGracePeriodSeconds")
        if k in spec
    }
    volumes = [
        {"name": v.get("name"), "type": next((k for k in v if k != "name"), "")}
        for v in spec.get("volumes") or []
        if isinstance(v, Mapping)
    ]
    if volumes:
        out_spec["volumes"] = volumes
    out_status: Obj = {k: status[k] for k in ("phase", "conditions") if k in status}
    return {
        "apiVersion": pod.get("apiVersion", "v1"),
        "kind": pod.get("kind", "Pod"),
        "metadata": out_meta,
        "spec": out_spec,
        "status": out_status,
    }


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration (``90s``, ``10m``, ``1h30m``) or plain seconds."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"invalid duration {text!r} (use e.g. 30s, 10m, 2h, 1h30m)")
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


def pdbs_covering(pdbs: list[Obj], pods: list[Obj]) -> list[tuple[Obj, list[str]]]:
    """PDBs that select at least one of ``pods`` (same namespace), with the pods."""
    out: list[tuple[Obj, list[str]]] = []
    for pdb in pdbs:
        ns = (pdb.get("metadata") or {}).get("namespace")
        selector = (pdb.get("spec") or {}).get("selector")
        covered = [
            f"{ns}/{p['metadata']['name']}"
            for p in pods
            if p["metadata"].get("namespace") == ns
            and selector_matches(selector, p["metadata"].get("labels") or {}, null_matches=False)
        ]
        if covered:
            out.append((pdb, covered))
    return out


def our_webhook_configs(configs: list[Obj]) -> list[Obj]:
    """ValidatingWebhookConfigurations that contain ``vnodemaintenance.kb.io``."""
    return [
        cfg
        for cfg in configs
        if any(w.get("name") == c.WEBHOOK_NAME for w in cfg.get("webhooks") or [])
    ]


def maintenance_event(event: Obj, nodes: set[str]) -> bool:
    """An event with a maintenance reason, on a NodeMaintenance, or on a maintained node."""
    obj = event.get("involvedObject") or {}
    return (
        event.get("reason") in MAINTENANCE_REASONS
        or obj.get("kind") == c.KIND
        or (obj.get("kind") == "Node" and obj.get("name") in nodes)
    )


@dataclass
class Item:
    """One thing the bundle tried to collect, and how that went."""

    name: str
    file: str = ""
    status: str = "ok"  # ok | forbidden | not-found | not-served | error
    count: int | None = None
    detail: str = ""

    @property
    def problem(self) -> bool:
        return self.status in ("forbidden", "error")

    def to_json(self) -> Obj:
        return {
            "name": self.name,
            "file": self.file or None,
            "status": self.status,
            "count": self.count,
            "detail": self.detail or None,
        }


def summary_text(meta: Mapping[str, Any], items: list[Item]) -> str:
    """SUMMARY.txt: what was collected, what was not and why."""
    since = meta.get("since")
    lines = [
        f"nmo gather {meta.get('version', '')}",
        f"API server:          {meta.get('server', '')}",
        f"Started:             {meta.get('startedAt', '')}",
        f"Finished:            {meta.get('finishedAt', '')}",
        f"Operator namespace:  {meta.get('operatorNamespace', '')}",
        f"Lease namespace:     {meta.get('leaseNamespace', '')}",
        f"Logs since:          {f'{since:g}s' if since else 'all'}",
        "Secrets are never collected; credential-like values are replaced by <redacted>.",
        "",
    ]
    problems = [i for i in items if i.problem]
    lines.append(
        f"{len(items) - len(problems)} of {len(items)} items collected"
        + (f", {len(problems)} problem(s):" if problems else ".")
    )
    for item in problems:
        lines.append(f"  ! {item.name}: {item.status}: {item.detail}")
    lines.append("")
    width = max((len(i.name) for i in items), default=0)
    for item in items:
        count = f" ({item.count})" if item.count is not None else ""
        where = f" -> {item.file}" if item.file else ""
        note = f"  {item.detail}" if item.detail and not item.problem else ""
        lines.append(f"  {item.name:<{width}}  {item.status}{count}{where}{note}")
    return "\n".join(lines) + "\n"
