"""cert-manager's part of the sandbox: where its binaries are, its flags, its probe.

The processes themselves run in tests/integration/test_cert_manager.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from nmo_sandbox import MissingBinariesError
from nmo_sandbox.certmanager import (
    CAINJECTOR,
    CONTROLLER,
    NAMESPACE,
    VERSION,
    CertManagerBinaries,
    CertManagerPorts,
    certificate_ready,
    commands,
    find_cert_manager,
    injected,
    probe_objects,
)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "cert-manager-bin.sh"


def cache(
    tmp_path: Path, *, crds: bool = True, bins: tuple[str, ...] = (CONTROLLER, CAINJECTOR)
) -> Path:
    bin_dir = tmp_path / "cert-manager" / VERSION / "bin"
    bin_dir.mkdir(parents=True)
    for name in bins:
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    if crds:
        (bin_dir.parent / "crds").mkdir()
        (bin_dir.parent / "crds" / "cert-manager.io_certificates.yaml").write_text("{}\n")
    return bin_dir


def test_missing_binaries_name_what_and_how(tmp_path: Path) -> None:
    found = CertManagerBinaries(cache(tmp_path, crds=False, bins=(CONTROLLER,)))
    with pytest.raises(MissingBinariesError) as err:
        found.check()
    message = str(err.value)
    assert f"{CAINJECTOR}, ../crds/*.yaml" in message
    assert "make cert-manager-bin" in message


def test_the_override_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = cache(tmp_path)
    monkeypatch.setenv("NMO_CERT_MANAGER_BIN", str(bin_dir))
    found = find_cert_manager()
    assert found.bin_dir == bin_dir.resolve()
    assert found.crds_dir == bin_dir.parent.resolve() / "crds"


def test_python_and_the_script_agree_on_the_cache(tmp_path: Path) -> None:
    env = {**os.environ, "NMO_CACHE_DIR": str(tmp_path)}
    env.pop("NMO_CERT_MANAGER_VERSION", None)
    printed = subprocess.run(
        ["bash", str(SCRIPT), "--print-dir"], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert printed == str(tmp_path / "cert-manager" / VERSION / "bin")
    checked = subprocess.run(["bash", str(SCRIPT), "--check"], env=env, capture_output=True)
    assert checked.returncode == 1  # nothing cached there


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
    assert "https://go.dev/dl/" in result.stderr


def test_flags_bind_loopback_and_elect_no_leader(tmp_path: Path) -> None:
    bins = CertManagerBinaries(tmp_path)
    argvs = commands(bins, kubeconfig=tmp_path / "kubeconfig", ports=CertManagerPorts(1, 2, 3))
    controller, cainjector = argvs[CONTROLLER], argvs[CAINJECTOR]
    assert controller[0] == str(tmp_path / CONTROLLER)
    assert "--metrics-listen-address=127.0.0.1:1" in controller
    assert "--internal-healthz-listen-address=127.0.0.1:2" in controller
    assert f"--cluster-resource-namespace={NAMESPACE}" in controller
    assert "--metrics-listen-address=127.0.0.1:3" in cainjector
    for argv in (controller, cainjector):
        assert f"--kubeconfig={tmp_path / 'kubeconfig'}" in argv
        assert "--leader-elect=false" in argv
        assert "--enable-profiling=false" in argv


def test_probe_injects_from_its_own_certificate() -> None:
    objects = {obj["kind"]: obj for _, obj in probe_objects()}
    vwc = objects["ValidatingWebhookConfiguration"]
    cert = objects["Certificate"]
    annotation = vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert annotation == f"{cert['metadata']['namespace']}/{cert['metadata']['name']}"
    assert cert["spec"]["issuerRef"]["name"] == objects["Issuer"]["metadata"]["name"]
    (hook,) = vwc["webhooks"]
    assert hook["failurePolicy"] == "Ignore"  # never blocks a request if called


def test_readiness_predicates() -> None:
    def cert(status: str, observed: int, generation: int = 2) -> dict[str, object]:
        return {
            "metadata": {"generation": generation},
            "status": {
                "conditions": [{"type": "Ready", "status": status, "observedGeneration": observed}]
            },
        }

    assert certificate_ready(cert("True", 2))
    assert not certificate_ready(cert("True", 1))  # stale: an older spec was Ready
    assert not certificate_ready(cert("False", 2))
    assert not certificate_ready({"metadata": {}, "status": {}})
    assert injected({"webhooks": [{"clientConfig": {"caBundle": "Y2E="}}]})
    assert not injected({"webhooks": [{"clientConfig": {}}]})
    assert not injected({"webhooks": []})
