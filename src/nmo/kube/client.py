"""The one boundary between nmo and the API server (the only kr8s user).

kr8s gives nmo authentication (kubeconfig, in-cluster service account, exec
plugins) and a shared httpx client. Everything else a long-running operator
needs is owned here: nmo's own errors (:mod:`nmo.kube.errors`), finite
timeouts, retries with capped jittered backoff that honour ``Retry-After``, a
bound on concurrent requests (kr8s's pool has 100 connections and no pool
timeout), and raw streaming for the watch loop.

Requests are made with ``raise_for_status=False`` on purpose: kr8s answers a
401/403 by re-authenticating and recreating the shared client, which would
kill every open watch; a 403 is often a normal answer for nmo (an eviction in
a terminating namespace), so nmo reads the status code itself.

A kubeconfig named by ``--kubeconfig`` or ``$KUBECONFIG`` must be there and
readable (:func:`check_kubeconfig`), as kubectl requires: kr8s skips a
missing file silently and then authenticates as the pod's service account,
so ``nmo cleanup --kubeconfig <typo>`` in a CI pod would act as that pod.
With a kubeconfig named, kr8s is never allowed that fallback, not even when
it re-reads its credentials later.

The API's ``Warning`` headers (deprecations, admission webhook warnings) are
handed to :attr:`Kube.on_warning` when a caller sets it, as kubectl prints
them. Every attempt's answer (its status code, or ``<error>`` when none came)
is handed to :attr:`Kube.on_response` with the method and the server's
host, as client-go reports it to ``rest_client_requests_total``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import ssl
import stat
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx
import kr8s
import kr8s.asyncio

from nmo import __version__
from nmo.api import constants as c
from nmo.api.names import name_error
from nmo.kube import backoff
from nmo.kube.errors import (
    InvalidName,
    KubeconfigError,
    KubeError,
    Transient,
    error_for_status,
)
from nmo.kube.transport import Transport

log = logging.getLogger("nmo.kube")

USER_AGENT = f"nmo/{__version__}"
_SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

Params = Mapping[str, str | int | bool]


class KubeClient(Protocol):
    """The slice of :class:`Kube` its callers need: one request (a wrapper such as
    the webhooks' budgeted client, or a test's fake, can stand in)."""

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
    ) -> dict[str, Any]: ...


@dataclass(frozen=True)
class RetryPolicy:
    """How the boundary retries transient failures and 429s."""

    attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 10.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Capped exponential backoff with full jitter; Retry-After is a floor."""
        return backoff.delay(
            attempt, base=self.base_delay, cap=self.max_delay, retry_after=retry_after
        )


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds form only)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


_WARNING = re.compile(r'\d{3}\s+\S+\s+"((?:[^"\\]|\\.)*)"')


def parse_warning(value: str) -> str:
    """The text of a ``Warning: 299 - "text"`` header (RFC 7234); the raw value otherwise."""
    match = _WARNING.match(value.strip())
    if match is None:
        return value.strip()
    return re.sub(r"\\(.)", r"\1", match.group(1))


def api_path(
    group_version: str,
    plural: str,
    *,
    name: str | None = None,
    namespace: str | None = None,
    subresource: str | None = None,
) -> str:
    """``/api/v1/...`` or ``/apis/<group>/<version>/...`` for a resource.

    ``name`` and ``namespace`` often come from objects other people wrote (an
    ownerReference, a CR's nodeName): one that is not a valid Kubernetes name
    raises :class:`InvalidName` instead of becoming a path nobody meant
    (``../``, ``?``, ``%2F``). ``group_version``, ``plural`` and
    ``subresource`` are nmo's own constants.
    """
    # An empty name is refused too (it would address the whole collection);
    # an empty namespace means "all namespaces", as before.
    for value, is_namespace in ((namespace or None, True), (name, False)):
        if value is not None and (why := name_error(value, namespace=is_namespace)) is not None:
            what = "namespace" if is_namespace else f"{plural} name"
            raise InvalidName(f"invalid {what} {value!r}: {why}", status_code=404, reason="Invalid")
    base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    parts = [base]
    if namespace:
        parts += ["namespaces", namespace]
    parts.append(plural)
    if name is not None:
        parts.append(name)
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


def _why(exc: OSError) -> str:
    """The system's reason, worded as Go's (lower case): ``no such file or directory``."""
    return (exc.strerror or str(exc)).lower()


def check_kubeconfig(kubeconfig: str) -> None:
    """Every file ``kubeconfig`` names (``os.pathsep``-separated, as ``$KUBECONFIG``)
    exists and can be read; :class:`KubeconfigError` says which cannot, as
    kubectl does (``stat <path>: no such file or directory``)."""
    for path in kubeconfig.split(os.pathsep):
        if not path:
            continue
        full = os.path.expanduser(path)
        try:
            mode = os.stat(full).st_mode
        except OSError as exc:
            raise KubeconfigError(f"stat {path}: {_why(exc)}") from exc
        if stat.S_ISDIR(mode):
            raise KubeconfigError(f"read {path}: is a directory")
        try:
            with open(full, "rb"):
                pass
        except OSError as exc:
            raise KubeconfigError(f"open {path}: {_why(exc)}") from exc


MAX_STREAMS = 512  # watches: three kinds plus one per node under maintenance


async def _widen_pool(api: Any, limits: httpx.Limits) -> None:
    """Give kr8s's shared httpx client nmo's transport, sized for its watches.

    kr8s 0.20 builds its client with httpx's default pool (100 connections,
    20 kept alive, no pool timeout), so 100 open watches would starve every
    request and a burst of evictions would keep reconnecting. nmo watches the
    pods of each node under maintenance, so the pool is sized for bounded
    requests plus :data:`MAX_STREAMS`, and keeps a connection per request
    slot alive. The transport is :class:`nmo.kube.transport.Transport`
    (httpx's own costs several times its CPU per request under load), or
    httpx's when the kubeconfig names a proxy. kr8s rebuilds the client
    after a 401/403, so its builder is wrapped, not just the current client.
    """
    build = getattr(api, "_create_session", None)
    if build is None or getattr(build, "_nmo_widened", False):
        return

    async def create_session() -> None:
        await build()
        old = api._session
        verify = await api.auth.ssl_context()
        proxy = api.auth.proxy
        transport = None
        # httpx stops reading HTTP(S)_PROXY/ALL_PROXY/NO_PROXY once it is given a
        # transport: keep its own whenever the environment proxies the API server.
        if not proxy and _env_proxy(str(api.auth.server)) is None:
            transport = Transport(
                ssl_context=verify if isinstance(verify, ssl.SSLContext) else None,
                max_connections=_bound(limits.max_connections),
                max_keepalive=_bound(limits.max_keepalive_connections),
                keepalive_expiry=_bound(limits.keepalive_expiry),
            )
        api._session = httpx.AsyncClient(
            base_url=old.base_url,
            headers=old.headers,
            verify=verify,
            timeout=old.timeout,
            follow_redirects=True,
            proxy=proxy,
            limits=limits,
            transport=transport,
        )
        await old.aclose()

    create_session._nmo_widened = True  # type: ignore[attr-defined]
    api._create_session = create_session
    await create_session()


def _env_proxy(server: str) -> str | None:
    """The proxy the environment names for ``server`` (``NO_PROXY`` honoured)."""
    url = httpx.URL(server)
    proxies = urllib.request.getproxies()
    found = proxies.get(url.scheme) or proxies.get("all")
    return found if found and not urllib.request.proxy_bypass(url.host) else None


def _bound(value: float | None) -> float:
    """An httpx limit as a number (httpx's None: no limit)."""
    return float("inf") if value is None else value


def nm_path(name: str | None = None, subresource: str | None = None) -> str:
    """The one place a NodeMaintenance path is built (collection, object, status)."""
    return api_path(c.API_VERSION, c.PLURAL, name=name, subresource=subresource)


def node_path(name: str | None = None, subresource: str | None = None) -> str:
    return api_path("v1", "nodes", name=name, subresource=subresource)


def _split(path: str) -> tuple[str, str]:
    """Split a path into kr8s's (base, url) so it rebuilds the same path."""
    base, _, last = path.rstrip("/").rpartition("/")
    return base, last


class Kube:
    """An authenticated API client with nmo's errors, retries and bounds."""

    def __init__(
        self,
        api: Any,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        max_in_flight: int = 128,
    ) -> None:
        self._api = api
        self._timeout = httpx.Timeout(timeout, connect=10.0)
        self._api.timeout = self._timeout
        self.retry = retry or RetryPolicy()
        self._slots = asyncio.Semaphore(max_in_flight)
        self.requests_total = 0
        self.on_warning: Callable[[str], None] | None = None
        self.on_response: Callable[[str, str, str], None] | None = None
        self._host: str | None = None

    def _answered(self, method: str, code: int | None) -> None:
        """Report one attempt: (status code or ``<error>``, method, host)."""
        if self.on_response is None:
            return
        if self._host is None:
            try:
                self._host = urlsplit(self.server).netloc or "none"
            except Exception:  # no kubeconfig server (a test double)
                self._host = "none"
        self.on_response("<error>" if code is None else str(code), method, self._host)

    @classmethod
    async def connect(
        cls,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        in_cluster: bool = False,
        timeout: float = 30.0,
        max_in_flight: int = 128,
    ) -> Kube:
        """Authenticate from a kubeconfig, or the in-cluster service account.

        A kubeconfig named here or by ``$KUBECONFIG`` that cannot be read raises
        :class:`KubeconfigError`; only when none is named may kr8s fall back from
        ``~/.kube/config`` to the pod's service account, as kubectl does.
        """
        named = None if in_cluster else (kubeconfig or os.environ.get("KUBECONFIG") or None)
        if named is not None:
            check_kubeconfig(named)
        try:
            if in_cluster:
                api = await kr8s.asyncio.api(serviceaccount=_SERVICE_ACCOUNT_DIR)
            else:
                api = await kr8s.asyncio.api(
                    kubeconfig=named,
                    context=context,
                    # "": kr8s never falls back to the pod's service account,
                    # not even when it re-reads its credentials after a 401.
                    serviceaccount="" if named is not None else None,
                )
        except (httpx.TransportError, kr8s.APITimeoutError) as exc:
            raise Transient(f"cannot reach the API server: {exc}") from exc
        except kr8s.ServerError as exc:
            code = exc.response.status_code if exc.response is not None else 0
            raise error_for_status(code, {"message": str(exc)}) from exc
        limits = httpx.Limits(
            max_connections=max_in_flight + MAX_STREAMS,
            # httpx keeps 20 idle connections by default: a burst of 100
            # evictions would then open (and TLS-handshake) most of its
            # connections anew every time.
            max_keepalive_connections=max_in_flight,
        )
        await _widen_pool(api, limits)
        return cls(api, timeout=timeout, max_in_flight=max_in_flight)

    @property
    def server(self) -> str:
        return str(self._api.auth.server)

    async def close(self) -> None:
        session = getattr(self._api, "_session", None)
        if session is not None:
            await session.aclose()

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
        """One API call with retries; returns the decoded JSON body."""
        attempt = 0
        while True:
            try:
                return await self._once(method, path, params, body, content_type, timeout)
            except KubeError as exc:
                retryable = isinstance(exc, Transient) or exc.status_code == 429
                if not retry or not retryable or attempt + 1 >= self.retry.attempts:
                    raise
                delay = self.retry.delay(attempt, exc.retry_after)
                log.debug(
                    "retrying request",
                    extra={"method": method, "path": path, "error": str(exc), "delay": delay},
                )
                attempt += 1
                await asyncio.sleep(delay)

    async def _once(
        self,
        method: str,
        path: str,
        params: Params | None,
        body: Any,
        content_type: str,
        timeout: float | None,
    ) -> dict[str, Any]:
        base, url = _split(path)
        kwargs: dict[str, Any] = {"headers": {"User-Agent": USER_AGENT}}
        if params:
            kwargs["params"] = {k: _param(v) for k, v in params.items()}
        if body is not None:
            kwargs["content"] = json.dumps(body)
            kwargs["headers"]["Content-Type"] = content_type
        if timeout is not None:
            kwargs["timeout"] = httpx.Timeout(timeout, connect=10.0)
        async with self._slots:
            self.requests_total += 1
            try:
                async with self._api.call_api(
                    method, version="", base=base, url=url, raise_for_status=False, **kwargs
                ) as response:
                    self._answered(method, response.status_code)
                    if self.on_warning is not None:
                        for value in response.headers.get_list("warning"):
                            self.on_warning(parse_warning(value))
                    return _decode(response)
            except (httpx.TransportError, kr8s.APITimeoutError) as exc:
                self._answered(method, None)
                raise Transient(f"{method} {path}: {type(exc).__name__}: {exc}") from exc

    async def get(self, path: str, *, params: Params | None = None) -> dict[str, Any]:
        return await self.request("GET", path, params=params)

    async def list_all(
        self,
        path: str,
        *,
        params: Params | None = None,
        limit: int = 500,
        transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """LIST with pagination; returns one list object (items and resourceVersion).

        ``transform`` is applied to each item as its page arrives, so a large
        list never holds more than one page of full objects.
        """
        query: dict[str, str | int | bool] = {"limit": limit, **(params or {})}
        items: list[dict[str, Any]] = []
        while True:
            page = await self.get(path, params=query)
            batch = page.pop("items", None) or []
            items.extend(map(transform, batch) if transform else batch)
            del batch
            cont = (page.get("metadata") or {}).get("continue")
            if not cont:
                page["items"] = items
                return page
            query["continue"] = cont

    async def create(
        self, path: str, body: Mapping[str, Any], *, params: Params | None = None
    ) -> dict[str, Any]:
        return await self.request("POST", path, params=params, body=body)

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request(
            "PATCH", path, body=patch, content_type="application/merge-patch+json"
        )

    async def strategic_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A strategic-merge patch: lists with a merge key (a Node's
        status.conditions, keyed by type) are merged item by item."""
        return await self.request(
            "PATCH", path, body=patch, content_type="application/strategic-merge-patch+json"
        )

    async def json_patch(self, path: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        return await self.request(
            "PATCH", path, body=ops, content_type="application/json-patch+json"
        )

    async def replace(
        self, path: str, body: Mapping[str, Any], *, params: Params | None = None
    ) -> dict[str, Any]:
        return await self.request("PUT", path, params=params, body=body)

    async def delete(self, path: str, *, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return await self.request("DELETE", path, body=body)

    async def request_text(
        self, path: str, *, params: Params | None = None, timeout: float | None = None
    ) -> str:
        """GET a plain-text endpoint (pod logs) with the same errors and retries."""
        base, url = _split(path)
        kwargs: dict[str, Any] = {"headers": {"User-Agent": USER_AGENT, "Accept": "*/*"}}
        if params:
            kwargs["params"] = {k: _param(v) for k, v in params.items()}
        if timeout is not None:
            kwargs["timeout"] = httpx.Timeout(timeout, connect=10.0)
        attempt = 0
        while True:
            try:
                async with self._slots:
                    self.requests_total += 1
                    try:
                        async with self._api.call_api(
                            "GET", version="", base=base, url=url, raise_for_status=False, **kwargs
                        ) as response:
                            self._answered("GET", response.status_code)
                            if response.status_code >= 400:
                                _decode(response)
                            return str(response.text)
                    except (httpx.TransportError, kr8s.APITimeoutError) as exc:
                        self._answered("GET", None)
                        raise Transient(f"GET {path}: {type(exc).__name__}: {exc}") from exc
            except KubeError as exc:
                retryable = isinstance(exc, Transient) or exc.status_code == 429
                if not retryable or attempt + 1 >= self.retry.attempts:
                    raise
                attempt += 1
                await asyncio.sleep(self.retry.delay(attempt - 1, exc.retry_after))

    async def stream(
        self, path: str, *, params: Params, read_timeout: float
    ) -> AsyncIterator[dict[str, Any]]:
        """Stream a watch: yields each decoded event line until the server ends it."""
        base, url = _split(path)
        self.requests_total += 1
        answered = False
        try:
            async with self._api.call_api(
                "GET",
                version="",
                base=base,
                url=url,
                raise_for_status=False,
                stream=True,
                params={k: _param(v) for k, v in params.items()},
                headers={"User-Agent": USER_AGENT},
                timeout=httpx.Timeout(10.0, read=read_timeout),
            ) as response:
                answered = True
                self._answered("GET", response.status_code)
                if response.is_error:
                    await response.aread()
                    _decode(response)
                async for line in response.aiter_lines():
                    if line.strip():
                        yield json.loads(line)
        except (httpx.TransportError, kr8s.APITimeoutError) as exc:
            if not answered:
                self._answered("GET", None)
            raise Transient(f"watch {path}: {type(exc).__name__}: {exc}") from exc
        except json.JSONDecodeError as exc:
            raise Transient(f"watch {path}: malformed event: {exc}") from exc


def _param(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _decode(response: httpx.Response) -> dict[str, Any]:
    """JSON body of a response, or the matching nmo error."""
    try:
        data = response.json() if response.content else {}
    except json.JSONDecodeError:
        data = {"message": response.text[:500]}
    if not isinstance(data, dict):
        data = {"message": str(data)[:500]}
    if response.status_code >= 400:
        raise error_for_status(
            response.status_code,
            data,
            retry_after=parse_retry_after(response.headers.get("Retry-After")),
        )
    return data
