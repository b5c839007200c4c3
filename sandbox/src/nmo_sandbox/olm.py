"""What OLM creates for a ClusterServiceVersion, without OLM, and what OpenShift's SCC does.

The sandbox has no Operator Lifecycle Manager (its catalog, resolver and
controllers would cost more than the tests they serve). The tests that run a
CSV's operator on a real node create what OLM's install strategy creates
(operator-lifecycle-manager, ``pkg/controller/install``), from the CSV alone:

* a ServiceAccount per account the CSV names, a Role and RoleBinding per
  ``permissions`` entry (and, the OperatorGroup being global, the same rules
  as a ClusterRole and ClusterRoleBinding: OLM lifts them), a ClusterRole
  and ClusterRoleBinding per ``clusterPermissions`` entry;
* for a deployment that serves webhooks: the Service ``<deployment>-service``
  (one port per webhook ``containerPort``, to its ``targetPort``), the
  ``kubernetes.io/tls`` Secret ``<service>-cert`` (``tls.crt``, ``tls.key``,
  ``olmCAKey``) with a certificate for ``<service>.<namespace>.svc``, and two
  volumes of it in every container: ``apiservice-cert`` at
  ``/apiserver.local.config/certificates`` (``apiserver.crt``,
  ``apiserver.key``) and ``webhook-cert`` at
  ``/tmp/k8s-webhook-server/serving-certs`` (``tls.crt``, ``tls.key``);
* the Deployment: the CSV's spec with those volumes, the CSV's annotations on
  the pod template, ``OPERATOR_CONDITION_NAME`` in every container,
  ``revisionHistoryLimit: 1``; an admin's Subscription ``config`` (here a
  ``nodeSelector``) merged in;
* a ValidatingWebhookConfiguration per webhook definition, named
  ``<generateName>-<random>``, calling the Service with the CA as caBundle;
* before all that, the bundle's other manifests (:func:`bundle_objects`):
  its CRDs, and the rest with the namespaced ones in the install namespace.

:func:`restricted_v2` is OpenShift's ``restricted-v2`` SCC admitting a pod
template: it refuses a user or fsGroup outside the namespace's range, and
gives the containers the range's first UID (their group stays 0) and the pod
that fsGroup, as the SCC admission plugin does to each pod.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CERT_MOUNTS",
    "OlmCertificate",
    "SCCError",
    "bundle_objects",
    "csv_install_objects",
    "restricted_v2",
    "service_name",
]

Obj = dict[str, Any]

# (volume, mount path, {Secret key: file name}), as OLM mounts its certificate.
CERT_MOUNTS = (
    (
        "apiservice-cert",
        "/apiserver.local.config/certificates",
        {"tls.crt": "apiserver.crt", "tls.key": "apiserver.key"},
    ),
    (
        "webhook-cert",
        "/tmp/k8s-webhook-server/serving-certs",
        {"tls.crt": "tls.crt", "tls.key": "tls.key"},
    ),
)
_MANAGED = {"olm.managed": "true"}
_RBAC = "rbac.authorization.k8s.io"
_NAMESPACES_VIEW = {
    "apiGroups": [""],
    "resources": ["namespaces"],
    "verbs": ["get", "list", "watch"],
}


@dataclass(frozen=True)
class OlmCertificate:
    """The serving certificate OLM issues for ``<service>.<namespace>.svc`` (PEM)."""

    cert: bytes
    key: bytes
    ca: bytes


def service_name(deployment: str) -> str:
    return f"{deployment.replace('.', '-')}-service"


def _owner(csv: Obj, namespace: str) -> dict[str, str]:
    return {
        "olm.owner": csv["metadata"]["name"],
        "olm.owner.kind": "ClusterServiceVersion",
        "olm.owner.namespace": namespace,
    }


def _meta(name: str, namespace: str | None, labels: Obj) -> Obj:
    return {"name": name, "labels": labels} | ({"namespace": namespace} if namespace else {})


def _binding(
    kind: str, name: str, namespace: str | None, role: str, account: tuple[str, str], labels: Obj
) -> Obj:
    """A ``kind``Binding of the ``kind`` ``role`` to the ServiceAccount ``account`` (ns, name)."""
    return {
        "apiVersion": f"{_RBAC}/v1",
        "kind": f"{kind}Binding",
        "metadata": _meta(name, namespace, labels),
        "roleRef": {"apiGroup": _RBAC, "kind": kind, "name": role},
        "subjects": [{"kind": "ServiceAccount", "namespace": account[0], "name": account[1]}],
    }


def _grant(
    kind: str, name: str, namespace: str | None, rules: list[Obj], account: tuple[str, str],
    labels: Obj,
) -> list[Obj]:  # fmt: skip
    """A Role (``namespace``) or ClusterRole (None) with ``rules``, bound to ``account``."""
    role = {"apiVersion": f"{_RBAC}/v1", "kind": kind, "metadata": _meta(name, namespace, labels)}
    return [role | {"rules": rules}, _binding(kind, name, namespace, name, account, labels)]


def _rbac(csv: Obj, namespace: str) -> list[Obj]:
    spec = csv["spec"]["install"]["spec"]
    name = csv["metadata"]["name"]
    labels = {**_MANAGED, **_owner(csv, namespace)}
    accounts = {
        p["serviceAccountName"]
        for key in ("permissions", "clusterPermissions")
        for p in spec.get(key, [])
    }
    accounts |= {
        d["spec"]["template"]["spec"].get("serviceAccountName", "default")
        for d in spec["deployments"]
    }
    out: list[Obj] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": sa, "namespace": namespace, "labels": labels},
        }
        for sa in sorted(accounts - {"default"})
    ]
    for i, perm in enumerate(spec.get("permissions", [])):
        account = (namespace, perm["serviceAccountName"])
        out += _grant("Role", f"{name}-p{i}", namespace, perm["rules"], account, labels)
        # An AllNamespaces OperatorGroup lifts them cluster-wide, with read
        # access to namespaces (OLM's ensureSingletonRBAC).
        lifted = [*perm["rules"], _NAMESPACES_VIEW]
        out += _grant("ClusterRole", f"{name}-p{i}", None, lifted, account, labels)
    for i, perm in enumerate(spec.get("clusterPermissions", [])):
        account = (namespace, perm["serviceAccountName"])
        out += _grant("ClusterRole", f"{name}-c{i}", None, perm["rules"], account, labels)
    return out


def _with_cert_volumes(pod: Obj, secret: str) -> None:
    volumes = [v for v in pod.get("volumes", []) if v["name"] not in {m[0] for m in CERT_MOUNTS}]
    for name, path, items in CERT_MOUNTS:
        volumes.append(
            {
                "name": name,
                "secret": {
                    "secretName": secret,
                    "items": [{"key": k, "path": p} for k, p in items.items()],
                },
            }
        )
        for container in pod["containers"]:
            mounts = [
                m
                for m in container.get("volumeMounts", [])
                if m["name"] != name and m["mountPath"] != path
            ]
            container["volumeMounts"] = [*mounts, {"name": name, "mountPath": path}]
    pod["volumes"] = volumes


def _webhooks(csv: Obj, namespace: str, ca: bytes) -> list[Obj]:
    out = []
    for hook in csv["spec"].get("webhookdefinitions", []):
        if hook["type"] != "ValidatingAdmissionWebhook":
            raise ValueError(f"webhook {hook['generateName']}: only validating ones are emulated")
        webhook: Obj = {
            "name": hook["generateName"],
            "rules": hook["rules"],
            "failurePolicy": hook.get("failurePolicy", "Fail"),
            "sideEffects": hook["sideEffects"],
            "admissionReviewVersions": hook["admissionReviewVersions"],
            "clientConfig": {
                "service": {
                    "name": service_name(hook["deploymentName"]),
                    "namespace": namespace,
                    "path": hook["webhookPath"],
                    "port": hook.get("containerPort", 443),
                },
                "caBundle": base64.b64encode(ca).decode(),
            },
            # An AllNamespaces OperatorGroup selects every namespace.
            "namespaceSelector": {},
        }
        for key in ("timeoutSeconds", "matchPolicy", "objectSelector"):
            if key in hook:
                webhook[key] = hook[key]
        labels = {
            **_MANAGED,
            **_owner(csv, namespace),
            "olm.webhook-description-generate-name": hook["generateName"],
        }
        out.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"generateName": f"{hook['generateName']}-", "labels": labels},
                "webhooks": [webhook],
            }
        )
    return out


def _serving(
    dep: Obj, namespace: str, cert: OlmCertificate, hooks: list[Obj], labels: Obj
) -> list[Obj]:
    """The Service, certificate Secret and their RBAC OLM makes for a deployment's webhooks."""
    svc = service_name(dep["name"])
    secret = f"{svc}-cert"
    sa = dep["spec"]["template"]["spec"].get("serviceAccountName", "default")
    ports = {
        h.get("containerPort", 443): h.get("targetPort", h.get("containerPort", 443))
        for h in hooks
        if h["deploymentName"] == dep["name"]
    }
    pem = {"tls.crt": cert.cert, "tls.key": cert.key, "olmCAKey": cert.ca}
    account = (namespace, sa)
    mount = {
        "apiGroups": [""],
        "resources": ["secrets"],
        "resourceNames": [secret],
        "verbs": ["get"],
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": svc, "namespace": namespace, "labels": labels},
            "spec": {
                "selector": dep["spec"]["selector"]["matchLabels"],
                "ports": [
                    {"name": str(p), "port": p, "targetPort": t} for p, t in sorted(ports.items())
                ],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": secret, "namespace": namespace, "labels": labels},
            "data": {k: base64.b64encode(v).decode() for k, v in pem.items()},
        },
        *_grant("Role", secret, namespace, [mount], account, labels),
        _binding(
            "ClusterRole", f"{svc}-system:auth-delegator", None, "system:auth-delegator",
            account, labels,
        ),
        _binding(
            "Role", f"{svc}-auth-reader", "kube-system",
            "extension-apiserver-authentication-reader", account, labels,
        ),
    ]  # fmt: skip


def csv_install_objects(
    csv: Obj,
    namespace: str,
    certificate: OlmCertificate,
    *,
    node_selector: dict[str, str] | None = None,
) -> list[Obj]:
    """Every object OLM creates to install ``csv`` in ``namespace`` (an
    AllNamespaces OperatorGroup), RBAC first, webhook configurations last."""
    objects = _rbac(csv, namespace)
    labels = {**_MANAGED, **_owner(csv, namespace)}
    hooks = csv["spec"].get("webhookdefinitions", [])
    template_annotations = {
        **csv["metadata"].get("annotations", {}),
        "olm.operatorGroup": "global-operators",
        "olm.operatorNamespace": namespace,
        "olm.targetNamespaces": "",
    }
    for dep in csv["spec"]["install"]["spec"]["deployments"]:
        spec = copy.deepcopy(dep["spec"])
        pod = spec["template"]
        if any(h["deploymentName"] == dep["name"] for h in hooks):
            objects += _serving(dep, namespace, certificate, hooks, labels)
            _with_cert_volumes(pod["spec"], f"{service_name(dep['name'])}-cert")
        pod.setdefault("metadata", {})["annotations"] = {
            **(pod["metadata"].get("annotations") or {}),
            **template_annotations,
        }
        for container in pod["spec"]["containers"]:
            env = [e for e in container.get("env", []) if e["name"] != "OPERATOR_CONDITION_NAME"]
            env.append({"name": "OPERATOR_CONDITION_NAME", "value": csv["metadata"]["name"]})
            container["env"] = env
        if node_selector:
            pod["spec"]["nodeSelector"] = {**pod["spec"].get("nodeSelector", {}), **node_selector}
        spec["revisionHistoryLimit"] = 1
        objects.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {
                    "name": dep["name"],
                    "namespace": namespace,
                    "labels": {**(dep.get("label") or {}), **labels},
                },
                "spec": spec,
            }
        )
    return objects + _webhooks(csv, namespace, certificate.ca)


# Kinds a registry+v1 bundle may carry that live in a namespace.
_NAMESPACED = {
    "ConfigMap", "NetworkPolicy", "PodDisruptionBudget", "PrometheusRule", "Role",
    "RoleBinding", "Secret", "Service", "ServiceAccount", "ServiceMonitor",
}  # fmt: skip


def bundle_objects(manifests: Iterable[Obj], namespace: str) -> list[Obj]:
    """A bundle's manifests but its CSV, as OLM creates them: CRDs first, the
    namespaced objects in ``namespace``."""
    docs = [m for m in manifests if m["kind"] != "ClusterServiceVersion"]
    out = [m for m in docs if m["kind"] == "CustomResourceDefinition"]
    for doc in docs:
        if doc["kind"] == "CustomResourceDefinition":
            continue
        doc = copy.deepcopy(doc)
        if doc["kind"] in _NAMESPACED:
            doc["metadata"]["namespace"] = namespace
        out.append(doc)
    return out


class SCCError(ValueError):
    """The SCC refuses the pod (OpenShift's admission error names the field)."""


def restricted_v2(template: Obj, uid_range: tuple[int, int]) -> Obj:
    """``template`` (a pod template) as restricted-v2 admits it in a namespace
    whose ``openshift.io/sa.scc.uid-range`` is ``uid_range`` (first, size).

    Raises :class:`SCCError` for a runAsUser or fsGroup outside the range.
    """
    first, size = uid_range
    out = copy.deepcopy(template)
    spec = out["spec"]
    pod_context = spec.setdefault("securityContext", {})

    def in_range(value: int) -> bool:
        return first <= value < first + size

    fs_group = pod_context.get("fsGroup")
    if fs_group is not None and not in_range(fs_group):
        raise SCCError(
            f"unable to validate against any security context constraint: "
            f"[fsGroup: Invalid value: []int64{{{fs_group}}}: {fs_group} is not an allowed group]"
        )
    pod_context["fsGroup"] = first if fs_group is None else fs_group
    pod_user = pod_context.get("runAsUser")
    for container in spec["containers"] + spec.get("initContainers", []):
        context = container.setdefault("securityContext", {})
        user = context.get("runAsUser", pod_user)
        if user is not None and not in_range(user):
            raise SCCError(
                "unable to validate against any security context constraint: "
                f"[{container['name']}.runAsUser: Invalid value: {user}: must be in the "
                f"ranges: [{first}, {first + size - 1}]]"
            )
        context["runAsUser"] = first if user is None else user
    return out
