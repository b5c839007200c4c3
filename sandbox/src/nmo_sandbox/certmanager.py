"""cert-manager in the sandbox: its controller and cainjector as processes.

``Sandbox(dir, cert_manager=True)`` (``nmo-sandbox up --cert-manager``) applies
cert-manager's CRDs server-side and runs the two binaries
``hack/cert-manager-bin.sh`` built from cert-manager's Go module, the way
kube-controller-manager runs: the admin kubeconfig, no leader election, every
listener on a free loopback port. cert-manager's own webhook is not run: its
CRDs have one version each (no conversion webhook), and the webhook only
validates and defaults cert-manager's resources, which the chart writes
correctly; the controller and cainjector are what issue and inject.

The sandbox is ready when cert-manager has done real work end to end: a
self-signed probe Certificate is Ready and cainjector has put its CA into a
probe ValidatingWebhookConfiguration (one that matches no request). The probe
objects are deleted again.

This module holds the pure parts (where the binaries are, the command lines,
the probe objects); :mod:`nmo_sandbox.cluster` starts the processes.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from nmo_sandbox.binaries import cache_root, script_bin_dir
from nmo_sandbox.errors import MissingBinariesError

__all__ = [
    "CAINJECTOR",
    "COMPONENTS",
    "CONTROLLER",
    "NAMESPACE",
    "PROBE_NAME",
    "VERSION",
    "CertManagerBinaries",
    "CertManagerPorts",
    "commands",
    "crds",
    "environment",
    "find_cert_manager",
    "probe_objects",
]

VERSION = "v1.21.1"
CONTROLLER = "cert-manager-controller"
CAINJECTOR = "cert-manager-cainjector"
COMPONENTS = (CONTROLLER, CAINJECTOR)
# --cluster-resource-namespace (ClusterIssuer secrets) and the probe's home,
# where cert-manager's Helm chart installs it.
NAMESPACE = "cert-manager"
PROBE_NAME = "nmo-sandbox-cert-manager-probe"
_SCRIPT = Path("hack") / "cert-manager-bin.sh"


@dataclass(frozen=True)
class CertManagerBinaries:
    """The cache directory of one cert-manager version: ``bin/`` and ``crds/``."""

    bin_dir: Path

    def path(self, name: str) -> Path:
        return self.bin_dir / name

    @property
    def crds_dir(self) -> Path:
        return self.bin_dir.parent / "crds"

    def missing(self) -> list[str]:
        out = [c for c in COMPONENTS if not os.access(self.path(c), os.X_OK)]
        if not any(self.crds_dir.glob("*.yaml")):
            out.append("../crds/*.yaml")
        return out

    def check(self) -> CertManagerBinaries:
        """Return self, or raise :class:`MissingBinariesError` naming what is missing."""
        missing = self.missing()
        if missing:
            raise MissingBinariesError(
                f"cert-manager {VERSION} missing in {self.bin_dir}: {', '.join(missing)}. "
                "Build it with `make cert-manager-bin` (or `hack/cert-manager-bin.sh`); "
                "the first build takes a few minutes and is cached per version."
            )
        return self


@dataclass(frozen=True)
class CertManagerPorts:
    """cert-manager's loopback listeners (plain HTTP, like its defaults)."""

    controller_metrics: int
    controller_healthz: int
    cainjector_metrics: int

    def to_json(self) -> dict[str, int]:
        return asdict(self)


def crds(bins: CertManagerBinaries) -> list[tuple[str, str]]:
    """(name, YAML text) of every CRD in ``crds/``, for a server-side apply."""
    out = []
    for path in sorted(bins.crds_dir.glob("*.yaml")):
        text = path.read_text()
        out.append((str(yaml.safe_load(text)["metadata"]["name"]), text))
    return out


def find_cert_manager(*, check: bool = True) -> CertManagerBinaries:
    """Locate cert-manager's binaries; with ``check`` raise if any is missing.

    ``$NMO_CERT_MANAGER_BIN``; else ``hack/cert-manager-bin.sh --print-dir``
    from a checkout; else the script's formula under the nmo cache.
    """
    override = os.environ.get("NMO_CERT_MANAGER_BIN")
    if override:
        found = CertManagerBinaries(Path(override).expanduser().resolve())
    else:
        found = CertManagerBinaries(script_bin_dir(_SCRIPT) or _default_bin_dir())
    return found.check() if check else found


def commands(
    bins: CertManagerBinaries, *, kubeconfig: Path, ports: CertManagerPorts
) -> dict[str, list[str]]:
    """The command lines of the controller and the cainjector, by component name."""
    return {
        CONTROLLER: [
            str(bins.path(CONTROLLER)),
            f"--kubeconfig={kubeconfig}",
            "--leader-elect=false",
            f"--cluster-resource-namespace={NAMESPACE}",
            f"--metrics-listen-address=127.0.0.1:{ports.controller_metrics}",
            f"--internal-healthz-listen-address=127.0.0.1:{ports.controller_healthz}",
            "--enable-profiling=false",
        ],
        CAINJECTOR: [
            str(bins.path(CAINJECTOR)),
            f"--kubeconfig={kubeconfig}",
            "--leader-elect=false",
            f"--metrics-listen-address=127.0.0.1:{ports.cainjector_metrics}",
            "--enable-profiling=false",
        ],
    }


def environment(kubeconfig: Path) -> dict[str, str]:
    """Extra environment of both processes.

    cainjector takes its client config from controller-runtime, whose
    ``--kubeconfig`` flag its own flag of that name shadows (cert-manager
    v1.21.1 then fails with "unable to get kubeconfig"); ``$KUBECONFIG`` is
    what controller-runtime reads next.
    """
    return {"KUBECONFIG": str(kubeconfig)}


def probe_objects() -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object) to create, in order, for the readiness probe.

    The webhook configuration matches an API group that does not exist, so
    the apiserver never calls it; cainjector still injects its caBundle.
    """
    ns = NAMESPACE
    cm = f"/apis/cert-manager.io/v1/namespaces/{ns}"
    meta = {"name": PROBE_NAME, "namespace": ns}
    return [
        (
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        ),
        (
            f"{cm}/issuers",
            {
                "apiVersion": "cert-manager.io/v1",
                "kind": "Issuer",
                "metadata": meta,
                "spec": {"selfSigned": {}},
            },
        ),
        (
            f"{cm}/certificates",
            {
                "apiVersion": "cert-manager.io/v1",
                "kind": "Certificate",
                "metadata": meta,
                "spec": {
                    "isCA": True,
                    "commonName": PROBE_NAME,
                    "secretName": PROBE_NAME,
                    "privateKey": {"algorithm": "ECDSA", "size": 256},
                    "issuerRef": {"kind": "Issuer", "name": PROBE_NAME},
                },
            },
        ),
        (
            "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {
                    "name": PROBE_NAME,
                    "annotations": {"cert-manager.io/inject-ca-from": f"{ns}/{PROBE_NAME}"},
                },
                "webhooks": [
                    {
                        "name": "probe.nmo-sandbox.invalid",
                        "admissionReviewVersions": ["v1"],
                        "sideEffects": "None",
                        "failurePolicy": "Ignore",
                        "clientConfig": {"url": "https://127.0.0.1:1/probe"},
                        "rules": [
                            {
                                "apiGroups": ["probe.nmo-sandbox.invalid"],
                                "apiVersions": ["v1"],
                                "operations": ["CREATE"],
                                "resources": ["probes"],
                            }
                        ],
                    }
                ],
            },
        ),
    ]


def probe_paths() -> dict[str, str]:
    """Where the probe's objects live (to read their status and delete them)."""
    ns = NAMESPACE
    return {
        "certificate": f"/apis/cert-manager.io/v1/namespaces/{ns}/certificates/{PROBE_NAME}",
        "issuer": f"/apis/cert-manager.io/v1/namespaces/{ns}/issuers/{PROBE_NAME}",
        "secret": f"/api/v1/namespaces/{ns}/secrets/{PROBE_NAME}",
        "webhook": "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/"
        + PROBE_NAME,
    }


def certificate_ready(cert: dict[str, Any]) -> bool:
    """True when a Certificate's Ready condition is True for its current generation."""
    conditions = (cert.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") == "Ready"
        and c.get("status") == "True"
        and c.get("observedGeneration", 0) >= cert["metadata"].get("generation", 0)
        for c in conditions
    )


def injected(webhook_configuration: dict[str, Any]) -> bool:
    """True when every webhook of the configuration carries a caBundle."""
    hooks = webhook_configuration.get("webhooks") or []
    return bool(hooks) and all((h.get("clientConfig") or {}).get("caBundle") for h in hooks)


def _default_bin_dir() -> Path:
    return cache_root() / "cert-manager" / VERSION / "bin"
