"""The one backoff rule: capped exponential growth with jitter.

Used by the API boundary (retries), the watch loop (reconnects), the work
queue (failed reconciles) and the evictor (blocked pods). ``delay(n)`` for
the n-th consecutive failure (0-based) is drawn uniformly from
``[d/2, d]`` with ``d = min(cap, base * 2**n)``, so callers that fail
together do not retry together; ``retry_after`` (a server's Retry-After) is
a floor, itself capped by ``cap`` or, when given, by ``retry_after_limit``
(a caller that does not hold anything while it waits can honour a server's
wait beyond its own backoff cap).
"""

from __future__ import annotations

import random

_MAX_EXPONENT = 16  # 2**16 * any sane base is past every cap


def delay(
    failures: int,
    *,
    base: float,
    cap: float,
    retry_after: float | None = None,
    retry_after_limit: float | None = None,
) -> float:
    ceiling = min(cap, base * 2 ** min(max(failures, 0), _MAX_EXPONENT))
    jittered = random.uniform(ceiling / 2, ceiling)
    if retry_after is not None:
        limit = cap if retry_after_limit is None else max(cap, retry_after_limit)
        return min(limit, max(retry_after, jittered))
    return jittered
