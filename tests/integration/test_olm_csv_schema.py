"""The generated OLM bundle against a real API server holding OLM's own ClusterServiceVersion CRD.

The offline validator (tests/unit/test_olm_bundle.py) reads the CSV with
OLM's Go types, which accept any string where OLM's CRD has an enum and
never check required fields of list items. Here the API server checks the
CSV against the CRD OLM installs (copied by ``hack/bundle-validate.sh`` from
the same operator-framework/api module), and every other manifest of the
bundle against the real Kubernetes schemas, with a server-side dry run in a
fresh namespace, as OLM would create them there. Last, the Deployment OLM
makes of the CSV, with the certificate volumes OLM adds, is accepted, and
would not be had the chart's own certificate volume been kept.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nmo_sandbox import Sandbox
from nmo_sandbox.binaries import find_binaries

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "hack" / "olm_bundle.py"
VALIDATOR_SCRIPT = ROOT / "hack" / "bundle-validate.sh"
CSV_CRD = "operators.coreos.com_clusterserviceversions.yaml"
CSV_FILE = "node-maintenance-operator.clusterserviceversion.yaml"
OLM_CERT_DIR = "/apiserver.local.config/certificates"  # OLM mounts apiserver.crt/.key here


def describe(result: subprocess.CompletedProcess[str]) -> str:
    return f"{' '.join(result.args)}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


@pytest.fixture(scope="module")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("olm")
    helm = find_binaries().path("helm")
    res = subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(out), "--helm", str(helm)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return {p.name: yaml.safe_load(p.read_text()) for p in (out / "bundle" / "manifests").iterdir()}


@pytest.fixture(scope="module")
def csv_crd() -> Path:
    res = subprocess.run(
        ["bash", str(VALIDATOR_SCRIPT), "--check"], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, "run `make bundle-validator` (it also caches OLM's CSV CRD)"
    return Path(res.stdout.strip().splitlines()[-1]).parent / CSV_CRD


@pytest.fixture(scope="module")
async def olm_csv_crd(sandbox: Sandbox, csv_crd: Path) -> AsyncIterator[None]:
    crd = csv_crd
    applied = await sandbox.kubectl("apply", "--server-side", "-f", str(crd))
    assert applied.returncode == 0, describe(applied)
    # `kubectl wait` fails outright while a new CRD has no conditions yet: poll.
    jsonpath = '{.status.conditions[?(@.type=="Established")].status}'
    deadline = time.monotonic() + 60
    while True:
        got = await sandbox.kubectl("get", "-f", str(crd), "-o", f"jsonpath={jsonpath}")
        if got.stdout.strip() == "True":
            break
        assert time.monotonic() < deadline, f"CSV CRD never Established: {describe(got)}"
        await asyncio.sleep(0.2)
    yield
    await sandbox.kubectl("delete", "-f", str(crd), "--wait=false")


async def dry_run(
    sandbox: Sandbox, namespace: str, docs: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    text = yaml.safe_dump_all(docs)
    return await sandbox.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=text
    )


def _in(namespace: str, csv: dict[str, Any]) -> dict[str, Any]:
    placed = yaml.safe_load(yaml.safe_dump(csv))
    placed["metadata"]["namespace"] = namespace  # OLM's "placeholder" becomes the install namespace
    return placed


async def test_bundle_accepted_by_the_apiserver(
    sandbox: Sandbox, olm_csv_crd: None, namespace: str, manifests: dict[str, dict[str, Any]]
) -> None:
    docs = [_in(namespace, m) if name == CSV_FILE else m for name, m in manifests.items()]
    kinds = {d["kind"] for d in docs}
    assert {"ClusterServiceVersion", "CustomResourceDefinition", "ClusterRole", "Service"} <= kinds
    result = await dry_run(sandbox, namespace, docs)
    assert result.returncode == 0, describe(result)
    assert result.stdout.count("(server dry run)") == len(docs), result.stdout


@pytest.mark.parametrize(
    ("field", "value", "complaint"),
    [
        ("type", "Bogus", 'Unsupported value: "Bogus"'),
        ("sideEffects", None, "sideEffects: Required value"),
    ],
)
async def test_apiserver_rejects_a_broken_webhook_definition(
    sandbox: Sandbox,
    olm_csv_crd: None,
    namespace: str,
    manifests: dict[str, dict[str, Any]],
    field: str,
    value: Any,
    complaint: str,
) -> None:
    csv = _in(namespace, manifests[CSV_FILE])
    hook = csv["spec"]["webhookdefinitions"][0]
    if value is None:
        del hook[field]
    else:
        hook[field] = value
    result = await dry_run(sandbox, namespace, [csv])
    assert result.returncode != 0, describe(result)
    assert complaint in result.stderr, describe(result)


def _as_olm_installs(name: str, spec: dict[str, Any], *, keep_chart_cert: bool) -> dict[str, Any]:
    """The Deployment OLM creates from the CSV: its certificate volumes added to the pod."""
    spec = yaml.safe_load(yaml.safe_dump(spec))
    pod = spec["template"]["spec"]
    secret = f"{name}-service-cert"
    pod.setdefault("volumes", []).extend(
        [
            {
                "name": "apiservice-cert",
                "secret": {
                    "secretName": secret,
                    "items": [
                        {"key": "tls.crt", "path": "apiserver.crt"},
                        {"key": "tls.key", "path": "apiserver.key"},
                    ],
                },
            },
            {
                "name": "webhook-cert",
                "secret": {
                    "secretName": secret,
                    "items": [
                        {"key": "tls.crt", "path": "tls.crt"},
                        {"key": "tls.key", "path": "tls.key"},
                    ],
                },
            },
        ]
    )
    container = pod["containers"][0]
    mounts = container.setdefault("volumeMounts", [])
    if keep_chart_cert:
        pod["volumes"].append({"name": "cert", "secret": {"secretName": "chart-cert"}})
        mounts.append({"name": "cert", "mountPath": OLM_CERT_DIR, "readOnly": True})
    mounts.extend(
        [
            {"name": "apiservice-cert", "mountPath": OLM_CERT_DIR},
            {"name": "webhook-cert", "mountPath": "/tmp/k8s-webhook-server/serving-certs"},
        ]
    )
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}, "spec": spec}


@pytest.mark.parametrize("keep_chart_cert", [False, True])
async def test_deployment_takes_olm_certificate_mounts(
    sandbox: Sandbox, namespace: str, manifests: dict[str, dict[str, Any]], keep_chart_cert: bool
) -> None:
    """Why the generator drops the chart's cert volume: OLM mounts its own at the same path."""
    [deployment] = manifests[CSV_FILE]["spec"]["install"]["spec"]["deployments"]
    installed = _as_olm_installs(
        deployment["name"], deployment["spec"], keep_chart_cert=keep_chart_cert
    )
    result = await dry_run(sandbox, namespace, [installed])
    if keep_chart_cert:
        assert result.returncode != 0, describe(result)
        assert "must be unique" in result.stderr, describe(result)
    else:
        assert result.returncode == 0, describe(result)
        assert "(server dry run)" in result.stdout
