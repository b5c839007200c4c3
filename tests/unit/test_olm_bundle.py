"""The OLM bundle: generated from the chart, accepted by the operator-framework validator.

``hack/olm_bundle.py`` (what ``make bundle`` runs) turns ``helm template`` of
the chart into a registry+v1 bundle; ``hack/bundle-validate.sh`` (a ``make
test`` prerequisite) builds the validator from the operator-framework api and
operator-registry Go modules. Here:

* the generated bundle passes the validator with no error and no warning;
* the validator fails on broken bundles, one per kind of check (its own
  exit code, not a grep of its logs);
* the CSV says what the chart says: the webhook's rules, path, failure
  policy and ports, the container's arguments, environment, probes and
  security, the RBAC rules (the same set, none added);
* the generator refuses what it cannot carry rather than drop it;
* it replaces the Go NMO's bundle in place (the Go bundle read from
  ../shared/third_party): the same package and channels, the Deployment
  OLM updates over the Go one (its name and immutable selector), an
  ``olm.skipRange`` that covers the Go releases, and a pod that fixes no UID
  or fsGroup, so OpenShift's restricted-v2 SCC admits it.

No cluster: helm and the validator are cached binaries; both missing is a
failure that names the make target that builds them.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from nmo.api import constants as c
from nmo_sandbox.binaries import find_binaries
from nmo_sandbox.gonmo import GoBundle, go_nmo_bundle
from nmo_sandbox.olm import SCCError, restricted_v2

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "node-maintenance-operator"
GENERATOR = ROOT / "hack" / "olm_bundle.py"
VALIDATOR_SCRIPT = ROOT / "hack" / "bundle-validate.sh"
IMAGE = "registry.example.com/nmo:0.1.0"
CSV_FILE = "node-maintenance-operator.clusterserviceversion.yaml"
CRD_FILE = "nodemaintenance.medik8s.io_nodemaintenances.yaml"
BUNDLE_KINDS = {
    "CustomResourceDefinition",
    "ClusterRole",
    "Service",
    "PodDisruptionBudget",
    "NetworkPolicy",
}


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("olm_bundle", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["olm_bundle"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


def _helm() -> str:
    cached = find_binaries(check=False).path("helm")
    found = str(cached) if os.access(cached, os.X_OK) else shutil.which("helm")
    assert found, "no helm: build the sandbox binaries with `make sandbox-bin`"
    return found


@pytest.fixture(scope="module")
def validator() -> Path:
    res = subprocess.run(
        ["bash", str(VALIDATOR_SCRIPT), "--check"], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, (
        "the OLM bundle validator is not built: run `make bundle-validator` "
        "(make test builds it first)"
    )
    return Path(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def bundle_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("olm")
    res = subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(out), "--image", IMAGE, "--helm", _helm()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.strip()) == out / "bundle"
    return out


@pytest.fixture(scope="module")
def csv(bundle_out: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(
        (bundle_out / "bundle" / "manifests" / CSV_FILE).read_text()
    )
    return doc


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    """The chart's objects as helm renders them for the bundle, read by this test alone."""
    args = [_helm(), "template", gen.RELEASE, str(CHART), "-n", gen.SENTINEL_NS, "--include-crds"]
    for key, value in gen.OLM_VALUES.items():
        args += ["--set", f"{key}={value}"]
    res = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    return [doc for doc in yaml.safe_load_all(res.stdout) if doc]


@pytest.fixture(scope="module")
def chart(rendered: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    kinds: dict[str, list[dict[str, Any]]] = {}
    for doc in rendered:
        kinds.setdefault(doc["kind"], []).append(doc)
    return kinds


def validate(validator: Path, bundle: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(validator), str(bundle)], capture_output=True, text=True, timeout=120, check=False
    )


# ---------------------------------------------------------------- layout and validator


def test_bundle_layout(bundle_out: Path) -> None:
    root = bundle_out / "bundle"
    kinds = {p.name: yaml.safe_load(p.read_text())["kind"] for p in (root / "manifests").iterdir()}
    assert kinds[CSV_FILE] == "ClusterServiceVersion"
    assert kinds[CRD_FILE] == "CustomResourceDefinition"
    assert {"ClusterRole", "Service", "PodDisruptionBudget"} <= set(kinds.values())
    # Only what OLM creates in the install namespace, or cluster-wide for the CSV.
    assert set(kinds.values()) <= {*BUNDLE_KINDS, "ClusterServiceVersion"}
    assert (
        "node-maintenance-operator-metrics-reader_rbac.authorization.k8s.io_v1_clusterrole.yaml"
        in kinds
    )
    annotations = yaml.safe_load((root / "metadata" / "annotations.yaml").read_text())
    assert annotations["annotations"] == {
        "operators.operatorframework.io.bundle.mediatype.v1": "registry+v1",
        "operators.operatorframework.io.bundle.manifests.v1": "manifests/",
        "operators.operatorframework.io.bundle.metadata.v1": "metadata/",
        "operators.operatorframework.io.bundle.package.v1": "node-maintenance-operator",
        "operators.operatorframework.io.bundle.channels.v1": "stable",
        "operators.operatorframework.io.bundle.channel.default.v1": "stable",
    }
    dockerfile = (bundle_out / "bundle.Dockerfile").read_text()
    for key, value in annotations["annotations"].items():
        assert f"LABEL {key}={value}\n" in dockerfile
    assert "COPY bundle/manifests /manifests/\n" in dockerfile
    # The CRD is the chart's, byte for byte in content.
    crd = yaml.safe_load((root / "manifests" / CRD_FILE).read_text())
    chart_crd = yaml.safe_load((CHART / "crds" / CRD_FILE).read_text())
    assert crd == chart_crd


def test_validator_accepts_the_generated_bundle(validator: Path, bundle_out: Path) -> None:
    res = validate(validator, bundle_out / "bundle")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ERROR" not in res.stdout and "WARN" not in res.stdout, res.stdout
    assert res.stdout.strip().endswith(": 0 errors, 0 warnings")


def _csv_path(root: Path) -> Path:
    return root / "manifests" / CSV_FILE


def _edit_csv(root: Path, edit: Any) -> None:
    doc = yaml.safe_load(_csv_path(root).read_text())
    edit(doc)
    _csv_path(root).write_text(yaml.safe_dump(doc))


def _hook(doc: dict[str, Any]) -> dict[str, Any]:
    hook: dict[str, Any] = doc["spec"]["webhookdefinitions"][0]
    return hook


def _drop_deployment_name(root: Path) -> None:
    _edit_csv(root, lambda d: _hook(d).pop("deploymentName"))


def _wrong_target_port(root: Path) -> None:
    _edit_csv(root, lambda d: _hook(d).update(targetPort=9999))


def _drop_crd(root: Path) -> None:
    (root / "manifests" / CRD_FILE).unlink()


def _drop_package(root: Path) -> None:
    path = root / "metadata" / "annotations.yaml"
    doc = yaml.safe_load(path.read_text())
    del doc["annotations"]["operators.operatorframework.io.bundle.package.v1"]
    path.write_text(yaml.safe_dump(doc))


def _add_namespace(root: Path) -> None:
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}
    (root / "manifests" / "x_v1_namespace.yaml").write_text(yaml.safe_dump(ns))


def _foreign_example(root: Path) -> None:
    example = [{"apiVersion": "example.com/v1", "kind": "Foo", "metadata": {"name": "a"}}]
    _edit_csv(
        root, lambda d: d["metadata"]["annotations"].update({"alm-examples": json.dumps(example)})
    )


def _no_install_modes(root: Path) -> None:
    _edit_csv(root, lambda d: d["spec"].update(installModes=[]))


def _skip_range(value: str) -> Any:
    def edit(root: Path) -> None:
        _edit_csv(root, lambda d: d["metadata"]["annotations"].update({"olm.skipRange": value}))

    return edit


BROKEN = {
    # nmo's install checks: what OLM needs to create the webhook
    "webhook without deploymentName": (
        _drop_deployment_name,
        "ERROR install: spec.webhookdefinitions[0] (vnodemaintenance.kb.io): no deploymentName",
    ),
    "webhook on a port the pod lacks": (_wrong_target_port, "has no container port 9999"),
    # operator-framework/api validators
    "owned CRD missing": (_drop_crd, 'owned CRD "nodemaintenance.medik8s.io/v1beta1'),
    "example of an API not owned": (_foreign_example, "example must have a provided API"),
    "no install modes": (_no_install_modes, "install modes not found"),
    # nmo's upgrade checks: what OLM's resolver reads to replace a CSV
    "skipRange over its own version": (
        _skip_range(">=0.0.1 <1.0.0"),
        'ERROR upgrade: olm.skipRange ">=0.0.1 <1.0.0" includes the CSV\'s own version',
    ),
    "skipRange OLM cannot parse": (_skip_range("0.12 to 0.20"), "ERROR upgrade: olm.skipRange"),
    # operator-registry format and content checks
    "annotations without package": (
        _drop_package,
        "ERROR format: Bundle validation errors: Missing annotation "
        '"operators.operatorframework.io.bundle.package.v1"',
    ),
    "kind registry+v1 does not allow": (_add_namespace, "Namespace is not supported type"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_validator_rejects_a_broken_bundle(
    case: str, validator: Path, bundle_out: Path, tmp_path: Path
) -> None:
    breaker, message = BROKEN[case]
    broken = tmp_path / "bundle"
    shutil.copytree(bundle_out / "bundle", broken)
    breaker(broken)
    res = validate(validator, broken)
    assert res.returncode == 1, res.stdout + res.stderr
    assert message in res.stdout, res.stdout


# ---------------------------------------------------------------- the CSV says what the chart says


def test_webhook_definitions_match_the_chart(
    csv: dict[str, Any], chart: dict[str, list[dict[str, Any]]]
) -> None:
    [vwc] = chart["ValidatingWebhookConfiguration"]
    [deployment] = chart["Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    webhook_port = next(
        p["containerPort"] for p in container["ports"] if p["name"] == "webhook-server"
    )
    definitions = csv["spec"]["webhookdefinitions"]
    assert [d["generateName"] for d in definitions] == [h["name"] for h in vwc["webhooks"]]
    for hook, definition in zip(vwc["webhooks"], definitions, strict=True):
        ref = hook["clientConfig"]["service"]
        service = next(s for s in chart["Service"] if s["metadata"]["name"] == ref["name"])
        assert definition["type"] == "ValidatingAdmissionWebhook"
        assert definition["deploymentName"] == deployment["metadata"]["name"]
        assert definition["webhookPath"] == ref["path"] == c.WEBHOOK_PATH
        assert definition["rules"] == hook["rules"]
        assert definition["failurePolicy"] == hook["failurePolicy"]
        assert definition["sideEffects"] == hook["sideEffects"]
        assert definition["timeoutSeconds"] == hook["timeoutSeconds"]
        assert definition["admissionReviewVersions"] == hook["admissionReviewVersions"]
        assert definition["containerPort"] == ref["port"] == service["spec"]["ports"][0]["port"]
        assert definition["targetPort"] == webhook_port == 9443
        assert "matchConditions" not in hook  # OLM could not carry them
    # The chart's shape without matchConditions: CREATE fails closed, UPDATE
    # fails open, so a finalizer can be removed while nmo is down.
    policies = {d["rules"][0]["operations"][0]: d["failurePolicy"] for d in definitions}
    assert policies == {"CREATE": "Fail", "UPDATE": "Ignore"}
    assert definitions[0]["generateName"] == c.WEBHOOK_NAME


def test_deployment_matches_the_chart(
    csv: dict[str, Any], chart: dict[str, list[dict[str, Any]]]
) -> None:
    [deployment] = chart["Deployment"]
    [installed] = csv["spec"]["install"]["spec"]["deployments"]
    assert installed["name"] == deployment["metadata"]["name"]
    assert installed["spec"]["replicas"] == deployment["spec"]["replicas"]
    # The Go CSV's selector (see test_the_deployment_replaces_the_go_nmos_in_place),
    # which the chart's pods carry too.
    selector = installed["spec"]["selector"]["matchLabels"]
    assert selector == gen.GO_NMO_SELECTOR
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    want_pod = copy.deepcopy(deployment["spec"]["template"]["spec"])
    got_pod = copy.deepcopy(installed["spec"]["template"]["spec"])  # the fixture is shared
    [want] = want_pod.pop("containers")
    [got] = got_pod.pop("containers")

    # Only the release namespace (nmo falls back to $POD_NAMESPACE) is gone.
    ns_arg = f"--leader-election-namespace={gen.SENTINEL_NS}"
    assert got["args"] == [a for a in want["args"] if a != ns_arg]
    assert {
        "name": "POD_NAMESPACE",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
    } in got["env"]
    assert got["image"] == IMAGE
    for key in ("env", "ports", "livenessProbe", "readinessProbe", "securityContext", "resources"):
        assert got[key] == want[key], key
    # OLM mounts the serving certificate where --cert-dir points: the chart's
    # volume there is gone, the rest of the pod is the chart's.
    cert_dir = next(
        (a.split("=", 1)[1] for a in got["args"] if a.startswith("--cert-dir=")),
        c.DEFAULT_CERT_DIR,
    )
    assert cert_dir == c.DEFAULT_CERT_DIR == gen.OLM_CERT_DIR
    assert [m for m in want["volumeMounts"] if m["mountPath"] != cert_dir] == got["volumeMounts"]
    cert_volumes = {m["name"] for m in want["volumeMounts"] if m["mountPath"] == cert_dir}
    assert cert_volumes == {"cert"}
    assert got_pod.pop("volumes") == [
        v for v in want_pod.pop("volumes") if v["name"] not in cert_volumes
    ]
    assert got_pod == want_pod
    pod_labels = installed["spec"]["template"]["metadata"]["labels"]
    assert "helm.sh/chart" not in pod_labels and "app.kubernetes.io/managed-by" not in pod_labels
    assert pod_labels["control-plane"] == "controller-manager"
    assert csv["metadata"]["annotations"]["containerImage"] == IMAGE
    assert csv["spec"]["relatedImages"] == [{"name": "manager", "image": IMAGE}]


def _rules(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule["verbs"]
    }


def test_rbac_matches_the_chart(
    csv: dict[str, Any], chart: dict[str, list[dict[str, Any]]]
) -> None:
    spec = csv["spec"]["install"]["spec"]
    [deployment] = chart["Deployment"]
    sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    assert [p["serviceAccountName"] for p in spec["clusterPermissions"]] == [sa]
    assert [p["serviceAccountName"] for p in spec["permissions"]] == [sa]
    cluster_roles = {r["metadata"]["name"]: r for r in chart["ClusterRole"]}
    bound = [
        cluster_roles[b["roleRef"]["name"]]
        for b in chart["ClusterRoleBinding"]
        if any(s["name"] == sa for s in b["subjects"])
    ]
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in chart["Role"]}
    in_release_ns = [r for (ns, _), r in roles.items() if ns == gen.SENTINEL_NS]
    elsewhere = [r for (ns, _), r in roles.items() if ns != gen.SENTINEL_NS]
    assert {ns for ns, _ in roles} >= {"default", c.LEASE_NAMESPACE_DEFAULT}

    want_ns = _rules([rule for r in in_release_ns for rule in r["rules"]])
    want_cluster = _rules([rule for r in bound + elsewhere for rule in r["rules"]])
    assert _rules(spec["permissions"][0]["rules"]) == want_ns
    assert _rules(spec["clusterPermissions"][0]["rules"]) == want_cluster
    # The chart grants no wildcard; the CSV neither (NMO's has oauth.openshift.io *).
    assert not any("*" in triple for triple in _rules(spec["clusterPermissions"][0]["rules"]))


def test_owned_crd_and_package(csv: dict[str, Any], chart: dict[str, list[dict[str, Any]]]) -> None:
    [crd] = chart["CustomResourceDefinition"]
    [owned] = csv["spec"]["customresourcedefinitions"]["owned"]
    assert owned["name"] == crd["metadata"]["name"]
    assert (owned["kind"], owned["version"]) == ("NodeMaintenance", "v1beta1")
    assert {d["path"] for d in owned["specDescriptors"]} == set(
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    )
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert csv["metadata"]["name"] == f"node-maintenance-operator.v{meta['appVersion']}"
    assert csv["spec"]["version"] == meta["appVersion"]
    assert meta["kubeVersion"].startswith(">=" + csv["spec"]["minKubeVersion"])
    modes = {m["type"]: m["supported"] for m in csv["spec"]["installModes"]}
    assert modes == {
        "OwnNamespace": False,
        "SingleNamespace": False,
        "MultiNamespace": False,
        "AllNamespaces": True,
    }
    annotations = csv["metadata"]["annotations"]
    assert annotations["operatorframework.io/suggested-namespace"] == c.OPERATOR_NAMESPACE
    template = json.loads(annotations["operatorframework.io/suggested-namespace-template"])
    assert template["metadata"] == {
        "name": c.OPERATOR_NAMESPACE,
        "annotations": {"openshift.io/node-selector": ""},
    }
    [example] = json.loads(annotations["alm-examples"])
    assert example["kind"] == "NodeMaintenance"


# ------------------------------------------------------------ the generator refuses, never drops


def test_generator_refuses_a_kind_it_has_no_rule_for(rendered: list[dict[str, Any]]) -> None:
    meta = gen.chart_meta()
    extra = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "surprise"}}
    with pytest.raises(gen.BundleError, match=r"renders a ConfigMap \(surprise\)"):
        gen.build_bundle([*rendered, extra], meta, image=IMAGE)


def test_generator_refuses_the_release_namespace_left_in_an_argument() -> None:
    docs = gen.render_chart(
        _helm(), extra=["--set", f"operator.extraArgs[0]=--x={gen.SENTINEL_NS}"]
    )
    with pytest.raises(gen.BundleError, match="names the release namespace"):
        gen.build_bundle(docs, gen.chart_meta(), image=IMAGE)


def test_generator_lists_what_olm_cannot_express(rendered: list[dict[str, Any]]) -> None:
    bundle = gen.build_bundle(rendered, gen.chart_meta(), image=IMAGE)
    dropped = "\n".join(bundle.dropped)
    assert f"Role {c.LEASE_NAMESPACE_DEFAULT}/" in dropped and "granted cluster-wide" in dropped
    # Rendered with matchConditions, the generator says it cannot carry them.
    docs = gen.render_chart(_helm(), extra=["--set", "webhook.matchConditions=true"])
    with_conditions = gen.build_bundle(docs, gen.chart_meta(), image=IMAGE)
    assert (
        f"webhook {c.WEBHOOK_NAME} matchConditions: OLM's webhook definitions lack it"
        in with_conditions.dropped
    )


def test_generator_drops_what_registry_v1_cannot_carry_and_says_so(
    rendered: list[dict[str, Any]],
) -> None:
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "nmo-policy"},
    }
    bundle = gen.build_bundle([*rendered, policy], gen.chart_meta(), image=IMAGE)
    assert "ValidatingAdmissionPolicy nmo-policy: a registry+v1 bundle cannot carry it" in (
        bundle.dropped
    )
    assert all(m["kind"] != "ValidatingAdmissionPolicy" for m in bundle.manifests.values())


def test_optional_chart_objects_make_a_valid_bundle(validator: Path, tmp_path: Path) -> None:
    """The optional NetworkPolicy goes into the bundle as OLM carries it (no namespace)."""
    docs = gen.render_chart(_helm(), extra=["--set", "networkPolicy.enabled=true"])
    bundle = gen.build_bundle(docs, gen.chart_meta(), image=IMAGE)
    root = gen.write_bundle(bundle, tmp_path)
    policies = [m for m in bundle.manifests.values() if m["kind"] == "NetworkPolicy"]
    assert len(policies) == 1 and "namespace" not in policies[0]["metadata"]
    res = validate(validator, root)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().endswith(": 0 errors, 0 warnings")


def test_rolebinding_to_a_clusterrole_in_another_namespace(rendered: list[dict[str, Any]]) -> None:
    [deployment] = [d for d in rendered if d["kind"] == "Deployment"]
    sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "nmo-configmaps"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "nmo-configmaps", "namespace": "elsewhere"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "nmo-configmaps",
        },
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": gen.SENTINEL_NS}],
    }
    bundle = gen.build_bundle([*rendered, role, binding], gen.chart_meta(), image=IMAGE)
    [cluster] = bundle.csv["spec"]["install"]["spec"]["clusterPermissions"]
    assert ("", "configmaps", "get") in _rules(cluster["rules"])
    assert all(m["metadata"]["name"] != "nmo-configmaps" for m in bundle.manifests.values())
    assert "ClusterRole elsewhere/nmo-configmaps: granted cluster-wide" in "\n".join(bundle.dropped)


def test_cli_passes_chart_values(tmp_path: Path) -> None:
    values = ["--set", "drain.timeoutSeconds=3600", "--set", "drain.onTimeout=Abort"]
    res = subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(tmp_path), "--helm", _helm(), *values],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    doc = yaml.safe_load((tmp_path / "bundle" / "manifests" / CSV_FILE).read_text())
    [deployment] = doc["spec"]["install"]["spec"]["deployments"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--drain-timeout=3600" in args and "--drain-on-timeout=Abort" in args


# ------------------------------------------------------- in place of the Go NMO's bundle


@pytest.fixture(scope="module")
def go() -> GoBundle:
    return go_nmo_bundle()


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


# Longest first: ">=" before ">".
COMPARISONS: dict[str, Any] = {
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
}


def _holds(term: str, version: tuple[int, ...]) -> bool:
    for op, compare in COMPARISONS.items():
        if term.startswith(op):
            return bool(compare(version, _version(term.removeprefix(op))))
    raise AssertionError(f"no comparison in {term!r}")


def in_range(version: str, semver_range: str) -> bool:
    """blang/semver's ranges (what OLM parses olm.skipRange with), for the
    forms the bundle writes: ``A || B``, each a space-separated AND of
    comparisons."""
    v = _version(version)
    return any(
        all(_holds(term, v) for term in alternative.split())
        for alternative in semver_range.split("||")
    )


def test_same_package_and_channels_as_the_go_nmo(bundle_out: Path, go: GoBundle) -> None:
    path = bundle_out / "bundle" / "metadata" / "annotations.yaml"
    ours = yaml.safe_load(path.read_text())["annotations"]
    prefix = "operators.operatorframework.io.bundle."
    for key in ("mediatype.v1", "package.v1", "channels.v1", "channel.default.v1"):
        assert ours[prefix + key] == go.annotations[prefix + key], key
    assert ours[prefix + "package.v1"] == "node-maintenance-operator"


def test_the_deployment_replaces_the_go_nmos_in_place(csv: dict[str, Any], go: GoBundle) -> None:
    """OLM installs the new CSV's Deployment over the old one of the same name
    with an update: the API server refuses a changed selector."""
    [ours] = csv["spec"]["install"]["spec"]["deployments"]
    theirs = go.deployment
    assert ours["name"] == theirs["name"] == "node-maintenance-operator-controller-manager"
    assert ours["spec"]["selector"] == theirs["spec"]["selector"]
    their_pod_labels = theirs["spec"]["template"]["metadata"]["labels"]
    assert their_pod_labels.items() <= ours["spec"]["template"]["metadata"]["labels"].items()
    for spec in (ours["spec"], theirs["spec"]):
        assert spec["template"]["spec"]["serviceAccountName"] == c.OPERATOR_SERVICE_ACCOUNT
    assert csv["spec"]["installModes"] == go.csv["spec"]["installModes"]
    # OLM's webhook Service is <deployment>-service: the same, on the same ports.
    [their_hook] = go.csv["spec"]["webhookdefinitions"]
    ours_by_name = {d["generateName"]: d for d in csv["spec"]["webhookdefinitions"]}
    our_hook = ours_by_name[their_hook["generateName"]]
    for key in ("deploymentName", "containerPort", "targetPort", "webhookPath", "type"):
        assert our_hook[key] == their_hook[key], key
    # The CRD OLM applies over the Go one: the same name and stored version.
    [owned] = csv["spec"]["customresourcedefinitions"]["owned"]
    [their_owned] = go.csv["spec"]["customresourcedefinitions"]["owned"]
    assert (owned["name"], owned["version"]) == (their_owned["name"], their_owned["version"])


GO_RELEASES = ["0.12.0", "0.13.0", "0.15.1", "0.17.0", "0.19.0", "0.20.0", "0.20.3"]


def test_skip_range_covers_the_go_releases(csv: dict[str, Any], go: GoBundle) -> None:
    skip = csv["metadata"]["annotations"]["olm.skipRange"]
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert skip == f"<{meta['appVersion']} || >=0.12.0 <1.0.0"
    # The Go CSV's own range starts there: its releases reach each other by it.
    assert go.csv["metadata"]["annotations"]["olm.skipRange"] == ">=0.12.0"
    for version in [*GO_RELEASES, go.csv["spec"]["version"]]:  # 0.0.1: an untagged Go build
        assert in_range(version, skip), version
    assert not in_range(csv["spec"]["version"], skip)  # never itself
    assert not in_range("1.0.0", skip)
    assert "replaces" not in csv["spec"]  # OLM sets it to whatever it replaces


def test_skip_range_refuses_a_version_among_the_go_releases() -> None:
    assert gen.skip_range("0.1.0") == "<0.1.0 || >=0.12.0 <1.0.0"
    assert gen.skip_range("1.2.0", ">=5.0.0 <5.4.0") == "<1.2.0 || >=5.0.0 <5.4.0"
    with pytest.raises(gen.BundleError, match="lies among the Go NMO's releases"):
        gen.skip_range("0.15.0")
    with pytest.raises(gen.BundleError, match="not '>=LOW <HIGH'"):
        gen.skip_range("0.1.0", ">=0.12.0")


def test_the_pod_fixes_no_user_as_the_go_csv(
    csv: dict[str, Any], go: GoBundle, rendered: list[dict[str, Any]]
) -> None:
    """The Go CSV sets only runAsNonRoot; OpenShift's restricted-v2 SCC then
    picks the UID and fsGroup, and refuses a pod that fixes others (the
    chart's 65532, which only the chart's non-OpenShift render keeps)."""
    [ours] = csv["spec"]["install"]["spec"]["deployments"]
    template = ours["spec"]["template"]
    fixed = {"runAsUser", "runAsGroup", "fsGroup"}
    assert not fixed & set(template["spec"]["securityContext"])
    for container in template["spec"]["containers"]:
        assert not fixed & set(container.get("securityContext") or {})
    assert template["spec"]["securityContext"]["runAsNonRoot"] is True
    assert go.deployment["spec"]["template"]["spec"]["securityContext"] == {"runAsNonRoot": True}
    admitted = restricted_v2(template, (1000650000, 10000))
    assert admitted["spec"]["securityContext"]["fsGroup"] == 1000650000
    assert admitted["spec"]["containers"][0]["securityContext"]["runAsUser"] == 1000650000
    # The chart as it renders elsewhere would be refused.
    docs = gen.render_chart(_helm(), extra=["--set", "openshift.restrictedSCC=false"])
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    with pytest.raises(SCCError, match="65532 is not an allowed group"):
        restricted_v2(deployment["spec"]["template"], (1000650000, 10000))
