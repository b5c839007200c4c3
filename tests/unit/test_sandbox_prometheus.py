"""The Prometheus launcher's pure parts: where its binaries are, its config, its flags.

The server itself runs in tests/integration/test_alerts.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from nmo_sandbox import MissingBinariesError
from nmo_sandbox.prometheus import (
    PROMETHEUS,
    PROMTOOL,
    VERSION,
    Prometheus,
    PrometheusBinaries,
    find_prometheus,
    prometheus_config,
)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "prometheus-bin.sh"


def cache(tmp_path: Path, bins: tuple[str, ...] = (PROMETHEUS, PROMTOOL)) -> Path:
    bin_dir = tmp_path / "prometheus" / VERSION / "bin"
    bin_dir.mkdir(parents=True)
    for name in bins:
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def test_missing_binaries_name_what_and_how(tmp_path: Path) -> None:
    found = PrometheusBinaries(cache(tmp_path, bins=(PROMETHEUS,)))
    with pytest.raises(MissingBinariesError) as err:
        found.check()
    assert f": {PROMTOOL}." in str(err.value)
    assert "make prometheus-bin" in str(err.value)


def test_the_override_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = cache(tmp_path)
    monkeypatch.setenv("NMO_PROMETHEUS_BIN", str(bin_dir))
    found = find_prometheus()
    assert found.prometheus == bin_dir.resolve() / PROMETHEUS
    assert found.promtool == bin_dir.resolve() / PROMTOOL


def test_python_and_the_script_agree_on_the_cache(tmp_path: Path) -> None:
    env = {**os.environ, "NMO_CACHE_DIR": str(tmp_path)}
    env.pop("NMO_PROMETHEUS_VERSION", None)
    printed = subprocess.run(
        ["bash", str(SCRIPT), "--print-dir"], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert printed == str(tmp_path / "prometheus" / VERSION / "bin")
    checked = subprocess.run(["bash", str(SCRIPT), "--check"], env=env, capture_output=True)
    assert checked.returncode == 1  # nothing cached there
    cache(tmp_path)
    checked = subprocess.run(["bash", str(SCRIPT), "--check"], env=env, capture_output=True)
    assert checked.returncode == 0


def test_without_go_the_script_says_so(tmp_path: Path) -> None:
    bare = tmp_path / "path"
    bare.mkdir()
    for tool in ("bash", "date", "mkdir", "dirname", "printf"):
        real = subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip()
        if real:
            (bare / tool).symlink_to(real)
    env = {"PATH": str(bare), "NMO_CACHE_DIR": str(tmp_path / "cache"), "HOME": str(tmp_path)}
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True)
    assert result.returncode == 1
    assert "Go is not installed or not on PATH" in result.stderr


def test_config_and_flags(tmp_path: Path) -> None:
    job = {"job_name": "nmo", "static_configs": [{"targets": ["127.0.0.1:8443"]}]}
    config = prometheus_config(
        rule_files=[tmp_path / "r.yaml"], scrape_configs=[job], interval="2s"
    )
    assert config == {
        "global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "2s"},
        "rule_files": [str(tmp_path / "r.yaml")],
        "scrape_configs": [job],
    }
    yaml.safe_dump(config)  # what start() writes
    prom = Prometheus(tmp_path, binaries=PrometheusBinaries(tmp_path / "bin"))
    prom.port = 9999
    argv = prom.argv()
    assert argv[0] == str(tmp_path / "bin" / PROMETHEUS)
    assert "--web.listen-address=127.0.0.1:9999" in argv  # loopback only
    assert f"--storage.tsdb.path={tmp_path / 'data'}" in argv
    assert prom.url == "http://127.0.0.1:9999"


FAKE_GO = """#!/bin/sh
# A go command older than the module needs, with GOTOOLCHAIN=local (Debian's go.env).
case "$1 $2" in
  "env GOVERSION") echo go1.25.0 ;;
  "env GOTOOLCHAIN") echo "${GOTOOLCHAIN:-local}" ;;
  "env GOPROXY") echo https://proxy.golang.org ;;
  "mod download") printf '{"Path": "m", "Version": "v", "GoMod": "%s"}\\n' "$FAKE_GOMOD" ;;
  install*)
    echo "${GOTOOLCHAIN:-unset}" >> "$FAKE_LOG"
    for last; do :; done
    name=${last%@*}; name=${name##*/}
    printf '#!/bin/sh\\n' > "$GOBIN/$name"; chmod +x "$GOBIN/$name" ;;
  *) echo "fake go: $*" >&2; exit 2 ;;
esac
"""


def test_an_older_local_go_builds_with_the_modules_toolchain(tmp_path: Path) -> None:
    """Prometheus's go.mod says `go 1.26.7`; a go command older than that with
    GOTOOLCHAIN=local (as Debian's go.env sets it) refuses `go install`. The
    script asks for the module's toolchain (GOTOOLCHAIN=go1.26.7), which the go
    command fetches from the Go module proxy (golang.org/toolchain)."""
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "go").write_text(FAKE_GO)
    (fake / "go").chmod(0o755)
    gomod = tmp_path / "prometheus.mod"
    gomod.write_text("module github.com/prometheus/prometheus\n\ngo 1.26.7\n")
    log = tmp_path / "install.log"
    env = {
        **os.environ,
        "PATH": f"{fake}:{os.environ['PATH']}",
        "NMO_CACHE_DIR": str(tmp_path / "cache"),
        "FAKE_GOMOD": str(gomod),
        "FAKE_LOG": str(log),
    }
    for name in ("GOTOOLCHAIN", "NMO_PROMETHEUS_VERSION"):
        env.pop(name, None)
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert log.read_text().split() == ["go1.26.7", "go1.26.7"]  # prometheus, promtool
    assert "go1.26.7" in result.stderr

    # A go command new enough (or GOTOOLCHAIN set by the caller) is left alone.
    log.unlink()
    env["NMO_CACHE_DIR"] = str(tmp_path / "cache2")
    env["GOTOOLCHAIN"] = "go1.26.9"
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert log.read_text().split() == ["go1.26.9", "go1.26.9"]
