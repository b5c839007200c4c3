"""FastAPI app factories: the webhook, the probes and the metrics endpoint.

Why this module exists: it is the thin HTTP adapter between uvicorn and the
pure parts (admission models, validators, probes, metrics auth). Each app
comes from a factory that receives everything it uses, so there is no module
state and tests build as many apps as they like.

Guarantees of the webhook app (behavior.md A6):

* ``POST`` :data:`nmo.api.constants.WEBHOOK_PATH` answers every review whose
  ``request.uid`` can be read with a well-formed AdmissionReview (HTTP 200;
  a review about anything but a NodeMaintenance is denied with 400 BadRequest
  naming what was expected), and anything else with a 4xx and a plain-text
  reason: 415 for a body that is not ``application/json``, 413 for one over
  768 KiB (never read past the limit, see :mod:`nmo.server.intake`), 429
  when too many big bodies are being uploaded at once, 408 for a body that
  takes too long or trickles in, 400 for the rest. Whatever the bytes, the
  answer is never a 5xx;
* a body over :data:`PARSE_INLINE_BYTES` is parsed in a worker thread, one at
  a time, so the event loop (probes, leader lease, the operator) keeps turning;
  one of the usual few KiB is parsed inline, which costs less than the
  hand-over would;
* a review is answered before FastAPI's middleware and router (:func:`_direct`),
  which add nothing to it but CPU; other paths, other methods and the
  lifespan are FastAPI's (404, 405);
* the API requests a review's lookups make are charged to its peer address
  (:meth:`nmo.webhooks.validators.Lookups.for_requester`), as are a metrics
  scrape's reviews (:class:`nmo.server.metricsauth.MetricsAuth`);
* every answer is counted in ``nmo_webhook_admissions_total{operation,result}``
  and timed in ``nmo_webhook_admission_duration_seconds``;
* every decision is logged with the node name and the word "maintenance", so
  ``kubectl logs ... | grep -i maintenance`` shows why a CR was refused;
* an unexpected exception denies the request (the apiserver's failurePolicy
  would refuse it anyway) instead of crashing the connection.

A lifespan runs the app's background coroutines (e.g. the certificate
watcher of the server it is mounted on) for exactly as long as the app lives,
restarting one that crashes after a short pause.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest
from starlette.types import ASGIApp, Receive, Scope, Send

from nmo.api.constants import WEBHOOK_NAME, WEBHOOK_PATH
from nmo.server import incidents
from nmo.server.intake import (
    BODY_GRACE_SECONDS,
    BODY_SECONDS,
    MAX_BODY_BYTES,
    MIN_BODY_RATE,
    Unacceptable,
    Uploads,
    read_review_body,
)
from nmo.server.listener import source_of
from nmo.server.metricsauth import AuthRejected, MetricsAuth
from nmo.server.probes import Probes, probes_router
from nmo.telemetry.metrics import Metrics
from nmo.webhooks.review import (
    AdmissionRequest,
    AdmissionReview,
    MalformedReview,
    parse_review,
    review_response,
    wrong_target,
)
from nmo.webhooks.validators import (
    Decision,
    Lookups,
    deletion_warnings,
    node_name_of,
    shown_name,
    validate_create,
    validate_update,
)

log = logging.getLogger("nmo.webhooks")

Background = Callable[[], Awaitable[None]]
Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]

Header = tuple[bytes, bytes]

_RESTART_DELAY = 5.0
# Real reviews of a NodeMaintenance are a few KiB: parsed inline, it costs
# microseconds; above this, a thread keeps the loop free.
PARSE_INLINE_BYTES = 16 * 1024
_TEXT = b"text/plain; charset=utf-8"
_JSON = b"application/json"


async def _supervise(name: str, run: Background) -> None:
    while True:
        try:
            await run()
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background task crashed, restarting", extra={"task": name})
            await asyncio.sleep(_RESTART_DELAY)


def _lifespan(background: Mapping[str, Background]) -> Lifespan:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tasks = [
            asyncio.create_task(_supervise(name, run), name=name)
            for name, run in background.items()
        ]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    return lifespan


def _bare_app(title: str, background: Mapping[str, Background] | None) -> FastAPI:
    # No docs or OpenAPI routes: these ports serve machines, and an
    # unauthenticated schema page next to /metrics would be an odd gift.
    return FastAPI(
        title=title,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=_lifespan(background or {}),
    )


async def decide(request: AdmissionRequest, lookups: Lookups) -> Decision:
    """Run the rule set that applies to the request's operation."""
    problem = wrong_target(request)
    if problem is not None:
        return Decision.bad_request(problem)
    new = request.object or {}
    if request.operation == "CREATE":
        meta = new.get("metadata")
        # The object's uid is already assigned when validating webhooks run;
        # the review uid is the fallback for hand-made reviews.
        uid = meta.get("uid") if isinstance(meta, dict) else None
        claimant = uid if isinstance(uid, str) and uid else request.uid
        return await validate_create(new, lookups, claimant=claimant, dry_run=request.dry_run)
    if request.operation == "UPDATE":
        decision = validate_update(request.old_object, new)
        if decision.allowed and (more := await deletion_warnings(new, request.old_object, lookups)):
            return Decision.allow([*decision.warnings, *more])
        return decision
    return Decision.allow()


class _Answer:
    """One webhook answer, sent as two ASGI messages or as a FastAPI response."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes, media_type: bytes, *extra: Header) -> None:
        self.status = status
        self.body = body
        # What starlette's Response would send, in its order.
        length = (b"content-length", b"%d" % len(body))
        self.headers = [*extra, length, (b"content-type", media_type)]

    async def send(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})

    def response(self) -> Response:
        response = Response(self.body, status_code=self.status)
        response.raw_headers = list(self.headers)
        return response


def _text(message: str, status_code: int, *, close: bool = False) -> _Answer:
    # errors="replace": the message may quote input that is not valid UTF-8.
    body = (message + "\n").encode("utf-8", errors="replace")
    extra: list[Header] = []
    if close:
        extra.append((b"connection", b"close"))
    if status_code == 429:
        extra.append((b"retry-after", b"1"))
    return _Answer(status_code, body, _TEXT, *extra)


def _review(answer: dict[str, Any]) -> _Answer:
    # ASCII-only JSON: a uid or message echoed from the request may hold lone
    # surrogates, which cannot be encoded as UTF-8 but can be escaped.
    return _Answer(200, json.dumps(answer, separators=(",", ":")).encode("ascii"), _JSON)


def _direct(app: FastAPI, answer: Callable[[Request], Awaitable[_Answer]]) -> ASGIApp:
    """``app``, whose reviews (``POST`` :data:`WEBHOOK_PATH`) are answered
    before its middleware stack and router.

    Those layers (error, telemetry, body-limit and exception middleware, the
    router, dependency solving, a Response object) took about 7% of nmo's CPU
    per review (docs/performance.md) and add nothing to it: the review
    handler answers every outcome itself. Anything else (the lifespan, other
    paths and methods) is FastAPI's. A bug that escapes the handler is still
    a logged 500, as FastAPI's error middleware would make it.
    """

    async def direct(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != WEBHOOK_PATH or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        try:
            reply = await answer(Request(scope, receive))
        except Exception:
            shown = incidents.report(log, "maintenance admission request failed unexpectedly")
            reply = _text(shown, 500, close=True)
        await reply.send(send)

    return direct


def create_webhook_app(
    *,
    lookups: Lookups,
    metrics: Metrics,
    background: Mapping[str, Background] | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    uploads: Uploads | None = None,
    body_seconds: float = BODY_SECONDS,
    min_body_rate: float = MIN_BODY_RATE,
    body_grace: float = BODY_GRACE_SECONDS,
) -> ASGIApp:
    """The validating webhook ``vnodemaintenance.kb.io``."""
    app = _bare_app("nmo webhook", background)
    uploads = uploads or Uploads()
    parsing = asyncio.Semaphore(1)
    # Children of the labelled counter, made once: labels() checks and locks.
    counted: dict[tuple[str, str], Counter] = {}

    def count(operation: str, result: str) -> None:
        child = counted.get((operation, result))
        if child is None:
            child = counted[operation, result] = metrics.webhook_admissions.labels(
                operation=operation, result=result
            )
        child.inc()

    async def parse(body: bytes) -> AdmissionReview:
        if len(body) <= PARSE_INLINE_BYTES:
            return parse_review(body)
        async with parsing:
            return await asyncio.to_thread(parse_review, body)

    def refused(message: str, uid: str | None, **log_extra: Any) -> None:
        log.warning(
            "unusable maintenance admission request: %s",
            message,
            extra={"webhook": WEBHOOK_NAME, "uid": uid, **log_extra},
        )
        count("UNKNOWN", "error")

    async def answer(http_request: Request) -> _Answer:
        started = time.perf_counter()
        try:
            try:
                body = await read_review_body(
                    http_request,
                    limit=max_body_bytes,
                    uploads=uploads,
                    body_seconds=body_seconds,
                    min_rate=min_body_rate,
                    grace=body_grace,
                )
            except Unacceptable as exc:
                refused(exc.message, None, status=exc.status_code)
                return _text(exc.message, exc.status_code, close=exc.close)
            try:
                parsed = await parse(body)
            except MalformedReview as exc:
                refused(exc.message, exc.uid)
                if exc.uid is None:
                    return _text(exc.message, 400)
                decision = Decision.bad_request(exc.message)
                return _review(review_response(exc.uid, decision, api_version=exc.api_version))
            request = parsed.request
            try:
                decision = await decide(request, lookups.for_requester(_peer(http_request)))
            except Exception:
                shown = incidents.report(
                    log, "maintenance admission failed unexpectedly", uid=request.uid
                )
                decision = Decision(False, shown, 500, "InternalError", "error")
            _log_decision(request, decision)
            count(request.operation, decision.result)
            return _review(review_response(request.uid, decision, api_version=parsed.api_version))
        finally:
            metrics.webhook_latency.observe(time.perf_counter() - started)

    @app.post(WEBHOOK_PATH)  # reached only through FastAPI itself (see _direct)
    async def review(http_request: Request) -> Response:
        return (await answer(http_request)).response()

    return _direct(app, answer)


def _peer(request: Request) -> str:
    """The address a request came from (who pays for its API requests)."""
    return source_of(request.client.host) if request.client is not None else ""


def _log_decision(request: AdmissionRequest, decision: Decision) -> None:
    obj = request.object or request.old_object or {}
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    node = shown_name(node_name_of(obj)) or "<none>"
    extra = {
        "webhook": WEBHOOK_NAME,
        "operation": request.operation,
        "cr": shown_name(request.name or (name if isinstance(name, str) else "")),
        "node": node,
        "uid": request.uid,
        "user": request.user_info.username,
        "dry_run": request.dry_run,
        "result": decision.result,
    }
    if decision.allowed and decision.warnings:
        log.info(
            "maintenance %s for node %s allowed with warnings: %s",
            request.operation,
            node,
            "; ".join(decision.warnings),
            extra={**extra, "warnings": list(decision.warnings)},
        )
    elif decision.allowed:
        log.info("maintenance %s for node %s allowed", request.operation, node, extra=extra)
    else:
        log.info(
            "maintenance %s for node %s denied: %s",
            request.operation,
            node,
            decision.message,
            extra=extra,
        )


def create_probes_app(probes: Probes) -> FastAPI:
    """``/healthz`` and ``/readyz`` (plain HTTP, port 8081 by default)."""
    app = _bare_app("nmo probes", None)
    app.include_router(probes_router(probes))
    return app


def create_metrics_app(
    *,
    metrics: Metrics,
    auth: MetricsAuth | None,
    background: Mapping[str, Background] | None = None,
) -> FastAPI:
    """``/metrics``; guarded by TokenReview/SubjectAccessReview unless ``auth`` is None."""
    app = _bare_app("nmo metrics", background)

    @app.get("/metrics")
    async def serve_metrics(request: Request) -> Response:
        if auth is not None:
            try:
                await auth.check(
                    request.headers.get("authorization"),
                    path=request.url.path,
                    method=request.method,
                    source=_peer(request),
                )
            except AuthRejected as exc:
                return PlainTextResponse(exc.message + "\n", status_code=exc.status_code)
        metrics.refresh()
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
