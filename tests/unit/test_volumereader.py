"""The volume reader (volume-safe completion's I/O): what it asks the API and
what it hands the planner, including the failures the sandbox's chart
identity never meets (a 403 on the list, a PV gone meanwhile)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from nmo.controller.volumereader import ATTACHMENTS, VolumeReader
from nmo.kube.client import Kube
from nmo.kube.errors import Forbidden, NotFound

Obj = dict[str, Any]


def va(name: str, node: str, pv: str) -> Obj:
    return {
        "metadata": {"name": name, "managedFields": [{"manager": "kcm"}]},
        "spec": {"attacher": "d", "nodeName": node, "source": {"persistentVolumeName": pv}},
        "status": {"attached": True},
    }


class ListingKube:
    """Answers the attachments' LIST and each PV's GET; records every request."""

    def __init__(self, items: list[Obj], pvs: dict[str, Obj], *, listing: Exception | None = None):
        self.items, self.pvs, self.listing = items, pvs, listing
        self.requests: list[str] = []

    async def list_all(
        self, path: str, *, transform: Callable[[Obj], Obj] | None = None, **_: Any
    ) -> Obj:
        self.requests.append(f"LIST {path}")
        if self.listing is not None:
            raise self.listing
        assert transform is not None
        return {"items": [transform(i) for i in self.items]}

    async def get(self, path: str, **_: Any) -> Obj:
        self.requests.append(f"GET {path}")
        name = path.rsplit("/", 1)[1]
        if name not in self.pvs:
            raise NotFound(f"persistentvolumes {name!r} not found")
        return self.pvs[name]


async def test_the_nodes_attachments_and_their_volumes_are_read() -> None:
    pv = {"metadata": {"name": "pv-1"}, "spec": {"accessModes": ["ReadWriteOnce"]}}
    kube = ListingKube(
        [va("a", "n1", "pv-1"), va("b", "n2", "pv-2"), va("c", "n1", "pv-gone")], {"pv-1": pv}
    )
    facts = await VolumeReader(cast(Kube, kube)).read("n1")
    assert facts.error is None
    assert [a["metadata"] for a in facts.attachments] == [{"name": "a"}, {"name": "c"}]
    assert dict(facts.volumes) == {"pv-1": pv, "pv-gone": None}
    assert kube.requests == [
        f"LIST {ATTACHMENTS}",
        "GET /api/v1/persistentvolumes/pv-1",
        "GET /api/v1/persistentvolumes/pv-gone",
    ]  # nothing of the other node's


async def test_a_refused_list_is_a_fact_for_the_condition() -> None:
    refused = Forbidden('volumeattachments.storage.k8s.io is forbidden: User "x" cannot list')
    facts = await VolumeReader(cast(Kube, ListingKube([], {}, listing=refused))).read("n1")
    assert facts.attachments == () and "cannot list" in (facts.error or "")
