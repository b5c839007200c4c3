"""``nmo status``: one readable view of a maintenance, for humans and scripts.

Following a maintenance with kubectl means reading the CR's status, the
lease in another namespace and events in ``default`` side by side. This
module joins them: :func:`summarize` turns one CR, its lease and events into
a stable JSON-ready dict (the ``-o json`` contract, documented in
docs/troubleshooting-ops.md), and :func:`render` draws summaries with rich.
Both are pure; :func:`collect` does the reading.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from nmo.api import constants as c
from nmo.controller.recorder import EVENT_NAMESPACE
from nmo.core.maintenance.lease import lease_times, parse_time
from nmo.kube.client import Kube, api_path, nm_path
from nmo.kube.errors import Forbidden, NotFound

Obj = dict[str, Any]

SCHEMA = "nmo.status/v1"
RECENT_EVENTS = 10
PHASE_STYLE = {"Running": "yellow", "Succeeded": "green", "Failed": "red"}


class StatusError(Exception):
    """The asked-for maintenance does not exist."""


def _iso(t: datetime | None) -> str | None:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if t else None


def lease_view(lease: Obj | None, now: datetime) -> Obj | None:
    """Holder, renewal and expiry of the node lease."""
    if lease is None:
        return None
    spec = lease.get("spec") or {}
    renewed, expires = lease_times(spec)
    return {
        "name": (lease.get("metadata") or {}).get("name"),
        "namespace": (lease.get("metadata") or {}).get("namespace"),
        "holder": spec.get("holderIdentity") or None,
        "renewTime": _iso(renewed),
        "expires": _iso(expires),
        "valid": bool(expires and expires > now and spec.get("holderIdentity")),
    }


def event_time(event: Obj) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )


def related_events(events: list[Obj], nm_name: str, node_name: str) -> list[Obj]:
    """Events on the CR or its node, oldest first, the most recent few."""
    wanted = {(c.KIND, nm_name), ("Node", node_name)}
    mine = [
        e
        for e in events
        if (
            (e.get("involvedObject") or {}).get("kind"),
            (e.get("involvedObject") or {}).get("name"),
        )
        in wanted
    ]
    mine.sort(key=event_time)
    return [
        {
            "time": event_time(e) or None,
            "type": e.get("type"),
            "reason": e.get("reason"),
            "object": f"{(e.get('involvedObject') or {}).get('kind')}/"
            f"{(e.get('involvedObject') or {}).get('name')}",
            "message": e.get("message"),
            "count": e.get("count") or 1,
        }
        for e in mine[-RECENT_EVENTS:]
    ]


def pending_view(status: Obj) -> list[Obj]:
    """Pending pods with why; falls back to pendingPodsRefs (CRs written by the Go NMO)."""
    details = status.get("pendingPodsDetails")
    if details is not None:
        return [
            {
                "namespace": d.get("namespace"),
                "name": d.get("name"),
                "reason": d.get("reason"),
                "message": d.get("message") or None,
                "disruptionBudget": d.get("disruptionBudget"),
                "since": d.get("since"),
            }
            for d in details
        ]
    return [
        {
            "namespace": r.get("namespace"),
            "name": r.get("name"),
            "reason": None,
            "message": None,
            "disruptionBudget": None,
            "since": None,
        }
        for r in status.get("pendingPodsRefs") or []
    ]


def conditions_view(status: Obj) -> list[Obj]:
    """The CR's conditions as stored (Drained, Queued, VolumesDetached)."""
    return [
        {
            "type": x.get("type"),
            "status": x.get("status"),
            "reason": x.get("reason"),
            "message": x.get("message") or None,
            "since": x.get("lastTransitionTime"),
        }
        for x in status.get("conditions") or []
    ]


def waiting_on(conditions: list[Obj]) -> Obj | None:
    """What holds the maintenance, if a condition says so: the fleet limits, the
    window, the soak or an alert gate (``Queued`` True), or the volumes still
    attached after the drain (``VolumesDetached`` False)."""
    for x in conditions:
        held = (x.get("type"), x.get("status")) in (
            (c.CONDITION_QUEUED, "True"),
            (c.CONDITION_VOLUMES_DETACHED, "False"),
        )
        if held:
            return x
    return None


def summarize(nm: Obj, *, lease: Obj | None, events: list[Obj], now: datetime) -> Obj:
    """The stable machine-readable view of one maintenance (pure)."""
    meta = nm.get("metadata") or {}
    spec = nm.get("spec") or {}
    status = nm.get("status") or {}
    node = str(spec.get("nodeName") or "")
    return {
        "name": meta.get("name"),
        "node": node,
        "reason": spec.get("reason"),
        "phase": status.get("phase"),
        "drainProgress": status.get("drainProgress"),
        "deleting": bool(meta.get("deletionTimestamp")),
        "createdAt": meta.get("creationTimestamp"),
        "lastUpdate": status.get("lastUpdate"),
        "lastError": status.get("lastError") or None,
        "totalPods": status.get("totalpods"),
        "evictionPods": status.get("evictionPods"),
        "errorOnLeaseCount": status.get("errorOnLeaseCount"),
        "pendingPods": pending_view(status),
        "conditions": conditions_view(status),
        "lease": lease_view(lease, now),
        "events": related_events(events, str(meta.get("name") or ""), node),
    }


def document(summaries: list[Obj], now: datetime) -> Obj:
    """The ``-o json`` document: always a list, even for one maintenance."""
    return {"schema": SCHEMA, "generatedAt": _iso(now), "items": summaries}


def _ago(value: str | None, now: datetime) -> str:
    t = parse_time(value)
    if t is None:
        return "-"
    seconds = int((now - t).total_seconds())
    future = seconds < 0
    seconds = abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            text = f"{seconds // size}{unit}"
            break
    else:
        text = f"{seconds}s"
    return f"in {text}" if future else f"{text} ago"


def _plain(*cells: object) -> list[Text]:
    """Table cells as plain text: cluster strings are never read as Rich markup."""
    return [Text(str(cell)) for cell in cells]


def _lease_text(lease: Obj | None, now: datetime) -> Text:
    if lease is None:
        return Text("none", style="dim")
    holder = lease.get("holder") or "(no holder)"
    state = "valid" if lease.get("valid") else "expired"
    style = "green" if lease.get("valid") and holder == c.LEASE_HOLDER else "yellow"
    return Text(f"{holder}, {state}, expires {_ago(lease.get('expires'), now)}", style=style)


def render_one(s: Obj, now: datetime) -> RenderableType:
    phase = s.get("phase") or "(not reconciled yet)"
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("Node", Text(str(s.get("node") or "-")))
    head.add_row(
        "Phase",
        Text(
            phase + (" (deleting)" if s.get("deleting") else ""), style=PHASE_STYLE.get(phase, "")
        ),
    )
    progress = int(s.get("drainProgress") or 0)
    bar = Table.grid(padding=(0, 1))
    bar.add_row(ProgressBar(total=100, completed=progress, width=30), f"{progress}%")
    head.add_row("Progress", bar)
    pods = f"{s.get('evictionPods') or 0} to evict of {s.get('totalPods') or 0} on the node"
    head.add_row("Pods", pods)
    if s.get("reason"):
        head.add_row("Reason", Text(str(s["reason"])))
    head.add_row("Lease", _lease_text(s.get("lease"), now))
    if s.get("errorOnLeaseCount"):
        head.add_row("Lease errors", str(s["errorOnLeaseCount"]))
    held = waiting_on(s.get("conditions") or [])
    if held is not None:
        why = f"{held.get('type')} {held.get('reason') or ''}".strip()
        if held.get("message"):
            why += f": {held['message']}"
        head.add_row("Waiting", Text(why, style="yellow"))
    head.add_row("Last update", _ago(s.get("lastUpdate"), now))
    if s.get("lastError"):
        head.add_row("Last error", Text(str(s["lastError"]), style="red"))
    parts: list[RenderableType] = [head]
    if s.get("pendingPods"):
        pending = Table(title="Pending pods", title_justify="left", expand=False)
        for col in ("Pod", "Why", "Budget", "Since", "Message"):
            pending.add_column(col)
        for p in s["pendingPods"]:
            pending.add_row(
                *_plain(
                    f"{p['namespace']}/{p['name']}",
                    p.get("reason") or "-",
                    p.get("disruptionBudget") or "-",
                    _ago(p.get("since"), now) if p.get("since") else "-",
                    p.get("message") or "",
                )
            )
        parts.append(pending)
    if s.get("events"):
        events = Table(title="Recent events", title_justify="left", expand=False)
        for col in ("Age", "Type", "Reason", "Object", "Message"):
            events.add_column(col)
        for e in s["events"][-5:]:
            events.add_row(
                *_plain(
                    _ago(e.get("time"), now),
                    e.get("type") or "",
                    e.get("reason") or "",
                    e.get("object") or "",
                    e.get("message") or "",
                )
            )
        parts.append(events)
    title = Text(f"nodemaintenance/{s.get('name')}")
    return Panel(Group(*parts), title=title, title_align="left")


def render(summaries: list[Obj], now: datetime) -> RenderableType:
    """All maintenances, one panel each."""
    if not summaries:
        return Text("No NodeMaintenance found.")
    return Group(*(render_one(s, now) for s in summaries))


NM_PATH = nm_path()


async def collect(
    kube: Kube, *, name: str | None, node: str | None, lease_namespace: str, now: datetime
) -> list[Obj]:
    """Read the maintenances asked for, with leases and events; summarize them."""
    if name:
        try:
            items = [await kube.get(f"{NM_PATH}/{name}")]
        except NotFound as exc:
            raise StatusError(f'nodemaintenance "{name}" not found') from exc
    else:
        items = list((await kube.list_all(NM_PATH)).get("items") or [])
        if node:
            items = [m for m in items if (m.get("spec") or {}).get("nodeName") == node]
            if not items:
                raise StatusError(f'no NodeMaintenance for node "{node}"')
    items.sort(key=lambda m: str((m.get("metadata") or {}).get("name")))
    if not items:
        return []
    events = await _events(kube, items)
    leases: dict[str, Obj] = {}
    try:
        listed = await kube.list_all(
            api_path("coordination.k8s.io/v1", "leases", namespace=lease_namespace)
        )
        leases = {str(x["metadata"]["name"]): x for x in listed.get("items") or []}
    except (NotFound, Forbidden):
        pass
    out = []
    for nm in items:
        node_name = str((nm.get("spec") or {}).get("nodeName") or "")
        lease = leases.get(c.lease_name(node_name)) if node_name else None
        out.append(summarize(nm, lease=lease, events=events, now=now))
    return out


async def _events(kube: Kube, items: list[Obj]) -> list[Obj]:
    """Events in ``default``: by field selector for a few CRs, one list for many."""
    path = api_path("v1", "events", namespace=EVENT_NAMESPACE)
    try:
        if len(items) > 3:
            return list((await kube.list_all(path)).get("items") or [])
        events: list[Obj] = []
        for nm in items:
            pairs = [(c.KIND, (nm.get("metadata") or {}).get("name"))]
            pairs.append(("Node", (nm.get("spec") or {}).get("nodeName")))
            for kind, obj in pairs:
                selector = f"involvedObject.kind={kind},involvedObject.name={obj}"
                page = await kube.list_all(path, params={"fieldSelector": selector})
                events += page.get("items") or []
        return events
    except Forbidden:
        return []
