"""``/healthz``, ``/readyz`` and ``/leaderz``, answered like controller-runtime's healthz.

Why this module exists: the kubelet, ``curl -fsS`` in the troubleshooting
guide and humans all read these endpoints, so they follow the format every
Kubernetes component uses:

* all checks pass: HTTP 200, body ``ok`` (``?verbose`` lists each check);
* a check fails: HTTP 500 and the list, ``[-]<name> failed: <reason>``,
  ending in ``<endpoint> check failed``. Unlike controller-runtime the reason
  is shown (these ports carry no secrets and "why is the pod not ready" is
  the question the probes exist to answer). Only a :class:`CheckFailed`
  message is a reason; any other exception is a bug whose text may say too
  much, so it reads ``internal error (ref <id>)`` and the log has it;
* ``?exclude=<name>`` skips a check; ``/readyz/<name>`` runs just one.

A check is a callable that returns (sync or async) when healthy and raises
with a readable message when not. Each check runs with a timeout, so a stuck
dependency fails its probe instead of hanging it.

``/leaderz`` is not a check but a question: does this replica run the
maintenance workers right now? HTTP 200 ``leading`` when it does, 503
``not leading`` when it does not (a standby, or before the caches synced).
It is there for people and tests that want to know which replica reconciles
without reading logs; it is never a readiness condition (a standby is ready).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from nmo.server import incidents

log = logging.getLogger("nmo.webhooks.probes")

Check = Callable[[], Awaitable[None] | None]
Leading = Callable[[], bool]

_TEXT = "text/plain; charset=utf-8"
_HEADERS = {"X-Content-Type-Options": "nosniff"}


class CheckFailed(Exception):
    """Raise from a check to fail it with a message."""


def ping() -> None:
    """The always-healthy check every component has."""


@dataclass(frozen=True)
class CheckStatus:
    name: str
    healthy: bool
    reason: str = ""
    excluded: bool = False


class Probes:
    """Named liveness and readiness checks."""

    def __init__(
        self,
        *,
        healthz: Mapping[str, Check] | None = None,
        readyz: Mapping[str, Check] | None = None,
        leading: Leading | None = None,
        timeout: float = 5.0,
    ) -> None:
        self.checks: dict[str, dict[str, Check]] = {
            "healthz": {"ping": ping, **(healthz or {})},
            "readyz": {"ping": ping, **(readyz or {})},
        }
        self.leading = leading  # None: no /leaderz (a process without workers)
        self.timeout = timeout

    def add_healthz(self, name: str, check: Check) -> None:
        self.checks["healthz"][name] = check

    def add_readyz(self, name: str, check: Check) -> None:
        self.checks["readyz"][name] = check

    async def run_one(self, name: str, check: Check) -> CheckStatus:
        try:
            result = check()
            if inspect.isawaitable(result):
                await asyncio.wait_for(result, self.timeout)
        except TimeoutError:
            return CheckStatus(name, False, f"timed out after {self.timeout:g}s")
        except CheckFailed as exc:
            return CheckStatus(name, False, str(exc) or type(exc).__name__)
        except Exception:  # a bug, not a verdict: its text stays in the log
            return CheckStatus(
                name, False, incidents.report(log, f"check {name} raised", check=name)
            )
        return CheckStatus(name, True)

    async def run(self, endpoint: str, exclude: set[str]) -> list[CheckStatus]:
        checks = self.checks[endpoint]
        statuses = await asyncio.gather(
            *(self.run_one(n, c) for n, c in checks.items() if n not in exclude)
        )
        skipped = [CheckStatus(n, True, excluded=True) for n in checks if n in exclude]
        return sorted([*statuses, *skipped], key=lambda s: s.name)


def render(endpoint: str, statuses: list[CheckStatus], *, verbose: bool, unknown: set[str]) -> str:
    """The body controller-runtime writes (with reasons)."""
    failed = any(not s.healthy for s in statuses)
    if not failed and not verbose:
        return "ok"
    lines = []
    for s in statuses:
        if s.excluded:
            lines.append(f"[+]{s.name} excluded: ok")
        elif s.healthy:
            lines.append(f"[+]{s.name} ok")
        else:
            lines.append(f"[-]{s.name} failed: {s.reason}")
    if unknown:
        names = ", ".join(f'"{n}"' for n in sorted(unknown))
        lines.append(f"warn: some health checks cannot be excluded: no matches for {names}")
    lines.append(f"{endpoint} check {'failed' if failed else 'passed'}")
    return "\n".join(lines) + "\n"


def _response(body: str, status_code: int) -> PlainTextResponse:
    return PlainTextResponse(body, status_code=status_code, media_type=_TEXT, headers=_HEADERS)


def probes_router(probes: Probes) -> APIRouter:
    """Routes for ``/healthz``, ``/readyz``, ``/<endpoint>/<check>`` and ``/leaderz``."""
    router = APIRouter()

    async def aggregated(endpoint: str, request: Request) -> PlainTextResponse:
        exclude = set(request.query_params.getlist("exclude"))
        unknown = exclude - probes.checks[endpoint].keys()
        statuses = await probes.run(endpoint, exclude)
        verbose = "verbose" in request.query_params
        failed = [s for s in statuses if not s.healthy]
        if failed:
            log.info(
                "%s check failed",
                endpoint,
                extra={"failed": {s.name: s.reason for s in failed}},
            )
        return _response(
            render(endpoint, statuses, verbose=verbose, unknown=unknown), 500 if failed else 200
        )

    async def single(endpoint: str, name: str) -> PlainTextResponse:
        check = probes.checks[endpoint].get(name)
        if check is None:
            return _response(f"no such {endpoint} check: {name}\n", 404)
        status = await probes.run_one(name, check)
        if status.healthy:
            return _response("ok", 200)
        return _response(f"internal server error: {status.reason}\n", 500)

    def routes(
        endpoint: str,
    ) -> tuple[
        Callable[[Request], Awaitable[PlainTextResponse]],
        Callable[[str], Awaitable[PlainTextResponse]],
    ]:
        # Closures, not default arguments: FastAPI would expose those as
        # query parameters.
        async def agg(request: Request) -> PlainTextResponse:
            return await aggregated(endpoint, request)

        async def one(name: str) -> PlainTextResponse:
            return await single(endpoint, name)

        return agg, one

    for endpoint in ("healthz", "readyz"):
        agg, one = routes(endpoint)
        router.add_api_route(f"/{endpoint}", agg, methods=["GET", "HEAD"])
        router.add_api_route(f"/{endpoint}/{{name}}", one, methods=["GET", "HEAD"])

    leading = probes.leading
    if leading is not None:

        async def leaderz() -> PlainTextResponse:
            if leading():
                return _response("leading", 200)
            return _response("not leading", 503)

        router.add_api_route("/leaderz", leaderz, methods=["GET", "HEAD"])
    return router
