"""What untrusted traffic may spend of the operator's API budget.

Why this module exists: the webhook and metrics ports answer anyone, and two
of their answers cost an API request: an unknown metrics token (a
TokenReview) and a review naming a node missing from the informer cache (a
GET). Both went through the operator's client, the same in-flight slots as
evictions, without a bound (issue 14, item 7). This module bounds them:

* :class:`BudgetedKube` wraps the operator's client for the webhooks with its
  own, small number of requests in flight (a share of the operator's slots,
  never all of them) and a token-bucket rate; past either, a request fails
  at once with :class:`nmo.core.errors.TooManyRequests`, never queues;
* :class:`Forgetful` remembers negative answers (a rejected token, a missing
  node) for a short TTL, with a bounded number of entries, so repeating the
  same bad input costs nothing.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from nmo.core.errors import TooManyRequests
from nmo.core.kube import Params

if TYPE_CHECKING:  # lookups imports this module
    from nmo.webhooks.lookups import KubeClient


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


class BudgetedKube:
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
        if self._in_flight >= self.max_in_flight or not self._bucket.take():
            self.refused += 1
            raise TooManyRequests(
                "too many API requests for webhook and metrics callers right now",
                status_code=429,
                retry_after=1.0,
            )
        self._in_flight += 1
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
            self._in_flight -= 1
