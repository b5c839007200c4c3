"""Kubernetes Events for NodeMaintenance objects and Nodes.

Events are how ``kubectl describe nm`` and ``kubectl get events
--field-selector reason=...`` tell the story (guide section 4). Both objects
are cluster-scoped, so, as client-go does, events go to namespace
``default``. Recording an event never fails a reconcile: errors are logged.
"""

from __future__ import annotations

import logging
import secrets
from datetime import UTC, datetime
from typing import Any

from nmo.api import constants as c
from nmo.core.errors import KubeError
from nmo.core.kube import Kube, api_path

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


class EventRecorder:
    def __init__(self, kube: Kube, *, instance: str = "nmo") -> None:
        self.kube = kube
        self.instance = instance

    async def emit(
        self, obj: dict[str, Any], event: tuple[str, str], *, warning: bool = False
    ) -> None:
        reason, message = event
        kind = "Warning" if warning else "Normal"
        body = build_event(obj, kind, reason, message, datetime.now(UTC), self.instance)
        try:
            await self.kube.create(api_path("v1", "events", namespace=EVENT_NAMESPACE), body)
        except KubeError as exc:
            log.warning(
                "could not record maintenance event %s: %s",
                reason,
                exc,
                extra={"reason": reason, "object": body["involvedObject"]["name"]},
            )
        else:
            log.info(
                "maintenance event %s: %s",
                reason,
                message,
                extra={"object": body["involvedObject"]["name"], "event_type": kind},
            )
