"""The fleet's gates: a soak after a node returns, and firing alerts (pure; issue 23).

Both are opt-in and only hold back maintenances that have not started: a CR
the fleet budget would admit now (or that waits only for older CRs) stays
queued while a gate holds, with the gate named in its ``Queued`` condition.

* The **soak** (``--fleet-soak-seconds``): after a maintenance leaves the
  fleet ledger (its CR deleted or failed, its node restored), no queued
  maintenance starts until the soak has passed. The time of that return is
  written into the ledger Lease (:data:`nmo.controller.ledger.RETURNED`) in
  the same compare-and-swap that frees the slot, so it is as durable as the
  budget itself: a restart, a new leader or the CR's deletion does not
  shorten it. A slot pruned because its CR vanished while nmo was down has no
  known return time: its return is taken as the moment nmo noticed, which
  can only lengthen the soak. Whose clock: the return is stamped by the
  leader that frees the slot and compared with the clock of the leader that
  admits; after a leader change their skew lengthens or shortens the soak by
  that much (a return stamped ahead of the new leader's clock is stamped again
  at its now: one soak, not the skew plus one).
* The **alert gate** (``--blocking-prometheus-url``, ``--blocking-alerts``):
  while an alert whose name matches the pattern fires (``re.search``, as
  kured's filter), nothing new starts. Prometheus not answering holds too
  (fail-closed, as kured): nmo cannot tell that nothing fires.

:func:`hold` applies both to the fleet budget's decision; the poller that
asks Prometheus is :mod:`nmo.controller.alertgate`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from nmo.core.maintenance import admission
from nmo.core.maintenance.admission import Admission

REASON_SOAK = "Soaking"
REASON_ALERT = "AlertFiring"
REASON_PROMETHEUS = "PrometheusUnavailable"

_HELD = (admission.REASON_ADMITTED, admission.REASON_ORDER)  # decisions a gate may hold


@dataclass(frozen=True)
class Returned:
    """The last node that came back from a maintenance, as the ledger records it."""

    maintenance: str
    node: str
    at: datetime


@dataclass(frozen=True)
class AlertsSeen:
    """What the poller last heard from Prometheus (every firing alert's name)."""

    url: str
    firing: tuple[str, ...] = ()
    answered: bool = False  # at least one answer, and the last query was answered
    error: str | None = None  # the last query failed: why


def encode_returned(returned: Returned) -> str:
    return json.dumps(
        {
            "maintenance": returned.maintenance,
            "node": returned.node,
            "at": returned.at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
        sort_keys=True,
    )


def decode_returned(text: str | None) -> Returned | None:
    """The ledger's record, or None when there is none or it cannot be read
    (then there is nothing to soak after: the record is nmo's own)."""
    if not text:
        return None
    try:
        raw = json.loads(text)
        at = datetime.fromisoformat(str(raw["at"]).replace("Z", "+00:00"))
        if at.tzinfo is None:
            return None
        return Returned(str(raw.get("maintenance", "")), str(raw.get("node", "")), at)
    except (ValueError, TypeError, KeyError):
        return None


def firing_alerts(body: Any) -> tuple[str, ...]:
    """The names of the firing alerts in Prometheus's ``GET /api/v1/alerts``
    answer (pending ones are not firing yet); ValueError when it is not one."""
    if not isinstance(body, Mapping) or body.get("status") != "success":
        raise ValueError("not a successful Prometheus /api/v1/alerts answer")
    alerts = (body.get("data") or {}).get("alerts")
    if not isinstance(alerts, list):
        raise ValueError("the answer has no data.alerts list")
    names = set()
    for alert in alerts:
        if not isinstance(alert, Mapping) or alert.get("state") != "firing":
            continue
        name = (alert.get("labels") or {}).get("alertname")
        if isinstance(name, str) and name:
            names.add(name)
    return tuple(sorted(names))


def blocked_by(firing: Iterable[str], pattern: str) -> tuple[str, ...]:
    """The firing alerts the pattern names (``re.search``: unanchored, as kured)."""
    compiled = re.compile(pattern)
    return tuple(sorted({name for name in firing if compiled.search(name)}))


def soak_left(returned: Returned | None, soak_seconds: float, now: datetime) -> float:
    """Seconds until the soak after the last return ends (0: none), at most one
    soak. A return stamped in the future (by a replica whose clock is ahead of
    this one) is stamped again at this clock's now by the planner
    (:func:`nmo.core.maintenance.queueing.admit`), so it holds one soak from then."""
    if returned is None or soak_seconds <= 0:
        return 0.0
    left = (returned.at + timedelta(seconds=soak_seconds) - now).total_seconds()
    return max(0.0, min(left, soak_seconds))


def hold(
    decision: Admission,
    *,
    returned: Returned | None,
    alerts: AlertsSeen | None,
    settings: admission.BudgetSettings,
    now: datetime,
) -> Admission:
    """The budget's decision, held back by a gate when one holds.

    Only a CR the budget lets start (or that waits for older CRs only) is
    held; one queued by the budget or the window says that first. Alerts
    before the soak: they say why the fleet is not healthy.
    """
    if decision.reason not in _HELD:
        return decision
    where = f"position {decision.position or 1} of {decision.queued or 1} in the queue"
    if alerts is not None and settings.blocking_alerts:
        held = _alert_hold(alerts, settings.blocking_alerts)
        if held is not None:
            reason, message = held
            return _queued(decision, reason, f"{where}: {message}", settings.blocking_interval)
    left = soak_left(returned, settings.soak_seconds, now)
    if left > 0:
        assert returned is not None
        ends = returned.at + timedelta(seconds=settings.soak_seconds)
        message = (
            f"{where}: soaking after node {returned.node} returned from maintenance "
            f"{returned.maintenance} at {_stamp(returned.at)}; the next maintenance starts "
            f"after {_stamp(ends)} (--fleet-soak-seconds {settings.soak_seconds:g})"
        )
        return _queued(decision, REASON_SOAK, message, max(0.05, left))
    return decision


def _alert_hold(alerts: AlertsSeen, pattern: str) -> tuple[str, str] | None:
    if alerts.error is not None:
        return REASON_PROMETHEUS, (
            f"cannot reach Prometheus at {alerts.url}: {alerts.error}; new maintenances "
            "wait until it answers (fail-closed, --blocking-prometheus-url)"
        )
    if not alerts.answered:
        return REASON_PROMETHEUS, (
            f"waiting for the first answer from Prometheus at {alerts.url} "
            "(--blocking-prometheus-url)"
        )
    names = blocked_by(alerts.firing, pattern)
    if not names:
        return None
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    plural = "s" if len(names) > 1 else ""
    return REASON_ALERT, (
        f"alert{plural} {shown} firing on Prometheus (--blocking-alerts {pattern!r})"
    )


def _queued(decision: Admission, reason: str, message: str, retry: float) -> Admission:
    # A CR behind older ones looks again when the gate may have opened, not
    # every second as it does when the head is about to start: the head's
    # admission wakes the queue anyway.
    after = retry
    if decision.retry_after is not None and decision.reason != admission.REASON_ORDER:
        after = min(retry, decision.retry_after)
    return replace(
        decision,
        admit=False,
        reason=reason,
        message=message,
        position=decision.position or 1,
        queued=decision.queued or 1,
        retry_after=after,
    )


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")
