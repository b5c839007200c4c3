"""Reads what the etcd-quorum rule needs, for a queued maintenance about to start.

The decision is :mod:`nmo.core.maintenance.quorum`'s (the planner asks for
this read for a queued control-plane node); this module only asks
the API: whether the cluster is OpenShift (discovery of
``config.openshift.io/v1``, cached for :data:`OPENSHIFT_TTL` seconds), the
PodDisruptionBudgets of ``openshift-etcd`` and, when the single one allows no
disruption, its guard pods. Everything is read fresh (but discovery): a
stale answer could break etcd quorum. Only control-plane nodes are looked
at (the planner's rule), so nothing is requested for ordinary workers.
"""

from __future__ import annotations

import time
from typing import Any

from nmo.api import constants as c
from nmo.core.maintenance import quorum
from nmo.core.maintenance.observed import QuorumFacts
from nmo.kube.client import Kube, api_path
from nmo.kube.errors import KubeError, NotFound

OPENSHIFT_TTL = 60.0
Obj = dict[str, Any]


class QuorumGuard:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._openshift: bool | None = None
        self._checked = float("-inf")

    async def _is_openshift(self) -> bool:
        now = time.monotonic()
        if self._openshift is not None and now - self._checked < OPENSHIFT_TTL:
            return self._openshift
        try:
            await self.kube.get(f"/apis/{c.OPENSHIFT_CONFIG_GROUP_VERSION}")
            answer = True
        except NotFound:
            answer = False
        self._openshift, self._checked = answer, now
        return answer

    async def _items(self, path: str) -> list[Obj]:
        page = await self.kube.get(path)
        return [o for o in page.get("items") or [] if isinstance(o, dict)]

    async def read(self) -> QuorumFacts:
        """The facts the etcd-quorum rule reads, read now (a failed read is a fact too)."""
        try:
            if not await self._is_openshift():
                return QuorumFacts(openshift=False)
            pdbs = await self._items(
                api_path("policy/v1", "poddisruptionbudgets", namespace=c.ETCD_NAMESPACE)
            )
            pods: list[Obj] = []
            if len(pdbs) == 1 and quorum.disruptions_allowed(pdbs[0]) < 1:
                # A handful of pods; the rule matches the PDB's selector itself.
                pods = await self._items(api_path("v1", "pods", namespace=c.ETCD_NAMESPACE))
        except KubeError as exc:
            return QuorumFacts(openshift=True, error=str(exc))
        return QuorumFacts(openshift=True, pdbs=tuple(pdbs), pods=tuple(pods))
