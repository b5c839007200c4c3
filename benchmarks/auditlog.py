"""The apiserver's audit log as counts per client: requests by verb, status writes, evictions.

Pure functions over audit events (one JSON object per line, the sandbox's
Metadata-level policy, ResponseComplete stage only), so the benchmarks'
figures can be tested without a cluster:

* :func:`parse_line` reads one line into a :class:`Request` (user agent,
  ``"<verb> <resource>[/<subresource>]"``, response code);
* :func:`tally` counts the requests whose user agent starts with a prefix
  (``nmo/``, ``go-nmo-manager/``, ``raw-ceiling/``, ``kubectl``) into a
  :class:`Tally`: requests by verb, status writes (``update`` or ``patch`` on
  ``nodemaintenances/status``) and evictions by answer (``create
  pods/eviction``: 201 evicted, anything else refused: 429 from a
  PodDisruptionBudget, 409 on a conflict, 404 for a pod already gone...).

A write to the ``nodemaintenances`` resource itself cannot change the status
(the CRD has the status subresource, so the apiserver drops ``status`` from
such a write); the Metadata-level log carries no bodies anyway. Those writes
(finalizers) are in the by-verb counts, not in the status writes.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

STATUS_WRITE_VERBS = frozenset({"update", "patch"})
NM_STATUS = "nodemaintenances/status"
EVICTION = "create pods/eviction"
EVICTED = 201


@dataclass(frozen=True)
class Request:
    """One request of the audit log."""

    agent: str
    verb: str  # "<verb> <resource>[/<subresource>]" ("create pods/eviction") or "<verb> <path>"
    code: int  # the response's HTTP status (0 when the event has none)


def parse_event(ev: dict[str, object]) -> Request:
    """The :class:`Request` of one decoded audit event."""
    ref = ev.get("objectRef")
    ref = ref if isinstance(ref, dict) else {}
    res, sub = ref.get("resource"), ref.get("subresource")
    if res is None:  # a non-resource URL (/healthz, /version...): its path
        res = str(ev.get("requestURI", "?")).split("?", 1)[0]
    verb = str(ev.get("verb", "?"))
    what = f"{verb} {res}/{sub}" if sub else f"{verb} {res}"
    status = ev.get("responseStatus")
    code = status.get("code") if isinstance(status, dict) else None
    return Request(str(ev.get("userAgent", "")), what, int(code) if isinstance(code, int) else 0)


def parse_line(raw: bytes | str) -> Request | None:
    """One audit log line as a :class:`Request`; ``None`` for anything that is no event."""
    try:
        ev = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return parse_event(ev) if isinstance(ev, dict) else None


@dataclass(frozen=True)
class Tally:
    """One client's requests in an audit window."""

    requests: int = 0
    by_verb: dict[str, int] = field(default_factory=dict)  # most frequent first
    status_writes: int = 0  # update/patch nodemaintenances/status
    evictions: int = 0  # create pods/eviction, whatever the answer
    refused_evictions: int = 0  # create pods/eviction answered anything but 201
    eviction_answers: dict[str, int] = field(default_factory=dict)  # HTTP code -> count

    def status_writes_per_cr(self, crs: int) -> float:
        return self.status_writes / crs if crs else 0.0


def is_status_write(req: Request) -> bool:
    verb, _, target = req.verb.partition(" ")
    return verb in STATUS_WRITE_VERBS and target == NM_STATUS


def tally(requests: Iterable[Request], agent_prefix: str) -> Tally:
    """Count the requests of the clients whose user agent starts with ``agent_prefix``."""
    mine = [r for r in requests if r.agent.startswith(agent_prefix)]
    verbs = Counter(r.verb for r in mine)
    answers = Counter(r.code for r in mine if r.verb == EVICTION)
    return Tally(
        requests=len(mine),
        by_verb=dict(verbs.most_common()),
        status_writes=sum(1 for r in mine if is_status_write(r)),
        evictions=sum(answers.values()),
        refused_evictions=sum(n for code, n in answers.items() if code != EVICTED),
        eviction_answers={str(code): n for code, n in sorted(answers.items())},
    )
