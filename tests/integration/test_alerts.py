"""The chart's alerts on a real Prometheus (issue 23 part 3).

The PrometheusRule the chart ships (templates/prometheusrule.yaml) is
rendered with ``helm template`` (nmo_sandbox.prometheus.chart_rules) and
evaluated by Prometheus itself, built by ``make prometheus-bin``:

* ``promtool test rules`` runs tests/prometheus/*_test.yaml: every alert
  fires, does not fire, carries its labels and expands its annotations
  (summary, description, runbook_url), with the chart's default values and
  with its prometheusRule values set;
* a Prometheus server scrapes a running nmo's ``/metrics`` over TLS with a
  ServiceAccount token that only the chart's metrics-reader ClusterRole
  (``metrics.readers``) lets through nmo's TokenReview and
  SubjectAccessReview, loads the chart's rules, and NodeMaintenanceDrainBlocked
  fires for a drain a PodDisruptionBudget blocks, then resolves once the
  budget allows the evictions;
* the launcher itself (nmo_sandbox.prometheus.running_prometheus) serves an
  always-firing rule, as a gate test uses it, and stops.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from chart_identity import RELEASE_NAMESPACE, chart_identity
from objects import Api
from operator_fixtures import CURRENT, Operator, wait_for
from test_drain_control import blocked_node, create_nm, remove_nm, wait_phase, wait_reason

from nmo_sandbox import Sandbox
from nmo_sandbox.prometheus import (
    Prometheus,
    chart_rules,
    find_prometheus,
    running_prometheus,
)

pytestmark = pytest.mark.integration

TESTS = Path(__file__).resolve().parents[1] / "prometheus"
# The rule file each promtool test file loads, and the chart values it is
# rendered with (tests/prometheus/alerts_values_test.yaml's header).
RULE_FILES = {
    "alerts_test.yaml": ("nmo-alerts.yaml", ()),
    "alerts_values_test.yaml": (
        "nmo-alerts-values.yaml",
        (
            "prometheusRule.drainBlockedFor=1h30m",
            "prometheusRule.webhookDenialsPerSecond=2",
            "prometheusRule.alertLabels.team=platform",
            "prometheusRule.runbookBaseURL=https://git.example.com/infra/nmo/blob/main/docs/troubleshooting.md/",
        ),
    ),
}
PROMETHEUS_SA = "nmo-tests-prometheus"  # bound by metrics.readers
STRANGER_SA = "nmo-tests-stranger"  # not bound


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(find_prometheus().promtool), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )


def stage(tmp_path: Path, test_file: str, rules: dict[str, Any] | None = None) -> Path:
    """``test_file`` beside its rule file, rendered from the chart (or ``rules``)."""
    rule_file, values = RULE_FILES[test_file]
    shutil.copy(TESTS / test_file, tmp_path / test_file)
    rendered = rules if rules is not None else chart_rules(values)
    (tmp_path / rule_file).write_text(yaml.safe_dump(rendered, sort_keys=False))
    return tmp_path / rule_file


def alert_cases(test_file: str) -> tuple[set[str], set[str]]:
    """(alerts some case expects firing, alerts some case expects silent)."""
    doc = yaml.safe_load((TESTS / test_file).read_text())
    cases = [c for t in doc["tests"] for c in t.get("alert_rule_test", [])]
    return (
        {c["alertname"] for c in cases if c.get("exp_alerts")},
        {c["alertname"] for c in cases if not c.get("exp_alerts")},
    )


def test_promtool_tests_cover_every_alert_of_the_chart() -> None:
    """Each alert has a case where it fires and one where it does not."""
    shipped = {r["alert"] for g in chart_rules()["groups"] for r in g["rules"]}
    assert len(shipped) == 5, shipped
    fires, silent = alert_cases("alerts_test.yaml")
    assert fires == shipped
    assert silent == shipped
    fires_with_values, _ = alert_cases("alerts_values_test.yaml")
    assert fires_with_values == shipped  # alertLabels reach every alert


@pytest.mark.parametrize("test_file", sorted(RULE_FILES))
def test_promtool_rules_unit_tests(test_file: str, tmp_path: Path) -> None:
    rule_file = stage(tmp_path, test_file)
    checked = promtool("check", "rules", rule_file.name, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 5 rules found" in checked.stdout, checked.stdout
    result = promtool("test", "rules", test_file, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout


def test_promtool_tests_fail_on_other_rules(tmp_path: Path) -> None:
    """The unit tests hold the rendered rules to their values: a chart rendered
    with another threshold (drainBlockedFor=1h) fails them, naming the alert."""
    rules = chart_rules(("prometheusRule.drainBlockedFor=1h",))
    stage(tmp_path, "alerts_test.yaml", rules)
    result = promtool("test", "rules", "alerts_test.yaml", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    failed = result.stdout + result.stderr
    assert "alertname: NodeMaintenanceDrainBlocked" in failed, failed
    for other in ("DrainTimedOut", "Failed", "LeaseErrors", "WebhookDenialsSpike"):
        assert f"alertname: NodeMaintenance{other}," not in failed, failed


# -- the launcher, as other tests use it ------------------------------------------------


async def test_the_launcher_serves_an_always_firing_rule_then_stops(tmp_path: Path) -> None:
    """What a gate test (``--blocking-prometheus-url``) starts: one rule, no scrape."""
    rules = tmp_path / "always.yaml"
    rule = {"alert": "AlwaysFiring", "expr": "vector(1)", "labels": {"severity": "critical"}}
    rules.write_text(yaml.safe_dump({"groups": [{"name": "gate", "rules": [rule]}]}))
    async with running_prometheus(tmp_path / "prom", rule_files=[rules]) as prom:
        (alert,) = await prom.wait_for_alerts("AlwaysFiring", labels={"severity": "critical"})
        assert alert["state"] == "firing"
        (sample,) = await prom.query("vector(1) * 2")
        assert sample["value"][1] == "2", sample
        url = prom.url
    async with httpx.AsyncClient() as http:
        with pytest.raises(httpx.TransportError):
            await http.get(f"{url}/-/ready")  # stopped: nothing listens any more


# -- a real Prometheus scraping a real nmo ---------------------------------------------


async def service_account_token(kube: httpx.AsyncClient, namespace: str, name: str) -> str:
    resp = await kube.post(
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        json={"metadata": {"name": name}},
    )
    assert resp.status_code in (201, 409), resp.text
    resp = await kube.post(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
        json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    assert resp.status_code == 201, resp.text
    return str(resp.json()["status"]["token"])


def scrape_job(name: str, port: int, token: Path, ca: Path) -> dict[str, Any]:
    """What the chart's ServiceMonitor asks of Prometheus: HTTPS, verified, a bearer token."""
    return {
        "job_name": name,
        "scheme": "https",
        "metrics_path": "/metrics",
        "authorization": {"type": "Bearer", "credentials_file": str(token)},
        "tls_config": {"ca_file": str(ca)},
        "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
    }


async def test_drain_blocked_alert_fires_and_resolves_on_a_real_prometheus(
    sole_operator: None,  # the session's nmo stopped: this test's nmo reconciles alone
    sandbox: Sandbox,
    kube: httpx.AsyncClient,
    namespace: str,
    node_factory: Any,
    tmp_path: Path,
) -> None:
    api = Api(kube)
    # The chart's identity with a Prometheus ServiceAccount in metrics.readers:
    # nmo runs as the chart's ServiceAccount, the metrics-reader binding is the
    # chart's.
    identity = await chart_identity(
        sandbox,
        variant="prom",
        values=(
            f"metrics.readers[0].name={PROMETHEUS_SA}",
            f"metrics.readers[0].namespace={RELEASE_NAMESPACE}",
        ),
    )
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    for sa in (PROMETHEUS_SA, STRANGER_SA):
        (tokens / sa).write_text(await service_account_token(kube, RELEASE_NAMESPACE, sa))
    # nmo's metrics certificate, issued by the sandbox CA as cert-manager does
    # for the chart (tls.crt, tls.key; Prometheus trusts the CA).
    serving = sandbox.issue_serving_cert(tmp_path / "metrics-cert", ["127.0.0.1"], name="tls")
    nmo = Operator(
        sandbox,
        tmp_path,
        ["--metrics-secure", "--metrics-cert-dir", str(serving.cert_file.parent)],
        identity=identity,
    )
    # The alert's threshold through the chart's value (default 30m), so that
    # it fires within seconds; everything else as the chart renders it.
    rules = tmp_path / "nmo-alerts.yaml"
    rules.write_text(yaml.safe_dump(chart_rules(("prometheusRule.drainBlockedFor=3s",))))
    CURRENT.append(nmo)
    try:
        await nmo.start()
        jobs = [
            scrape_job("nmo", nmo.metrics_port, tokens / PROMETHEUS_SA, serving.ca_file),
            scrape_job("stranger", nmo.metrics_port, tokens / STRANGER_SA, serving.ca_file),
        ]
        async with running_prometheus(
            tmp_path / "prometheus", rule_files=[rules], scrape_configs=jobs, interval="1s"
        ) as prom:
            await drain_blocked_fires_and_resolves(api, prom, namespace, node_factory)
    finally:
        nmo.kill(signal.SIGTERM)
        CURRENT.remove(nmo)


async def drain_blocked_fires_and_resolves(
    api: Api, prom: Prometheus, namespace: str, node_factory: Any
) -> None:
    async def scraped() -> dict[str, dict[str, Any]] | None:
        targets = {t["labels"]["job"]: t for t in await prom.targets()}
        done = all(t["health"] != "unknown" for t in targets.values()) and len(targets) == 2
        return targets if done else None

    targets = await wait_for(scraped, timeout=30, what="both scrape targets tried")
    # The bound ServiceAccount passes nmo's TokenReview and SubjectAccessReview,
    # the unbound one is refused (403), over a verified TLS connection.
    assert targets["nmo"]["health"] == "up", targets["nmo"]
    assert targets["stranger"]["health"] == "down", targets["stranger"]
    assert "403" in targets["stranger"]["lastError"], targets["stranger"]
    assert await prom.query('nmo_leader{job="nmo"}') != []

    node, _ = await blocked_node(api, namespace, node_factory)  # 2 pods, PDB allows 0
    name = await create_nm(api, node)

    # The gauge is computed at each scrape: the 3 s threshold, a scrape and an
    # evaluation after nmo first reports the drain Blocked (it was about 30 s
    # when the gauge was set only at the end of a drain pass).
    await wait_reason(api, name, "Blocked")
    (alert,) = await prom.wait_for_alerts(
        "NodeMaintenanceDrainBlocked", labels={"maintenance": name}, timeout=15
    )
    assert alert["labels"] == {
        "alertname": "NodeMaintenanceDrainBlocked",
        "severity": "warning",
        "maintenance": name,
        "node": node,
    }
    assert float(alert["value"]) > 3
    assert alert["annotations"]["summary"].startswith(
        f"The drain of node {node} has been blocked for "
    )
    assert alert["annotations"]["runbook_url"] == (
        "docs/troubleshooting.md#71-nodemaintenancedrainblocked"
    )
    # One alert for this maintenance, however many scrapes and evaluations.
    ours = [a for a in await prom.alerts() if a["labels"].get("maintenance") == name]
    assert len(ours) == 1, ours

    # The budget allows the evictions: the drain finishes, nmo drops the
    # series, and the alert resolves (leaves /api/v1/alerts).
    await api.merge(
        f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/db-pdb",
        {"spec": {"minAvailable": 0}},
    )
    await wait_phase(api, name, "Succeeded")

    await prom.wait_for_alerts(
        "NodeMaintenanceDrainBlocked", labels={"maintenance": name}, present=False, timeout=30
    )
    assert await prom.query(f'nmo_drain_blocked_seconds{{maintenance="{name}"}}') == []
    await remove_nm(api, name)
