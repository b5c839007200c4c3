"""The fleet budget and the maintenance window: who may start now (pure).

A maintenance is *admitted* when nmo starts on its node; from then on it
counts against the budget until its CR is deleted or it fails (a Failed
maintenance has its node restored). The admitted maintenances are kept in
a ledger that every admission updates with a compare-and-swap
(:mod:`nmo.controller.ledger`), so the decision below is always taken on the
latest ledger, by one process at a time, whatever the timing.

:func:`decide` admits only the head of the queue (creation order: oldest
first, then name): a strict FIFO, so queued CRs start in creation order;
each admission wakes the queue, so the next head follows at once. Taking
the queue in order, a CR fits when

* fewer than ``--max-parallel-maintenances`` maintenances are admitted, and
* its node is already unavailable, or fewer than ``--max-unavailable``
  nodes are (a node is unavailable when it is unschedulable, not Ready, or
  under an admitted maintenance: as NVIDIA's maintenance operator counts),

and the maintenance window, if any, is open. Outside the window nothing new
starts; admitted maintenances go on.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from nmo.api.models import NodeMaintenance
from nmo.core.maintenance import transitions

Obj = dict[str, Any]

REASON_ADMITTED = "Admitted"
REASON_BUDGET = "BudgetExhausted"
REASON_UNAVAILABLE = "MaxUnavailable"
REASON_WINDOW = "OutsideWindow"
REASON_ORDER = "WaitingForOlder"  # it fits, but older CRs start first

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_HHMM = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")


@dataclass(frozen=True)
class Window:
    """Maintenances start only inside the window: on ``days`` (the day the
    window opens), from ``start`` to ``end`` in ``tz``; an end at or before
    the start ends the next day (22:00-06:00)."""

    days: frozenset[int]  # 0 = Monday
    start: time
    end: time
    tz: tzinfo
    text: str = ""  # as given, for messages

    def _spans(self, now: datetime) -> Iterable[tuple[datetime, datetime]]:
        local = now.astimezone(self.tz)
        for back in range(-1, 8):  # yesterday's window may still be open; the next week
            day = local.date() + timedelta(days=back)
            if day.weekday() not in self.days:
                continue
            opens = datetime.combine(day, self.start, self.tz)
            closes = datetime.combine(day, self.end, self.tz)
            if closes <= opens:
                closes += timedelta(days=1)
            yield opens.astimezone(UTC), closes.astimezone(UTC)

    def is_open(self, now: datetime) -> bool:
        return any(opens <= now < closes for opens, closes in self._spans(now))

    def next_open(self, now: datetime) -> datetime | None:
        """When the window opens next (None if it is open now or has no days)."""
        if self.is_open(now):
            return None
        later = [opens for opens, _ in self._spans(now) if opens > now]
        return min(later) if later else None


def parse_days(text: str) -> frozenset[int]:
    """``Mon-Fri``, ``Sat,Sun``, ``Mon,Wed-Thu`` (English abbreviations)."""
    out: set[int] = set()
    for part in (p.strip() for p in text.split(",") if p.strip()):
        first, _, last = part.partition("-")
        try:
            a = DAYS.index(first.strip().capitalize()[:3])
            b = DAYS.index(last.strip().capitalize()[:3]) if last else a
        except ValueError:
            raise ValueError(
                f"invalid day {part!r}: use {', '.join(DAYS)} and ranges like Mon-Fri"
            ) from None
        out.update((a + k) % 7 for k in range((b - a) % 7 + 1))  # Fri-Mon wraps
    if not out:
        raise ValueError("no day given: use e.g. Mon-Fri")
    return frozenset(out)


def parse_window(days: str, start: str, end: str, timezone: str) -> Window:
    """The window from its four settings, or ValueError saying what is wrong."""
    day_set = parse_days(days)
    times: list[time] = []
    for what, value in (("start", start), ("end", end)):
        match = _HHMM.match(value.strip())
        if match is None:
            raise ValueError(f"invalid window {what} {value!r}: use HH:MM, 24-hour")
        times.append(time(int(match.group(1)), int(match.group(2))))
    name = timezone.strip() or "UTC"
    try:
        tz: tzinfo = UTC if name == "UTC" else ZoneInfo(name)  # UTC needs no tz database
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown time zone {timezone!r}: use an IANA name like Europe/Berlin "
            "(the time zone database must be installed: the tzdata package)"
        ) from None
    if times[0] == times[1]:
        raise ValueError("the window's start and end are equal: it would never be open")
    text = f"{days} {start}-{end} {timezone or 'UTC'}"
    return Window(days=day_set, start=times[0], end=times[1], tz=tz, text=text)


def parse_max_unavailable(text: str) -> tuple[int | None, float | None]:
    """``3`` -> (3, None); ``20%`` -> (None, 0.2); ValueError otherwise."""
    value = text.strip()
    try:
        if value.endswith("%"):
            percent = float(value[:-1])
            if not 0 < percent <= 100:
                raise ValueError
            return None, percent / 100
        count = int(value)
        if count < 1:
            raise ValueError
        return count, None
    except ValueError:
        raise ValueError(
            f"invalid --max-unavailable {text!r}: use a count of nodes (at least 1) "
            "or a percentage of the nodes (e.g. 20%)"
        ) from None


@dataclass(frozen=True)
class BudgetSettings:
    max_parallel: int = 0  # --max-parallel-maintenances; 0: no limit
    max_unavailable: str = ""  # --max-unavailable: "3" or "20%"; "": no limit
    window: Window | None = None
    recheck: float = 30.0  # a queued CR is looked at again at least this often
    # The gates (nmo.core.maintenance.gates): --fleet-soak-seconds, and
    # --blocking-prometheus-url with --blocking-alerts (checked every interval).
    soak_seconds: float = 0.0
    blocking_url: str = ""
    blocking_alerts: str = ""
    blocking_interval: float = 30.0

    @property
    def enabled(self) -> bool:
        return bool(
            self.max_parallel
            or self.max_unavailable
            or self.window
            or self.soak_seconds > 0
            or self.blocking_url
        )

    def unavailable_cap(self, total_nodes: int) -> int | None:
        """Nodes that may be unavailable at once; a percentage rounds up (at least 1)."""
        if not self.max_unavailable:
            return None
        count, share = parse_max_unavailable(self.max_unavailable)
        if count is not None:
            return count
        assert share is not None
        return max(1, math.ceil(share * total_nodes))


@dataclass(frozen=True)
class Admission:
    admit: bool
    reason: str
    message: str
    position: int = 0  # 1-based place in the queue (0: admitted)
    queued: int = 0  # CRs in the queue
    retry_after: float | None = None  # when to look again (the window opens)


def unavailable(node: Mapping[str, Any]) -> bool:
    """A node out of service by itself: unschedulable, or not Ready."""
    if (node.get("spec") or {}).get("unschedulable"):
        return True
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") != "True")
    return True  # no Ready condition yet: not serving


def awaits_start(nm: NodeMaintenance, *, node_exists: bool) -> bool:
    """A CR the budget has to admit before it starts: not begun and not being
    deleted, or failed for a missing node whose Node exists again (it starts
    again, so it takes a slot like a new one; while its node stays missing it
    queues nothing behind it)."""
    if nm.metadata.deletion_timestamp is not None:
        return False
    if not nm.status.begun:
        return True
    return node_exists and transitions.is_node_missing_failure(nm.status, nm.spec.node_name)


def queue_order(nm: NodeMaintenance) -> tuple[datetime, str]:
    created = nm.metadata.creation_timestamp or datetime.max.replace(tzinfo=UTC)
    return created, nm.metadata.name


@dataclass(frozen=True)
class Fleet:
    """What the decision reads: the ledger and the cluster, as observed."""

    admitted: Mapping[str, str]  # CR name -> node: the ledger's, and the CRs running
    queue: Sequence[NodeMaintenance]  # every CR waiting to start (the candidate included)
    node_count: int  # the cluster's nodes
    unavailable_nodes: frozenset[str] = field(default_factory=frozenset)


def fleet(
    admitted: Mapping[str, str],
    queue: Sequence[NodeMaintenance],
    nodes: Mapping[str, Mapping[str, Any]],
) -> Fleet:
    down = frozenset(name for name, node in nodes.items() if unavailable(node))
    return Fleet(
        admitted=dict(admitted), queue=tuple(queue), node_count=len(nodes), unavailable_nodes=down
    )


def decide(
    candidate: NodeMaintenance, seen: Fleet, settings: BudgetSettings, now: datetime
) -> Admission:
    """May ``candidate`` start now? (see the module docstring)"""
    name = candidate.metadata.name
    if name in seen.admitted:
        return Admission(True, REASON_ADMITTED, "admitted")
    # Admitted CRs whose status does not say so yet are not in the queue any more.
    waiting = {q.metadata.name: q for q in seen.queue if q.metadata.name not in seen.admitted}
    queue = sorted({**waiting, name: candidate}.values(), key=queue_order)
    position = next(i for i, q in enumerate(queue, 1) if q.metadata.name == name)
    where = f"position {position} of {len(queue)} in the queue"
    window = settings.window
    if window is not None and not window.is_open(now):
        opens = window.next_open(now)
        wait = None if opens is None else max(1.0, (opens - now).total_seconds())
        when = "" if opens is None else f"; it opens at {opens.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        return Admission(
            False,
            REASON_WINDOW,
            f"{where}: outside the maintenance window ({window.text}){when}",
            position,
            len(queue),
            wait,
        )
    running = len(seen.admitted)
    out = set(seen.unavailable_nodes) | set(seen.admitted.values())
    cap = settings.unavailable_cap(seen.node_count)
    for ahead in queue:
        node = ahead.spec.node_name
        if settings.max_parallel and running >= settings.max_parallel:
            return Admission(
                False,
                REASON_BUDGET,
                f"{where}: {len(seen.admitted)} of {settings.max_parallel} maintenances "
                "running (--max-parallel-maintenances)",
                position,
                len(queue),
            )
        if cap is not None and node not in out and len(out) >= cap:
            return Admission(
                False,
                REASON_UNAVAILABLE,
                f"{where}: {len(set(seen.unavailable_nodes) | set(seen.admitted.values()))} of "
                f"{cap} nodes unavailable (--max-unavailable {settings.max_unavailable})",
                position,
                len(queue),
            )
        if ahead.metadata.name == name:
            if position == 1:
                return Admission(True, REASON_ADMITTED, "admitted")
            # It fits, but older CRs start first: each admission wakes the next.
            return Admission(
                False,
                REASON_ORDER,
                f"{where}: starting after the {position - 1} older "
                f"maintenance{'s' if position > 2 else ''} ahead of it",
                position,
                len(queue),
                retry_after=1.0,
            )
        running += 1
        out.add(node)
    raise AssertionError("the candidate is in its own queue")  # pragma: no cover
