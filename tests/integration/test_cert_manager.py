"""The chart's default TLS mode against a real cert-manager (controller and cainjector).

A sandbox of its own started with ``cert_manager=True`` (the session's has
no cert-manager), and ``helm install`` with the chart's defaults: the chart's
self-signed Issuer, CA Certificate and CA Issuer, then the serving
Certificate. cert-manager must make the Certificate Ready and write the Secret
(tls.crt for the webhook Service's names, tls.key, ca.crt), and cainjector
must put that CA into the ValidatingWebhookConfiguration named by its
``cert-manager.io/inject-ca-from`` annotation. A renewal (triggered as
``cmctl renew`` does) must land a new serial and a new key in the Secret while
the injected caBundle, the chart's CA, still verifies the new certificate;
with the chart's ``duration``/``renewBefore`` values it renews on schedule.
The guide's troubleshooting section 3a runs verbatim against it, and
``nmo-sandbox up --cert-manager`` / ``down`` are checked from the CLI.

Cost: about 45-70 s on 2 shared cores (two sandbox starts: the CLI's and
the module's, about 15 s each with cert-manager).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from operator_fixtures import wait_for

from nmo.api import constants as c
from nmo_sandbox import MissingBinariesError, Sandbox, find_binaries
from nmo_sandbox.certmanager import COMPONENTS, PROBE_NAME, find_cert_manager
from nmo_sandbox.process import ProcessRef, run_command

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "node-maintenance-operator"
RELEASE = "nmo"
NS = c.OPERATOR_NAMESPACE
VWC = "node-maintenance-operator-validating-webhook-configuration"
VWC_PATH = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{VWC}"
CERTS = f"/apis/cert-manager.io/v1/namespaces/{NS}/certificates"
SECRETS = f"/api/v1/namespaces/{NS}/secrets"


@dataclass
class Installed:
    sandbox: Sandbox
    kube: httpx.AsyncClient
    certificate: str  # the serving Certificate the webhook configuration injects from


async def test_cli_up_records_cert_manager_and_down_stops_it(tmp_path: Path) -> None:
    """``nmo-sandbox up --cert-manager`` returns (its Python process is gone) with
    cert-manager running and recorded; ``down`` from another process stops it.

    First in the module, so it never runs beside the module's sandbox.
    """
    directory = tmp_path / "sbx"
    cli = [sys.executable, "-m", "nmo_sandbox.cli"]
    up = await run_command(
        [*cli, "up", "--dir", str(directory), "--nodes", "1", "--cert-manager"], timeout=300
    )
    try:
        assert up.returncode == 0, up.stderr
        state = json.loads((directory / "state.json").read_text())
        refs = {name: ProcessRef.from_json(state["components"][name]) for name in COMPONENTS}
        assert all(ref.alive() for ref in refs.values()), refs
        assert set(state["cert_manager"]["ports"]) == {
            "controller_metrics", "controller_healthz", "cainjector_metrics",
        }  # fmt: skip
        for name in COMPONENTS:
            assert (directory / "logs" / f"{name}.log").read_text().strip()
        probe = await run_command(
            [str(find_binaries().path("kubectl")), f"--kubeconfig={directory / 'kubeconfig'}",
             "get", "validatingwebhookconfigurations,certificates.cert-manager.io",
             "-A", "-o", "name"],
            timeout=30,
        )  # fmt: skip
        assert probe.returncode == 0, probe.stderr
        assert PROBE_NAME not in probe.stdout, "the readiness probe's objects were left behind"
    finally:
        down = await run_command([*cli, "down", "--dir", str(directory)], timeout=60)
    assert down.returncode == 0, down.stderr
    assert not any(ref.alive() for ref in refs.values())
    assert not directory.exists()


@pytest.fixture(scope="module")
async def cm_sandbox(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Sandbox]:
    try:
        binaries = find_binaries()
        find_cert_manager()
    except MissingBinariesError as exc:
        pytest.fail(str(exc), pytrace=False)
    async with Sandbox(
        tmp_path_factory.mktemp("cm-sandbox"), nodes=1, binaries=binaries, cert_manager=True
    ) as sb:
        yield sb


@pytest.fixture(scope="module")
async def installed(
    cm_sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Installed]:
    """The chart installed with its defaults (TLS mode cert-manager)."""
    home = tmp_path_factory.mktemp("cm-helm")
    result = await cm_sandbox.helm(
        "install", RELEASE, str(CHART), "-n", NS, "--create-namespace", home=home, timeout=120
    )
    assert result.returncode == 0, result.stderr
    async with cm_sandbox.client(user_agent="nmo-cert-manager-test") as kube:
        vwc = (await kube.get(VWC_PATH)).json()
        inject_from = vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        namespace, certificate = inject_from.split("/")
        assert namespace == NS
        yield Installed(cm_sandbox, kube, certificate)


async def ready_certificate(kube: httpx.AsyncClient, name: str, revision: int) -> dict[str, Any]:
    """The Certificate once Ready at ``revision`` or later (cert-manager counts issuances)."""

    async def ready() -> dict[str, Any] | None:
        cert: dict[str, Any] = (await kube.get(f"{CERTS}/{name}")).json()
        status = cert.get("status") or {}
        conditions = {cond["type"]: cond["status"] for cond in status.get("conditions") or []}
        if conditions.get("Ready") == "True" and status.get("revision", 0) >= revision:
            return cert
        return None

    return await wait_for(ready, timeout=60, what=f"Certificate {name} Ready at rev {revision}")


async def secret_files(kube: httpx.AsyncClient, name: str) -> dict[str, bytes]:
    resp = await kube.get(f"{SECRETS}/{name}")
    assert resp.status_code == 200, resp.text
    return {k: base64.b64decode(v) for k, v in (resp.json().get("data") or {}).items()}


async def injected_bundles(kube: httpx.AsyncClient) -> list[bytes]:
    vwc = (await kube.get(VWC_PATH)).json()
    return [base64.b64decode(w["clientConfig"].get("caBundle") or "") for w in vwc["webhooks"]]


def check_issued(files: dict[str, bytes], ca_bundle: bytes) -> x509.Certificate:
    """tls.crt is for the webhook Service, matches tls.key, and the bundle's CA signed it."""
    assert {"tls.crt", "tls.key", "ca.crt"} <= files.keys(), sorted(files)
    cert = x509.load_pem_x509_certificate(files["tls.crt"])
    key = serialization.load_pem_private_key(files["tls.key"], password=None)
    assert cert.public_key() == key.public_key()
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    service = "node-maintenance-operator-webhook-service"
    assert f"{service}.{NS}.svc" in sans.get_values_for_type(x509.DNSName)
    (ca,) = x509.load_pem_x509_certificates(ca_bundle)
    cert.verify_directly_issued_by(ca)  # raises unless the injected CA signed it
    now = dt.datetime.now(dt.UTC)
    assert cert.not_valid_before_utc <= now < cert.not_valid_after_utc
    return cert


async def test_default_install_is_issued_and_injected(installed: Installed) -> None:
    kube = installed.kube
    t0 = time.monotonic()
    cert = await ready_certificate(kube, installed.certificate, 1)
    issued_in = time.monotonic() - t0
    files = await secret_files(kube, cert["spec"]["secretName"])

    async def bundles() -> list[bytes] | None:
        found = await injected_bundles(kube)
        return found if all(found) else None

    injected = await wait_for(bundles, timeout=60, what="cainjector to fill every caBundle")
    assert injected == [files["ca.crt"]] * len(injected), "caBundle is not the Secret's ca.crt"
    served = check_issued(files, files["ca.crt"])
    # The chart's own CA (isCA Certificate from the self-signed Issuer) signed it.
    (ca,) = x509.load_pem_x509_certificates(files["ca.crt"])
    assert ca.subject != served.subject
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    print(f"Certificate Ready {issued_in:.1f}s after helm install returned")


async def test_renewal_lands_a_new_serial_the_injected_ca_still_verifies(
    installed: Installed,
) -> None:
    kube = installed.kube
    before = await ready_certificate(kube, installed.certificate, 1)
    secret = before["spec"]["secretName"]
    old = await secret_files(kube, secret)
    old_cert = x509.load_pem_x509_certificate(old["tls.crt"])
    bundle_before = await injected_bundles(kube)

    # What `cmctl renew` does: an Issuing condition on the Certificate's status.
    conditions = [cond for cond in before["status"]["conditions"] if cond["type"] != "Issuing"] + [
        {
            "type": "Issuing",
            "status": "True",
            "reason": "ManuallyTriggered",
            "message": "Certificate re-issuance manually triggered",
            "lastTransitionTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "observedGeneration": before["metadata"]["generation"],
        }
    ]
    body = {**before, "status": {**before["status"], "conditions": conditions}}
    resp = await kube.put(f"{CERTS}/{installed.certificate}/status", json=body)
    assert resp.status_code == 200, resp.text

    t0 = time.monotonic()
    revision = before["status"]["revision"] + 1
    await ready_certificate(kube, installed.certificate, revision)
    renewed_in = time.monotonic() - t0
    new = await secret_files(kube, secret)
    new_cert = x509.load_pem_x509_certificate(new["tls.crt"])
    assert new_cert.serial_number != old_cert.serial_number
    assert new["tls.key"] != old["tls.key"], "rotationPolicy Always: a new private key"
    bundle_after = await injected_bundles(kube)
    assert bundle_after == bundle_before, "a serving-certificate renewal keeps the chart's CA"
    check_issued(new, bundle_after[0])
    print(f"renewed (revision {revision}) {renewed_in:.1f}s after the trigger")


async def test_troubleshooting_3a_commands_hold(installed: Installed) -> None:
    """docs/troubleshooting.md section 3a, verbatim, against the real cert-manager."""
    cert = await ready_certificate(installed.kube, installed.certificate, 1)
    sb = installed.sandbox
    listed = await sb.kubectl("get", "certificate", "-n", NS)
    assert listed.returncode == 0, listed.stderr
    row = next(line.split() for line in listed.stdout.splitlines() if installed.certificate in line)
    assert row[1] == "True", listed.stdout  # READY
    described = await sb.kubectl("describe", "certificate", installed.certificate, "-n", NS)
    assert "The certificate has been successfully issued" in described.stdout, described.stdout
    secret = await sb.kubectl("get", "secret", cert["spec"]["secretName"], "-n", NS)
    assert secret.returncode == 0 and "kubernetes.io/tls" in secret.stdout, secret.stdout
    kubectl = f"{sb.bin_dir / 'kubectl'} --kubeconfig={sb.kubeconfig}"
    pipeline = (
        f"{kubectl} get validatingwebhookconfiguration {VWC}"
        " -o jsonpath='{.webhooks[0].clientConfig.caBundle}'"
        " | base64 -d | openssl x509 -noout -subject -enddate"
    )
    shown = await run_command(["bash", "-o", "pipefail", "-c", pipeline], timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("subject=") and "CN" in shown.stdout, shown.stdout
    assert "node-maintenance-operator-ca" in shown.stdout, shown.stdout
    assert "notAfter=" in shown.stdout


async def test_renewal_on_schedule_from_the_charts_duration_values(
    installed: Installed, tmp_path: Path
) -> None:
    """webhook.certManager.duration/renewBefore reach the Certificate and cert-manager
    renews on its own schedule: 1h with renewBefore 59m57s (the smallest values its
    webhook admits) renews 3 s after each issuance, no trigger needed."""
    kube = installed.kube
    before = await ready_certificate(kube, installed.certificate, 1)
    bundle = await injected_bundles(kube)
    short = [
        "--set", "webhook.certManager.duration=1h",
        "--set", "webhook.certManager.renewBefore=59m57s",
    ]  # fmt: skip
    home = tmp_path / "helm"
    upgraded = await installed.sandbox.helm(
        "upgrade", RELEASE, str(CHART), "-n", NS, *short, home=home, timeout=120
    )
    assert upgraded.returncode == 0, upgraded.stderr
    try:
        seen = await ready_certificate(kube, installed.certificate, before["status"]["revision"])
        assert seen["spec"]["renewBefore"] == "59m57s"
        # Two more issuances after the one the new duration causes: on schedule.
        revision = before["status"]["revision"] + 3
        renewed = await ready_certificate(kube, installed.certificate, revision)
        files = await secret_files(kube, renewed["spec"]["secretName"])
        cert = check_issued(files, bundle[0])
        lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
        assert lifetime == dt.timedelta(hours=1), lifetime
        assert await injected_bundles(kube) == bundle
    finally:
        restored = await installed.sandbox.helm(
            "upgrade", RELEASE, str(CHART), "-n", NS, home=home, timeout=120
        )
        assert restored.returncode == 0, restored.stderr
