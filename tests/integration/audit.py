"""Reading the sandbox apiserver's audit log: who asked the apiserver for what, and when.

The sandbox logs every request once, at ResponseComplete, as one JSON object
per line (``sandbox.audit_log``; see nmo/sandbox/components.py). That makes
it the way to assert what nmo did *not* do, without a fixed sleep:

    window = await AuditWindow.open(sandbox)   # a marker request of our own
    ...                                          # act, then wait FOR something nmo does
    events = await window.close()               # a second marker, waited for
    assert not [e for e in nmo_events(events) if e.is_write and e.name == node]

``close`` returns the events logged between the two markers whose request
was received after the first marker was (a request that started earlier but
completed inside the window, such as a long watch, is left out). Because an
event is written when the request completes, a watch appears only when it
ends: stop the watching process before closing a window that must see it.
Close a window once the thing waited for has been seen: what is waited for
bounds the window, never a duration.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from nmo_sandbox import Sandbox

NMO_AGENT = "nmo/"  # nmo's User-Agent is nmo/<version> (nmo.kube.client.USER_AGENT)
MARKER_AGENT = "nmo-tests-audit-marker"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass(frozen=True)
class AuditEvent:
    """One audit event (level Metadata) with the fields tests ask about."""

    raw: dict[str, Any]

    @property
    def user_agent(self) -> str:
        return str(self.raw.get("userAgent") or "")

    @property
    def username(self) -> str:
        return str((self.raw.get("user") or {}).get("username") or "")

    @property
    def verb(self) -> str:
        return str(self.raw.get("verb") or "")

    @property
    def uri(self) -> str:
        return str(self.raw.get("requestURI") or "")

    @property
    def code(self) -> int:
        return int((self.raw.get("responseStatus") or {}).get("code") or 0)

    @property
    def received(self) -> datetime:
        return datetime.fromisoformat(str(self.raw["requestReceivedTimestamp"]))

    def _ref(self, key: str) -> str:
        return str((self.raw.get("objectRef") or {}).get(key) or "")

    @property
    def resource(self) -> str:
        return self._ref("resource")

    @property
    def subresource(self) -> str:
        return self._ref("subresource")

    @property
    def name(self) -> str:
        return self._ref("name")

    @property
    def namespace(self) -> str:
        return self._ref("namespace")

    @property
    def query(self) -> dict[str, list[str]]:
        """The request's query parameters, URL-decoded."""
        return parse_qs(urlsplit(self.uri).query, keep_blank_values=True)

    @property
    def field_selectors(self) -> list[str]:
        return self.query.get("fieldSelector", [])

    @property
    def is_nmo(self) -> bool:
        return self.user_agent.startswith(NMO_AGENT)

    @property
    def is_write(self) -> bool:
        return self.verb in WRITE_VERBS

    def on(self, resource: str, name: str | None = None, *, subresource: str | None = "") -> bool:
        """About ``resource``, object ``name`` if given, and ``subresource`` exactly
        ("" for none; None for any)."""
        return (
            self.resource == resource
            and (subresource is None or self.subresource == subresource)
            and (name is None or self.name == name)
        )

    def __str__(self) -> str:
        return (
            f"{self.raw.get('requestReceivedTimestamp')} {self.user_agent} {self.username} "
            f"{self.verb} {self.uri} -> {self.code}"
        )


def nmo_events(events: Iterable[AuditEvent]) -> list[AuditEvent]:
    """The requests nmo made (its User-Agent is ``nmo/<version>``)."""
    return [e for e in events if e.is_nmo]


def show(events: Iterable[AuditEvent], limit: int = 40) -> str:
    """A readable listing for assertion messages."""
    lines = [str(e) for e in events]
    more = f"\n... and {len(lines) - limit} more" if len(lines) > limit else ""
    return "\n".join(lines[:limit]) + more


class AuditLog:
    """Incremental reader of the audit log file (complete lines only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Start after the last complete line: one being written now is not ours
        # to parse (read from its middle, it is not JSON).
        with path.open("rb") as fh:
            size = fh.seek(0, 2)
            start = max(0, size - (1 << 20))
            fh.seek(start)
            tail = fh.read(size - start)
        self.offset = start + tail.rfind(b"\n") + 1 if b"\n" in tail else size

    def read(self) -> list[AuditEvent]:
        """The events logged since the last read."""
        with self.path.open("rb") as fh:
            size = fh.seek(0, 2)
            if size < self.offset:
                pytest.fail(f"{self.path} shrank under the reader ({size} < {self.offset} bytes)")
            fh.seek(self.offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        self.offset += end
        return [AuditEvent(json.loads(line)) for line in data[:end].splitlines() if line.strip()]


class AuditWindow:
    """The audit events between two marker requests of our own."""

    def __init__(self, sandbox: Sandbox, log: AuditLog) -> None:
        self.sandbox = sandbox
        self._log = log
        self._seen: list[AuditEvent] = []  # everything read since the window was created
        self.start: AuditEvent | None = None
        self.end: AuditEvent | None = None

    @classmethod
    async def open(cls, sandbox: Sandbox) -> AuditWindow:
        """A window that starts at a marker request made (and seen logged) now."""
        window = cls(sandbox, AuditLog(sandbox.audit_log))
        window.start = await window._mark()
        return window

    def events(self) -> list[AuditEvent]:
        """The window's events so far (it stays open until :meth:`close`)."""
        assert self.start is not None
        if self.end is None:
            self._seen += self._log.read()
        first = self._seen.index(self.start) + 1
        last = len(self._seen) if self.end is None else self._seen.index(self.end)
        since = self.start.received
        return [
            e
            for e in self._seen[first:last]
            if e.received >= since and not e.user_agent.startswith(MARKER_AGENT)
        ]

    async def close(self) -> list[AuditEvent]:
        """Make the end marker request, wait until it is logged, return the window."""
        if self.end is None:
            self.end = await self._mark()
        return self.events()

    async def _mark(self) -> AuditEvent:
        """A request only we make; its audit event once it is logged."""
        agent = f"{MARKER_AGENT}-{uuid.uuid4().hex[:12]}"
        async with self.sandbox.client(user_agent=agent) as client:
            resp = await client.get("/api/v1/namespaces/default")
        assert resp.status_code == 200, f"audit marker request: {resp.status_code} {resp.text}"
        deadline = time.monotonic() + 30
        while True:
            self._seen += self._log.read()
            for event in reversed(self._seen):
                if event.user_agent == agent:
                    return event
            if time.monotonic() > deadline:
                pytest.fail(f"audit marker {agent} never appeared in {self._log.path}")
            await asyncio.sleep(0.05)
