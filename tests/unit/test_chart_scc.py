"""The operator pod under OpenShift's restricted-v2 SCC, rendered offline (``helm template``).

restricted-v2 gives every pod a UID (its group is 0) and an fsGroup from the
namespace's range (``openshift.io/sa.scc.uid-range``) and refuses a pod that
asks for a user or an fsGroup outside it, so the chart's fixed 65532 cannot
run there. ``openshift.restrictedSCC`` (auto: the cluster serves
``security.openshift.io/v1``) leaves them to the SCC, as the Go NMO's
manifests do (they set only ``runAsNonRoot``). What restricted-v2 demands
besides holds either way: non-root, no privilege escalation, every
capability dropped, the RuntimeDefault seccomp profile, only the volume
types it allows. That the image runs as such a user: tests/integration/test_image.py
(podman, ``--user 1000650000:0``) and tests/e2e/test_olm_csv.py (a real node).
"""

from __future__ import annotations

from typing import Any

import pytest
from test_chart_alerts import helm_env, of_kind, render, template

__all__ = ["helm_env"]  # the fixture, shared

SCC_API = ["--api-versions", "security.openshift.io/v1"]
FIXED = {"runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532}
# restricted-v2's volumes (OpenShift 4.11+).
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
    "persistentVolumeClaim", "projected", "secret",
}  # fmt: skip


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = of_kind(docs, "Deployment")
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def user_fields(spec: dict[str, Any]) -> dict[str, Any]:
    """Every runAsUser, runAsGroup and fsGroup the pod or a container fixes."""
    found = {k: v for k, v in spec["securityContext"].items() if k in FIXED}
    for container in spec["containers"] + spec.get("initContainers", []):
        context = container.get("securityContext") or {}
        found |= {f"{container['name']}.{k}": v for k, v in context.items() if k in FIXED}
    return found


def assert_restricted_v2_accepts(spec: dict[str, Any]) -> None:
    """What restricted-v2 requires of a pod it assigns the user to."""
    assert user_fields(spec) == {}
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    for container in spec["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert not context.get("privileged")
        assert all("hostPort" not in p for p in container.get("ports", []))
    for volume in spec["volumes"]:
        (kind,) = set(volume) - {"name"}
        assert kind in RESTRICTED_VOLUMES, volume


@pytest.mark.parametrize(
    ("values", "apis"),
    [
        ([], SCC_API),  # helm install on OpenShift, or template --api-versions
        (["--set", "openshift.restrictedSCC=true"], []),  # GitOps rendering for OpenShift
        (["--set-json", 'openshift.restrictedSCC="true"'], []),  # a YAML string
        # Every optional volume: the metrics certificate, the webhook client CA.
        (
            ["--set", "metrics.serviceMonitor.enabled=true",
             "--set", "webhook.clientCA.configMap=apiserver-ca"],
            SCC_API,
        ),
    ],
)  # fmt: skip
def test_on_openshift_the_scc_chooses_the_user(
    helm_env: dict[str, str], values: list[str], apis: list[str]
) -> None:
    assert_restricted_v2_accepts(pod_spec(render(helm_env, *values, *apis)))


@pytest.mark.parametrize(
    ("values", "apis"),
    [
        ([], []),  # plain Kubernetes
        ([], ["--api-versions", "config.openshift.io/v1"]),  # not the SCC API
        (["--set", "openshift.restrictedSCC=false"], SCC_API),
    ],
)
def test_elsewhere_the_pod_runs_as_65532(
    helm_env: dict[str, str], values: list[str], apis: list[str]
) -> None:
    spec = pod_spec(render(helm_env, *values, *apis))
    assert user_fields(spec) == FIXED
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_the_volumes_stay_readable_without_fsgroup(helm_env: dict[str, str]) -> None:
    """Secret files are root-owned: mode 0440 leaves them to group 0, which an
    SCC-assigned user runs in (and to the fsGroup the SCC adds)."""
    spec = pod_spec(render(helm_env, *SCC_API))
    modes = {v["name"]: v["secret"].get("defaultMode") for v in spec["volumes"] if "secret" in v}
    assert modes and all(mode is not None and mode & 0o040 for mode in modes.values()), modes
    (tmp,) = [v for v in spec["volumes"] if v["name"] == "tmp"]
    assert "emptyDir" in tmp  # writable by any user (mode 0777)


def test_schema_refuses_another_value(helm_env: dict[str, str]) -> None:
    result = template(helm_env, "--set", "openshift.restrictedSCC=maybe")
    assert result.returncode != 0
    assert "restrictedSCC" in result.stderr, result.stderr
