"""Kubernetes Events for NodeMaintenance objects and Nodes.

Events are how ``kubectl describe nm`` and ``kubectl get events
--field-selector reason=...`` tell the story (guide section 4). Both objects
are cluster-scoped, so, as client-go does, events go to namespace
``default``. Recording an event never fails a reconcile: errors are logged.

Repeats are correlated as client-go's recorder correlates them
(:mod:`nmo.controller.correlator`): the same event again raises ``count`` on one
Event object instead of creating another.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from nmo.api import constants as c
from nmo.controller.correlator import EventCorrelator, Key, event_key
from nmo.kube.client import Kube, api_path
from nmo.kube.errors import KubeError, NotFound

log = logging.getLogger("nmo.events")

EVENT_NAMESPACE = "default"


def involved(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    ref = {
        "apiVersion": obj.get("apiVersion", "v1"),
        "kind": obj.get("kind", ""),
        "name": meta.get("name", ""),
        "uid": meta.get("uid", ""),
    }
    if meta.get("resourceVersion"):
        ref["resourceVersion"] = meta["resourceVersion"]
    return ref


def build_event(
    obj: dict[str, Any], kind: str, reason: str, message: str, now: datetime, instance: str
) -> dict[str, Any]:
    ref = involved(obj)
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{ref['name']}.{int(now.timestamp() * 1e9):x}{secrets.token_hex(2)}",
            "namespace": EVENT_NAMESPACE,
        },
        "involvedObject": ref,
        "reason": reason,
        "message": message,
        "type": kind,
        "source": {"component": c.EVENT_COMPONENT},
        "reportingComponent": c.EVENT_COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


STRATEGIC_MERGE = "application/strategic-merge-patch+json"


@dataclass
class _KeyLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class EventRecorder:
    """Writes events through an :class:`EventCorrelator`, as client-go's recorder does.

    A repeat of an event this process recorded before PATCHes that Event
    (``count`` + 1, ``lastTimestamp`` now); if the Event is gone (the API
    server's event TTL, one hour by default), it is created again under its
    name with the raised count, as client-go does. Writes of one event key
    are serialized, so two workers never race on the same Event.
    """

    def __init__(
        self,
        kube: Kube,
        *,
        instance: str = "nmo",
        correlator: EventCorrelator | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = kube
        self.instance = instance
        self.correlator = correlator or EventCorrelator()
        self.clock = clock
        self._locks: dict[Key, _KeyLock] = {}

    async def emit(
        self, obj: dict[str, Any], event: tuple[str, str], *, warning: bool = False
    ) -> None:
        reason, message = event
        kind = "Warning" if warning else "Normal"
        now = self.clock()
        body = build_event(obj, kind, reason, message, now, self.instance)
        key = event_key(body)
        held = self._locks.setdefault(key, _KeyLock())
        held.users += 1
        try:
            async with held.lock:
                await self._record(body, now)
        finally:
            held.users -= 1
            if held.users == 0:
                del self._locks[key]

    async def _record(self, body: dict[str, Any], now: datetime) -> None:
        reason = body["reason"]
        name = body["involvedObject"]["name"]
        result = self.correlator.correlate(body, now.timestamp())
        if result is None:
            log.info(
                "maintenance event %s not recorded: too many events about %s",
                reason,
                name,
                extra={"reason": reason, "object": name},
            )
            return
        written = result.event
        path = api_path("v1", "events", namespace=EVENT_NAMESPACE)
        try:
            answer: dict[str, Any] | None = None
            if result.patch is not None:
                try:
                    answer = await self.kube.request(
                        "PATCH",
                        api_path(
                            "v1",
                            "events",
                            namespace=EVENT_NAMESPACE,
                            name=written["metadata"]["name"],
                        ),
                        body=result.patch,
                        content_type=STRATEGIC_MERGE,
                    )
                except NotFound:
                    answer = None
            if answer is None:
                written["metadata"].pop("resourceVersion", None)
                answer = await self.kube.create(path, written)
        except KubeError as exc:
            log.warning(
                "could not record maintenance event %s: %s",
                reason,
                exc,
                extra={"reason": reason, "object": name},
            )
            return
        self.correlator.update_state(answer)
        log.info(
            "maintenance event %s: %s",
            reason,
            written["message"],
            extra={"object": name, "event_type": body["type"], "count": answer.get("count")},
        )
