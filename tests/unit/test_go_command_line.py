"""The Go NMO's command line, read by ``nmo run`` and ``/manager`` (issue 11 item 1).

Every argument list the Go NMO's Deployments and CSVs pass (current main and
the releases with a kube-rbac-proxy sidecar), every form Go's ``flag``
package accepts, the address forms and ``0``, the zap flags and their
refusals, and nmo's own flags next to them. Unknown and abbreviated flags
still fail by name.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
from pathlib import Path

import pytest

from nmo.api import constants as c
from nmo.cli import build_parser, goflags, gomanager, main, server_settings, settings_from
from nmo.cli.defaults import leader_election_namespace, webhook_cert_dir
from nmo.cli.goflags import BindAddress, GoFlagError, ZapOptions, log_choice, normalize
from nmo.server.servers import bind
from nmo.telemetry.logsetup import JsonFormatter

# What the Go NMO's manifests pass to /manager, verbatim: its CSV
# (bundle/manifests/) and config/default/manager_ports_patch.yaml,
GO_CSV_ARGS = [
    "--health-probe-bind-address=:8081",
    "--metrics-bind-address=:8443",
    "--leader-elect",
    "--enable-http2=false",
]
GO_MANAGER_YAML_ARGS = ["--leader-elect"]  # config/manager/manager.yaml alone
GO_RBAC_PROXY_ARGS = [  # releases 0.17-0.20, config/default/manager_auth_proxy_patch.yaml
    "--health-probe-bind-address=:8081",
    "--metrics-bind-address=127.0.0.1:8080",
    "--leader-elect",
]


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(["run", *normalize(argv)])


def test_the_go_csv_args_mean_what_they_mean_to_the_go_nmo() -> None:
    args = parse(GO_CSV_ARGS)
    servers = server_settings(args)
    assert args.leader_elect is True
    assert (servers.probes_bind_address, servers.probes_port) == ("", 8081)
    assert (servers.metrics_bind_address, servers.metrics_port) == ("", 8443)
    assert servers.metrics_secure is True  # TLS + TokenReview/SubjectAccessReview, as Go
    assert servers.enable_http2 is False
    assert servers.webhook_port == 9443


def test_the_kube_rbac_proxy_layout_serves_plain_metrics_on_loopback() -> None:
    """The sidecar proxies http://127.0.0.1:8080/: nmo must answer plain HTTP there."""
    servers = server_settings(parse(GO_RBAC_PROXY_ARGS))
    assert (servers.metrics_bind_address, servers.metrics_port) == ("127.0.0.1", 8080)
    assert servers.metrics_secure is False
    secure = server_settings(parse([*GO_RBAC_PROXY_ARGS, "--metrics-secure"]))
    assert secure.metrics_secure is True  # an explicit choice wins


def test_manager_yaml_alone_elects_a_leader_on_the_default_ports() -> None:
    args = parse(GO_MANAGER_YAML_ARGS)
    servers = server_settings(args)
    assert args.leader_elect is True
    assert (servers.probes_bind_address, servers.probes_port) == (None, 8081)
    assert (servers.metrics_port, servers.metrics_secure) == (8443, True)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (":8081", BindAddress("", 8081)),
        ("0.0.0.0:8081", BindAddress("0.0.0.0", 8081)),
        ("127.0.0.1:8080", BindAddress("127.0.0.1", 8080)),
        ("[::]:8081", BindAddress("::", 8081)),
        ("[::1]:9000", BindAddress("::1", 9000)),
        ("localhost:8081", BindAddress("localhost", 8081)),
        (":0", BindAddress("", 0)),  # any free port, as net.Listen
        ("0", None),
    ],
)
def test_bind_address_forms(value: str, expected: BindAddress | None) -> None:
    for flag in ("health-probe-bind-address", "metrics-bind-address"):
        assert goflags.parse_bind_address(flag, value) == expected


def test_an_empty_address_is_what_controller_runtime_makes_of_it() -> None:
    assert goflags.parse_bind_address("health-probe-bind-address", "") is None  # off
    assert goflags.parse_bind_address("metrics-bind-address", "") == BindAddress("", 8080)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("8081", "missing port"),
        ("::1:8080", "too many colons"),
        (":http", 'invalid port "http"'),
        (":65536", 'invalid port "65536"'),
        ("127.0.0.1:", 'invalid port ""'),
    ],
)
def test_bad_bind_addresses_are_refused_by_name(value: str, message: str) -> None:
    with pytest.raises(GoFlagError, match=message) as err:
        goflags.parse_bind_address("metrics-bind-address", value)
    assert "--metrics-bind-address" in str(err.value)


@pytest.mark.parametrize(
    ("flag", "attr"),
    [
        ("--health-probe-bind-address", "probes"),
        ("--metrics-bind-address", "metrics"),
    ],
)
def test_zero_turns_a_server_off(flag: str, attr: str) -> None:
    servers = server_settings(parse([f"{flag}=0"]))
    assert getattr(servers, f"{attr}_port") is None


def test_addresses_reach_the_server_settings_in_every_form() -> None:
    for argv in (
        ["--health-probe-bind-address=[::]:8081"],
        ["--health-probe-bind-address", "[::]:8081"],
        ["-health-probe-bind-address=[::]:8081"],
        ["-health-probe-bind-address", "[::]:8081"],
    ):
        servers = server_settings(parse(argv))
        assert (servers.probes_bind_address, servers.probes_port) == ("::", 8081), argv


@pytest.mark.parametrize(
    ("arg", "value"),
    [
        ("--leader-elect", True),
        ("-leader-elect", True),
        *[(f"--leader-elect={v}", True) for v in ("1", "t", "T", "true", "TRUE", "True")],
        *[(f"-leader-elect={v}", False) for v in ("0", "f", "F", "false", "FALSE", "False")],
        ("--no-leader-elect", False),  # nmo's own form
    ],
)
def test_boolean_forms_of_go_flags(arg: str, value: bool) -> None:
    assert parse([arg]).leader_elect is value


@pytest.mark.parametrize("arg", ["--enable-http2=false", "-enable-http2=0", "--no-enable-http2"])
def test_http2_off_is_accepted(arg: str) -> None:
    assert server_settings(parse([arg])).enable_http2 is False


def test_http2_on_is_accepted_and_reaches_the_servers_which_warn() -> None:
    assert server_settings(parse(["--enable-http2=true"])).enable_http2 is True


def test_leader_election_is_off_unless_asked_as_in_the_go_nmo() -> None:
    assert parse([]).leader_elect is False
    assert settings_from(parse([])).engine.leader_election is False


@pytest.mark.parametrize("value", ["yes", "on", "2", ""])
def test_a_bad_boolean_fails_with_gos_message(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", f"--leader-elect={value}"]) == 2
    assert f'invalid boolean value "{value}" for -leader-elect: parse error' in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["--leader-elekt"],
        ["--config=controller_manager_config.yaml"],  # not a flag of the Go NMO either
        ["-v=10"],
        ["--leader-elect", "false"],  # Go takes "false" as an argument, not a value
    ],
)
def test_unknown_flags_still_fail_by_name(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err and argv[-1] in err


@pytest.mark.parametrize("abbreviated", ["--leader", "--metrics-bind", "--zap-log"])
def test_abbreviations_are_refused_as_go_refuses_them(
    abbreviated: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["run", f"{abbreviated}=x"])
    assert "unrecognized arguments" in capsys.readouterr().err


def test_nmo_flags_keep_working_next_to_go_flags() -> None:
    args = parse(
        [
            "--bind-address", "127.0.0.1", "--health-probe-port", "18081",
            "--metrics-port", "18443", "--no-metrics-secure", "--leader-elect",
            "--leader-election-namespace", "ns", "--webhook-port", "19443",
            "--zap-log-level=debug", "--max-concurrent-reconciles", "3",
        ]
    )  # fmt: skip
    settings = settings_from(args)
    s = settings.servers
    assert (s.bind_address, s.probes_bind_address, s.probes_port) == ("127.0.0.1", None, 18081)
    assert (s.metrics_port, s.metrics_secure, s.webhook_port) == (18443, False, 19443)
    assert settings.engine.leader_election is True
    assert settings.engine.leader_election_namespace == "ns"
    assert settings.engine.max_concurrent_reconciles == 3


def test_a_port_given_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="--health-probe-bind-address or --health-probe-port"):
        server_settings(parse(["--health-probe-bind-address=:8081", "--health-probe-port=1"]))


def test_everything_after_double_dash_is_left_alone() -> None:
    assert normalize(["--leader-elect=false", "--", "-leader-elect=x"]) == [
        "--no-leader-elect",
        "--",
        "-leader-elect=x",
    ]


def test_go_kubeconfig_flag_forms(tmp_path: Path) -> None:
    path = str(tmp_path / "kc")
    assert parse([f"-kubeconfig={path}"]).kubeconfig == path
    assert parse(["-kubeconfig", path]).kubeconfig == path


# -- zap ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("zap", "expected"),
    [
        (ZapOptions(), ("info", "text")),  # nmo's own defaults when no zap flag is given
        (ZapOptions(devel=True), ("debug", "text")),
        (ZapOptions(devel=False), ("info", "json")),
        (ZapOptions(encoder="json"), ("info", "json")),
        (ZapOptions(encoder="CONSOLE"), ("info", "text")),
        (ZapOptions(devel=True, encoder="json"), ("debug", "json")),
        (ZapOptions(devel=False, log_level="debug"), ("debug", "json")),
        (ZapOptions(log_level="error"), ("error", "text")),
        (ZapOptions(log_level="panic"), ("critical", "text")),
        (ZapOptions(log_level="5"), ("debug", "text")),
        (ZapOptions(log_level="Info"), ("info", "text")),
    ],
)
def test_zap_flags_choose_the_logging(zap: ZapOptions, expected: tuple[str, str]) -> None:
    choice = log_choice(zap, level="info", fmt="text")
    assert (choice.level, choice.fmt) == expected


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        ("--zap-log-level=verbose", 'invalid log level "verbose"'),
        ("--zap-log-level=0", 'invalid log level "0"'),
        ("--zap-log-level=-1", 'invalid log level "-1"'),
        ("--zap-encoder=yaml", 'invalid encoder value "yaml"'),
        ("--zap-stacktrace-level=debug", 'invalid stacktrace level "debug"'),
        ("--zap-time-encoding=nano", 'invalid time-encoding value "nano"'),
        ("-zap-devel=maybe", 'invalid boolean value "maybe" for -zap-devel'),
    ],
)
def test_zap_values_controller_runtime_refuses_are_refused(
    arg: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", arg]) == 2
    assert message in capsys.readouterr().err


def test_every_zap_flag_is_accepted_in_go_form() -> None:
    args = parse(
        [
            "-zap-devel=false", "--zap-encoder", "json", "-zap-log-level=2",
            "--zap-stacktrace-level=error", "--zap-time-encoding=rfc3339nano",
        ]
    )  # fmt: skip
    assert (args.zap_devel, args.zap_encoder, args.zap_log_level) == (False, "json", "2")
    assert (args.zap_stacktrace_level, args.zap_time_encoding) == ("error", "rfc3339nano")


@pytest.mark.parametrize(
    ("encoding", "ts"),
    [
        ("epoch", 1767225600.5),
        ("millis", 1767225600500.0),
        ("nanos", 1767225600500000000),
        ("iso8601", "2026-01-01T00:00:00.500Z"),
        ("rfc3339", "2026-01-01T00:00:00Z"),
        ("rfc3339nano", "2026-01-01T00:00:00.5Z"),
        (None, "2026-01-01T00:00:00.500+00:00"),
    ],
)
def test_zap_time_encodings_of_json_logs(encoding: str | None, ts: object) -> None:
    record = logging.makeLogRecord({"msg": "maintenance started", "levelname": "INFO"})
    record.created = 1767225600.5
    assert json.loads(JsonFormatter(encoding).format(record))["ts"] == ts


# -- /manager and the defaults it finds -----------------------------------------------


def test_manager_is_nmo_run_with_the_go_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert gomanager.main(["--zap-log-level=verbose"]) == 2  # parsed as nmo run's
    assert 'invalid log level "verbose"' in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        gomanager.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--health-probe-bind-address" in out and "--leader-elect" in out
    assert "--shutdown-delay-seconds" in out


def test_the_top_level_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "Node Maintenance Operator" in out
    assert "``" not in out  # no reST markup from a docstring


def test_leader_election_namespace_is_found_where_the_go_nmo_finds_it(tmp_path: Path) -> None:
    sa = tmp_path / "namespace"
    missing = tmp_path / "missing"
    assert leader_election_namespace("flag", {"POD_NAMESPACE": "pod"}) == "flag"
    env = {"POD_NAMESPACE": "pod", "OPERATOR_NAMESPACE": "op"}
    assert leader_election_namespace(None, env, service_account_namespace=missing) == "pod"
    env = {"OPERATOR_NAMESPACE": "openshift-workload-availability"}  # the Go CSV's env
    assert (
        leader_election_namespace(None, env, service_account_namespace=missing)
        == "openshift-workload-availability"
    )
    sa.write_text("in-pod\n")
    assert leader_election_namespace(None, {}, service_account_namespace=sa) == "in-pod"
    assert leader_election_namespace(None, {}, service_account_namespace=missing) == (
        c.OPERATOR_NAMESPACE
    )


def test_webhook_certificates_are_found_where_the_go_nmo_finds_them(tmp_path: Path) -> None:
    olm, cr = tmp_path / "olm", tmp_path / "cr"
    dirs = {"olm_dir": str(olm), "controller_runtime_dir": str(cr)}
    assert webhook_cert_dir(None, **dirs) == str(olm)  # neither: wait for OLM's
    cr.mkdir()
    (cr / "tls.crt").write_text("c")
    (cr / "tls.key").write_text("k")
    assert webhook_cert_dir(None, **dirs) == str(cr)  # the kustomize Deployment's Secret
    olm.mkdir()
    (olm / "apiserver.crt").write_text("c")
    (olm / "apiserver.key").write_text("k")
    assert webhook_cert_dir(None, **dirs) == str(olm)  # OLM's first, as Go
    assert webhook_cert_dir("/given", **dirs) == "/given"


def test_an_empty_host_listens_on_every_interface() -> None:
    sock = bind("", 0)
    try:
        port = sock.getsockname()[1]
        if socket.has_dualstack_ipv6():
            assert sock.family == socket.AF_INET6
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass  # IPv4 reaches it too
    finally:
        sock.close()


def test_the_image_installs_manager_as_nmo_run() -> None:
    """The Go Deployment's ``command: [/manager]``: the image's /manager is the
    console script of :func:`nmo.cli.gomanager.main`."""
    import tomllib

    root = Path(__file__).resolve().parents[2]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["nmo-manager"] == "nmo.cli.gomanager:main"
    runtime = (root / "Containerfile").read_text().rsplit("\nFROM ", 1)[1]
    assert "COPY --from=build /opt/nmo/bin/nmo-manager /manager" in runtime


def test_a_read_only_root_filesystem_keeps_the_metrics_certificate_in_shared_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Go CSV: readOnlyRootFilesystem and no /tmp volume. Tests run as root,
    who may write anywhere, so the unusable temporary directory is a file."""
    import tempfile

    from nmo.server.servers import private_dir

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(blocker))
    shm = tmp_path / "shm"
    shm.mkdir()
    made = private_dir("nmo-metrics-cert-", fallback=str(shm))
    assert made.parent == shm and made.is_dir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert private_dir("nmo-metrics-cert-", fallback=str(shm)).parent == tmp_path


def test_without_a_writable_temporary_directory_certificates_load_from_shared_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Go CSV: readOnlyRootFilesystem and no /tmp volume, where tempfile finds
    no directory and every certificate load (a scratch copy for OpenSSL)
    raised: the metrics server, and so the pod, never started. Tests run as
    root, who may write anywhere, so the unusable directory is a file."""
    import tempfile

    from nmo.cli.defaults import temporary_directory
    from nmo.server.tls import ReloadingCertificate, write_self_signed

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setattr(tempfile, "_candidate_tempdir_list", lambda: [str(blocker)])
    write_self_signed(tmp_path / "cert", ["localhost"])
    with pytest.raises(FileNotFoundError, match="No usable temporary directory"):
        ReloadingCertificate(tmp_path / "cert").load()
    with pytest.raises(FileNotFoundError):
        temporary_directory(fallback=str(tmp_path / "no-shm"))
    shm = tmp_path / "shm"
    shm.mkdir()
    used, why = temporary_directory(fallback=str(shm))
    assert (used, tempfile.gettempdir()) == (str(shm), str(shm))
    assert why is not None and "No usable temporary directory" in why
    ReloadingCertificate(tmp_path / "cert").load()
    assert list(shm.iterdir()) == []  # the scratch copy is gone
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # usable: kept as it is
    assert temporary_directory(fallback=str(shm)) == (str(tmp_path), None)


def test_status_heartbeat_defaults_to_a_minute_and_takes_seconds() -> None:
    assert settings_from(parse([])).engine.plan.heartbeat == 60.0
    assert settings_from(parse(["--status-heartbeat", "10"])).engine.plan.heartbeat == 10.0


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_a_bad_status_heartbeat_is_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "--status-heartbeat", value])
    assert exited.value.code == 2
    assert "argument --status-heartbeat: " in capsys.readouterr().err


def test_pdb_recheck_interval_defaults_to_a_minute_and_takes_seconds() -> None:
    assert settings_from(parse([])).engine.plan.pdb_recheck == 60.0
    assert settings_from(parse(["--pdb-recheck-interval", "5"])).engine.plan.pdb_recheck == 5.0


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_a_bad_pdb_recheck_interval_is_refused(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "--pdb-recheck-interval", value])
    assert exited.value.code == 2
    assert "argument --pdb-recheck-interval: " in capsys.readouterr().err


# -- a pod spec that gives only args (the Go image's entry point is the operator)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--leader-elect"], ["run", "--leader-elect"]),
        (
            ["--health-probe-bind-address=:8081", "--metrics-bind-address=:8443"],
            [
                "run",
                *normalize(["--health-probe-bind-address=:8081", "--metrics-bind-address=:8443"]),
            ],
        ),
        (["-leader-elect"], ["run", *normalize(["-leader-elect"])]),
        (["run", "--leader-elect"], ["run", "--leader-elect"]),
        (["version"], ["version"]),
        (["--help"], ["--help"]),
        (["-h"], ["-h"]),
        ([], []),
    ],
)
def test_arguments_that_start_with_a_flag_are_runs(argv: list[str], expected: list[str]) -> None:
    from nmo.cli import command_line

    assert command_line(argv) == expected


def test_only_go_args_run_the_operator_parser() -> None:
    from nmo.cli import command_line

    args = build_parser().parse_args(command_line(["--leader-elect", "--enable-http2=false"]))
    assert args.command == "run"
    assert args.leader_elect is True


def test_an_unknown_flag_alone_still_fails_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--no-such-flag"])
    assert exc.value.code == 2
    assert "--no-such-flag" in capsys.readouterr().err


def test_the_default_cert_dir_is_go_os_tempdir_and_probes_no_file(tmp_path: Path) -> None:
    """controller-runtime's default is os.TempDir()/k8s-webhook-server/serving-certs:
    ``$TMPDIR`` as it is, even when it does not exist (the Go CSV's read-only root
    has no writable temporary directory, and importing nmo must not fail there)."""
    import subprocess
    import sys

    missing = tmp_path / "no-such-dir"
    probe = "from nmo.cli.defaults import CONTROLLER_RUNTIME_CERT_DIR as d; print(d)"
    for tmpdir, expected in ((str(missing), str(missing)), (None, "/tmp")):
        env = {"PATH": "/usr/bin:/bin"} | ({"TMPDIR": tmpdir} if tmpdir else {})
        done = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
        )
        assert done.stdout.strip() == f"{expected}/k8s-webhook-server/serving-certs"


# -- every interface, both families, by default (IPv6 clusters) -------------------


def test_the_default_bind_address_is_every_interface_of_both_families() -> None:
    args = build_parser().parse_args(["run"])
    settings = server_settings(args)
    assert settings.bind_address == ""
    sock = bind(settings.bind_address, 0)
    try:
        if socket.has_dualstack_ipv6():
            assert sock.family == socket.AF_INET6
            assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0
            port = sock.getsockname()[1]
            for family, loopback in ((socket.AF_INET6, "::1"), (socket.AF_INET, "127.0.0.1")):
                with socket.socket(family, socket.SOCK_STREAM) as client:
                    client.settimeout(5)
                    client.connect((loopback, port))  # accepted by the kernel's backlog
        else:
            assert sock.family == socket.AF_INET
    finally:
        sock.close()


def test_the_webhook_url_in_the_log_brackets_ipv6() -> None:
    from nmo.server.servers import url_host

    assert url_host("::1") == "[::1]"
    assert url_host("127.0.0.1") == "127.0.0.1"
    assert url_host("") in ("[::]", "0.0.0.0")
