#!/usr/bin/env python3
"""Generate the OLM bundle (registry+v1) from the Helm chart, so nothing is written twice.

    hack/olm_bundle.py [--out build/olm] [--image IMAGE] [--set KEY=VALUE]... [--helm PATH]

The chart is the single source: ``helm template`` renders it (with the values
in :data:`OLM_VALUES`, into a sentinel namespace) and every rendered object
is either carried into the bundle or replaced by what OLM does itself:

=================================  ==============================================
rendered by the chart              in the bundle
=================================  ==============================================
CustomResourceDefinition           ``manifests/`` and ``spec.customresourcedefinitions.owned``
Deployment                         ``spec.install.spec.deployments`` (OLM mounts the
                                   webhook certificate where ``--cert-dir`` points)
ValidatingWebhookConfiguration     ``spec.webhookdefinitions``
ClusterRole bound to the operator  ``spec.install.spec.clusterPermissions``
Role in the install namespace      ``spec.install.spec.permissions``
Role in another namespace          ``clusterPermissions`` (OLM's ``permissions`` only
                                   reach the install namespace)
ServiceAccount, webhook Service,   dropped: OLM creates the account, the
serving-certificate Secret         ``<deployment>-service`` and the certificate
other ClusterRoles, Services,      ``manifests/`` as they are (no namespace: OLM
PodDisruptionBudget, NetworkPolicy puts them in the install namespace)
ValidatingAdmissionPolicy(Binding) dropped, with a note: registry+v1 has no place
=================================  ==============================================

Anything else the chart may render one day stops the generator with an error
rather than vanishing from the bundle. What differs from the chart (a webhook's
``matchConditions``, the Roles granted cluster-wide) is listed on stderr and
in docs/install.md, section 10.

The bundle can replace the Go NMO's in place (a Subscription moved to a
catalog that serves it): the same package and channel, the Go CSV's
Deployment selector (OLM updates the Deployment of the same name, and a
selector is immutable), and an ``olm.skipRange`` that covers the Go releases
(:data:`GO_NMO_RELEASES`) and every earlier nmo. The pod fixes no UID or
fsGroup, as the Go CSV does: OpenShift's restricted-v2 SCC chooses them.

This is developer tooling: it needs helm and PyYAML, never the nmo package.
Output: ``<out>/bundle/{manifests,metadata}`` and ``<out>/bundle.Dockerfile``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "node-maintenance-operator"
PACKAGE = "node-maintenance-operator"
RELEASE = PACKAGE
# Rendered into every namespaced object; the bundle must not keep it anywhere.
SENTINEL_NS = "olm-install-namespace"
# Where OLM mounts the webhook serving certificate (apiserver.crt/apiserver.key).
OLM_CERT_DIR = "/apiserver.local.config/certificates"
SUGGESTED_NAMESPACE = "node-maintenance-operator-system"
# The chart's values for the bundle, each for a reason OLM imposes.
OLM_VALUES = {
    # OLM issues and rotates the webhook certificate itself.
    "webhook.certManager.enabled": "false",
    # The lease namespace cannot be a bundle object; nmo creates it at start-up.
    "leases.createNamespace": "false",
    # OLM is how OpenShift installs operators: grant the etcd quorum guard read.
    "openshift.etcdQuorumGuard": "true",
    # OLM's webhook definitions cannot carry matchConditions: the chart's other
    # shape (CREATE and UPDATE as two webhooks, UPDATE failing open) keeps
    # finalizer removal working while nmo is down.
    "webhook.matchConditions": "false",
    # The pod fixes no runAsUser, runAsGroup or fsGroup, as the Go CSV: on
    # OpenShift the SCC chooses them (restricted-v2 refuses 65532), elsewhere
    # the image's USER 65532 runs it (runAsNonRoot checks it).
    "openshift.restrictedSCC": "true",
}
# The Go NMO's releases on its package's channel: its CSV (medik8s/node-maintenance-operator,
# bundle/manifests, main after v0.20.0) declares olm.skipRange ">=0.12.0".
# nmo's bundle skips the 0.x line from there, so OLM moves a Subscription to
# the package from any of them to nmo (it compares no versions, only ranges).
GO_NMO_RELEASES = ">=0.12.0 <1.0.0"
# The Go CSV's Deployment selector. OLM installs a new CSV's Deployment over
# the old one of the same name with an update, and the API server refuses a
# changed selector, so the bundle keeps this one (the chart's pods carry both
# labels; the chart's own selector cannot change either).
GO_NMO_SELECTOR = {"control-plane": "controller-manager", "node-maintenance-operator": ""}
# Optional hardening the chart may render that OLM has no place for.
NOT_IN_REGISTRY_V1 = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
# OpenShift's console filters on these; nmo claims none of the features.
OPENSHIFT_NO = (
    "fips-compliant",
    "proxy-aware",
    "tls-profiles",
    "token-auth-aws",
    "token-auth-azure",
    "token-auth-gcp",
    "cnf",
    "cni",
    "csi",
)
# Labels that say Helm manages an object; under OLM it does not.
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")

Obj = dict[str, Any]


class BundleError(Exception):
    """The chart renders something the bundle cannot carry faithfully."""


@dataclass
class Bundle:
    """The bundle's files (name -> object) and what the chart had that OLM cannot express."""

    manifests: dict[str, Obj]
    annotations: Obj
    dropped: list[str] = field(default_factory=list)

    @property
    def csv(self) -> Obj:
        return self.manifests[f"{PACKAGE}.clusterserviceversion.yaml"]


# ---------------------------------------------------------------- rendering


def find_helm(explicit: str | None = None) -> str:
    """helm as the sandbox builds it (``make sandbox-bin``), else one on PATH."""
    if explicit:
        return explicit
    candidates: list[Path] = []
    if os.environ.get("NMO_SANDBOX_BIN"):
        candidates.append(Path(os.environ["NMO_SANDBOX_BIN"]) / "helm")
    script = ROOT / "hack" / "sandbox-bin.sh"
    res = subprocess.run(
        ["bash", str(script), "--print-dir"], capture_output=True, text=True, check=False
    )
    if res.returncode == 0 and res.stdout.strip():
        candidates.append(Path(res.stdout.strip().splitlines()[-1]) / "helm")
    for cand in candidates:
        if os.access(cand, os.X_OK):
            return str(cand)
    on_path = shutil.which("helm")
    if on_path:
        return on_path
    raise BundleError("no helm: build the sandbox binaries with `make sandbox-bin`")


def render_chart(helm: str, *, chart: Path = CHART, extra: Iterable[str] = ()) -> list[Obj]:
    """``helm template`` of the chart with :data:`OLM_VALUES` into the sentinel namespace."""
    args = [helm, "template", RELEASE, str(chart), "-n", SENTINEL_NS, "--include-crds"]
    for key, value in OLM_VALUES.items():
        args += ["--set", f"{key}={value}"]
    args += list(extra)
    res = subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)
    if res.returncode != 0:
        raise BundleError(f"helm template failed: {res.stderr.strip()}")
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def chart_meta(chart: Path = CHART) -> Obj:
    meta: Obj = yaml.safe_load((chart / "Chart.yaml").read_text())
    return meta


# ---------------------------------------------------------------- pure transform


def _strip_helm(obj: Obj) -> Obj:
    out = copy.deepcopy(obj)
    meta = out.setdefault("metadata", {})
    meta.pop("namespace", None)
    labels = meta.get("labels") or {}
    for key in HELM_LABELS:
        labels.pop(key, None)
    return out


def _by_kind(docs: list[Obj]) -> dict[str, list[Obj]]:
    out: dict[str, list[Obj]] = {}
    for doc in docs:
        out.setdefault(doc["kind"], []).append(doc)
    return out


def _one(kinds: dict[str, list[Obj]], kind: str) -> Obj:
    found = kinds.get(kind, [])
    if len(found) != 1:
        raise BundleError(f"the chart renders {len(found)} {kind} objects; the bundle needs one")
    return found[0]


def _manifest_name(obj: Obj) -> str:
    group_version = obj["apiVersion"].replace("/", "_")
    return f"{obj['metadata']['name']}_{group_version}_{obj['kind'].lower()}.yaml"


def _container(deployment: Obj) -> Obj:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    for c in containers:
        if c["name"] == "manager":
            return dict(c)
    raise BundleError("the chart's Deployment has no container named manager")


def _arg_value(args: list[str], flag: str) -> str | None:
    for arg in args:
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _deployment_spec(deployment: Obj, dropped: list[str]) -> tuple[Obj, str | None]:
    """The Deployment's spec as OLM installs it, and the Secret its cert volume named."""
    spec = copy.deepcopy(deployment["spec"])
    pod = spec["template"]
    for key in HELM_LABELS:
        pod["metadata"].get("labels", {}).pop(key, None)
    pod_labels = pod["metadata"].get("labels", {})
    if any(pod_labels.get(k) != v for k, v in GO_NMO_SELECTOR.items()):
        raise BundleError(f"the chart's pods lack the Go NMO's selector labels {GO_NMO_SELECTOR}")
    spec["selector"] = {"matchLabels": dict(GO_NMO_SELECTOR)}
    pod_spec = pod["spec"]
    manager = next(c for c in pod_spec["containers"] if c["name"] == "manager")
    args: list[str] = manager.get("args", [])
    # nmo defaults the leader-election namespace to $POD_NAMESPACE; the chart's
    # explicit one is the release namespace, unknown before OLM installs.
    if _arg_value(args, "--leader-election-namespace") == SENTINEL_NS:
        args.remove(f"--leader-election-namespace={SENTINEL_NS}")
        env = {e["name"]: e for e in manager.get("env", [])}
        ref = env.get("POD_NAMESPACE", {}).get("valueFrom", {}).get("fieldRef", {})
        if ref.get("fieldPath") != "metadata.namespace":
            raise BundleError("the manager has no POD_NAMESPACE from metadata.namespace")
    # Without the flag nmo reads OLM_CERT_DIR too (its default).
    cert_dir = _arg_value(args, "--cert-dir") or OLM_CERT_DIR
    secret: str | None = None
    if "--no-enable-webhook" not in args:
        if cert_dir != OLM_CERT_DIR:
            raise BundleError(
                f"--cert-dir={cert_dir}: OLM mounts the certificate at {OLM_CERT_DIR}"
            )
        mounts = manager.get("volumeMounts", [])
        cert_mounts = [m for m in mounts if m["mountPath"] == cert_dir]
        manager["volumeMounts"] = [m for m in mounts if m["mountPath"] != cert_dir]
        names = {m["name"] for m in cert_mounts}
        volumes = pod_spec.get("volumes", [])
        for vol in volumes:
            if vol["name"] in names and "secret" in vol:
                secret = vol["secret"]["secretName"]
        pod_spec["volumes"] = [v for v in volumes if v["name"] not in names]
        if names:
            dropped.append(
                f"Deployment volume {', '.join(sorted(names))}: OLM mounts its own at {cert_dir}"
            )
    return spec, secret


def _webhook_definitions(
    vwc: Obj, deployment: Obj, services: list[Obj], dropped: list[str]
) -> tuple[list[Obj], set[str]]:
    """``spec.webhookdefinitions`` and the names of the Services OLM replaces."""
    pod_labels = deployment["spec"]["template"]["metadata"].get("labels", {})
    ports = {p["name"]: p["containerPort"] for p in _container(deployment).get("ports", [])}
    replaced: set[str] = set()
    out: list[Obj] = []
    for hook in vwc["webhooks"]:
        ref = hook["clientConfig"].get("service")
        if ref is None:
            raise BundleError(f"webhook {hook['name']} has no service: OLM needs one")
        svc = next((s for s in services if s["metadata"]["name"] == ref["name"]), None)
        if svc is None:
            raise BundleError(f"webhook {hook['name']} names Service {ref['name']}, not rendered")
        selector = svc["spec"]["selector"]
        if any(pod_labels.get(k) != v for k, v in selector.items()):
            raise BundleError(f"Service {ref['name']} does not select the Deployment's pods")
        svc_port = next(
            (p for p in svc["spec"]["ports"] if p["port"] == ref.get("port", 443)), None
        )
        if svc_port is None:
            raise BundleError(f"Service {ref['name']} has no port {ref.get('port', 443)}")
        target = svc_port.get("targetPort", svc_port["port"])
        target = ports.get(target, target) if isinstance(target, str) else target
        if target not in ports.values():
            raise BundleError(f"webhook {hook['name']}: no container port {target}")
        definition: Obj = {
            "generateName": hook["name"],
            "type": "ValidatingAdmissionWebhook",
            "deploymentName": deployment["metadata"]["name"],
            "containerPort": svc_port["port"],
            "targetPort": target,
            "webhookPath": ref["path"],
            "rules": hook["rules"],
            "failurePolicy": hook["failurePolicy"],
            "sideEffects": hook["sideEffects"],
            "admissionReviewVersions": hook["admissionReviewVersions"],
        }
        for key in ("timeoutSeconds", "matchPolicy", "objectSelector"):
            if key in hook:
                definition[key] = hook[key]
        for key in ("matchConditions", "namespaceSelector"):
            if key in hook:
                dropped.append(f"webhook {hook['name']} {key}: OLM's webhook definitions lack it")
        out.append(definition)
        replaced.add(ref["name"])
    return out, replaced


def _bound_to(binding: Obj, sa: str) -> bool:
    return any(
        s.get("kind") == "ServiceAccount"
        and s.get("name") == sa
        and s.get("namespace") == SENTINEL_NS
        for s in binding.get("subjects", [])
    )


def _permissions(
    kinds: dict[str, list[Obj]], sa: str, dropped: list[str]
) -> tuple[list[Obj], list[Obj], set[tuple[str, str]]]:
    """(clusterPermissions rules, permissions rules, the (kind, name) of RBAC consumed)."""
    cluster_rules: list[Obj] = []
    ns_rules: list[Obj] = []
    consumed: set[tuple[str, str]] = set()
    roles = {r["metadata"]["name"]: r for r in kinds.get("ClusterRole", [])}
    for crb in kinds.get("ClusterRoleBinding", []):
        if not _bound_to(crb, sa):
            continue
        role = roles[crb["roleRef"]["name"]]
        cluster_rules += role["rules"]
        consumed |= {
            ("ClusterRoleBinding", crb["metadata"]["name"]),
            ("ClusterRole", role["metadata"]["name"]),
        }
    ns_roles = {
        (r["metadata"]["namespace"], r["metadata"]["name"]): r for r in kinds.get("Role", [])
    }
    for rb in kinds.get("RoleBinding", []):
        ns = rb["metadata"]["namespace"]
        if not _bound_to(rb, sa):
            raise BundleError(f"RoleBinding {ns}/{rb['metadata']['name']} binds someone else")
        ref = rb["roleRef"]
        role = roles[ref["name"]] if ref["kind"] == "ClusterRole" else ns_roles[(ns, ref["name"])]
        if ns == SENTINEL_NS:
            ns_rules += role["rules"]
        else:
            cluster_rules += role["rules"]
            dropped.append(
                f"{ref['kind']} {ns}/{ref['name']}: granted cluster-wide "
                "(OLM's permissions reach only the install namespace)"
            )
        consumed |= {("RoleBinding", rb["metadata"]["name"]), (ref["kind"], ref["name"])}
    return cluster_rules, ns_rules, consumed


def _title(name: str) -> str:
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name)
    return words[:1].upper() + words[1:]


def _descriptors(schema: Obj) -> list[Obj]:
    out = []
    for name, prop in sorted((schema.get("properties") or {}).items()):
        entry: Obj = {"path": name, "displayName": _title(name)}
        if prop.get("description"):
            entry["description"] = " ".join(prop["description"].split())
        out.append(entry)
    return out


def _owned_crd(crd: Obj) -> Obj:
    spec = crd["spec"]
    version = next(v for v in spec["versions"] if v.get("storage"))
    schema = version["schema"]["openAPIV3Schema"]
    return {
        "name": crd["metadata"]["name"],
        "kind": spec["names"]["kind"],
        "version": version["name"],
        "displayName": _title(spec["names"]["kind"]),
        "description": schema.get("description", ""),
        "resources": [
            {
                "kind": spec["names"]["kind"],
                "name": spec["names"]["plural"],
                "version": version["name"],
            }
        ],
        "specDescriptors": _descriptors(schema["properties"].get("spec", {})),
        "statusDescriptors": _descriptors(schema["properties"].get("status", {})),
    }


def _min_kube_version(meta: Obj) -> str:
    match = re.search(r">=\s*v?(\d+\.\d+\.\d+)", str(meta.get("kubeVersion", "")))
    if not match:
        raise BundleError(f"Chart.yaml kubeVersion {meta.get('kubeVersion')!r} has no lower bound")
    return match.group(1)


def _sample(crd: Obj) -> Obj:
    spec = crd["spec"]
    version = next(v for v in spec["versions"] if v.get("storage"))["name"]
    return {
        "apiVersion": f"{spec['group']}/{version}",
        "kind": spec["names"]["kind"],
        "metadata": {"name": "nm-worker-1"},
        "spec": {"nodeName": "worker-1", "reason": "kernel upgrade"},
    }


def _semver(text: str) -> tuple[int, int, int]:
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", text)
    if not match:
        raise BundleError(f"version {text!r} is not MAJOR.MINOR.PATCH")
    major, minor, patch = (int(g) for g in match.groups())
    return major, minor, patch


def skip_range(version: str, go_releases: str = GO_NMO_RELEASES) -> str:
    """``olm.skipRange``: the Go NMO's releases and every version before nmo's own."""
    bounds = re.fullmatch(r">=(\S+) <(\S+)", go_releases)
    if not bounds:
        raise BundleError(f"the Go NMO's releases {go_releases!r} are not '>=LOW <HIGH'")
    low, high = (_semver(b) for b in bounds.groups())
    if low <= _semver(version) < high:
        raise BundleError(
            f"version {version} lies among the Go NMO's releases ({go_releases}): "
            "the bundle would skip itself"
        )
    return f"<{version} || {go_releases}"


def _assert_no_sentinel(obj: Any, where: str) -> None:
    text = json.dumps(obj)
    if SENTINEL_NS in text:
        raise BundleError(f"{where} still names the release namespace: it cannot be known to OLM")


def build_bundle(
    docs: list[Obj],
    meta: Obj,
    *,
    image: str,
    channel: str = "stable",
    go_releases: str = GO_NMO_RELEASES,
) -> Bundle:
    """The bundle for the rendered chart ``docs`` (pure: no I/O)."""
    dropped: list[str] = []
    kinds = _by_kind(docs)
    crd = _one(kinds, "CustomResourceDefinition")
    deployment = _one(kinds, "Deployment")
    vwc = _one(kinds, "ValidatingWebhookConfiguration")
    sa_obj = _one(kinds, "ServiceAccount")
    sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    if sa_obj["metadata"]["name"] != sa:
        raise BundleError(
            f"the Deployment runs as {sa}, the chart creates {sa_obj['metadata']['name']}"
        )

    dep_spec, cert_secret = _deployment_spec(deployment, dropped)
    manager = next(c for c in dep_spec["template"]["spec"]["containers"] if c["name"] == "manager")
    manager["image"] = image
    services = kinds.get("Service", [])
    hooks, replaced_services = _webhook_definitions(vwc, deployment, services, dropped)
    cluster_rules, ns_rules, consumed = _permissions(kinds, sa, dropped)

    manifests: dict[str, Obj] = {}
    handled = {"CustomResourceDefinition", "Deployment", "ValidatingWebhookConfiguration"}
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind in handled or (kind, name) in consumed:
            continue
        if kind == "ServiceAccount" and name == sa:
            continue  # OLM creates the accounts its permissions name
        if kind == "Service" and name in replaced_services:
            continue  # OLM creates <deploymentName>-service for the webhook
        if kind == "Secret" and name == cert_secret:
            continue  # OLM issues the serving certificate
        if kind in NOT_IN_REGISTRY_V1:
            dropped.append(f"{kind} {name}: a registry+v1 bundle cannot carry it")
            continue
        if kind in ("ClusterRole", "Service", "PodDisruptionBudget", "NetworkPolicy"):
            obj = _strip_helm(doc)
            _assert_no_sentinel(obj, f"{kind} {name}")
            manifests[_manifest_name(obj)] = obj
            continue
        raise BundleError(f"the chart renders a {kind} ({name}) the OLM bundle has no rule for")

    crd_file = f"{crd['spec']['group']}_{crd['spec']['names']['plural']}.yaml"
    manifests[crd_file] = _strip_helm(crd)

    version = str(meta["appVersion"])
    dep_labels = {
        k: v for k, v in deployment["metadata"].get("labels", {}).items() if k not in HELM_LABELS
    }
    install = {
        "strategy": "deployment",
        "spec": {
            "clusterPermissions": [{"serviceAccountName": sa, "rules": cluster_rules}],
            "permissions": [{"serviceAccountName": sa, "rules": ns_rules}],
            "deployments": [
                {"name": deployment["metadata"]["name"], "label": dep_labels, "spec": dep_spec}
            ],
        },
    }
    _assert_no_sentinel(install, "the install strategy")
    _assert_no_sentinel(hooks, "the webhook definitions")
    csv: Obj = {
        "apiVersion": "operators.coreos.com/v1alpha1",
        "kind": "ClusterServiceVersion",
        "metadata": {
            "name": f"{PACKAGE}.v{version}",
            "namespace": "placeholder",
            "annotations": {
                "alm-examples": json.dumps([_sample(crd)]),
                "capabilities": "Basic Install",
                "categories": "OpenShift Optional",
                "containerImage": image,
                "olm.skipRange": skip_range(version, go_releases),
                "description": "Cordons, taints and drains a node while a NodeMaintenance exists.",
                "operatorframework.io/suggested-namespace": SUGGESTED_NAMESPACE,
                # An empty node selector: OpenShift's default one would keep the
                # pods off the control-plane nodes the Deployment prefers.
                "operatorframework.io/suggested-namespace-template": json.dumps(
                    {
                        "apiVersion": "v1",
                        "kind": "Namespace",
                        "metadata": {
                            "name": SUGGESTED_NAMESPACE,
                            "annotations": {"openshift.io/node-selector": ""},
                        },
                    }
                ),
                # Disconnected installs mirror images by digest only.
                "features.operators.openshift.io/disconnected": json.dumps("@sha256:" in image),
                **{f"features.operators.openshift.io/{k}": "false" for k in OPENSHIFT_NO},
            },
        },
        "spec": {
            "displayName": "Node Maintenance Operator (nmo)",
            "description": " ".join(str(meta.get("description", "")).split()),
            "version": version,
            "minKubeVersion": _min_kube_version(meta),
            "maturity": "alpha",
            "keywords": list(meta.get("keywords", [])),
            "provider": {"name": "nmo"},
            "installModes": [
                {"type": "OwnNamespace", "supported": False},
                {"type": "SingleNamespace", "supported": False},
                {"type": "MultiNamespace", "supported": False},
                {"type": "AllNamespaces", "supported": True},
            ],
            "customresourcedefinitions": {"owned": [_owned_crd(crd)]},
            "install": install,
            "webhookdefinitions": hooks,
            "relatedImages": [{"name": "manager", "image": image}],
        },
    }
    manifests[f"{PACKAGE}.clusterserviceversion.yaml"] = csv
    annotations = {
        "annotations": {
            "operators.operatorframework.io.bundle.mediatype.v1": "registry+v1",
            "operators.operatorframework.io.bundle.manifests.v1": "manifests/",
            "operators.operatorframework.io.bundle.metadata.v1": "metadata/",
            "operators.operatorframework.io.bundle.package.v1": PACKAGE,
            "operators.operatorframework.io.bundle.channels.v1": channel,
            "operators.operatorframework.io.bundle.channel.default.v1": channel,
        }
    }
    return Bundle(manifests=manifests, annotations=annotations, dropped=dropped)


# ---------------------------------------------------------------- output


def write_bundle(bundle: Bundle, out: Path) -> Path:
    """Write ``<out>/bundle`` (replacing an older one) and ``<out>/bundle.Dockerfile``."""
    root = out / "bundle"
    if root.exists():
        shutil.rmtree(root)
    (root / "manifests").mkdir(parents=True)
    (root / "metadata").mkdir()
    for name, obj in sorted(bundle.manifests.items()):
        (root / "manifests" / name).write_text(yaml.safe_dump(obj, sort_keys=False))
    (root / "metadata" / "annotations.yaml").write_text(
        yaml.safe_dump(bundle.annotations, sort_keys=False)
    )
    labels = "".join(f"LABEL {k}={v}\n" for k, v in bundle.annotations["annotations"].items())
    (out / "bundle.Dockerfile").write_text(
        "# Generated by hack/olm_bundle.py from charts/node-maintenance-operator.\n"
        "FROM scratch\n"
        f"{labels}"
        "COPY bundle/manifests /manifests/\n"
        "COPY bundle/metadata /metadata/\n"
    )
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "olm")
    parser.add_argument(
        "--image", help="operator image (default: the chart's repository:appVersion)"
    )
    parser.add_argument("--helm", help="helm binary (default: the sandbox's, then PATH)")
    parser.add_argument("--channel", default="stable")
    parser.add_argument(
        "--go-releases",
        default=GO_NMO_RELEASES,
        metavar="'>=LOW <HIGH'",
        help="the Go NMO versions the bundle replaces in place, besides earlier nmo ones "
        f"(default {GO_NMO_RELEASES!r}; e.g. a downstream build's)",
    )
    parser.add_argument("--chart", type=Path, default=CHART)
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a chart value"
    )
    opts = parser.parse_args(argv)
    try:
        meta = chart_meta(opts.chart)
        extra = [arg for kv in opts.set for arg in ("--set", kv)]
        docs = render_chart(find_helm(opts.helm), chart=opts.chart, extra=extra)
        values = yaml.safe_load((opts.chart / "values.yaml").read_text())
        image = opts.image or f"{values['image']['repository']}:{meta['appVersion']}"
        bundle = build_bundle(
            docs, meta, image=image, channel=opts.channel, go_releases=opts.go_releases
        )
    except BundleError as exc:
        print(f"olm_bundle: error: {exc}", file=sys.stderr)
        return 1
    root = write_bundle(bundle, opts.out)
    for note in bundle.dropped:
        print(f"olm_bundle: differs from the chart: {note}", file=sys.stderr)
    print(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
