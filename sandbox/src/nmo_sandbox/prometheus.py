"""A real Prometheus server (and promtool) for the tests that check alerts.

The chart's alert rules (charts/node-maintenance-operator/templates/
prometheusrule.yaml) are proven on the Prometheus that will evaluate them, not
only read as text: ``promtool test rules`` unit-tests each alert, and an
integration test has a Prometheus scrape a running nmo and watches an alert
fire and resolve. Other tests start a Prometheus for their own reasons (an
always-firing rule behind nmo's ``--blocking-prometheus-url``), so the
launcher is here, in the sandbox package, and knows nothing about nmo:

    async with running_prometheus(
        tmp_path / "prom",
        rule_files=[rules_yaml],            # Prometheus rule files (groups: ...)
        scrape_configs=[{...}],             # Prometheus scrape_config entries
        interval="1s",                      # global scrape and evaluation interval
    ) as prom:
        prom.url                            # http://127.0.0.1:<free port>
        await prom.alerts()                 # /api/v1/alerts' data["alerts"]
        await prom.query("up")              # /api/v1/query's data["result"]
        await prom.wait_for_alerts("AlwaysFiring")  # polls until it is firing

The binaries are ``hack/prometheus-bin.sh``'s, built from the Go module
github.com/prometheus/prometheus into ``~/.cache/nmo/prometheus/<version>/bin``
(``make prometheus-bin``; ``make test`` builds them first). :func:`chart_rules`
renders the chart's PrometheusRule with ``helm template`` and returns it as a
Prometheus rule file, so the tests test what ships.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from nmo_sandbox.binaries import cache_root, find_binaries, repo_root, script_bin_dir
from nmo_sandbox.errors import ComponentError, MissingBinariesError, SandboxError
from nmo_sandbox.process import ProcessRef, free_ports, kill_groups, log_tail, spawn

__all__ = [
    "PROMETHEUS",
    "PROMTOOL",
    "VERSION",
    "Prometheus",
    "PrometheusBinaries",
    "chart_rules",
    "find_prometheus",
    "prometheus_config",
    "running_prometheus",
]

VERSION = "v0.316.0"  # hack/prometheus-bin.sh's default
PROMETHEUS = "prometheus"
PROMTOOL = "promtool"
_SCRIPT = Path("hack") / "prometheus-bin.sh"
_CHART = Path("charts") / "node-maintenance-operator"


@dataclass(frozen=True)
class PrometheusBinaries:
    """The cache directory of one Prometheus version: ``prometheus`` and ``promtool``."""

    bin_dir: Path

    @property
    def prometheus(self) -> Path:
        return self.bin_dir / PROMETHEUS

    @property
    def promtool(self) -> Path:
        return self.bin_dir / PROMTOOL

    def missing(self) -> list[str]:
        return [b for b in (PROMETHEUS, PROMTOOL) if not os.access(self.bin_dir / b, os.X_OK)]

    def check(self) -> PrometheusBinaries:
        """Return self, or raise :class:`MissingBinariesError` naming what is missing."""
        missing = self.missing()
        if missing:
            raise MissingBinariesError(
                f"Prometheus missing in {self.bin_dir}: {', '.join(missing)}. "
                "Build it with `make prometheus-bin` (or `hack/prometheus-bin.sh`); "
                "the first build takes several minutes and is cached per version."
            )
        return self


def find_prometheus(*, check: bool = True) -> PrometheusBinaries:
    """Locate ``prometheus`` and ``promtool``; with ``check`` raise if either is missing.

    ``$NMO_PROMETHEUS_BIN``; else ``hack/prometheus-bin.sh --print-dir`` from
    a checkout; else the script's formula under the nmo cache.
    """
    override = os.environ.get("NMO_PROMETHEUS_BIN")
    if override:
        found = PrometheusBinaries(Path(override).expanduser().resolve())
    else:
        found = PrometheusBinaries(script_bin_dir(_SCRIPT) or _default_bin_dir())
    return found.check() if check else found


def prometheus_config(
    *,
    rule_files: Sequence[Path] = (),
    scrape_configs: Sequence[Mapping[str, Any]] = (),
    interval: str = "1s",
) -> dict[str, Any]:
    """A prometheus.yml: one global scrape and evaluation interval, no Alertmanager."""
    return {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": interval,
        },
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [dict(c) for c in scrape_configs],
    }


class Prometheus:
    """One Prometheus server on a free loopback port, its files under ``workdir``.

    ``start`` returns once the server is ready and has loaded every rule
    group of ``rule_files``; ``stop`` ends its process group (idempotent). Its
    log is ``workdir/prometheus.log`` (:meth:`log`, quoted when it fails).
    """

    def __init__(
        self,
        workdir: Path,
        *,
        rule_files: Sequence[Path] = (),
        scrape_configs: Sequence[Mapping[str, Any]] = (),
        interval: str = "1s",
        binaries: PrometheusBinaries | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.rule_files = [Path(p) for p in rule_files]
        self.config = prometheus_config(
            rule_files=self.rule_files, scrape_configs=scrape_configs, interval=interval
        )
        self.binaries = binaries
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._ref: ProcessRef | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.workdir / "prometheus.log"

    def log(self, lines: int = 40) -> str:
        return log_tail(self.log_file, lines)

    def argv(self) -> list[str]:
        bins = self.binaries or find_prometheus()
        return [
            str(bins.prometheus),
            f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=info",
        ]

    async def start(self, timeout: float = 60.0) -> None:
        """Write the config, start the server and wait until its rules are loaded."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(self.config, sort_keys=False))
        groups = sum(
            len((yaml.safe_load(p.read_text()) or {}).get("groups") or []) for p in self.rule_files
        )
        for attempt in range(3):  # another process may take the free port first
            (self.port,) = free_ports(1)
            self._proc = spawn(self.argv(), log_file=self.log_file, die_with_parent=True)
            self._ref = ProcessRef.of(self._proc.pid)
            if await self._ready(groups, timeout):
                return
            self.stop()
            if "address already in use" not in self.log(10) or attempt == 2:
                break
        raise ComponentError(
            "prometheus", f"Prometheus did not become ready on {self.url}", self.log()
        )

    async def _ready(self, groups: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(base_url=self.url, timeout=5) as http:
            while time.monotonic() < deadline:
                if self._proc is None or self._proc.poll() is not None:
                    return False
                with contextlib.suppress(httpx.TransportError):
                    ready = await http.get("/-/ready")
                    if ready.status_code == 200:
                        rules = await http.get("/api/v1/rules")
                        if len(rules.json()["data"]["groups"]) >= groups:
                            return True
                await asyncio.sleep(0.1)
        return False

    def stop(self) -> None:
        """SIGTERM the server (SIGKILL after 5 s) and reap it."""
        if self._ref is not None:
            kill_groups([self._ref])
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
        self._proc = self._ref = None

    async def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>``'s ``data``; raises when Prometheus reports an error."""
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as http:
            resp = await http.get(f"/api/v1/{path}", params=params)
        body = resp.json()
        if resp.status_code != 200 or body.get("status") != "success":
            raise SandboxError(f"Prometheus /api/v1/{path} answered {resp.status_code}: {body}")
        return body["data"]

    async def alerts(self) -> list[dict[str, Any]]:
        """The active alerts (pending and firing): ``labels``, ``annotations``, ``state``..."""
        return list((await self.api("alerts"))["alerts"])

    async def wait_for_alerts(
        self,
        alertname: str,
        *,
        labels: Mapping[str, str] | None = None,
        state: str = "firing",
        present: bool = True,
        timeout: float = 60.0,
    ) -> list[dict[str, Any]]:
        """Poll ``/api/v1/alerts`` until ``alertname`` (with ``labels``) is in ``state``.

        With ``present=False``, until no such alert is active in any state
        (it resolved); returns the matching alerts (``[]`` then). Raises
        :class:`SandboxError` with the last answer after ``timeout`` seconds.
        """
        want = {"alertname": alertname, **(labels or {})}
        deadline = time.monotonic() + timeout
        while True:
            active = [a for a in await self.alerts() if want.items() <= a["labels"].items()]
            found = [a for a in active if a["state"] == state]
            if present and found:
                return found
            if not present and not active:
                return []
            if time.monotonic() > deadline:
                what = state if present else "resolved"
                raise SandboxError(f"no {what} alert {want} after {timeout:g}s; active: {active}")
            await asyncio.sleep(0.2)

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result vector (each ``metric`` and ``value``)."""
        return list((await self.api("query", query=expr))["result"])

    async def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets (``health``, ``lastError``, ``scrapeUrl``...)."""
        return list((await self.api("targets"))["activeTargets"])


@contextlib.asynccontextmanager
async def running_prometheus(
    workdir: Path,
    *,
    rule_files: Sequence[Path] = (),
    scrape_configs: Sequence[Mapping[str, Any]] = (),
    interval: str = "1s",
    binaries: PrometheusBinaries | None = None,
) -> AsyncIterator[Prometheus]:
    """A started :class:`Prometheus`, stopped on exit."""
    prom = Prometheus(
        workdir,
        rule_files=rule_files,
        scrape_configs=scrape_configs,
        interval=interval,
        binaries=binaries,
    )
    try:
        await prom.start()
        yield prom
    finally:
        prom.stop()


def chart_rules(values: Sequence[str] = (), *, helm: Path | None = None) -> dict[str, Any]:
    """The chart's PrometheusRule as a Prometheus rule file (``{"groups": [...]}``).

    ``helm template`` with ``prometheusRule.enabled=true`` and ``--set``
    ``values`` on top; the helm is the sandbox's (``make sandbox-bin``).
    """
    root = repo_root()
    if root is None:
        raise MissingBinariesError("chart_rules needs a checkout (the chart is not installed)")
    helm = helm or find_binaries().path("helm")
    sets = [a for v in ("prometheusRule.enabled=true", *values) for a in ("--set", v)]
    res = subprocess.run(
        [str(helm), "template", "nmo", str(root / _CHART), *sets],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if res.returncode != 0:
        raise SandboxError(f"helm template failed: {res.stderr.strip()}")
    (rule,) = [d for d in yaml.safe_load_all(res.stdout) if d and d.get("kind") == "PrometheusRule"]
    return {"groups": rule["spec"]["groups"]}


def _default_bin_dir() -> Path:
    return cache_root() / "prometheus" / VERSION / "bin"
