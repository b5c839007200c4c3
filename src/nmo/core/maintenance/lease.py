"""The medik8s node lease rules, as pure functions (behavior.md A5, B3).

Whoever holds ``<ns>/node-<node>`` owns the node: a remediation operator will
not fence a node nmo holds, and nmo will not drain a node someone else
holds. :func:`decide` says what to do to hold it (create, renew, take over an
expired foreign lease, or refuse); :func:`apply` and :func:`build_lease`
compute the object to write. :func:`lease_times` is the one place that reads
a lease's renew time and expiry (used by the decision, ``nmo cleanup`` and
``nmo status``). The I/O lives in :mod:`nmo.controller.leaseholder`.

The corner cases are medik8s/common's (pkg/lease/manager.go): a lease without
``renewTime`` or ``leaseDurationSeconds`` has no expiry, so a foreign one is
invalid and taken over, and an own one is renewed as if newly acquired; any
holder but ours, an empty one included, holds a valid lease; every renewal
and takeover points the lease's ownerReferences at the current Node.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from nmo.api import constants as c

Lease = dict[str, Any]

MICRO_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def format_micro(t: datetime) -> str:
    return t.astimezone(UTC).strftime(MICRO_FORMAT)


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def lease_times(spec: Mapping[str, Any]) -> tuple[datetime | None, datetime | None]:
    """When a lease (its ``spec``) was last renewed and when it expires.

    Both are None unless ``renewTime`` and ``leaseDurationSeconds`` are set:
    medik8s/common gives such a lease no expiry (it is never valid), and
    ``acquireTime`` does not stand in for a missing renewal.
    """
    renewed = parse_time(spec.get("renewTime"))
    duration = spec.get("leaseDurationSeconds")
    if renewed is None or duration is None:
        return None, None
    return renewed, renewed + timedelta(seconds=int(duration))


class Action(enum.Enum):
    CREATE = "create"
    RENEW = "renew"
    TAKE_OVER = "take-over"
    KEEP = "keep"
    FOREIGN = "foreign"


@dataclass(frozen=True)
class Decision:
    action: Action
    holder: str = ""
    expires: datetime | None = None
    reacquire: bool = False  # a RENEW that also sets acquireTime and bumps leaseTransitions


UNKNOWN_HOLDER = "unknown"  # medik8s/common's name for a lease without holderIdentity


CLOCK_SKEW = timedelta(seconds=2)
"""How far another holder's clock (or a renewal landing while nmo read the
lease) may be from nmo's: a foreign lease is valid until ``renewTime +
leaseDurationSeconds + CLOCK_SKEW``, and a renewal up to ``CLOCK_SKEW`` in the
future is a renewal, not garbage. The doubt goes to the holder: taking a lease
a remediation operator still holds would let it fence a node nmo drains."""


def decide(
    lease: Lease | None,
    now: datetime,
    *,
    holder: str = c.LEASE_HOLDER,
    renew_after: timedelta = timedelta(minutes=5),
    skew: timedelta = CLOCK_SKEW,
) -> Decision:
    """What to do with the lease to hold it (pure).

    ``now`` must be read after the lease was: a ``now`` from before the read
    makes a renewal that landed in between look like the future. A foreign
    lease is expired only if ``renewTime + duration + skew < now``.
    """
    if lease is None:
        return Decision(Action.CREATE)
    spec = lease.get("spec") or {}
    current = spec.get("holderIdentity")
    renewed, expires = lease_times(spec)
    if current == holder:
        if renewed is None or expires is None:
            # No renewal or duration recorded: renewed as if acquired now (common).
            return Decision(Action.RENEW, holder, None, reacquire=True)
        if now > expires:
            return Decision(Action.RENEW, holder, expires, reacquire=not spec.get("acquireTime"))
        if now - renewed >= renew_after:
            return Decision(Action.RENEW, holder, expires)
        return Decision(Action.KEEP, holder, expires)
    name = UNKNOWN_HOLDER if current is None else str(current)
    valid = renewed is not None and expires is not None and renewed - skew <= now <= expires + skew
    if valid:  # whoever holds it, an empty holderIdentity included
        return Decision(Action.FOREIGN, name, expires)
    return Decision(Action.TAKE_OVER, name, expires)


def owner_reference(node: Mapping[str, Any]) -> dict[str, Any]:
    """The lease's owner: the Node it is for (apiVersion, kind, name, uid, as common)."""
    meta = node["metadata"]
    return {"apiVersion": "v1", "kind": "Node", "name": meta["name"], "uid": meta["uid"]}


def build_lease(
    node: dict[str, Any], namespace: str, now: datetime, *, holder: str = c.LEASE_HOLDER
) -> Lease:
    name = str(node["metadata"]["name"])
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": c.lease_name(name),
            "namespace": namespace,
            "ownerReferences": [owner_reference(node)],
        },
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": c.LEASE_DURATION_SECONDS,
            "acquireTime": format_micro(now),
            "renewTime": format_micro(now),
            "leaseTransitions": 0,
        },
    }


def apply(
    decision: Decision,
    lease: Lease,
    node: Mapping[str, Any],
    now: datetime,
    *,
    holder: str = c.LEASE_HOLDER,
) -> Lease:
    """The lease object after a RENEW or TAKE_OVER of it for ``node`` (pure)."""
    meta = dict(lease.get("metadata") or {})
    meta["ownerReferences"] = [owner_reference(node)]
    out = {**lease, "metadata": meta, "spec": dict(lease.get("spec") or {})}
    spec = out["spec"]
    if decision.action is Action.TAKE_OVER or decision.reacquire:
        spec["acquireTime"] = format_micro(now)
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
    spec["holderIdentity"] = holder
    spec["leaseDurationSeconds"] = c.LEASE_DURATION_SECONDS
    spec["renewTime"] = format_micro(now)
    return out
