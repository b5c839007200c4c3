"""nmo's identity in the integration tests: the chart's ServiceAccount and RBAC.

Every ``nmo run`` the tests start outside the cluster (and every nmo webhook
or event recorder they run in-process) authenticates as a ServiceAccount
that holds exactly the RBAC the chart renders with its default values
(nmo_sandbox.identity: ``helm template``, the ServiceAccount, ClusterRoles,
Roles and bindings, nothing else), with the chart's namespace flags. So a
feature the chart's RBAC does not allow fails its tests here, as it would
in a cluster. The admin's kubeconfig is for the tests themselves (nodes,
pods, CRs) and for an nmo whose test says why (``Identity.admin``).

Names: release ``nmo-tests``, ``fullnameOverride`` ``nmo-tests``
(``nmo-tests-<variant>`` for a second ServiceAccount, or other values), in
the release namespace ``nmo-tests-system``: nothing collides with the real
chart that test_chart.py and test_guide_commands.py install and uninstall
(release ``nmo`` in ``node-maintenance-operator-system``). Rendered, applied
and given a token once per sandbox (one per xdist worker) and variant, on
first use; applied again if a test deleted the lease namespace meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import yaml

from nmo.api import constants as c
from nmo.controller.ledger import LEDGER_NAME
from nmo_sandbox import Sandbox
from nmo_sandbox.identity import Identity, apply_chart_identity, apply_manifest

__all__ = ["ALLOW_POD_DELETION", "RELEASE_NAMESPACE", "Identity", "chart_identity"]

RELEASE = "nmo-tests"
RELEASE_NAMESPACE = "nmo-tests-system"
LEASE_NAMESPACE = c.LEASE_NAMESPACE_DEFAULT  # the chart's leases.namespace
# The chart value that lets nmo delete pods (onTimeout Delete).
ALLOW_POD_DELETION = ("drain.allowPodDeletion=true",)

_APPLIED: dict[tuple[str, str, tuple[str, ...]], Identity] = {}
_LOCK = asyncio.Lock()


async def chart_identity(
    sandbox: Sandbox, *, variant: str = "", values: Sequence[str] = ()
) -> Identity:
    """The chart's identity (``--set values`` on top of the defaults), applied once."""
    key = (str(sandbox.dir), variant, tuple(values))
    async with _LOCK:
        identity = _APPLIED.get(key)
        if identity is None:
            fullname = f"{RELEASE}-{variant}" if variant else RELEASE
            identity = _APPLIED[key] = await apply_chart_identity(
                sandbox,
                release=RELEASE,
                namespace=RELEASE_NAMESPACE,
                fullname=fullname,
                values=values,
                kubeconfig=sandbox.dir / "identities" / f"{fullname}.kubeconfig",
                lease_namespace=LEASE_NAMESPACE,
            )
        else:
            await _reapply_if_gone(sandbox, identity)
        return identity


async def _reapply_if_gone(sandbox: Sandbox, identity: Identity) -> None:
    """test_guide_commands.py deletes the lease namespace when it created it."""
    (binding,) = [
        d["metadata"]["name"]
        for d in yaml.safe_load_all(identity.manifest)
        if d["kind"] == "RoleBinding" and d["metadata"].get("namespace") == LEASE_NAMESPACE
    ]
    path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/rolebindings/{binding}"
    async with sandbox.client() as kube:
        found = await kube.get(path)
    if found.status_code == 404 or found.json()["metadata"].get("deletionTimestamp"):
        await apply_manifest(sandbox, identity.manifest, (RELEASE_NAMESPACE, LEASE_NAMESPACE))


async def reset_leader_leases(sandbox: Sandbox) -> None:
    """Delete the leader Lease and the budget ledger in the release namespace,
    so a test's replicas start from none (no nmo may be running on them)."""
    base = f"/apis/coordination.k8s.io/v1/namespaces/{RELEASE_NAMESPACE}/leases"
    async with sandbox.client() as kube:
        for name in (c.LEADER_ELECTION_ID, LEDGER_NAME):
            resp = await kube.delete(f"{base}/{name}")
            assert resp.status_code in (200, 404), resp.text
