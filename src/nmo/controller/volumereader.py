"""Reads what volume-safe completion decides on, when a drain reaches its end.

The decision is :mod:`nmo.core.maintenance.volumes`'s (the planner asks for
this read, ``ReadKind.VOLUMES``, for a maintenance that waits for volumes and
has no pod left to evict); this module only asks the API: the
VolumeAttachments (storage.k8s.io/v1, cluster-scoped, no field selector on
``spec.nodeName``: listed, then filtered to the node) and the
PersistentVolume each remaining one names (its access modes, its claim). It
is read fresh on every look: nothing is watched or cached, and nothing is
requested for maintenances that do not wait. A failed read is a fact too:
the condition shows it and the wait's deadline still holds.
"""

from __future__ import annotations

from typing import Any

from nmo.core.maintenance.observed import VolumeFacts
from nmo.kube import slim
from nmo.kube.client import Kube, api_path
from nmo.kube.errors import KubeError, NotFound

Obj = dict[str, Any]
ATTACHMENTS = api_path("storage.k8s.io/v1", "volumeattachments")


class VolumeReader:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    async def read(self, node: str) -> VolumeFacts:
        """The node's VolumeAttachments and their PersistentVolumes, read now."""
        try:
            listed = await self.kube.list_all(ATTACHMENTS, transform=slim.volume_attachment)
            attachments = tuple(
                va
                for va in listed.get("items") or []
                if (va.get("spec") or {}).get("nodeName") == node
            )
            volumes: dict[str, Obj | None] = {}
            for va in attachments:
                name = ((va.get("spec") or {}).get("source") or {}).get("persistentVolumeName")
                if name and name not in volumes:
                    try:
                        pv = await self.kube.get(api_path("v1", "persistentvolumes", name=name))
                        volumes[name] = slim.persistent_volume(pv)
                    except NotFound:
                        volumes[name] = None
        except KubeError as exc:
            return VolumeFacts(error=str(exc))
        return VolumeFacts(attachments=attachments, volumes=volumes)
