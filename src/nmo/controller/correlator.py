"""Event correlation as client-go's recorder does it (tools/record/events_cache.go).

Why this exists: the Go operator records Events through client-go's
``EventCorrelator``, so an identical repeat is never a new Event object: it
PATCHes the first one, raising ``count`` and ``lastTimestamp``. Scripts and
alerts read ``count`` (``kubectl get events`` shows it as ``COUNT``), so nmo
correlates the same way. Everything here is a pure decision over an
in-memory cache and an injected ``now`` (seconds); :mod:`nmo.controller.recorder`
does the writing and reports the server's answer back (:meth:`update_state`).

What carries over, with client-go's defaults:

- **Deduplication.** Same source, involved object (kind, namespace, name,
  uid, apiVersion, fieldPath), type, reason and message: the next write is a
  strategic merge patch ``{count, lastTimestamp, message}`` of the Event the
  cache remembers; there is no time window on this (only the cache's size).
- **Aggregation.** More than 9 distinct messages for the same source, object,
  type and reason within 600 s: the 10th and later become one Event whose
  message is ``(combined from similar events): <message>``, counted in turn.
- **Spam filter.** Per source, object and type a token bucket of 25 events,
  refilled at one per 300 s; an event beyond it is dropped (after being
  counted, as client-go counts it).
- An LRU of 4096 entries per cache.

What does not: the cache lives as long as the process (client-go's too), so
the first repeat after a restart creates a new Event; nmo does not retry a
failed write 12 times in the background (:mod:`nmo.controller.recorder` logs it).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

Event = dict[str, Any]
Key = tuple[str, ...]

CACHE_SIZE = 4096
AGGREGATE_MAX_EVENTS = 10
AGGREGATE_INTERVAL = 600.0  # seconds
SPAM_BURST = 25
SPAM_QPS = 1.0 / 300.0
COMBINED_PREFIX = "(combined from similar events): "

K = TypeVar("K")
V = TypeVar("V")


class Lru(Generic[K, V]):
    """A bounded mapping that forgets the least recently used key."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)


def _source(event: Event) -> tuple[str, str]:
    src = event.get("source") or {}
    return str(src.get("component", "")), str(src.get("host", ""))


def _object(event: Event, *, field_path: bool) -> Key:
    ref = event.get("involvedObject") or {}
    parts = [ref.get("kind", ""), ref.get("namespace", ""), ref.get("name", "")]
    if field_path:
        parts.append(ref.get("fieldPath", ""))
    parts += [ref.get("uid", ""), ref.get("apiVersion", "")]
    return tuple(str(p) for p in parts)


def event_key(event: Event) -> Key:
    """What makes two events identical (client-go's getEventKey)."""
    return (
        *_source(event),
        *_object(event, field_path=True),
        str(event.get("type", "")),
        str(event.get("reason", "")),
        str(event.get("message", "")),
    )


def spam_key(event: Event) -> Key:
    """The token bucket an event draws from (client-go's getSpamKey)."""
    return (*_source(event), *_object(event, field_path=False), str(event.get("type", "")))


def aggregate_key(event: Event) -> tuple[Key, str]:
    """(group, member): events that differ only by message share a group."""
    group = (
        *_source(event),
        *_object(event, field_path=False),
        str(event.get("type", "")),
        str(event.get("reason", "")),
        str(event.get("reportingComponent", "")),
        str(event.get("reportingInstance", "")),
    )
    return group, str(event.get("message", ""))


@dataclass
class _Bucket:
    tokens: float
    stamp: float

    def take(self, now: float, *, burst: int, qps: float) -> bool:
        self.tokens = min(float(burst), self.tokens + max(0.0, now - self.stamp) * qps)
        self.stamp = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


@dataclass
class _Group:
    messages: set[str] = field(default_factory=set)
    last: float = float("-inf")


@dataclass(frozen=True)
class _Seen:
    count: int
    first_timestamp: str
    name: str
    resource_version: str


@dataclass(frozen=True)
class Correlated:
    """What to write: ``patch`` the Event named in ``event``, or create ``event``."""

    event: Event
    patch: dict[str, Any] | None = None


class EventCorrelator:
    """Filters, aggregates and counts events before they are written."""

    def __init__(
        self,
        *,
        cache_size: int = CACHE_SIZE,
        max_events: int = AGGREGATE_MAX_EVENTS,
        max_interval: float = AGGREGATE_INTERVAL,
        burst: int = SPAM_BURST,
        qps: float = SPAM_QPS,
    ) -> None:
        self.max_events = max_events
        self.max_interval = max_interval
        self.burst = burst
        self.qps = qps
        self._groups: Lru[Key, _Group] = Lru(cache_size)
        self._seen: Lru[Key, _Seen] = Lru(cache_size)
        self._buckets: Lru[Key, _Bucket] = Lru(cache_size)

    def correlate(self, event: Event, now: float) -> Correlated | None:
        """The write for ``event`` at ``now``, or None when the spam filter drops it."""
        aggregated, key = self._aggregate(event, now)
        observed, patch = self._observe(aggregated, key)
        spam = spam_key(observed)
        bucket = self._buckets.get(spam) or _Bucket(tokens=float(self.burst), stamp=now)
        allowed = bucket.take(now, burst=self.burst, qps=self.qps)
        self._buckets.put(spam, bucket)
        if not allowed:
            return None
        return Correlated(event=observed, patch=patch)

    def update_state(self, event: Event) -> None:
        """Remember the server's copy (name, resourceVersion, count) of a written Event."""
        meta = event.get("metadata") or {}
        self._seen.put(
            event_key(event),
            _Seen(
                count=int(event.get("count") or 0),
                first_timestamp=str(event.get("firstTimestamp") or ""),
                name=str(meta.get("name", "")),
                resource_version=str(meta.get("resourceVersion", "")),
            ),
        )

    def _aggregate(self, event: Event, now: float) -> tuple[Event, Key]:
        group_key, message = aggregate_key(event)
        group = self._groups.get(group_key)
        if group is None or now - group.last > self.max_interval:
            group = _Group()
        group.messages.add(message)
        group.last = now
        self._groups.put(group_key, group)
        if len(group.messages) < self.max_events:
            return event, event_key(event)
        group.messages.pop()  # the set never grows past the threshold
        combined = copy.deepcopy(event)
        ref_name = (event.get("involvedObject") or {}).get("name", "")
        combined["metadata"] = {
            "name": f"{ref_name}.{int(now * 1e9):x}",
            "namespace": (event.get("metadata") or {}).get("namespace", ""),
        }
        combined["message"] = COMBINED_PREFIX + message
        combined["count"] = 1
        combined["firstTimestamp"] = combined["lastTimestamp"] = event.get("lastTimestamp")
        return combined, group_key

    def _observe(self, event: Event, key: Key) -> tuple[Event, dict[str, Any] | None]:
        observed = copy.deepcopy(event)
        seen = self._seen.get(key)
        patch: dict[str, Any] | None = None
        if seen is not None and seen.count > 0:
            meta = observed.setdefault("metadata", {})
            meta["name"] = seen.name
            if seen.resource_version:
                meta["resourceVersion"] = seen.resource_version
            observed["firstTimestamp"] = seen.first_timestamp
            observed["count"] = seen.count + 1
            patch = {
                "count": observed["count"],
                "lastTimestamp": observed.get("lastTimestamp"),
                "message": observed.get("message", ""),
            }
        meta = observed.get("metadata") or {}
        self._seen.put(
            key,
            _Seen(
                count=int(observed.get("count") or 0),
                first_timestamp=str(observed.get("firstTimestamp") or ""),
                name=str(meta.get("name", "")),
                resource_version=str(meta.get("resourceVersion", "")),
            ),
        )
        return observed, patch
