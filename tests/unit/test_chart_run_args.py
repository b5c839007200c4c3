"""The chart's container arguments are a valid ``nmo run`` command line that
asks for leader election (issue 11 item 2: nmo's default is off, as the Go
NMO's; the chart's replicas must turn it on). Rendered offline with
``helm template``, as test_chart_alerts."""

from __future__ import annotations

import pytest
from test_chart_alerts import NS, helm_env, manager_args, render

from nmo.cli import Settings, build_parser, goflags, settings_from

__all__ = ["helm_env"]  # the fixture, shared


def _settings(args: list[str]) -> Settings:
    assert args[0] == "run"
    parsed = build_parser().parse_args(["run", *goflags.normalize(args[1:])])
    return settings_from(parsed)


def test_the_chart_asks_for_leader_election_in_its_namespace(
    helm_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    settings = _settings(manager_args(render(helm_env)))
    assert settings.engine.leader_election is True
    assert settings.engine.leader_election_namespace == NS


def test_the_chart_can_turn_it_off_for_one_replica(helm_env: dict[str, str]) -> None:
    docs = render(
        helm_env,
        "--set", "operator.leaderElection.enabled=false",
        "--set", "deployment.replicas=1",
    )  # fmt: skip
    assert _settings(manager_args(docs)).engine.leader_election is False


def test_critical_pods_last_is_off_unless_the_chart_turns_it_on(helm_env: dict[str, str]) -> None:
    """The Go NMO evicts every pod at once; drain.criticalPodsLast opts in."""
    assert _settings(manager_args(render(helm_env))).engine.plan.critical_last is False
    docs = render(helm_env, "--set", "drain.criticalPodsLast=true")
    assert _settings(manager_args(docs)).engine.plan.critical_last is True
    assert build_parser().parse_args(["run"]).critical_pods_last is False


def test_volume_detach_wait_is_off_unless_the_chart_turns_it_on(helm_env: dict[str, str]) -> None:
    """The Go NMO succeeds when the last pod left; drain.waitForVolumeDetach opts in."""
    plan = _settings(manager_args(render(helm_env))).engine.plan
    assert (plan.volume_detach, plan.volume_detach_timeout) == (False, 360)
    docs = render(
        helm_env,
        "--set", "drain.waitForVolumeDetach=true",
        "--set", "drain.volumeDetachTimeoutSeconds=900",
    )  # fmt: skip
    plan = _settings(manager_args(docs)).engine.plan
    assert (plan.volume_detach, plan.volume_detach_timeout) == (True, 900)
    defaults = build_parser().parse_args(["run"])
    assert (defaults.wait_for_volume_detach, defaults.volume_detach_timeout) == (False, 360)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--volume-detach-timeout=0"])


def test_pod_drain_rules_are_off_unless_the_chart_allows_namespaces(
    helm_env: dict[str, str],
) -> None:
    """Pod labels are tenant input: no namespace's rules by default (issue 20)."""
    plan = _settings(manager_args(render(helm_env))).engine.plan
    assert plan.pod_rules_namespaces == frozenset()
    assert plan.max_drain_seconds == 0
    docs = render(
        helm_env,
        "--set", "drain.podRulesNamespaces={team-a,team-b}",
        "--set", "drain.maxSeconds=3600",
        "--set", "drain.maxAction=Abort",
    )  # fmt: skip
    plan = _settings(manager_args(docs)).engine.plan
    assert plan.pod_rules_namespaces == frozenset({"team-a", "team-b"})
    assert (plan.max_drain_seconds, plan.max_drain_action.value) == (3600, "Abort")
    assert build_parser().parse_args(["run"]).pod_drain_rules_namespaces == frozenset()
