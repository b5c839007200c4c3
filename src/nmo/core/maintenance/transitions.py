"""Status transitions of a NodeMaintenance, as pure functions.

Each function takes the current status and observations and returns the
new status; the reconciler writes it only when it differs (ignoring
``lastUpdate``), and fires an event only when the persisted phase actually
changes, so events fire once per transition (B4) and a 1,000-pod drain does
not write 1,000 statuses.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from nmo.api import constants as c
from nmo.api.models import (
    Condition,
    ConditionStatus,
    NodeMaintenanceStatus,
    PendingPodDetail,
    Phase,
    PodReference,
)


def progress(eviction_pods: int, pending: int) -> int:
    """NMO's formula, clamped: (evictionPods - pending) * 100 // evictionPods."""
    if eviction_pods <= 0:
        return 100 if pending == 0 else 0
    return max(0, min(100, (eviction_pods - pending) * 100 // eviction_pods))


def first_pass(
    status: NodeMaintenanceStatus, *, pending: list[PodReference], total_pods: int, now: datetime
) -> NodeMaintenanceStatus:
    """Phase empty (or Pending) -> Running with the drain's starting figures (A2.2)."""
    if status.begun:
        return status
    return status.model_copy(
        update={
            "phase": Phase.RUNNING,
            "last_update": now,
            "pending_pods": [p.name for p in pending],
            "pending_pods_refs": pending,
            "eviction_pods": len(pending),
            "total_pods": total_pods,
            "drain_progress": 0,
            "error_on_lease_count": status.error_on_lease_count or 0,
        }
    )


def failed(status: NodeMaintenanceStatus, *, error: str, now: datetime) -> NodeMaintenanceStatus:
    return status.model_copy(
        update={"phase": Phase.FAILED, "last_error": error, "last_update": now}
    )


def node_not_found(
    status: NodeMaintenanceStatus, node: str, now: datetime
) -> NodeMaintenanceStatus:
    return failed(status, error=c.Messages.NODE_NOT_FOUND.format(node=node), now=now)


def is_node_missing_failure(status: NodeMaintenanceStatus, node: str) -> bool:
    """Failed because the node was missing: not final (it applies again when a
    Node of that name exists, as the Go NMO does on its next reconcile)."""
    return status.phase is Phase.FAILED and status.last_error == c.Messages.NODE_NOT_FOUND.format(
        node=node
    )


def resumed(status: NodeMaintenanceStatus) -> NodeMaintenanceStatus:
    """A maintenance failed for a missing node runs again: its node is back.

    As the Go NMO: phase Running and errorOnLeaseCount 0 once the lease is
    taken; lastError keeps its text until the drain writes another one.
    """
    return status.model_copy(update={"phase": Phase.RUNNING, "error_on_lease_count": 0})


def duplicate(status: NodeMaintenanceStatus, node: str, now: datetime) -> NodeMaintenanceStatus:
    return failed(status, error=c.Messages.WEBHOOK_DUPLICATE.format(node=node), now=now)


def is_duplicate_failure(status: NodeMaintenanceStatus, node: str) -> bool:
    return (
        status.phase is Phase.FAILED
        and status.last_error == c.Messages.WEBHOOK_DUPLICATE.format(node=node)
    )


def lease_error(
    status: NodeMaintenanceStatus, *, error: str, counted: bool, now: datetime
) -> NodeMaintenanceStatus:
    """Record a lease error; ``counted`` errors increment errorOnLeaseCount (A5)."""
    count = (status.error_on_lease_count or 0) + (1 if counted else 0)
    if count > c.MAX_LEASE_ERRORS:
        return status.model_copy(
            update={
                "phase": Phase.FAILED,
                "error_on_lease_count": count,
                "last_error": c.Messages.LEASE_EXHAUSTED.format(count=count),
                "last_update": now,
            }
        )
    return status.model_copy(
        update={"error_on_lease_count": count, "last_error": error, "last_update": now}
    )


def lease_ok(status: NodeMaintenanceStatus) -> NodeMaintenanceStatus:
    if not status.error_on_lease_count:
        return status
    return status.model_copy(update={"error_on_lease_count": 0})


def drain_pass_error(details: Sequence[PendingPodDetail]) -> str | None:
    """lastError as the Go NMO writes it when a 30 s drain pass leaves pods:
    kubectl's per-pod timeout errors, aggregated (one alone, else ``[a, b]``).

    A pod evicted and still terminating timed out waiting; any other was not
    evicted yet (a PDB, a backoff). At most ``MAX_LAST_ERROR_PODS`` are named.
    """
    texts: list[str] = []
    for pod in details:
        template = (
            c.Messages.DRAIN_WAIT_TIMEOUT
            if pod.reason == "Terminating"
            else c.Messages.DRAIN_EVICT_TIMEOUT
        )
        text = template.format(
            name=pod.name, namespace=pod.namespace, timeout=f"{c.DRAIN_PASS_SECONDS}s"
        )
        if text not in texts:
            texts.append(text)
    if not texts:
        return None
    if len(texts) == 1:
        return texts[0]
    shown = texts[: c.MAX_LAST_ERROR_PODS]
    more = len(texts) - len(shown)
    return "[" + ", ".join(shown) + (f", ... {more} more" if more else "") + "]"


def is_drain_pass_error(error: str | None) -> bool:
    """Whether lastError is the drain-pass timeout text :func:`drain_pass_error` writes."""
    return bool(error) and (
        "global timeout reached" in str(error) or "to terminate: context deadline" in str(error)
    )


def draining(
    status: NodeMaintenanceStatus,
    *,
    pending: list[tuple[str, str]],
    details: list[PendingPodDetail],
    error: str | None,
    now: datetime,
    started: datetime,
) -> NodeMaintenanceStatus:
    """Pods remain: Running, lists of what remains, progress and why (A2.8, B9).

    lastError as the Go NMO: an eviction error at once (``error``); else,
    once the drain has run a pass (``DRAIN_PASS_SECONDS``), kubectl's timeout
    text for the pods left; before that, whatever it said (a normal drain
    shows none). Why each pod waits is in ``pendingPodsDetails`` and the
    ``Drained`` condition.
    """
    eviction_pods = status.eviction_pods or 0
    if error is None:
        error = status.last_error
        if (now - started).total_seconds() >= c.DRAIN_PASS_SECONDS:
            error = drain_pass_error(details) or error
    return status.model_copy(
        update={
            "phase": Phase.RUNNING,
            "pending_pods": [name for _, name in pending],
            "pending_pods_refs": [PodReference(namespace=ns, name=name) for ns, name in pending],
            "pending_pods_details": details,
            "drain_progress": progress(eviction_pods, len(pending)),
            "last_error": error,
            "last_update": now,
        }
    )


def succeeded(status: NodeMaintenanceStatus, now: datetime) -> NodeMaintenanceStatus:
    """All pods gone: Succeeded, 100 %, empty lists, lastError cleared (A2.9, B5)."""
    update: dict[str, object] = {
        "phase": Phase.SUCCEEDED,
        "drain_progress": 100,
        "pending_pods": [],
        "pending_pods_refs": [],
        "pending_pods_details": [],
        "last_error": None,
    }
    if status.phase is not Phase.SUCCEEDED:
        update["last_update"] = now
    return status.model_copy(update=update)


def with_condition(
    status: NodeMaintenanceStatus,
    *,
    type_: str,
    state: ConditionStatus,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None = None,
) -> NodeMaintenanceStatus:
    """Set one condition as meta.SetStatusCondition does: its
    lastTransitionTime moves only when its status changes."""
    old = next((x for x in status.conditions or [] if x.type == type_), None)
    since = old.last_transition_time if old is not None and old.status is state else None
    new = Condition(
        type=type_,
        status=state,
        reason=reason,
        message=message,
        last_transition_time=since or now,
        observed_generation=generation,
    )
    others = [x for x in status.conditions or [] if x.type != type_]
    return status.model_copy(update={"conditions": [*others, new]})


def condition(status: NodeMaintenanceStatus, type_: str) -> Condition | None:
    return next((x for x in status.conditions or [] if x.type == type_), None)


def drain_timing(
    status: NodeMaintenanceStatus, *, start: datetime, deadline: datetime | None
) -> NodeMaintenanceStatus:
    """Persist when the drain started and when it times out (kept across restarts)."""
    if status.drain_start_time == start and status.drain_deadline == deadline:
        return status
    return status.model_copy(update={"drain_start_time": start, "drain_deadline": deadline})


def drain_timed_out(
    status: NodeMaintenanceStatus, *, error: str, now: datetime
) -> NodeMaintenanceStatus:
    """onTimeout Abort: Failed with the deadline's error (the node is restored)."""
    return failed(status, error=error, now=now)


def comparable(st: NodeMaintenanceStatus) -> dict[str, object]:
    """A status as it is written, but lastUpdate: what two statuses are compared by.

    Compared in the API's form, so a zero or an empty list the API never
    stores (omitempty) equals a field that is absent.
    """
    body = st.to_api()
    body.pop("lastUpdate", None)
    return body


def transition(a: NodeMaintenanceStatus, b: NodeMaintenanceStatus) -> bool:
    """Whether ``b`` moves the maintenance to another state than ``a``: its phase,
    or a condition's status or reason (Draining -> Blocked -> TimedOut...). A
    message, a list or drainProgress alone is progress, not a transition."""

    def state(st: NodeMaintenanceStatus) -> tuple[object, ...]:
        conditions = sorted((x.type, x.status.value, x.reason) for x in st.conditions or [])
        return (st.phase, tuple(conditions))

    return state(a) != state(b)


def differs(a: NodeMaintenanceStatus, b: NodeMaintenanceStatus) -> bool:
    """Whether writing ``b`` over ``a`` changes anything but lastUpdate."""
    return comparable(a) != comparable(b)


def status_patch(new: NodeMaintenanceStatus) -> dict[str, object]:
    """A merge patch that sets every field and clears the removed ones."""
    body: dict[str, object] = dict(new.to_api())
    for name, info in NodeMaintenanceStatus.model_fields.items():
        alias = info.alias or name
        if alias not in body:
            body[alias] = None
    return body
