"""nmo's identity outside the cluster: the chart's ServiceAccount and RBAC.

An ``nmo run`` started on this machine (integration tests, benchmarks) must
be allowed exactly what the chart allows the operator's pods, or a feature
the chart forbids passes its tests and fails in every cluster. So it runs
with a token of a ServiceAccount holding the RBAC ``helm template`` renders
for the chart (the ServiceAccount, ClusterRoles, Roles and their bindings,
nothing else), and with the namespace flags the chart's Deployment passes.

:func:`apply_chart_identity` renders, applies and issues the token
(TokenRequest); callers pick a release name, namespace and
``fullnameOverride`` that collide with no real install of the chart (its
release ``nmo`` in ``node-maintenance-operator-system``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nmo.api import constants as c
from nmo_sandbox.cluster import Sandbox
from nmo_sandbox.errors import SandboxError
from nmo_sandbox.release import CHART

__all__ = ["RBAC_KINDS", "Identity", "apply_chart_identity", "render_rbac"]

RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
TOKEN_SECONDS = 48 * 3600  # outlives any test session or benchmark


@dataclass(frozen=True)
class Identity:
    """Who an out-of-cluster nmo is, and the namespace flags that go with it."""

    kubeconfig: Path
    username: str
    flags: tuple[str, ...] = ()  # ``nmo run`` flags, as a chart install passes them
    manifest: str = ""  # the RBAC applied for it (empty: not the chart's)

    @classmethod
    def admin(cls, sandbox: Sandbox, *, why: str) -> Identity:
        """The sandbox admin, for a caller that needs more than the chart grants:
        ``why`` says what (it is required, so every such use is explained)."""
        if not why.strip():
            raise ValueError("say why nmo needs the admin's credentials")
        return cls(sandbox.kubeconfig, "admin")


async def render_rbac(
    sandbox: Sandbox, *, release: str, namespace: str, fullname: str, values: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """The RBAC objects and the ServiceAccount of ``helm template`` (``--set values``)."""
    sets = [arg for value in values for arg in ("--set", value)]
    result = await sandbox.helm(
        "template", release, str(CHART), "-n", namespace,
        "--set", f"fullnameOverride={fullname}", *sets,
    )  # fmt: skip
    if result.returncode != 0:
        raise SandboxError(f"helm template {release}: {result.stderr.strip()}")
    docs = [d for d in yaml.safe_load_all(result.stdout) if d and d.get("kind") in RBAC_KINDS]
    return docs


async def _namespace(sandbox: Sandbox, name: str, timeout: float = 170.0) -> None:
    """Namespace ``name``, created when missing, once it is not being deleted."""
    deadline = time.monotonic() + timeout
    path = f"/api/v1/namespaces/{name}"
    async with sandbox.client() as http:
        while True:
            got = await http.get(path)
            if got.status_code == 404:
                body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
                created = await http.post("/api/v1/namespaces", json=body)
                if created.status_code == 201:
                    return
            elif got.status_code == 200 and not got.json()["metadata"].get("deletionTimestamp"):
                return
            if time.monotonic() > deadline:
                raise SandboxError(f"namespace {name} still being deleted after {timeout:g}s")
            await asyncio.sleep(0.5)


async def apply_manifest(sandbox: Sandbox, manifest: str, namespaces: Sequence[str]) -> None:
    """``kubectl apply`` the RBAC, its namespaces created first (as the chart's install)."""
    for name in namespaces:
        await _namespace(sandbox, name)
    result = await sandbox.kubectl("apply", "-f", "-", input=manifest)
    if result.returncode != 0:
        raise SandboxError(f"kubectl apply of the chart's RBAC: {result.stderr.strip()}")


async def apply_chart_identity(
    sandbox: Sandbox,
    *,
    release: str,
    namespace: str,
    fullname: str,
    values: Sequence[str] = (),
    kubeconfig: Path,
    lease_namespace: str = c.LEASE_NAMESPACE_DEFAULT,
) -> Identity:
    """Apply the chart's RBAC for ``fullname`` in release ``namespace`` and return
    a kubeconfig holding a token of its ServiceAccount, with the chart's flags."""
    docs = await render_rbac(
        sandbox, release=release, namespace=namespace, fullname=fullname, values=values
    )
    manifest = yaml.safe_dump_all(docs)
    await apply_manifest(sandbox, manifest, (namespace, lease_namespace))
    sa = f"{fullname}-controller-manager"
    kubeconfig.parent.mkdir(parents=True, exist_ok=True)
    path = await sandbox.service_account_kubeconfig(
        namespace, sa, kubeconfig, expiration=TOKEN_SECONDS
    )
    return Identity(
        kubeconfig=path,
        username=f"system:serviceaccount:{namespace}:{sa}",
        flags=("--leader-election-namespace", namespace, "--lease-namespace", lease_namespace),
        manifest=manifest,
    )
