"""Which notifications a reconcile pass produces, and their JSON document (pure).

nmo can POST a small JSON document to one receiver (``--notify-url``) on
five transitions of a maintenance. This module decides, from what one pass
did, which of them happened; :mod:`nmo.controller.notifier` delivers them.

* ``begin``, ``succeeded``, ``failed``, ``removed``: the pass fired the
  event ``BeginMaintenance``, ``SucceedMaintenance``, ``FailedMaintenance``
  or ``RemovedMaintenance`` on the CR. The planner fires those once per
  transition, so each notification is sent once too.
* ``blocked``: the pass persisted the condition ``Drained`` with reason
  ``Blocked`` over a status whose ``Drained`` reason was something else (or
  absent). Once per block: a drain that stays Blocked sends nothing more; it
  is sent again only after the reason left ``Blocked`` and came back. The
  status before is the one the pass read, the status after is the one it
  wrote (writes carry the resourceVersion read, so "before" is exactly what
  the write replaced; a pass that wrote nothing has after == before).

The document (version 1) is stable: fields are only ever added, and a
change of meaning would be a new ``version``. See docs/install.md.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from nmo.api import constants as c
from nmo.api.models import NodeMaintenance
from nmo.core.maintenance import transitions
from nmo.core.maintenance.drainplan import REASON_BLOCKED

VERSION = 1


class Emitted(Protocol):
    """An event a pass records (:class:`nmo.core.maintenance.observed.Emit`)."""

    @property
    def event(self) -> tuple[str, str]: ...  # (reason, message)

    @property
    def target(self) -> str: ...  # "maintenance" or "node"


class Kind(enum.StrEnum):
    """A notification's ``kind``, in the order one pass reports them."""

    BEGIN = "begin"
    BLOCKED = "blocked"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REMOVED = "removed"


_BY_EVENT: Mapping[str, Kind] = {
    c.EVENT_BEGIN[0]: Kind.BEGIN,
    c.EVENT_SUCCEEDED[0]: Kind.SUCCEEDED,
    c.EVENT_FAILED[0]: Kind.FAILED,
    c.EVENT_REMOVED[0]: Kind.REMOVED,
}


def kinds(
    events: Iterable[str], *, drained_before: str | None, drained_after: str | None
) -> tuple[Kind, ...]:
    """The notifications of one pass, from the reasons of the events it fired
    on the CR and the ``Drained`` condition's reason before and after it."""
    found = {_BY_EVENT[reason] for reason in events if reason in _BY_EVENT}
    if drained_after == REASON_BLOCKED and drained_before != REASON_BLOCKED:
        found.add(Kind.BLOCKED)
    return tuple(kind for kind in Kind if kind in found)


def rfc3339(when: datetime) -> str:
    """``2026-05-01T12:00:00Z``: UTC, second precision, as Kubernetes writes times."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Notification:
    kind: Kind
    maintenance: str  # the NodeMaintenance's name
    node: str  # spec.nodeName
    phase: str  # status.phase after the pass ("" while it has none)
    reason: str  # spec.reason ("" when unset)
    message: str  # see :func:`for_pass`
    time: datetime  # when the pass ran
    operator: str  # the nmo replica that sent it (its identity)

    def document(self) -> dict[str, Any]:
        """The JSON body, version 1 (docs/install.md)."""
        return {
            "version": VERSION,
            "kind": self.kind.value,
            "maintenance": self.maintenance,
            "node": self.node,
            "phase": self.phase,
            "reason": self.reason,
            "message": self.message,
            "time": rfc3339(self.time),
            "operator": self.operator,
        }


def drained(status: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The ``Drained`` condition of a status as the API returns it ({} if none)."""
    for cond in (status or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == c.CONDITION_DRAINED:
            return cond
    return {}


def for_pass(
    nm: NodeMaintenance,
    after: Mapping[str, Any] | None,
    events: Iterable[Emitted],
    *,
    now: datetime,
    operator: str,
) -> tuple[Notification, ...]:
    """The notifications of one pass over ``nm`` (as it read it).

    ``after`` is the CR's status once the pass is over (the API's answer to
    its status write, or what it read when it wrote none); ``events`` the
    events it fired. ``message`` is the ``Drained`` condition's message for
    ``blocked``, ``status.lastError`` for ``failed`` (the event's message if
    there is none) and the event's message for the others.
    """
    own = [e.event for e in events if e.target == "maintenance"]
    before = transitions.condition(nm.status, c.CONDITION_DRAINED)
    cond = drained(after)
    found = kinds(
        (reason for reason, _ in own),
        drained_before=before.reason if before is not None else None,
        drained_after=_str(cond.get("reason")) or None,
    )
    said = {_BY_EVENT[reason]: message for reason, message in own if reason in _BY_EVENT}
    out = []
    for kind in found:
        if kind is Kind.BLOCKED:
            message = _str(cond.get("message"))
        elif kind is Kind.FAILED:
            message = _str((after or {}).get("lastError")) or said[kind]
        else:
            message = said[kind]
        out.append(
            Notification(
                kind=kind,
                maintenance=nm.metadata.name,
                node=nm.spec.node_name,
                phase=_str((after or {}).get("phase")),
                reason=nm.spec.reason or "",
                message=message,
                time=now,
                operator=operator,
            )
        )
    return tuple(out)


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""
