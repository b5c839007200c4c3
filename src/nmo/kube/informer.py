"""List-then-watch: an in-memory mirror of one resource kind.

kr8s's own watch does not reconnect, hot-loops on 410 and never asks for
bookmarks, so nmo runs its own loop (the shape client-go's reflector has):

1. LIST (paginated) and take the list's resourceVersion; replace the store
   and report the differences to the handlers;
2. WATCH from that resourceVersion with ``allowWatchBookmarks`` and a server
   side ``timeoutSeconds``; apply each event, remember its resourceVersion;
3. a clean end of the stream resumes from the last resourceVersion, a 410
   (or an ERROR event with code 410) re-LISTs, any other failure backs off
   (capped, jittered) and resumes.

Guarantees: handlers see every change at least once (possibly coalesced after
a re-LIST), ``synced`` is set after the first LIST, and a dropped stream or a
restarting apiserver never produces a request storm.

Memory: a LIST is read 100 objects a page (client-go asks for 500): a
page is decoded whole before the transform slims it, and the process keeps
its high-water mark, so the page size, not the cluster size, sets most of
what a big LIST costs. After a LIST of :data:`COMPACT_AFTER` objects or more
the garbage it left is released (:func:`release_garbage`).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import gc
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from nmo.kube import backoff
from nmo.kube.client import Kube
from nmo.kube.errors import Gone, KubeError, NotFound, Transient

log = logging.getLogger("nmo.watch")

Obj = dict[str, Any]
# handler(event_type, new_or_last_object, old_object_or_None)
Handler = Callable[[str, Obj, Obj | None], None]
IndexFunc = Callable[[Obj], str | None]
Transform = Callable[[Obj], Obj]

PAGE_SIZE = 100
COMPACT_AFTER = 1000  # objects in one LIST


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def release_garbage() -> None:
    """Give back what a big LIST left behind: httpx keeps each response in a
    reference cycle with its stream, so a page's body lives until the cyclic
    collector runs (a full collection frees them all), and glibc keeps the
    heap it grew for the decoded pages until told to trim it."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def object_key(obj: Obj) -> str:
    """``namespace/name`` for namespaced objects, ``name`` otherwise."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    name = str(meta.get("name", ""))
    return f"{ns}/{name}" if ns else name


def _slim(obj: Obj) -> Obj:
    """Drop managedFields: nmo never reads them and they dominate memory."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def _older(new: Obj, old: Obj) -> bool:
    """Whether ``new`` is an older version than ``old`` (etcd's numeric RVs)."""
    try:
        return int(new["metadata"]["resourceVersion"]) < int(old["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return False  # not comparable: trust the event


class Informer:
    """Keeps ``store`` equal to the server's view of one resource."""

    def __init__(
        self,
        kube: Kube,
        path: str,
        *,
        name: str,
        params: Mapping[str, str] | None = None,
        timeout_seconds: int = 300,
        max_backoff: float = 30.0,
        index: IndexFunc | None = None,
        missing_hint: str = "",
        transform: Transform | None = None,
        page_size: int = PAGE_SIZE,
        on_synced: Callable[[], None] | None = None,
    ) -> None:
        self.kube = kube
        self.path = path
        self.name = name
        self.params = dict(params or {})
        self.timeout_seconds = timeout_seconds
        self.max_backoff = max_backoff
        self.store: dict[str, Obj] = {}
        self.synced = asyncio.Event()
        self.handlers: list[Handler] = []
        self._index_func = index
        self._transform = transform or _slim
        self.page_size = page_size
        self._on_synced = on_synced
        self.missing_hint = missing_hint
        self.index: dict[str, set[str]] = {}
        self.resource_version: str | None = None
        self.lists = 0
        self.watches = 0

    def add_handler(self, handler: Handler) -> None:
        self.handlers.append(handler)

    def get(self, key: str) -> Obj | None:
        return self.store.get(key)

    def remember(self, obj: Obj) -> None:
        """Write-through: the store sees our own write of a cached object before
        its watch event does (an older version never replaces a newer one)."""
        obj = self._transform(obj)
        key = object_key(obj)
        old = self.store.get(key)
        if old is not None and not _older(obj, old):
            self.store[key] = obj

    def by_index(self, value: str) -> list[Obj]:
        return [self.store[k] for k in self.index.get(value, ()) if k in self.store]

    def _index_put(self, key: str, old: Obj | None, new: Obj | None) -> None:
        if self._index_func is None:
            return
        if old is not None:
            value = self._index_func(old)
            if value is not None:
                self.index.get(value, set()).discard(key)
        if new is not None:
            value = self._index_func(new)
            if value is not None:
                self.index.setdefault(value, set()).add(key)

    def _emit(self, event: str, obj: Obj, old: Obj | None) -> None:
        for handler in self.handlers:
            try:
                handler(event, obj, old)
            except Exception:
                log.exception("watch handler failed", extra={"informer": self.name})

    def _apply(self, event: str, obj: Obj) -> None:
        obj = self._transform(obj)
        key = object_key(obj)
        old = self.store.get(key)
        if event == "DELETED":
            self.store.pop(key, None)
            self._index_put(key, old, None)
        elif event == "MODIFIED" and old is not None and _older(obj, old):
            return  # the store already holds our own later write (write-through)
        else:
            self.store[key] = obj
            self._index_put(key, old, obj)
        self._emit(event, obj, old)

    async def _relist(self) -> None:
        page = await self.kube.list_all(
            self.path, params=self.params, limit=self.page_size, transform=self._transform
        )
        self.lists += 1
        fresh = {object_key(o): o for o in page.get("items") or []}
        for key in list(self.store):
            if key not in fresh:
                gone = self.store.pop(key)
                self._index_put(key, gone, None)
                self._emit("DELETED", gone, gone)
        for key, obj in fresh.items():
            old = self.store.get(key)
            self.store[key] = obj
            self._index_put(key, old, obj)
            if old is None:
                self._emit("ADDED", obj, None)
            elif old.get("metadata", {}).get("resourceVersion") != obj["metadata"].get(
                "resourceVersion"
            ):
                self._emit("MODIFIED", obj, old)
        self.resource_version = str((page.get("metadata") or {}).get("resourceVersion") or "")
        del page
        if len(fresh) >= COMPACT_AFTER:
            del fresh
            release_garbage()
        first = not self.synced.is_set()
        self.synced.set()
        if first and self._on_synced is not None:
            self._on_synced()

    async def _watch_once(self) -> int:
        """One WATCH; returns how many events it delivered."""
        params: dict[str, str | int | bool] = {
            **self.params,
            "watch": True,
            "allowWatchBookmarks": True,
            "timeoutSeconds": self.timeout_seconds,
        }
        if self.resource_version:
            params["resourceVersion"] = self.resource_version
        self.watches += 1
        delivered = 0
        async for event in self.kube.stream(
            self.path, params=params, read_timeout=self.timeout_seconds + 30
        ):
            delivered += 1
            kind = event.get("type")
            obj = event.get("object") or {}
            if kind == "ERROR":
                code = int(obj.get("code") or 0)
                if code == 410:
                    raise Gone(str(obj.get("message", "resourceVersion too old")), status_code=410)
                raise Transient(f"watch error event: {obj.get('message')}", status_code=code)
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if kind == "BOOKMARK":
                if rv:
                    self.resource_version = str(rv)
                continue
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._apply(kind, obj)
                if rv:
                    self.resource_version = str(rv)
        return delivered

    def _backoff(self, failures: int) -> float:
        return backoff.delay(failures, base=0.5, cap=self.max_backoff)

    async def run(self) -> None:
        """Run forever (cancel to stop)."""
        failures = 0
        while True:
            try:
                if self.resource_version is None:
                    await self._relist()
                started = time.monotonic()
                delivered = await self._watch_once()
                if delivered or time.monotonic() - started >= 1.0:
                    failures = 0
                else:
                    # A watch that ends at once with nothing in it (a proxy
                    # cutting streams, say) must not turn into a hot loop.
                    failures += 1
                    await asyncio.sleep(self._backoff(failures))
            except Gone:
                log.info("watch expired, re-listing", extra={"informer": self.name})
                self.resource_version = None
            except KubeError as exc:
                failures += 1
                if isinstance(exc, NotFound) and self.missing_hint:
                    log.error(
                        "%s is not served by the API server: %s",
                        self.path,
                        self.missing_hint,
                        extra={"informer": self.name},
                    )
                delay = self._backoff(failures)
                log.warning(
                    "watch interrupted, retrying",
                    extra={"informer": self.name, "error": str(exc), "delay": round(delay, 2)},
                )
                await asyncio.sleep(delay)
