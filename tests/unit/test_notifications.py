"""Which notifications a pass produces, and the version 1 document (pure)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

import builders
from nmo.api import constants as c
from nmo.api.models import NodeMaintenance
from nmo.core.maintenance.notifications import Kind, Notification, for_pass, kinds, rfc3339
from nmo.core.maintenance.observed import Emit

NOW = datetime(2026, 5, 1, 12, 0, 0, 250000, tzinfo=UTC)
BEGIN, SUCCEEDED, FAILED, REMOVED = (
    e[0] for e in (c.EVENT_BEGIN, c.EVENT_SUCCEEDED, c.EVENT_FAILED, c.EVENT_REMOVED)
)
K = Kind


@pytest.mark.parametrize(
    ("events", "before", "after", "expected"),
    [
        # the four events, each on its own
        ([BEGIN], None, None, (K.BEGIN,)),
        ([SUCCEEDED], "Draining", "Drained", (K.SUCCEEDED,)),
        ([FAILED], None, None, (K.FAILED,)),
        ([REMOVED], "Drained", "Drained", (K.REMOVED,)),
        # events that notify nothing
        ([c.EVENT_UNCORDON[0], c.EVENT_DRAIN_TIMED_OUT, c.EVENT_POD_FORCE_DELETED], None, None, ()),
        ([], None, None, ()),
        # blocked: only when the reason turns to Blocked
        ([], None, "Blocked", (K.BLOCKED,)),
        ([], "Draining", "Blocked", (K.BLOCKED,)),
        ([], "WaitingForCompletion", "Blocked", (K.BLOCKED,)),
        ([], "TimedOut", "Blocked", (K.BLOCKED,)),
        ([], "Blocked", "Blocked", ()),  # still blocked: once per block
        ([], "Blocked", "Draining", ()),  # left Blocked: nothing (the next block notifies)
        ([], "Blocked", None, ()),
        ([], "Blocked", "TimedOut", ()),
        ([], "Draining", "Draining", ()),
        ([], None, "Draining", ()),
        # several in one pass, in a fixed order
        ([BEGIN], None, "Blocked", (K.BEGIN, K.BLOCKED)),
        ([SUCCEEDED, BEGIN], None, "Drained", (K.BEGIN, K.SUCCEEDED)),
        ([BEGIN, FAILED], None, None, (K.BEGIN, K.FAILED)),
        (
            [c.EVENT_DRAIN_TIMED_OUT, c.EVENT_UNCORDON[0], FAILED],
            "Blocked",
            "TimedOut",
            (K.FAILED,),
        ),
        ([c.EVENT_UNCORDON[0], REMOVED], "Blocked", "Blocked", (K.REMOVED,)),
        # an event fired twice in one pass is one notification
        ([BEGIN, BEGIN], None, None, (K.BEGIN,)),
    ],
)
def test_kinds(
    events: list[str], before: str | None, after: str | None, expected: tuple[Kind, ...]
) -> None:
    assert kinds(events, drained_before=before, drained_after=after) == expected


def _nm(drained: str | None = None, reason: str | None = "kernel upgrade") -> NodeMaintenance:
    status: dict[str, Any] = {}
    if drained is not None:
        status = {"phase": "Running", "conditions": [_cond(drained, "before")]}
    return NodeMaintenance.from_api(builders.nm(node="node-2", reason=reason, status=status))


def _cond(reason: str, message: str) -> dict[str, Any]:
    return {
        "type": c.CONDITION_DRAINED,
        "status": "True" if reason == "Drained" else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-05-01T11:00:00Z",
    }


def _status(phase: str, drained: str | None = None, **more: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"phase": phase, **more}
    if drained is not None:
        out["conditions"] = [
            {"type": "Other", "status": "True", "reason": "Blocked", "message": "not this one"},
            _cond(drained, f"{drained} message"),
        ]
    return out


def test_blocked_document_carries_the_condition_message() -> None:
    (note,) = for_pass(_nm("Draining"), _status("Running", "Blocked"), (), now=NOW, operator="op-1")
    assert note.document() == {
        "version": 1,
        "kind": "blocked",
        "maintenance": "nm-1",
        "node": "node-2",
        "phase": "Running",
        "reason": "kernel upgrade",
        "message": "Blocked message",
        "time": "2026-05-01T12:00:00Z",
        "operator": "op-1",
    }
    assert json.loads(json.dumps(note.document())) == note.document()


def test_a_block_notifies_once() -> None:
    assert for_pass(_nm("Blocked"), _status("Running", "Blocked"), (), now=NOW, operator="o") == ()


def test_begin_and_blocked_in_one_pass_in_order() -> None:
    notes = for_pass(
        _nm(), _status("Running", "Blocked"), (Emit(c.EVENT_BEGIN),), now=NOW, operator="o"
    )
    assert [n.kind for n in notes] == [K.BEGIN, K.BLOCKED]
    assert notes[0].message == c.EVENT_BEGIN[1]


def test_failed_carries_last_error_else_the_event_message() -> None:
    events = (Emit(c.EVENT_FAILED, warning=True),)
    after = _status("Failed", lastError="node node-2 not found")
    (note,) = for_pass(_nm(), after, events, now=NOW, operator="o")
    assert (note.kind, note.phase, note.message) == (K.FAILED, "Failed", "node node-2 not found")
    (note,) = for_pass(_nm(), _status("Failed"), events, now=NOW, operator="o")
    assert note.message == c.EVENT_FAILED[1]


@pytest.mark.parametrize(
    ("event", "kind"),
    [(c.EVENT_SUCCEEDED, K.SUCCEEDED), (c.EVENT_REMOVED, K.REMOVED), (c.EVENT_BEGIN, K.BEGIN)],
)
def test_event_kinds_carry_the_event_message(event: tuple[str, str], kind: Kind) -> None:
    (note,) = for_pass(
        _nm(), _status("Succeeded", "Drained"), (Emit(event),), now=NOW, operator="o"
    )
    assert (note.kind, note.message, note.phase) == (kind, event[1], "Succeeded")


def test_node_events_notify_nothing() -> None:
    # The same reason on the Node (it never happens, but the CR's events are what counts).
    events = (Emit(c.EVENT_BEGIN, target="node"), Emit(c.EVENT_UNCORDON, target="node"))
    assert for_pass(_nm(), _status("Running"), events, now=NOW, operator="o") == ()


def test_no_status_and_no_reason_are_empty_strings() -> None:
    (note,) = for_pass(_nm(reason=None), None, (Emit(c.EVENT_BEGIN),), now=NOW, operator="o")
    doc = note.document()
    assert doc["phase"] == "" and doc["reason"] == ""


def test_document_fields_are_stable() -> None:
    note = Notification(K.REMOVED, "m", "n", "Succeeded", "r", "msg", NOW, "op")
    assert list(note.document()) == [
        "version",
        "kind",
        "maintenance",
        "node",
        "phase",
        "reason",
        "message",
        "time",
        "operator",
    ]


@pytest.mark.parametrize(
    ("when", "text"),
    [
        (NOW, "2026-05-01T12:00:00Z"),
        (
            datetime(2026, 5, 1, 14, 0, 1, tzinfo=timezone(timedelta(hours=2))),
            "2026-05-01T12:00:01Z",
        ),
    ],
)
def test_rfc3339(when: datetime, text: str) -> None:
    assert rfc3339(when) == text
