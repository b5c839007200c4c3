"""The chart's drain values and its optional PrometheusRule, rendered offline.

``helm template`` needs no cluster: the tests use the sandbox's cached helm
(``make sandbox-bin``) or one on PATH, and fail without either. The
runbook links of the alerts must land on headings of the troubleshooting
guide (GitHub's anchor rules), in English and in Traditional Chinese.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from nmo.telemetry.metrics import Metrics
from nmo_sandbox.binaries import find_binaries

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "node-maintenance-operator"
GUIDE = ROOT / "docs" / "troubleshooting.md"
GUIDE_ZH = ROOT / "docs" / "troubleshooting.zh-TW.md"
METRICS_DOC = ROOT / "docs" / "metrics.md"
NS = "node-maintenance-operator-system"

# The metrics the alerts may read (issue 12 adds the three drain metrics).
COUNTERS = {
    "nmo_drain_timeouts_total",
    "nmo_forced_deletions_total",
    "nmo_lease_errors_total",
    "nmo_webhook_admissions_total",
}
GAUGES = {"nmo_drain_blocked_seconds", "nmo_maintenances", "nmo_leader"}
KNOWN = COUNTERS | GAUGES
ALERTS = {
    "NodeMaintenanceDrainBlocked": {"nmo_drain_blocked_seconds"},
    "NodeMaintenanceDrainTimedOut": {"nmo_drain_timeouts_total"},
    "NodeMaintenanceFailed": {"nmo_maintenances"},
    "NodeMaintenanceLeaseErrors": {"nmo_lease_errors_total"},
    "NodeMaintenanceWebhookDenialsSpike": {"nmo_webhook_admissions_total"},
}


def _helm() -> str | None:
    cached = find_binaries(check=False).path("helm")
    if os.access(cached, os.X_OK):
        return str(cached)
    return shutil.which("helm")


HELM = _helm()


@pytest.fixture(scope="module")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("helm-home")
    return {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def template(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    assert HELM is not None, "no helm: build the sandbox binaries with `make sandbox-bin`"
    return subprocess.run(
        [HELM, "template", "nmo", str(CHART), "-n", NS, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def render(env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    result = template(env, *args)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def manager_args(docs: list[dict[str, Any]]) -> list[str]:
    (deployment,) = of_kind(docs, "Deployment")
    (manager,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "manager"
    ]
    return [str(a) for a in manager["args"]]


def rules(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    (rule,) = of_kind(docs, "PrometheusRule")
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def github_anchors(markdown: str) -> list[str]:
    """The ids GitHub gives the headings of a Markdown file, in order."""
    seen: dict[str, int] = {}
    out: list[str] = []
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else re.match(r"#{1,6} +(.+?) *#* *$", line)
        if m is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.append(slug if n == 0 else f"{slug}-{n}")
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression, ``<counter>_created`` as its counter."""
    names = set(re.findall(r"\bnmo_[a-z_]+", expr))
    return {n.removesuffix("_created") if n.endswith("_total_created") else n for n in names}


# -- drain values --------------------------------------------------------------


def test_defaults_have_no_prometheus_rule_and_no_drain_deadline(helm_env: dict[str, str]) -> None:
    docs = render(helm_env)
    assert of_kind(docs, "PrometheusRule") == []
    args = manager_args(docs)
    assert "--drain-timeout=0" in args
    assert "--drain-on-timeout=Report" in args


def test_drain_values_render_into_the_manager_args(
    helm_env: dict[str, str], tmp_path: Path
) -> None:
    args = manager_args(
        render(helm_env, "--set", "drain.timeoutSeconds=3600", "--set", "drain.onTimeout=Abort")
    )
    assert "--drain-timeout=3600" in args
    assert "--drain-on-timeout=Abort" in args
    # A values file makes the number a float64, which Go prints as 1e+07.
    values = tmp_path / "values.yaml"
    values.write_text(
        "drain:\n  timeoutSeconds: 10000000\n  onTimeout: Delete\n  allowPodDeletion: true\n"
    )
    args = manager_args(render(helm_env, "-f", str(values)))
    assert "--drain-timeout=10000000" in args
    assert "--drain-on-timeout=Delete" in args


def test_fleet_values_render_into_args_nmo_accepts(helm_env: dict[str, str]) -> None:
    from nmo.cli import budget_settings, build_parser

    args = manager_args(
        render(
            helm_env,
            *("--set", "fleet.maxParallelMaintenances=5", "--set", "fleet.maxUnavailable=10%"),
            *("--set", "fleet.window.days=Mon-Fri", "--set", "fleet.window.start=22:00"),
            *("--set", "fleet.window.end=06:00", "--set", "fleet.window.timezone=Europe/Berlin"),
        )
    )
    for flag in (
        "--max-parallel-maintenances=5",
        "--max-unavailable=10%",
        "--window-days=Mon-Fri",
        "--window-start=22:00",
        "--window-end=06:00",
        "--window-timezone=Europe/Berlin",
    ):
        assert flag in args, args
    parsed = build_parser().parse_args(args)
    fleet = budget_settings(parsed)
    assert fleet.max_parallel == 5 and fleet.max_unavailable == "10%"
    assert fleet.window is not None and fleet.window.text == "Mon-Fri 22:00-06:00 Europe/Berlin"
    defaults = manager_args(render(helm_env))
    assert "--max-parallel-maintenances=0" in defaults
    assert not [a for a in defaults if a.startswith(("--max-unavailable", "--window"))]


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ("fleet.maxParallelMaintenances=-1", "/fleet/maxParallelMaintenances"),
        ("fleet.maxUnavailable=0%", "/fleet/maxUnavailable"),
        ("fleet.maxUnavailable=0", "/fleet/maxUnavailable"),
        ("fleet.window.start=25:00", "/fleet/window/start"),
        ("drain.onTimeout=Later", "/drain/onTimeout"),
        ("drain.timeoutSeconds=-1", "/drain/timeoutSeconds"),
        ("drain.timeoutSeconds=soon", "/drain/timeoutSeconds"),
        ("prometheusRule.drainBlockedFor=soon", "/prometheusRule/drainBlockedFor"),
        ("prometheusRule.runbookBaseURL=x#y", "/prometheusRule/runbookBaseURL"),
        ("prometheusRule.webhookDenialsPerSecond=-1", "/prometheusRule/webhookDenialsPerSecond"),
    ],
)
def test_schema_refuses(helm_env: dict[str, str], value: str, where: str) -> None:
    result = template(helm_env, "--set", value)
    assert result.returncode != 0, f"{value} was accepted"
    assert where in result.stderr, result.stderr


# -- the PrometheusRule --------------------------------------------------------


@pytest.fixture(scope="module")
def enabled(helm_env: dict[str, str]) -> list[dict[str, Any]]:
    return render(helm_env, "--set", "prometheusRule.enabled=true")


def test_prometheus_rule_has_the_alerts_with_runbooks(enabled: list[dict[str, Any]]) -> None:
    (rule,) = of_kind(enabled, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == NS
    assert rule["metadata"]["labels"]["app.kubernetes.io/name"] == "node-maintenance-operator"
    alerts = rules(enabled)
    assert set(alerts) == set(ALERTS)
    for name, alert in alerts.items():
        assert alert["labels"]["severity"] in {"info", "warning", "critical"}, name
        notes = alert["annotations"]
        assert notes["summary"].strip() and notes["description"].strip(), name
        assert notes["runbook_url"].startswith("docs/troubleshooting.md#"), name


def test_each_alert_reads_known_metrics(enabled: list[dict[str, Any]]) -> None:
    documented = set(re.findall(r"^\| `(nmo_[a-z_]+)` \|", METRICS_DOC.read_text(), re.M))
    for name, alert in rules(enabled).items():
        used = metric_names(str(alert["expr"]))
        assert used, f"{name}: no nmo metric in {alert['expr']!r}"
        assert used <= KNOWN, f"{name}: unknown metrics {used - KNOWN}"
        assert ALERTS[name] <= used, f"{name} does not read {ALERTS[name]}"
        assert used <= documented, f"{name}: {used - documented} missing from docs/metrics.md"


def test_alert_metrics_exist_in_the_operator() -> None:
    registry = Metrics().registry
    names = {f.name + ("_total" if f.type == "counter" else "") for f in registry.collect()}
    assert names >= KNOWN, f"not registered by nmo: {KNOWN - names}"


@pytest.mark.parametrize("guide", [GUIDE, GUIDE_ZH], ids=["en", "zh-TW"])
def test_every_runbook_anchor_is_a_heading(enabled: list[dict[str, Any]], guide: Path) -> None:
    anchors = set(github_anchors(guide.read_text()))
    for name, alert in rules(enabled).items():
        base, _, anchor = alert["annotations"]["runbook_url"].partition("#")
        assert (ROOT / base).is_file(), base
        assert anchor in anchors, f"{name}: #{anchor} is not a heading of {guide.name}"
        assert name.lower() in anchor, f"{name}: #{anchor} is not its own runbook"


def test_both_guides_have_the_same_runbook_headings() -> None:
    def section_7(path: Path) -> list[str]:
        return re.findall(r"^### (7\.\d+ .+)$", path.read_text(), re.M)

    assert section_7(GUIDE) == section_7(GUIDE_ZH)
    assert len(section_7(GUIDE)) == len(ALERTS)


def test_github_anchors_follow_githubs_rules() -> None:
    text = (
        "# A `b`, c.d\n```sh\n# not a heading\n```\n"
        "## 7.1 X\n## 7.1 X\n## 排空 規則\uff08x\uff09\n"  # full-width parentheses
    )
    assert github_anchors(text) == ["a-b-cd", "71-x", "71-x-1", "排空-規則x"]


def test_prometheus_rule_values(helm_env: dict[str, str]) -> None:
    docs = render(
        helm_env,
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "prometheusRule.labels.release=kube-prometheus-stack",
        "--set",
        "prometheusRule.alertLabels.team=platform",
        "--set",
        "prometheusRule.drainBlockedFor=1h30m",
        "--set",
        "prometheusRule.webhookDenialsPerSecond=2",
        "--set",
        "prometheusRule.runbookBaseURL=https://git.example.com/nmo/blob/main/docs/troubleshooting.md",
    )
    (rule,) = of_kind(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    alerts = rules(docs)
    assert all(a["labels"]["team"] == "platform" for a in alerts.values())
    assert str(alerts["NodeMaintenanceDrainBlocked"]["expr"]).endswith("> 5400")
    assert str(alerts["NodeMaintenanceWebhookDenialsSpike"]["expr"]).endswith("> 2")
    assert alerts["NodeMaintenanceFailed"]["annotations"]["runbook_url"] == (
        "https://git.example.com/nmo/blob/main/docs/troubleshooting.md#73-nodemaintenancefailed"
    )
    # Prometheus's own template braces reach Prometheus unrendered.
    summary = alerts["NodeMaintenanceDrainBlocked"]["annotations"]["summary"]
    assert "{{ $labels.node }}" in summary


@pytest.mark.parametrize(
    ("duration", "seconds"), [("30m", 1800), ("45s", 45), ("2h", 7200), ("1d2h3m4s", 93784)]
)
def test_drain_blocked_threshold_in_seconds(
    helm_env: dict[str, str], duration: str, seconds: int
) -> None:
    docs = render(
        helm_env,
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        f"prometheusRule.drainBlockedFor={duration}",
    )
    expr = str(rules(docs)["NodeMaintenanceDrainBlocked"]["expr"])
    assert expr.endswith(f"> {seconds}"), expr


def test_exprs_are_balanced(enabled: list[dict[str, Any]]) -> None:
    # No promtool here: at least the brackets, braces and quotes must pair up.
    for expr in (str(a["expr"]) for a in rules(enabled).values()):
        for left, right in ("()", "[]", "{}"):
            assert expr.count(left) == expr.count(right), expr
        assert expr.count('"') % 2 == 0, expr
