"""The cluster knowledge the admission rules need, answered cheaply and safely.

Why this module exists: NMO's webhook LISTs every NodeMaintenance on every
request and can still admit two CRs for one node when two creates race (the
second is admitted before the first is stored). nmo answers from the informer
caches the operator already keeps, and makes duplicates impossible within one
replica (behavior.md B8): the duplicate check and a *claim* on the node are
taken together under an :class:`asyncio.Lock`, and the claim stays until the
NodeMaintenance informer sees a CR for that node (or a short TTL passes,
when the create never materialised: another webhook refused it, a dry run,
a storage error).

The webhook port is reachable by any pod, so a review may be forged (issue
14, item 2). A claim is therefore only a reservation: a repeat from the same
claimant never extends it, and a competing create waits for it to settle
(confirmed by the informer: a duplicate; dropped or expired: go ahead) for at
most ``claim_wait`` seconds and is then admitted. Forged reviews can delay a
real create by ``claim_wait``, never refuse it; two real creates racing
behind a forged claim could both pass, and the reconciler's duplicate check
(behavior.md B8) fails the younger one.

Guarantees:

* Node and NodeMaintenance lookups never LIST: a Node missing from the cache
  is confirmed with one GET (it may have been created a moment ago), and a
  GET that found nothing is remembered for ``missing_node_ttl`` (bounded), so
  reviews naming made-up nodes cost no API traffic; a cache that has not
  synced within ``sync_timeout`` is a lookup failure.
* A NodeMaintenance being deleted still counts as existing.
* "Is OpenShift" is discovery (``GET /apis/config.openshift.io/v1`` answering
  200), cached for ``openshift_ttl``; on an error the last answer is kept.
* The etcd guard PDB and pods are read fresh (two small LISTs in
  ``openshift-etcd``, only for control-plane nodes on OpenShift), because a
  stale answer there could break etcd quorum.
* Whether nmo may delete pods (the ``onTimeout: Delete`` warning) is one
  SelfSubjectAccessReview, cached for ``access_ttl`` (:mod:`nmo.core.access`).
* The admission warnings' pods and PDBs are read fresh too, never cached
  (the memory of a cache of every pod would grow with the cluster): one LIST
  of the node's pods by field selector, then the PDBs of their namespaces
  (one LIST each, or one cluster-wide LIST past :data:`MAX_PDB_NAMESPACES`),
  all within ``budget_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from nmo.api import constants as c
from nmo.core.access import Access
from nmo.core.errors import KubeError, NotFound
from nmo.core.kube import Params, Requester, api_path, nm_path, node_path
from nmo.webhooks.budget import Forgetful
from nmo.webhooks.validators import LookupFailed, node_name_of

log = logging.getLogger("nmo.webhooks.lookups")

Obj = dict[str, Any]
Handler = Callable[[str, Obj, Obj | None], None]

NODES_PATH = node_path()
MAINTENANCES_PATH = nm_path()
PODS_PATH = api_path("v1", "pods")
PDBS_PATH = api_path("policy/v1", "poddisruptionbudgets")
MAX_PDB_NAMESPACES = 8  # beyond this many namespaces, one cluster-wide PDB LIST is cheaper


KubeClient = Requester  # the slice of :class:`nmo.core.kube.Kube` the webhooks use


class ObjectCache(Protocol):
    """The slice of :class:`nmo.core.watch.Informer` the lookups read."""

    store: dict[str, Obj]
    synced: asyncio.Event

    def add_handler(self, handler: Handler) -> None: ...


@dataclass(frozen=True)
class LookupSettings:
    openshift_ttl: float = 60.0
    # A claim is a reservation, never renewed: it ends when the informer shows
    # the CR, when the create is denied, or after claim_ttl. A competing create
    # waits at most claim_wait for it (well inside the apiserver's 10 s webhook
    # timeout), then goes ahead: an unauthenticated review cannot hold a node.
    claim_ttl: float = 10.0
    claim_wait: float = 3.0
    sync_timeout: float = 5.0
    request_timeout: float = 4.0
    budget_timeout: float = 2.0  # all the reads of the admission warnings together
    missing_node_ttl: float = 5.0  # a node the API said is missing is not asked for again
    access_ttl: float = 30.0  # how long "may nmo delete pods" is believed


@dataclass
class _Claim:
    claimant: str
    expires: float
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # confirmed or dropped


class ClusterLookups:
    """:class:`nmo.webhooks.validators.Lookups` backed by informers and the API."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        nodes: ObjectCache,
        maintenances: ObjectCache,
        settings: LookupSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._nodes = nodes
        self._maintenances = maintenances
        self.settings = settings or LookupSettings()
        self._clock = clock
        self._lock = asyncio.Lock()
        self._claims: dict[str, _Claim] = {}
        self._missing = Forgetful(self.settings.missing_node_ttl, clock=clock)
        self._openshift: bool | None = None
        self._openshift_checked = float("-inf")
        self._discovery_lock = asyncio.Lock()
        self.access = Access(
            kube,
            ttl=self.settings.access_ttl,
            timeout=self.settings.request_timeout,
            clock=clock,
        )
        maintenances.add_handler(self._on_maintenance)

    # -- caches -------------------------------------------------------------

    async def _synced(self, cache: ObjectCache, what: str) -> None:
        if cache.synced.is_set():
            return
        try:
            await asyncio.wait_for(cache.synced.wait(), self.settings.sync_timeout)
        except TimeoutError as exc:
            raise LookupFailed(f"the {what} cache has not synced yet") from exc

    def _on_maintenance(self, event: str, obj: Obj, old: Obj | None) -> None:
        """The informer saw a CR: the cache now answers for its node."""
        if event == "DELETED":
            return
        node_name = node_name_of(obj)
        if node_name and node_name in self._claims:
            self._drop(node_name)
            log.debug(
                "maintenance claim released: the CR is in the cache",
                extra={"node": node_name},
            )

    def maintenance_for(self, node_name: str) -> Obj | None:
        """A cached NodeMaintenance for the node (being deleted or not)."""
        for obj in self._maintenances.store.values():
            if node_name_of(obj) == node_name:
                return obj
        return None

    @property
    def claims(self) -> dict[str, str]:
        """Live claims, node -> claimant (for debugging and tests)."""
        now = self._clock()
        return {n: cl.claimant for n, cl in self._claims.items() if cl.expires > now}

    # -- Lookups protocol ----------------------------------------------------

    async def get_node(self, name: str) -> Obj | None:
        if self._nodes.synced.is_set():
            cached = self._nodes.store.get(name)
            if cached is not None:
                return cached
        if name in self._missing:
            return None
        try:
            return await self._kube.request(
                "GET",
                node_path(name),
                retry=False,
                timeout=self.settings.request_timeout,
            )
        except NotFound:
            self._missing.add(name)
            return None
        except KubeError as exc:
            raise LookupFailed(str(exc)) from exc

    async def claim_node(self, node_name: str, claimant: str, *, dry_run: bool = False) -> bool:
        await self._synced(self._maintenances, "NodeMaintenance")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.claim_wait
        while True:
            async with self._lock:
                now = self._clock()
                self._expire(now)
                existing = self.maintenance_for(node_name)
                if existing is not None:
                    log.info(
                        "maintenance already exists for node %s: %s",
                        node_name,
                        (existing.get("metadata") or {}).get("name"),
                        extra={"node": node_name},
                    )
                    return False
                held = self._claims.get(node_name)
                if held is not None and held.claimant == claimant:
                    return True  # a repeat: same answer, and the claim's end stays put
                late = loop.time() >= deadline
                if held is None or late:
                    if held is not None:
                        log.warning(
                            "maintenance claim on node %s not confirmed within %gs "
                            "(the create never reached the cache, or the review was not "
                            "from the apiserver); admitting the next create",
                            node_name,
                            self.settings.claim_wait,
                            extra={"node": node_name},
                        )
                        self._drop(node_name)
                    if not dry_run:
                        self._claims[node_name] = _Claim(claimant, now + self.settings.claim_ttl)
                    return True
            # Another create holds the node: it is either real (the informer
            # shows its CR within moments, and this one is a duplicate) or
            # never materialises; wait for whichever comes first.
            log.info(
                "maintenance for node %s is being admitted concurrently; waiting",
                node_name,
                extra={"node": node_name},
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(held.settled.wait(), max(deadline - loop.time(), 0.0))

    def _expire(self, now: float) -> None:
        for node in [n for n, cl in self._claims.items() if cl.expires <= now]:
            self._drop(node)

    def _drop(self, node_name: str) -> None:
        held = self._claims.pop(node_name, None)
        if held is not None:
            held.settled.set()

    def release_node(self, node_name: str, claimant: str) -> None:
        held = self._claims.get(node_name)
        if held is not None and held.claimant == claimant:
            self._drop(node_name)

    async def is_openshift(self) -> bool:
        async with self._discovery_lock:
            now = self._clock()
            if self._openshift is not None and now - self._openshift_checked < (
                self.settings.openshift_ttl
            ):
                return self._openshift
            try:
                await self._kube.request(
                    "GET",
                    f"/apis/{c.OPENSHIFT_CONFIG_GROUP_VERSION}",
                    retry=False,
                    timeout=self.settings.request_timeout,
                )
                answer = True
            except NotFound:
                answer = False
            except KubeError as exc:
                if self._openshift is None:
                    raise LookupFailed(str(exc)) from exc
                log.warning(
                    "OpenShift discovery failed, keeping the last answer",
                    extra={"error": str(exc), "openshift": self._openshift},
                )
                return self._openshift
            if answer != self._openshift:
                log.info("cluster is %s", "OpenShift" if answer else "not OpenShift")
            self._openshift, self._openshift_checked = answer, now
            return answer

    async def may_delete_pods(self) -> bool | None:
        return await self.access.may_delete_pods()

    async def _list(self, path: str, params: Params | None = None) -> list[Obj]:
        try:
            page = await self._kube.request(
                "GET", path, params=params, retry=False, timeout=self.settings.request_timeout
            )
        except KubeError as exc:
            raise LookupFailed(str(exc)) from exc
        return [o for o in page.get("items") or [] if isinstance(o, dict)]

    async def list_etcd_pdbs(self) -> Sequence[Obj]:
        return await self._list(
            api_path("policy/v1", "poddisruptionbudgets", namespace=c.ETCD_NAMESPACE)
        )

    async def list_etcd_pods(self, selector: Mapping[str, Any] | None) -> Sequence[Obj]:
        params: dict[str, str] = {}
        query = selector_query(selector)
        if query:
            params["labelSelector"] = query
        return await self._list(api_path("v1", "pods", namespace=c.ETCD_NAMESPACE), params)

    async def node_budgets(self, node_name: str) -> tuple[Sequence[Obj], Sequence[Obj]]:
        try:
            return await asyncio.wait_for(
                self._node_budgets(node_name), self.settings.budget_timeout
            )
        except TimeoutError as exc:
            raise LookupFailed(
                f"pods and PodDisruptionBudgets not read within {self.settings.budget_timeout:g}s"
            ) from exc

    async def _node_budgets(self, node_name: str) -> tuple[list[Obj], list[Obj]]:
        pods = await self._list(PODS_PATH, {"fieldSelector": f"spec.nodeName={node_name}"})
        namespaces = sorted({str((p.get("metadata") or {}).get("namespace", "")) for p in pods})
        if not namespaces:
            return pods, []
        if len(namespaces) > MAX_PDB_NAMESPACES:
            wanted = set(namespaces)
            pdbs = [
                b
                for b in await self._list(PDBS_PATH)
                if (b.get("metadata") or {}).get("namespace") in wanted
            ]
            return pods, pdbs
        pages = await asyncio.gather(
            *(
                self._list(api_path("policy/v1", "poddisruptionbudgets", namespace=ns))
                for ns in namespaces
            )
        )
        return pods, [b for page in pages for b in page]


def selector_query(selector: Mapping[str, Any] | None) -> str:
    """A metav1.LabelSelector as a ``labelSelector`` query string."""
    if not selector:
        return ""
    terms = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op = expr.get("key", ""), expr.get("operator", "")
        values = ",".join(expr.get("values") or [])
        if op == "In":
            terms.append(f"{key} in ({values})")
        elif op == "NotIn":
            terms.append(f"{key} notin ({values})")
        elif op == "Exists":
            terms.append(key)
        elif op == "DoesNotExist":
            terms.append(f"!{key}")
    return ",".join(terms)


def build_lookups(
    kube: KubeClient,
    *,
    nodes: ObjectCache,
    maintenances: ObjectCache,
    settings: LookupSettings | None = None,
) -> ClusterLookups:
    """The lookups for the webhook, from the operator's Kube and informers.

    ``nodes`` must mirror ``/api/v1/nodes`` and ``maintenances`` must mirror
    ``/apis/nodemaintenance.medik8s.io/v1beta1/nodemaintenances`` (all of
    them, unfiltered); call this before the informers start running so the
    claim-release handler sees every event.
    """
    return ClusterLookups(kube, nodes=nodes, maintenances=maintenances, settings=settings)
