"""benchmarks/auditlog.py: the drain benchmarks' counts from the apiserver's audit log.

Requests by verb, status writes per CR and refused evictions are the figures
the benchmarks compare nmo and the Go NMO on; each is counted here from
audit lines shaped as the sandbox's Metadata-level policy writes them.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "benchmarks" / "auditlog.py"


@pytest.fixture(scope="module")
def auditlog() -> ModuleType:
    spec = importlib.util.spec_from_file_location("auditlog", SOURCE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["auditlog"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def event(agent: str, verb: str, resource: str, sub: str | None = None, code: int = 200) -> str:
    ref: dict[str, Any] = {"resource": resource, "namespace": "ns", "name": "x"}
    if sub:
        ref["subresource"] = sub
    return json.dumps(
        {
            "kind": "Event",
            "level": "Metadata",
            "stage": "ResponseComplete",
            "verb": verb,
            "userAgent": agent,
            "objectRef": ref,
            "responseStatus": {"metadata": {}, "code": code},
        }
    )


GO = "go-nmo-manager/v0.0.0 (linux/amd64) kubernetes/$Format"
NMO = "nmo/0.1.0"
LINES = [
    event(GO, "update", "nodemaintenances"),  # the finalizer: not a status write
    event(GO, "update", "nodemaintenances", "status"),
    event(GO, "create", "pods", "eviction", 201),
    event(GO, "create", "pods", "eviction", 429),
    event(GO, "create", "pods", "eviction", 429),
    event(GO, "create", "pods", "eviction", 404),
    event(GO, "update", "nodemaintenances", "status", 409),  # a conflict is still a write
    event(NMO, "patch", "nodemaintenances", "status"),
    event(NMO, "create", "pods", "eviction", 201),
    event(NMO, "create", "pods", "eviction", 409),
    event(NMO, "get", "nodemaintenances", "status"),  # a read, not a write
    event(NMO, "list", "pods"),
    event("kubectl/v1.35.4", "create", "pods", "eviction", 201),
]


def test_a_tally_per_user_agent(auditlog: ModuleType) -> None:
    requests = [auditlog.parse_line(line) for line in LINES]
    go = auditlog.tally(requests, "go-nmo-manager/")
    assert go.requests == 7
    assert go.by_verb == {
        "create pods/eviction": 4,
        "update nodemaintenances/status": 2,
        "update nodemaintenances": 1,
    }
    assert list(go.by_verb) == sorted(go.by_verb, key=lambda v: -go.by_verb[v])
    assert (go.status_writes, go.evictions, go.refused_evictions) == (2, 4, 3)
    assert go.eviction_answers == {"201": 1, "404": 1, "429": 2}
    assert go.status_writes_per_cr(2) == 1.0

    nmo = auditlog.tally(requests, "nmo/")
    assert (nmo.requests, nmo.status_writes, nmo.evictions, nmo.refused_evictions) == (5, 1, 2, 1)
    assert nmo.eviction_answers == {"201": 1, "409": 1}


def test_a_prefix_never_mixes_clients(auditlog: ModuleType) -> None:
    """``nmo/`` is not a prefix of the Go NMO's agent, nor the other way round."""
    requests = [auditlog.parse_line(line) for line in LINES]
    prefixes = ("nmo/", "go-nmo-manager/", "kubectl")
    total = sum(auditlog.tally(requests, p).requests for p in prefixes)
    assert total == len(LINES)


def test_no_client_no_counts(auditlog: ModuleType) -> None:
    empty = auditlog.tally([], "nmo/")
    assert (empty.requests, empty.by_verb, empty.refused_evictions) == (0, {}, 0)
    assert empty.status_writes_per_cr(0) == 0.0


def test_lines_that_are_no_event(auditlog: ModuleType) -> None:
    assert auditlog.parse_line(b"") is None
    assert auditlog.parse_line(b'{"truncated": ') is None
    assert auditlog.parse_line(b"\xff\xfe") is None
    assert auditlog.parse_line(b"[1, 2]") is None
    bare = auditlog.parse_line(b'{"verb": "get", "userAgent": "x", "requestURI": "/readyz?v=1"}')
    assert (bare.agent, bare.verb, bare.code) == ("x", "get /readyz", 0)
