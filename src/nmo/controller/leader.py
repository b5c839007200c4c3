"""Leader election through a coordination Lease (client-go's algorithm).

Only the leader reconciles; every replica serves the webhook and probes.
A replica becomes leader when the lease is free or its holder has not
renewed it within ``lease_duration`` (measured on this replica's clock
from when it last saw the lease change, as client-go does, so clock skew
between replicas does not matter). The leader renews every
``retry_period``; if it cannot renew for ``renew_deadline`` it steps down
and the process exits so that it restarts as a clean standby. On a clean
shutdown the leader releases the lease so the standby takes over at once.

The deadline is a bound, not a check made afterwards: every attempt runs
under ``asyncio.timeout`` of what is left of ``renew_deadline`` since the
last successful renewal began, and its requests have their own budget (no
boundary retries, the same timeout), so a stalled apiserver cannot keep a
renewal in flight past it. When it passes, the leader's work (the engine's
leader-only runnables) is cancelled and awaited before :class:`LeadershipLost`
is raised, all before ``lease_duration`` (> ``renew_deadline``) lets a standby
take over.

Leader election that cannot work says so (issue 11 item 2): while this
replica is not the leader, an attempt that fails for a reason other than
another holder (the namespace does not exist, RBAC forbids the Lease, the
credentials are refused, the API server does not answer) becomes
:attr:`LeaderElector.problem`, a sentence that names the cause and what to
pass or create. It is logged at once, again when it changes and every
:data:`REPEAT_PROBLEM` seconds while it lasts, and the CLI's ``/readyz``
fails with it; the elector keeps retrying every ``retry_period`` and clears
the problem on the first attempt that gets an answer. An API server that
does not answer (a timeout, a 5xx) is logged at once too, but is a problem
for readiness only once it has lasted ``renew_deadline``, so that one slow
answer does not take a replica out of its Service.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nmo.core.maintenance.lease import format_micro
from nmo.kube.client import Kube, api_path
from nmo.kube.errors import (
    AlreadyExists,
    Conflict,
    Forbidden,
    KubeError,
    NotFound,
    Transient,
    Unauthorized,
)

log = logging.getLogger("nmo.leader")

REPEAT_PROBLEM = 30.0  # seconds between repeats of an unchanged problem in the log
_VERBS = {"GET": "get", "POST": "create", "PUT": "update"}


@dataclass
class LeaderSettings:
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        # client-go's rule: the leader must give up (renew_deadline) before a
        # standby may take over (lease_duration), or two leaders overlap.
        if not 0 < self.renew_deadline < self.lease_duration:
            raise ValueError(
                f"leader election: renew deadline ({self.renew_deadline}s) must be "
                f"positive and shorter than the lease duration ({self.lease_duration}s)"
            )
        if self.retry_period <= 0:
            raise ValueError(f"leader election: retry period must be positive: {self.retry_period}")


class LeadershipLost(Exception):
    """The leader could not renew its lease in time."""


def explain(exc: KubeError, *, method: str, settings: LeaderSettings) -> str:
    """Why an attempt at the leader Lease failed, and what to do about it."""
    ns, lease = settings.namespace, f"{settings.namespace}/{settings.name}"
    retrying = f"retrying every {settings.retry_period:g}s"
    elsewhere = "pass --leader-election-namespace=<namespace>"
    if method == "POST" and isinstance(exc, NotFound):
        return (
            f'leader election cannot work: namespace "{ns}" does not exist, so the Lease '
            f"{lease} cannot be created; create it (kubectl create namespace {ns}), "
            f"{elsewhere} naming one that exists, or run one replica without --leader-elect; "
            f"{retrying}"
        )
    if isinstance(exc, Forbidden) and exc.has_cause("NamespaceTerminating"):
        return (
            f'leader election cannot work: namespace "{ns}" is being deleted, so the Lease '
            f"{lease} cannot be created; wait until it is gone and create it again, or "
            f"{elsewhere}; {retrying}"
        )
    if isinstance(exc, Forbidden):
        verb = _VERBS.get(method, method.lower())
        return (
            f"leader election cannot work: not allowed to {verb} the Lease {lease}: "
            f"{exc.message}; grant get, create and update on leases.coordination.k8s.io in "
            f'namespace "{ns}" (the chart\'s leader-election Role does), or {elsewhere} '
            f"where it is allowed; {retrying}"
        )
    if isinstance(exc, Unauthorized):
        return (
            f"leader election cannot work: the API server refuses this process's credentials "
            f"({exc.message}); check --kubeconfig or the service account token; {retrying}"
        )
    verb = _VERBS.get(method, method.lower())
    return f"leader election cannot {verb} the Lease {lease}: {exc}; {retrying}"


class LeaderElector:
    def __init__(
        self,
        kube: Kube,
        settings: LeaderSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.s = settings
        self.clock = clock
        self.is_leader = False
        self.held = False  # acquired and not yet released: release() has work to do
        self._observed: tuple[str, str] | None = None  # (holder, renewTime)
        self._observed_at = 0.0
        self._last_ok = 0.0  # clock() when the last successful renewal began
        self.transitions = 0
        # Why this replica can neither lead nor stand by (None: it can).
        self._problem: str | None = None
        self._problem_since = 0.0
        self._problem_logged = 0.0
        self._problem_transient = False
        self._method = ""  # of the request in flight, for explain()

    @property
    def path(self) -> str:
        return api_path(
            "coordination.k8s.io/v1", "leases", namespace=self.s.namespace, name=self.s.name
        )

    def _body(self, lease: dict[str, Any] | None) -> dict[str, Any]:
        now = format_micro(datetime.now(UTC))
        spec = dict((lease or {}).get("spec") or {})
        if spec.get("holderIdentity") != self.s.identity:
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if lease else 0)
            spec["acquireTime"] = now
        spec.update(
            holderIdentity=self.s.identity,
            leaseDurationSeconds=int(self.s.lease_duration),
            renewTime=now,
        )
        meta: dict[str, Any] = {"name": self.s.name, "namespace": self.s.namespace}
        if lease:
            meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    async def _call(
        self, method: str, path: str, body: Any = None, *, timeout: float | None
    ) -> dict[str, Any]:
        """One leader-election request: its own budget, no boundary retries
        when bounded (the renew loop retries within the deadline itself)."""
        self._method = method
        if timeout is None:
            return await self.kube.request(method, path, body=body)
        return await self.kube.request(
            method, path, body=body, retry=False, timeout=max(timeout, 0.001)
        )

    async def try_acquire_or_renew(self, *, timeout: float | None = None) -> bool:
        try:
            lease: dict[str, Any] | None = await self._call("GET", self.path, timeout=timeout)
        except NotFound:
            lease = None
        if lease is None:
            try:
                await self._call(
                    "POST",
                    api_path("coordination.k8s.io/v1", "leases", namespace=self.s.namespace),
                    self._body(None),
                    timeout=timeout,
                )
                return True
            except (AlreadyExists, Conflict):
                return False
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        observed = (holder, str(spec.get("renewTime") or ""))
        if observed != self._observed:
            self._observed, self._observed_at = observed, self.clock()
        expired = self.clock() - self._observed_at > self.s.lease_duration
        if holder and holder != self.s.identity and not expired:
            return False
        try:
            await self._call("PUT", self.path, self._body(lease), timeout=timeout)
        except Conflict:
            return False
        return True

    async def _attempt(self, budget: float) -> bool:
        """One acquire-or-renew, cancelled when ``budget`` seconds have passed."""
        try:
            async with asyncio.timeout(budget):
                return await self.try_acquire_or_renew(timeout=budget)
        except TimeoutError:
            log.warning("leader election: no answer from the API server within %.1fs", budget)
        except KubeError as exc:
            log.warning("leader election: %s", exc)
        return False

    async def _acquire(self, budget: float) -> bool:
        """One attempt to become leader; a failure becomes :attr:`problem`."""
        try:
            async with asyncio.timeout(budget):
                acquired = await self.try_acquire_or_renew(timeout=budget)
        except TimeoutError:
            self._report(
                f"leader election cannot work: no answer from the API server within "
                f"{budget:.1f}s; retrying every {self.s.retry_period:g}s",
                transient=True,
            )
            return False
        except KubeError as exc:
            transient = isinstance(exc, Transient) or exc.status_code == 429
            self._report(explain(exc, method=self._method, settings=self.s), transient=transient)
            return False
        if self._problem is not None:
            log.info(
                "leader election works again: the Lease %s/%s answered",
                self.s.namespace,
                self.s.name,
            )
            self._problem = None
        return acquired

    def _report(self, problem: str, *, transient: bool = False) -> None:
        now = self.clock()
        if problem != self._problem or now - self._problem_logged >= REPEAT_PROBLEM:
            log.log(logging.WARNING if transient else logging.ERROR, "%s", problem)
            self._problem_logged = now
        if self._problem is None or transient != self._problem_transient:
            self._problem_since = now
        self._problem, self._problem_transient = problem, transient

    @property
    def problem(self) -> str | None:
        """Why this replica can neither lead nor stand by (None: it can)."""
        if self._problem_transient and self.clock() - self._problem_since < self.s.renew_deadline:
            return None
        return self._problem

    async def run(self, lead: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Wait for leadership, then run ``lead`` while renewing; raise on loss."""
        log.info("leader election: waiting for lease %s/%s", self.s.namespace, self.s.name)
        while True:
            started = self.clock()
            if await self._acquire(self.s.renew_deadline):
                break
            await asyncio.sleep(self.s.retry_period)
        self.is_leader = self.held = True
        self.transitions += 1
        log.info("leader election: became leader as %s", self.s.identity)
        leading = asyncio.create_task(lead(), name="leader-work")
        self._last_ok = started
        try:
            await self._renew_until_lost(leading, last_ok=started)
        finally:
            self.is_leader = False
            await self._stop(leading, self._last_ok)

    async def _stop(self, leading: asyncio.Task[None], since: float) -> None:
        """Cancel the leader's work and wait for it to stop, but not past the lease."""
        if leading.done():
            return
        leading.cancel()
        grace = max(self.s.lease_duration - (self.clock() - since), 0.0)
        done, _ = await asyncio.wait({leading}, timeout=grace)
        if not done:
            log.error(
                "leader election: leader work still running %.1fs after losing the lease", grace
            )

    async def _renew_until_lost(self, leading: asyncio.Task[None], *, last_ok: float) -> None:
        """Renew every ``retry_period``; raise once ``renew_deadline`` has passed
        since the last successful renewal began (``last_ok``)."""
        while not leading.done():
            left = last_ok + self.s.renew_deadline - self.clock()
            sleep = asyncio.ensure_future(asyncio.sleep(min(self.s.retry_period, max(left, 0.0))))
            await asyncio.wait({leading, sleep}, return_when=asyncio.FIRST_COMPLETED)
            sleep.cancel()
            if leading.done():
                break
            started = self.clock()
            left = last_ok + self.s.renew_deadline - started
            if left > 0 and await self._attempt(left):
                last_ok = self._last_ok = started
                continue
            if self.clock() - last_ok >= self.s.renew_deadline:
                self.held = False  # nothing left to release: do not ask a stalled API
                raise LeadershipLost(
                    f"could not renew leader lease within {self.s.renew_deadline}s"
                )
        leading.result()

    async def release(self) -> None:
        """Give the lease up (clean shutdown) so a standby takes over at once."""
        if not self.held:
            return
        try:
            # Bounded: a shutdown never waits on an API server that stopped
            # answering; the lease then expires on its own.
            async with asyncio.timeout(self.s.renew_deadline):
                lease = await self.kube.get(self.path)
                if (lease.get("spec") or {}).get("holderIdentity") != self.s.identity:
                    self.held = False
                    return
                lease["spec"]["holderIdentity"] = ""
                lease["spec"]["leaseDurationSeconds"] = 1
                await self.kube.replace(self.path, lease)
            self.held = False
            log.info("leader election: released lease")
        except (KubeError, TimeoutError) as exc:
            why = str(exc) or f"no answer within {self.s.renew_deadline:g}s"
            log.warning("leader election: release failed: %s", why)
