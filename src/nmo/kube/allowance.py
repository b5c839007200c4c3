"""What untrusted traffic may spend of the operator's API budget.

Why this module exists: the webhook and metrics ports answer anyone, and two
of their answers cost an API request: an unknown metrics token (a
TokenReview) and a review naming a node missing from the informer cache (a
GET). Both went through the operator's client, the same in-flight slots as
evictions, without a bound (issue 14, item 7). This module bounds them:

* :class:`BudgetedKube` wraps the operator's client for the webhooks with its
  own, small number of requests in flight (a share of the operator's slots,
  never all of them) and a token-bucket rate; past either, a request fails
  at once with :class:`nmo.kube.errors.TooManyRequests`, never queues;
* :class:`Shares` puts a token bucket per caller in front of such a client
  (``for_key``): one caller past its own rate is refused the same way and
  leaves the rest of the budget to the others (issue 20: random tokens from
  one pod drained the shared bucket, and 10 of 10 real scrapes got 429);
  callers are told apart by what they cannot forge (their peer address, an
  identity the API server vouched for), never by what a request says;
* :class:`Forgetful` remembers negative answers (a rejected token, a missing
  node) for a short TTL, with a bounded number of entries, so repeating the
  same bad input costs nothing; :class:`TTLCache` is its counterpart for
  answers with a value.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from nmo.kube.client import Params
from nmo.kube.errors import TooManyRequests

if TYPE_CHECKING:  # lookups imports this module
    from nmo.kube.client import KubeClient

V = TypeVar("V")


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up."""

    def __init__(
        self, rate: float, burst: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class Forgetful:
    """A bounded set whose members leave after ``ttl`` seconds (oldest first when full)."""

    def __init__(
        self, ttl: float, max_entries: int = 4096, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl, self.max_entries, self._clock = ttl, max_entries, clock
        self._until: OrderedDict[Hashable, float] = OrderedDict()

    def add(self, key: Hashable) -> None:
        if self.ttl <= 0:
            return
        self._until[key] = self._clock() + self.ttl
        self._until.move_to_end(key)
        while len(self._until) > self.max_entries:
            self._until.popitem(last=False)

    def discard(self, key: Hashable) -> None:
        self._until.pop(key, None)

    def __contains__(self, key: Hashable) -> bool:
        until = self._until.get(key)
        if until is None:
            return False
        if until <= self._clock():
            del self._until[key]
            return False
        return True

    def __len__(self) -> int:
        return len(self._until)


class TTLCache(Generic[V]):
    """A bounded mapping whose entries leave ``ttl`` seconds after they were
    put (least recently put first when full)."""

    def __init__(
        self, ttl: float, max_entries: int = 1024, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl, self.max_entries, self._clock = ttl, max_entries, clock
        self._items: OrderedDict[Hashable, tuple[float, V]] = OrderedDict()

    def get(self, key: Hashable) -> V | None:
        hit = self._items.get(key)
        if hit is None:
            return None
        if hit[0] <= self._clock():
            del self._items[key]
            return None
        return hit[1]

    def pop(self, key: Hashable) -> V | None:
        value = self.get(key)
        self._items.pop(key, None)
        return value

    def put(self, key: Hashable, value: V) -> None:
        if self.ttl <= 0:
            return
        self._items[key] = (self._clock() + self.ttl, value)
        self._items.move_to_end(key)
        while len(self._items) > self.max_entries:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


class _Gate:
    """A :class:`KubeClient` in front of ``_kube`` that asks :meth:`_enter`
    before each request (which raises TooManyRequests to refuse it) and
    :meth:`_leave` after."""

    _kube: KubeClient

    def _enter(self) -> None:
        raise NotImplementedError

    def _leave(self) -> None:
        pass

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: Any = None,
        content_type: str = "application/json",
        retry: bool = True,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        self._enter()
        try:
            return await self._kube.request(
                method,
                path,
                params=params,
                body=body,
                content_type=content_type,
                retry=retry,
                timeout=timeout,
            )
        finally:
            self._leave()


class BudgetedKube(_Gate):
    """A :class:`KubeClient` with its own in-flight bound and request rate."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        max_in_flight: int = 16,
        rate: float = 20.0,
        burst: int = 40,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self.max_in_flight = max_in_flight
        self._in_flight = 0
        self._bucket = TokenBucket(rate, burst, clock=clock)
        self.refused = 0

    def _enter(self) -> None:
        if self._in_flight >= self.max_in_flight or not self._bucket.take():
            self.refused += 1
            raise TooManyRequests(
                "too many API requests for webhook and metrics callers right now",
                status_code=429,
                retry_after=1.0,
            )
        self._in_flight += 1

    def _leave(self) -> None:
        self._in_flight -= 1


class KeyedBuckets:
    """A :class:`TokenBucket` per key, ``rate`` a second and ``burst`` at
    once; the ``max_keys`` keys used last are remembered, and a key forgotten
    (or new) starts with a full bucket."""

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        max_keys: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate, self.burst, self.max_keys = rate, burst, max_keys
        self._clock = clock
        self._buckets: OrderedDict[Hashable, TokenBucket] = OrderedDict()
        self.refused = 0

    def take(self, key: Hashable) -> bool:
        """Spend one of ``key``'s tokens; False when it has none left."""
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(self.rate, self.burst, clock=self._clock)
            while len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        self._buckets.move_to_end(key)
        if bucket.take():
            return True
        self.refused += 1
        return False


class Shares(KeyedBuckets):
    """A token bucket per caller in front of ``kube``: :meth:`for_key` is the
    client one caller spends through, ``rate`` requests a second and ``burst``
    at once; past them its requests fail at once with TooManyRequests, and
    ``kube``'s own bound stays the total."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        rate: float,
        burst: int,
        max_keys: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(rate, burst, max_keys=max_keys, clock=clock)
        self.kube = kube

    def for_key(self, key: Hashable) -> KubeClient:
        return _Share(self, key)


@dataclass(frozen=True)
class Pool:
    """A bounded client (``in_flight``, ``rate``, ``burst``) and each caller's
    share of it (``share_rate``, ``share_burst``)."""

    in_flight: int
    rate: float
    burst: int
    share_rate: float
    share_burst: int

    def shares(self, kube: KubeClient, *, clock: Callable[[], float] = time.monotonic) -> Shares:
        pool = BudgetedKube(
            kube, max_in_flight=self.in_flight, rate=self.rate, burst=self.burst, clock=clock
        )
        return Shares(pool, rate=self.share_rate, burst=self.share_burst, clock=clock)


class _Share(_Gate):
    """``Shares.kube`` as one caller spends it."""

    def __init__(self, shares: Shares, key: Hashable) -> None:
        self._shares, self._key, self._kube = shares, key, shares.kube

    def _enter(self) -> None:
        if not self._shares.take(self._key):
            raise TooManyRequests(
                "too many API requests for this caller right now", status_code=429, retry_after=1.0
            )
