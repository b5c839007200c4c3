"""The alert gate's I/O: ask Prometheus which alerts fire, every interval.

The leader-only runnable ``alert-gate`` (:meth:`AlertPoller.run`) asks
``GET {url}/api/v1/alerts`` every ``interval`` seconds and keeps the answer:
the names of the firing alerts (:func:`nmo.core.maintenance.gates.firing_alerts`)
or why there is none. A pass reads that cached answer (:meth:`AlertPoller.seen`)
and never waits on Prometheus; which alerts block is decided in
:mod:`nmo.core.maintenance.gates`. When the answer changes (an alert starts
or stops firing, Prometheus stops or starts answering) the queue is woken
(``on_change``), so a maintenance starts within one interval of the alert
resolving.

It fails closed, as kured does: until the first answer, and after any failed
query (refused, timed out, TLS, 4xx/5xx, not JSON, a CA file missing or not
PEM), the gate holds; the poller itself never ends on them (a runnable that
ends stops the process, and every running maintenance with it). Each query
reads the bearer token file afresh (projected ServiceAccount tokens rotate);
the CA file is read when the client is made: at each start and after each
failed query (a CA mounted late or rotated is taken). A replica that stops
leading forgets the last answer.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from nmo import __version__
from nmo.core.maintenance import gates
from nmo.core.maintenance.gates import AlertsSeen
from nmo.telemetry.metrics import Metrics

log = logging.getLogger("nmo.alertgate")

USER_AGENT = f"nmo/{__version__}"
MAX_ERROR = 300  # characters of an error kept for the Queued message


@dataclass(frozen=True)
class AlertGateSettings:
    url: str  # --blocking-prometheus-url, e.g. https://prometheus-k8s.monitoring.svc:9091
    pattern: str  # --blocking-alerts
    interval: float = 30.0  # --blocking-prometheus-interval
    token_file: str | None = None  # --blocking-prometheus-token-file
    ca_file: str | None = None  # --blocking-prometheus-ca-file
    timeout: float = 10.0  # one query, connect to the last byte

    @property
    def endpoint(self) -> str:
        return self.url.rstrip("/") + "/api/v1/alerts"


class AlertPoller:
    def __init__(
        self,
        settings: AlertGateSettings,
        *,
        metrics: Metrics,
        on_change: Callable[[], None] = lambda: None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.on_change = on_change
        self._transport = transport
        self._seen = AlertsSeen(url=settings.url)
        metrics.blocking_alerts.set_function(self._blocking)
        metrics.prometheus_up.set_function(lambda: 1.0 if self._seen.answered else 0.0)
        for result in ("answered", "failed"):
            metrics.prometheus_queries.labels(result=result)

    def seen(self) -> AlertsSeen:
        """The last answer (the pass's view; never waits)."""
        return self._seen

    def _blocking(self) -> float:
        seen = self._seen
        if not seen.answered:
            return 0.0
        return float(len(gates.blocked_by(seen.firing, self.settings.pattern)))

    async def run(self) -> None:
        """Ask every interval until cancelled; a new leader starts from no answer,
        and a replica that stops leading forgets the last one."""
        self._seen = AlertsSeen(url=self.settings.url)
        log.info(
            "alert gate: new maintenances wait while alerts matching %r fire on %s",
            self.settings.pattern,
            self.settings.url,
        )
        client: httpx.AsyncClient | None = None
        try:
            while True:
                if client is None:
                    try:
                        client = self._client()
                    except OSError as exc:  # ssl.SSLError too: the CA file is not PEM
                        self._update(self._failed(f"CA file {self.settings.ca_file}: {exc}"))
                if client is not None:
                    seen = await self.query(client)
                    if seen.error is not None:  # the next query reads the CA file again
                        await client.aclose()
                        client = None
                    self._update(seen)
                await asyncio.sleep(self.settings.interval)
        finally:
            self._seen = AlertsSeen(url=self.settings.url)
            if client is not None:
                await client.aclose()

    def _client(self) -> httpx.AsyncClient:
        """A client verifying with the CA file as it is now (a failed query makes
        a new one: a CA mounted late or rotated is taken, never a crash)."""
        return httpx.AsyncClient(
            timeout=self.settings.timeout,
            verify=self._verify(),
            headers={"User-Agent": USER_AGENT, "Accept": "application/json"},
            transport=self._transport,
            trust_env=False,
        )

    def _verify(self) -> ssl.SSLContext | bool:
        if self.settings.ca_file:
            return ssl.create_default_context(cafile=self.settings.ca_file)
        return True

    def _auth(self) -> dict[str, str]:
        """The bearer token, read afresh (a small local file: read in place)."""
        if not self.settings.token_file:
            return {}
        token = Path(self.settings.token_file).read_text().strip()
        return {"Authorization": f"Bearer {token}"}

    async def query(self, client: httpx.AsyncClient) -> AlertsSeen:
        """One query; any failure is the answer's error (fail-closed)."""
        url = self.settings.url
        try:
            resp = await client.get(self.settings.endpoint, headers=self._auth())
            if resp.status_code != 200:
                raise ValueError(f"HTTP {resp.status_code} from {self.settings.endpoint}")
            firing = gates.firing_alerts(resp.json())
        except (httpx.HTTPError, OSError, ValueError) as exc:
            return self._failed(str(exc) or type(exc).__name__)
        self.metrics.prometheus_queries.labels(result="answered").inc()
        return AlertsSeen(url=url, firing=firing, answered=True)

    def _failed(self, error: str) -> AlertsSeen:
        self.metrics.prometheus_queries.labels(result="failed").inc()
        return AlertsSeen(url=self.settings.url, error=error[:MAX_ERROR])

    def _update(self, new: AlertsSeen) -> None:
        old, self._seen = self._seen, new
        pattern = self.settings.pattern
        before = (old.answered, old.error is None, gates.blocked_by(old.firing, pattern))
        after = (new.answered, new.error is None, gates.blocked_by(new.firing, pattern))
        if new.error is not None and new.error != old.error:
            log.warning("alert gate: cannot reach Prometheus at %s: %s", new.url, new.error)
        if before == after:
            return
        if after[2]:
            log.info("alert gate: holding new maintenances: %s firing", ", ".join(after[2]))
        elif new.answered:
            log.info("alert gate: no blocking alert fires on %s", new.url)
        self.on_change()  # the queue's head looks again
