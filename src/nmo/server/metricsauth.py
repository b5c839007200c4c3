"""``/metrics`` behind the API server's authentication and authorization.

Why this module exists: NMO serves metrics through controller-runtime's
``filters.WithAuthenticationAndAuthorization``, so Prometheus setups already
hold a ServiceAccount token allowed to ``get`` the non-resource URL
``/metrics`` (the chart's ``metrics-reader`` ClusterRole). nmo accepts exactly
the same callers, the same way:

1. ``Authorization: Bearer <token>`` is checked with a TokenReview
   (``authentication.k8s.io/v1``); no header, a malformed header or an
   unauthenticated token answers 401 ``Unauthorized``;
2. the user is checked with a SubjectAccessReview
   (``authorization.k8s.io/v1``) for verb ``get`` on the request path; a
   refusal answers 403 ``Authorization denied for user <name>``;
3. an API error during either step answers 500 (the caller cannot be told
   apart from an intruder, so it is not let in).

Positive answers are cached for ``cache_ttl`` (a minute by default), keyed by
a SHA-256 of the token, so a scrape every few seconds costs no API traffic;
so are tokens the TokenReview rejected (a token never turns valid later), so
repeating a bad token costs nothing; authorization refusals are never cached,
so a freshly granted role works at once.

The reviews a request costs are paid from one of two budgets
(:class:`nmo.kube.allowance.Shares` over a bounded client each), past which
the answer is 429 ``Too many authentication requests`` and no review is sent:

* *proven* callers, those let in before (within ``remember``, an hour by
  default), spend the proven budget: a token let in before is charged to its
  user, any other token to its peer address when that address was let in
  before (Prometheus after its token rotated);
* everyone else shares the small unproven budget, each peer address its own
  share of it.

So random tokens cost one review each, but only from the unproven budget
and, from one address, only that address's share of it (issue 20: 10 of 10
real scrapes got 429 while random tokens arrived); a proven scraper keeps its
own budget whatever the others send.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nmo.kube.allowance import Forgetful, Pool, TTLCache
from nmo.kube.client import KubeClient, api_path
from nmo.kube.errors import KubeError, TooManyRequests

log = logging.getLogger("nmo.webhooks.metrics_auth")

TOKEN_REVIEWS = api_path("authentication.k8s.io/v1", "tokenreviews")
SUBJECT_ACCESS_REVIEWS = api_path("authorization.k8s.io/v1", "subjectaccessreviews")

# A scrape costs two reviews when its token is not cached: a caller's share
# allows a few at once and one scrape a second or so.
PROVEN = Pool(in_flight=4, rate=5.0, burst=10, share_rate=2.0, share_burst=8)
UNPROVEN = Pool(in_flight=2, rate=3.0, burst=12, share_rate=1.0, share_burst=6)


@dataclass(frozen=True)
class User:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, list[str]] = field(default_factory=dict)


class AuthRejected(Exception):
    """The request may not see the metrics; carries the HTTP answer."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer`` header (as client-go parses it)."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


class MetricsAuth:
    """TokenReview + SubjectAccessReview, with a short positive cache and
    budgets for proven and unproven callers (see the module docstring)."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        cache_ttl: float = 60.0,
        max_entries: int = 1024,
        remember: float = 3600.0,
        proven: Pool = PROVEN,
        unproven: Pool = UNPROVEN,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._users: TTLCache[User] = TTLCache(cache_ttl, max_entries, clock=clock)
        self._allowed: TTLCache[bool] = TTLCache(cache_ttl, max_entries, clock=clock)
        self._rejected = Forgetful(cache_ttl, 4 * max_entries, clock=clock)
        # Let in before: token digest -> user name; peer addresses.
        self._proven_tokens: TTLCache[str] = TTLCache(remember, max_entries, clock=clock)
        self._proven_sources = Forgetful(remember, max_entries, clock=clock)
        self.proven = proven.shares(kube, clock=clock)
        self.unproven = unproven.shares(kube, clock=clock)
        self.reviews = 0

    def _budget(self, digest: str, source: str) -> KubeClient:
        """Who pays for the reviews of a request with this token, from this address."""
        user = self._proven_tokens.get(digest)
        if user is not None:
            return self.proven.for_key(("user", user))
        if source in self._proven_sources:
            return self.proven.for_key(("source", source))
        return self.unproven.for_key(("source", source))

    async def authenticate(self, token: str, *, kube: KubeClient) -> User | None:
        """The user behind a token, or None when the API server says no."""
        key = _digest(token)
        cached = self._users.get(key)
        if cached is not None:
            return cached
        if key in self._rejected:
            return None
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
        self.reviews += 1
        answer = await kube.request("POST", TOKEN_REVIEWS, body=body, retry=False)
        status = answer.get("status") or {}
        if not status.get("authenticated"):
            self._rejected.add(key)
            if status.get("error"):
                log.debug("token rejected", extra={"error": status.get("error")})
            return None
        info = status.get("user") or {}
        user = User(
            name=str(info.get("username", "")),
            uid=str(info.get("uid", "")),
            groups=tuple(info.get("groups") or ()),
            extra={k: list(v) for k, v in (info.get("extra") or {}).items()},
        )
        self._users.put(key, user)
        return user

    async def authorize(self, user: User, *, path: str, verb: str, kube: KubeClient) -> bool:
        """Whether RBAC lets the user ``verb`` the non-resource URL ``path``."""
        key = (user.name, user.uid, user.groups, path, verb)
        if self._allowed.get(key):
            return True
        spec: dict[str, Any] = {
            "user": user.name,
            "groups": list(user.groups),
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = dict(user.extra)
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        }
        self.reviews += 1
        answer = await kube.request("POST", SUBJECT_ACCESS_REVIEWS, body=body, retry=False)
        status = answer.get("status") or {}
        allowed = bool(status.get("allowed")) and not status.get("denied")
        if allowed:
            self._allowed.put(key, True)
        else:
            log.debug(
                "metrics access denied",
                extra={"user": user.name, "reason": status.get("reason", "")},
            )
        return allowed

    async def check(
        self, authorization: str | None, *, path: str, method: str, source: str = ""
    ) -> User:
        """Admit a request from peer address ``source`` or raise
        :class:`AuthRejected` with the HTTP answer."""
        token = bearer_token(authorization)
        if token is None:
            raise AuthRejected(401, "Unauthorized")
        digest = _digest(token)
        kube = self._budget(digest, source)
        try:
            user = await self.authenticate(token, kube=kube)
        except TooManyRequests as exc:
            raise AuthRejected(429, "Too many authentication requests") from exc
        except KubeError as exc:
            log.error("metrics authentication failed", extra={"error": str(exc)})
            raise AuthRejected(500, "Authentication failed") from exc
        if user is None:
            raise AuthRejected(401, "Unauthorized")
        verb = method.lower()  # as the apiserver's RequestInfo derives it
        try:
            allowed = await self.authorize(user, path=path, verb=verb, kube=kube)
        except TooManyRequests as exc:
            raise AuthRejected(429, "Too many authorization requests") from exc
        except KubeError as exc:
            log.error("metrics authorization failed", extra={"user": user.name, "error": str(exc)})
            raise AuthRejected(500, f"Authorization for user {user.name} failed") from exc
        if not allowed:
            raise AuthRejected(403, f"Authorization denied for user {user.name}")
        self._proven_tokens.put(digest, user.name)
        self._proven_sources.add(source)
        return user


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
