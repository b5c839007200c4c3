"""The chart's fleet gate values (soak, alert gate), rendered offline
(``helm template``, as test_chart_alerts)."""

from __future__ import annotations

import re

import pytest
from test_chart_alerts import METRICS_DOC, helm_env, manager_args, of_kind, render, template

from nmo.telemetry.metrics import Metrics

__all__ = ["helm_env"]  # the fixture, shared

URL = "https://thanos-querier.openshift-monitoring.svc:9091"
SA = "/var/run/secrets/kubernetes.io/serviceaccount"


def gate_args(args: list[str]) -> list[str]:
    return [a for a in args if a.startswith(("--blocking", "--fleet-soak"))]


def test_off_by_default(helm_env: dict[str, str]) -> None:
    assert gate_args(manager_args(render(helm_env))) == []


def test_the_values_render_into_the_manager_args(helm_env: dict[str, str]) -> None:
    docs = render(
        helm_env,
        *("--set", "fleet.soakSeconds=300"),
        *("--set-string", f"fleet.blockingAlerts.prometheusUrl={URL}"),
        *("--set-string", "fleet.blockingAlerts.alerts=^(KubeNodeNotReady|Etcd.*)$"),
        *("--set-string", f"fleet.blockingAlerts.tokenFile={SA}/token"),
        *("--set-string", f"fleet.blockingAlerts.caFile={SA}/service-ca.crt"),
        *("--set", "fleet.blockingAlerts.intervalSeconds=15"),
    )
    assert gate_args(manager_args(docs)) == [
        "--fleet-soak-seconds=300",
        f"--blocking-prometheus-url={URL}",
        "--blocking-alerts=^(KubeNodeNotReady|Etcd.*)$",
        "--blocking-prometheus-interval=15",
        f"--blocking-prometheus-token-file={SA}/token",
        f"--blocking-prometheus-ca-file={SA}/service-ca.crt",
    ]


def test_the_network_policy_lets_prometheus_port_out(helm_env: dict[str, str]) -> None:
    docs = render(
        helm_env,
        *("--set", "networkPolicy.enabled=true"),
        *("--set-string", f"fleet.blockingAlerts.prometheusUrl={URL}"),
        *("--set-string", "fleet.blockingAlerts.alerts=.*"),
    )
    (policy,) = of_kind(docs, "NetworkPolicy")
    rules = [
        r for r in policy["spec"]["egress"] if r["ports"] == [{"port": 9091, "protocol": "TCP"}]
    ]
    assert len(rules) == 1 and "169.254.0.0/16" in str(rules[0]["to"])


@pytest.mark.parametrize(
    ("values", "where"),
    [
        (("--set", "fleet.soakSeconds=-1"), "/fleet/soakSeconds"),
        (("--set-string", "fleet.soakSeconds=soon"), "/fleet/soakSeconds"),
        (
            ("--set-string", "fleet.blockingAlerts.prometheusUrl=prometheus:9090"),
            "/fleet/blockingAlerts/prometheusUrl",
        ),
        (  # a URL without a pattern would be refused by nmo at start
            ("--set-string", f"fleet.blockingAlerts.prometheusUrl={URL}"),
            "/fleet/blockingAlerts",
        ),
        (("--set", "fleet.blockingAlerts.intervalSeconds=0"), "/fleet/blockingAlerts"),
    ],
)
def test_the_schema_refuses_wrong_values(
    helm_env: dict[str, str], values: tuple[str, str], where: str
) -> None:
    result = template(helm_env, *values)
    assert result.returncode != 0, f"{values} was accepted"
    assert where in result.stderr, result.stderr


def test_the_gate_metrics_are_documented_and_registered() -> None:
    documented = set(re.findall(r"^\| `(nmo_[a-z_]+)` \|", METRICS_DOC.read_text(), re.M))
    registered = {f.name for f in Metrics().registry.collect()}
    gauges = (
        "nmo_fleet_soak_remaining_seconds",
        "nmo_fleet_blocking_alerts",
        "nmo_fleet_prometheus_up",
    )
    for name in gauges:
        assert name in documented and name in registered, name
    assert "nmo_fleet_prometheus_queries_total" in documented
