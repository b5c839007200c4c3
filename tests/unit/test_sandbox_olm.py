"""The sandbox's stand-in for OLM and OpenShift's SCC (nmo_sandbox.olm), on the Go NMO's CSV.

tests/e2e/test_olm_csv.py installs CSVs with it, so what it creates must be
what OLM creates (operator-lifecycle-manager, pkg/controller/install and
operatorgroup.go): the certificate Secret and its two mounts, the Service
to the webhook's target port, the webhook configuration, the namespaced
rules lifted cluster-wide for a global OperatorGroup. And the SCC must
refuse what restricted-v2 refuses.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest

from nmo_sandbox.gonmo import GoBundle, go_nmo_bundle
from nmo_sandbox.olm import (
    OlmCertificate,
    SCCError,
    bundle_objects,
    csv_install_objects,
    restricted_v2,
)

NS = "openshift-workload-availability"
CERT = OlmCertificate(b"CERT", b"KEY", b"CA")
SVC = "node-maintenance-operator-controller-manager-service"


@pytest.fixture(scope="module")
def go() -> GoBundle:
    return go_nmo_bundle()


@pytest.fixture(scope="module")
def installed(go: GoBundle) -> dict[tuple[str, str], dict[str, Any]]:
    objects = csv_install_objects(go.csv, NS, CERT, node_selector={"type": "real"})
    keyed = {
        (o["kind"], o["metadata"].get("name", o["metadata"].get("generateName"))): o
        for o in objects
    }
    assert len(keyed) == len(objects), "two objects of one kind and name"
    return keyed


def test_the_deployment_mounts_olms_certificate_twice(
    go: GoBundle, installed: dict[tuple[str, str], dict[str, Any]]
) -> None:
    dep = installed["Deployment", "node-maintenance-operator-controller-manager"]
    pod = dep["spec"]["template"]["spec"]
    volumes = {v["name"]: v["secret"] for v in pod["volumes"]}
    assert volumes == {
        "apiservice-cert": {
            "secretName": f"{SVC}-cert",
            "items": [
                {"key": "tls.crt", "path": "apiserver.crt"},
                {"key": "tls.key", "path": "apiserver.key"},
            ],
        },
        "webhook-cert": {
            "secretName": f"{SVC}-cert",
            "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}],
        },
    }
    [manager] = pod["containers"]
    assert manager["volumeMounts"] == [
        {"name": "apiservice-cert", "mountPath": "/apiserver.local.config/certificates"},
        {"name": "webhook-cert", "mountPath": "/tmp/k8s-webhook-server/serving-certs"},
    ]
    assert manager["env"][-1] == {
        "name": "OPERATOR_CONDITION_NAME",
        "value": go.csv["metadata"]["name"],
    }
    assert pod["nodeSelector"] == {"type": "real"}
    assert dep["spec"]["revisionHistoryLimit"] == 1
    # Everything else is the CSV's.
    want = copy.deepcopy(go.deployment["spec"]["template"]["spec"])
    want.update(volumes=pod["volumes"], nodeSelector={"type": "real"})
    want["containers"][0].update(volumeMounts=manager["volumeMounts"], env=manager["env"])
    assert pod == want


def test_the_service_secret_and_webhook(installed: dict[tuple[str, str], dict[str, Any]]) -> None:
    svc = installed["Service", SVC]
    assert svc["spec"]["ports"] == [{"name": "443", "port": 443, "targetPort": 9443}]
    assert svc["spec"]["selector"] == {
        "control-plane": "controller-manager",
        "node-maintenance-operator": "",
    }
    secret = installed["Secret", f"{SVC}-cert"]
    assert secret["type"] == "kubernetes.io/tls"
    assert {k: base64.b64decode(v) for k, v in secret["data"].items()} == {
        "tls.crt": b"CERT", "tls.key": b"KEY", "olmCAKey": b"CA",
    }  # fmt: skip
    vwc = installed["ValidatingWebhookConfiguration", "vnodemaintenance.kb.io-"]
    [hook] = vwc["webhooks"]
    assert hook["name"] == "vnodemaintenance.kb.io"
    assert hook["clientConfig"] == {
        "service": {
            "name": SVC,
            "namespace": NS,
            "path": "/validate-nodemaintenance-medik8s-io-v1beta1-nodemaintenance",
            "port": 443,
        },
        "caBundle": base64.b64encode(b"CA").decode(),
    }
    assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Fail", 15)


def test_a_global_operator_group_lifts_the_namespaced_rules(
    go: GoBundle, installed: dict[tuple[str, str], dict[str, Any]]
) -> None:
    """The Go CSV deletes leases (medik8s-leases) and writes events (default)
    by its namespaced permissions: OLM grants them cluster-wide."""
    name = go.csv["metadata"]["name"]
    role = installed["Role", f"{name}-p0"]
    lifted = installed["ClusterRole", f"{name}-p0"]
    assert lifted["rules"][:-1] == role["rules"]
    assert lifted["rules"][-1]["resources"] == ["namespaces"]
    binding = installed["ClusterRoleBinding", f"{name}-p0"]
    account = go.deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "namespace": NS, "name": account}]
    assert ("ServiceAccount", "node-maintenance-operator-controller-manager") in installed


def test_bundle_objects_put_namespaced_manifests_in_the_namespace(go: GoBundle) -> None:
    objects = bundle_objects(go.manifests.values(), NS)
    assert objects[0]["kind"] == "CustomResourceDefinition"
    assert all(o["kind"] != "ClusterServiceVersion" for o in objects)
    for o in objects:
        namespaced = o["kind"] == "Service"
        assert (o["metadata"].get("namespace") == NS) is namespaced, o["metadata"]


def _template(pod: dict[str, Any], container: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "spec": {"securityContext": pod, "containers": [{"name": "manager", **(container or {})}]}
    }


@pytest.mark.parametrize(
    ("pod", "container", "refused"),
    [
        ({"fsGroup": 65532}, None, "65532 is not an allowed group"),
        ({"runAsUser": 65532}, None, "manager.runAsUser: Invalid value: 65532"),
        ({}, {"securityContext": {"runAsUser": 0}}, "manager.runAsUser: Invalid value: 0"),
    ],
)
def test_restricted_v2_refuses_a_user_outside_the_range(
    pod: dict[str, Any], container: dict[str, Any] | None, refused: str
) -> None:
    with pytest.raises(SCCError, match=refused):
        restricted_v2(_template(pod, container), (1000650000, 10000))


def test_restricted_v2_assigns_the_first_uid_and_the_fsgroup() -> None:
    template = _template({"runAsNonRoot": True})
    admitted = restricted_v2(template, (1000650000, 10000))
    assert admitted["spec"]["securityContext"] == {"runAsNonRoot": True, "fsGroup": 1000650000}
    assert admitted["spec"]["containers"][0]["securityContext"] == {"runAsUser": 1000650000}
    assert template == _template({"runAsNonRoot": True})  # a copy, the input unchanged
    inside = restricted_v2(_template({"runAsUser": 1000650005}), (1000650000, 10000))
    assert inside["spec"]["containers"][0]["securityContext"] == {"runAsUser": 1000650005}
