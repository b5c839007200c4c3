"""The chart's cert-manager certificates and the ServiceMonitor's TLS, rendered offline.

Without an issuerRef the chart runs its own CA (self-signed Issuer -> CA
Certificate -> CA Issuer -> serving certificates), so renewing a serving
certificate keeps the CA the apiserver and Prometheus trust. The
ServiceMonitor verifies the metrics certificate unless verification is
switched off on purpose.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_chart_alerts import helm_env, manager_args, of_kind, render, template

from nmo.cli import build_parser, settings_from

__all__ = ["helm_env"]  # the fixture, shared

Docs = list[dict[str, Any]]
MONITOR = ("--set", "metrics.serviceMonitor.enabled=true")


def by_name(docs: Docs, kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in of_kind(docs, kind)}


def test_serving_certificates_come_from_the_charts_ca(helm_env: dict[str, str]) -> None:
    docs = render(helm_env, *MONITOR)
    issuers = by_name(docs, "Issuer")
    certs = by_name(docs, "Certificate")
    assert issuers["node-maintenance-operator-selfsigned-issuer"]["spec"] == {"selfSigned": {}}
    ca = certs["node-maintenance-operator-ca"]["spec"]
    assert ca["isCA"] is True and ca["duration"] == "87600h"
    assert ca["issuerRef"] == {
        "kind": "Issuer",
        "name": "node-maintenance-operator-selfsigned-issuer",
    }
    assert issuers["node-maintenance-operator-ca-issuer"]["spec"] == {
        "ca": {"secretName": ca["secretName"]}
    }
    serving = [c for name, c in certs.items() if name != "node-maintenance-operator-ca"]
    assert {c["metadata"]["name"] for c in serving} == {
        "node-maintenance-operator-serving-cert",
        "node-maintenance-operator-metrics-cert",
    }
    for cert in serving:
        # signed by the CA, never by the self-signed Issuer: a renewal keeps the CA
        assert cert["spec"]["issuerRef"] == {
            "kind": "Issuer",
            "name": "node-maintenance-operator-ca-issuer",
        }
        assert not cert["spec"].get("isCA")
    (webhook,) = of_kind(docs, "ValidatingWebhookConfiguration")
    injected = webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert injected.endswith("/node-maintenance-operator-serving-cert")


def test_an_issuer_ref_replaces_the_charts_ca(helm_env: dict[str, str]) -> None:
    ref = ("--set", "webhook.certManager.issuerRef.kind=ClusterIssuer")
    docs = render(helm_env, *MONITOR, *ref, "--set", "webhook.certManager.issuerRef.name=corp")
    assert of_kind(docs, "Issuer") == []
    certs = by_name(docs, "Certificate")
    assert set(certs) == {
        "node-maintenance-operator-serving-cert",
        "node-maintenance-operator-metrics-cert",
    }
    for cert in certs.values():
        assert cert["spec"]["issuerRef"] == {"kind": "ClusterIssuer", "name": "corp"}


def test_the_service_monitor_verifies_the_metrics_certificate(helm_env: dict[str, str]) -> None:
    docs = render(helm_env, *MONITOR)
    (monitor,) = of_kind(docs, "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    tls = endpoint["tlsConfig"]
    assert "insecureSkipVerify" not in tls
    metrics_cert = by_name(docs, "Certificate")["node-maintenance-operator-metrics-cert"]["spec"]
    assert tls["ca"] == {"secret": {"name": metrics_cert["secretName"], "key": "ca.crt"}}
    service = by_name(docs, "Service")[
        "node-maintenance-operator-controller-manager-metrics-service"
    ]
    ns = service["metadata"]["namespace"]
    assert tls["serverName"] == f"{service['metadata']['name']}.{ns}.svc"
    assert tls["serverName"] in metrics_cert["dnsNames"]
    # nmo serves that certificate: the flag, the mount and the Secret line up
    args = manager_args(docs)
    assert "--metrics-cert-dir=/etc/nmo/metrics-cert" in args
    (deployment,) = of_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (manager,) = [c for c in pod["containers"] if c["name"] == "manager"]
    mount = next(m for m in manager["volumeMounts"] if m["mountPath"] == "/etc/nmo/metrics-cert")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == metrics_cert["secretName"]
    assert not volume["secret"].get("optional")
    run = build_parser().parse_args(args)
    assert str(settings_from(run).servers.metrics_cert_dir) == "/etc/nmo/metrics-cert"


def test_skipping_verification_is_an_explicit_opt_in(helm_env: dict[str, str]) -> None:
    skip = ("--set", "metrics.serviceMonitor.tls.insecureSkipVerify=true")
    docs = render(helm_env, *MONITOR, *skip)
    (monitor,) = of_kind(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["tlsConfig"] == {"insecureSkipVerify": True}
    assert "node-maintenance-operator-metrics-cert" not in by_name(docs, "Certificate")
    assert not [a for a in manager_args(docs) if a.startswith("--metrics-cert-dir")]
    # without cert-manager there is nothing to verify against: say so, unless opted out
    off = ("--set", "webhook.certManager.enabled=false")
    failed = template(helm_env, *MONITOR, *off)
    assert failed.returncode != 0
    assert "metrics.serviceMonitor.tls.insecureSkipVerify=true" in failed.stderr
    assert of_kind(render(helm_env, *MONITOR, *off, *skip), "ServiceMonitor")


@pytest.mark.parametrize("monitor", [False, True])
def test_no_metrics_certificate_without_a_service_monitor_using_it(
    helm_env: dict[str, str], monitor: bool
) -> None:
    docs = render(helm_env, *(MONITOR if monitor else ()))
    assert ("node-maintenance-operator-metrics-cert" in by_name(docs, "Certificate")) is monitor


def test_a_custom_ca_for_the_service_monitor(helm_env: dict[str, str]) -> None:
    ca = ("--set", "metrics.serviceMonitor.tls.ca.configMap.name=corp-ca")
    docs = render(
        helm_env, *MONITOR, *ca, "--set", "metrics.serviceMonitor.tls.ca.configMap.key=ca.pem"
    )
    (monitor,) = of_kind(docs, "ServiceMonitor")
    tls = monitor["spec"]["endpoints"][0]["tlsConfig"]
    assert tls["ca"] == {"configMap": {"name": "corp-ca", "key": "ca.pem"}}
