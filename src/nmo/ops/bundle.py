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
  summaries): values of keys naming a pass/secret/token/key/credential, env
  values whose name does, URL userinfo passwords, PEM blocks, the value after
  ``--token``/``--password``/``--secret``-style flags, bearer tokens, JWTs and
  long base64/hex blobs.

Secrets themselves are never read. The other helpers decide which objects
are relevant (PDBs covering pods on maintained nodes, the webhook
configurations of ``vnodemaintenance.kb.io``, maintenance events) and how the
summary reads, so :mod:`nmo.ops.gather` only fetches and writes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nmo.api import constants as c
from nmo.core.selectors import selector_matches

Obj = dict[str, Any]

REDACTED = "<redacted>"
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

_SECRET_WORD = r"pass(?:word|wd)?|secret|token|key|credential"
_SENSITIVE_KEY = re.compile(rf"{_SECRET_WORD}|auth(?:orization)?$", re.IGNORECASE)
# Names of things, not the things: secretName, tokenSecretRef name, the
# ``key`` of a taint, toleration, selector requirement or secretKeyRef, ...
_NAME_KEY = re.compile(r"(name|ref|path|expirationseconds|audience)s?$|^keys?$", re.IGNORECASE)
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}")
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}")
_KEYVAL = re.compile(
    r"(?i)\b((?:[a-z_]*(?:token|pass(?:word|wd)?|secret|api[-_]?key|private[-_]?key|credential))"
    r"[a-z_]*\"?\s*[=:]\s*)(\"?)[^\s\"',}]{4,}"
)
_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]+-----.*?(?:-----END [A-Z0-9 ]+-----|$)", re.DOTALL)
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s:/@]*:)[^\s@/]+@")
_FLAG = re.compile(rf"(?i)^--?[a-z0-9_-]*(?:{_SECRET_WORD})[a-z0-9_-]*$")
_FLAG_VALUE = re.compile(
    rf"(?i)(?<![\w-])(--?[a-z0-9_-]*(?:{_SECRET_WORD})[a-z0-9_-]*)(=|\s+)(?!-)(\"?)[^\s\"]+"
)
# ``--tls-private-key-file /etc/tls/key.pem`` names where a secret is, not the secret
_FLAG_NAMES_A_THING = re.compile(r"(?i)[-_](file|path|dir|name|ref)$")
_BLOB = re.compile(r"(?<![A-Za-z0-9+/_:-])[A-Za-z0-9+/_-]{40,}={0,2}")
_HEX = re.compile(r"(?<![0-9A-Za-z:])[0-9a-fA-F]{32,}(?![0-9A-Za-z])")


def _blob(match: re.Match[str]) -> str:
    """A long run of base64 with upper, lower and digits looks random: a key,
    not a path or a name (which are lowercase or carry separators)."""
    text = match.group(0)
    mixed = any(ch.isupper() for ch in text) and any(ch.islower() for ch in text)
    return REDACTED if mixed and any(ch.isdigit() for ch in text) else text


def _is_secret_flag(flag: str) -> bool:
    return _FLAG.match(flag) is not None and _FLAG_NAMES_A_THING.search(flag) is None


def _flag_value(match: re.Match[str]) -> str:
    if not _is_secret_flag(match.group(1)):
        return match.group(0)
    return match.group(1) + match.group(2) + match.group(3) + REDACTED


def redact_text(text: str) -> str:
    """Scrub credentials from free text, by shape: PEM blocks, URL passwords,
    JWTs, bearer tokens, ``token=...``-like pairs, secret-looking flag values
    and long random-looking blobs (hex, base64)."""
    text = _PEM.sub(REDACTED, text)
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + "@", text)
    text = _JWT.sub(REDACTED, text)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    text = _FLAG_VALUE.sub(_flag_value, text)
    text = _KEYVAL.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    text = _HEX.sub(REDACTED, text)
    return _BLOB.sub(_blob, text)


def _sensitive(key: str) -> bool:
    return bool(_SENSITIVE_KEY.search(key)) and not _NAME_KEY.search(key)


def redact(value: Any, *, _key: str = "") -> Any:
    """A copy of a collected object with credentials replaced by ``<redacted>``.

    ``metadata.managedFields`` is dropped too: it is bulky and says nothing a
    reader of the bundle needs.
    """
    if isinstance(value, Mapping):
        out: Obj = {}
        env_like = isinstance(value.get("name"), str) and "value" in value
        for k, v in value.items():
            if k == "managedFields":
                continue
            if isinstance(v, str) and _sensitive(str(k)):
                out[k] = REDACTED if v else v
            elif k == "value" and env_like and _sensitive(str(value["name"])) and v:
                out[k] = REDACTED
            else:
                out[k] = redact(v, _key=str(k))
        return out
    if isinstance(value, list):
        items = [redact(v, _key=_key) for v in value]
        # ["--token", "abc"]: the argument after a secret-looking flag is its value
        for i in range(1, len(items)):
            before, this = value[i - 1], items[i]
            flag = isinstance(before, str) and _is_secret_flag(before)
            if flag and isinstance(this, str) and not this.startswith("-"):
                items[i] = REDACTED
        return items
    if isinstance(value, str):
        return _redact_string(value)
    return value


def _redact_string(text: str) -> str:
    """JSON embedded in a string (last-applied-configuration) is redacted as an object."""
    if text[:1] in "{[":
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict | list):
            return json.dumps(redact(parsed), separators=(",", ":"))
    return redact_text(text)


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
