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
  SelfSubjectAccessReview, cached for ``access_ttl`` (:mod:`nmo.kube.access`).
* The admission warnings' pods and PDBs are read for the node alone: one
  LIST of the node's pods by field selector, then the PDBs of their
  namespaces (one LIST each, or one cluster-wide LIST past
  :data:`MAX_PDB_NAMESPACES`), all within ``budget_timeout``; the answer is
  reused for ``budgets_ttl`` seconds, for the ``budgets_nodes`` nodes asked
  about last (never a cache of every pod, which would grow with the
  cluster), so repeated CREATEs for a node cost one read (issue 20). One
  read per node is under way at a time: reviews that need it meanwhile wait
  for that one; once there is an answer, a review past ``budgets_ttl``
  starts the next read and takes the last answer without waiting (at most
  ``budgets_ttl + budget_timeout`` old), so no review waits on the API
  server for its warnings but a node's first (issue 22: every review in
  the moments of a read made its own, and waited for it). A read is charged
  to the sender of the review that started it; a review waiting for another
  sender's read shares its outcome, at worst going without its warnings.

Who pays (issue 20): every API request made while deciding a review is
charged to the review's sender, told apart by its peer address (a review's
``userInfo`` is whatever its sender wrote; the address is not), through
:meth:`ClusterLookups.for_requester`. An address is *proven* once a review
it sent became a NodeMaintenance: the informer shows a new CR whose uid the
address's review named first, before the CR existed. Only the apiserver's
reviews can: a CR's uid is assigned just before its review is sent, and the
review comes before the CR is stored.
Proven addresses spend shares of the proven budget, every other address a
share of the small unproven one, so forged reviews (from any number of pods)
can never spend what the apiserver's reviews need; until its first CR the
apiserver is unproven, and its CREATEs lose at most their warnings (or a
GET for a node newer than the cache, answered "please try again").
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
from nmo.kube.access import Access
from nmo.kube.allowance import Forgetful, Pool, TTLCache
from nmo.kube.client import KubeClient, Params, api_path, nm_path, node_path
from nmo.kube.errors import KubeError, NotFound
from nmo.webhooks.validators import LookupFailed, Lookups, node_name_of

log = logging.getLogger("nmo.webhooks.lookups")

Obj = dict[str, Any]
Handler = Callable[[str, Obj, Obj | None], None]
Budgets = tuple[list[Obj], list[Obj]]  # a node's pods, and the PDBs of their namespaces

NODES_PATH = node_path()
MAINTENANCES_PATH = nm_path()
PODS_PATH = api_path("v1", "pods")
PDBS_PATH = api_path("policy/v1", "poddisruptionbudgets")
MAX_PDB_NAMESPACES = 8  # beyond this many namespaces, one cluster-wide PDB LIST is cheaper


# A review costs at most 1 + MAX_PDB_NAMESPACES requests (its warnings), plus
# a GET for a node newer than the cache, or two LISTs for the etcd quorum.
PROVEN = Pool(in_flight=12, rate=15.0, burst=30, share_rate=5.0, share_burst=20)
UNPROVEN = Pool(in_flight=4, rate=5.0, burst=10, share_rate=2.0, share_burst=10)


class ObjectCache(Protocol):
    """The slice of :class:`nmo.kube.informer.Informer` the lookups read."""

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
    budgets_ttl: float = 5.0  # how long a node's pods and PDBs (the warnings) are reused
    budgets_nodes: int = 16  # for this many nodes at most
    proven_ttl: float = 24 * 3600.0  # an address whose review became a CR, for this long
    proven: Pool = PROVEN  # the budget of proven addresses (see the module docstring)
    unproven: Pool = UNPROVEN  # and of every other address


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
        self._nodes = nodes
        self._maintenances = maintenances
        self.settings = s = settings or LookupSettings()
        self._clock = clock
        self.proven = s.proven.shares(kube, clock=clock)
        self.unproven = s.unproven.shares(kube, clock=clock)
        # Lookups charged to no sender (cached answers, direct calls).
        self._kube = self.proven.kube
        self._first_reviewer: TTLCache[str] = TTLCache(60.0, 4096, clock=clock)  # uid -> address
        self._proven_sources = Forgetful(s.proven_ttl, 256, clock=clock)
        # A node's last answer and when it was read, served while a new read is
        # under way (never with a budgets_ttl of 0: then nothing is reused).
        kept = s.budgets_ttl + s.budget_timeout if s.budgets_ttl > 0 else 0
        self._budgets: TTLCache[tuple[float, Budgets]] = TTLCache(
            kept, s.budgets_nodes, clock=clock
        )
        self._budget_reads: dict[str, asyncio.Task[Budgets]] = {}
        self._lock = asyncio.Lock()
        self._claims: dict[str, _Claim] = {}
        self._missing = Forgetful(self.settings.missing_node_ttl, clock=clock)
        self._openshift: bool | None = None
        self._openshift_checked = float("-inf")
        self._discovery_lock = asyncio.Lock()
        self.access = Access(
            self._kube,
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
        """The informer saw a CR: the cache now answers for its node, and the
        address that first sent a review naming its uid is proven."""
        if event == "DELETED":
            return
        uid = (obj.get("metadata") or {}).get("uid")
        new = old is None and isinstance(uid, str)  # first seen now, not a later change
        source = self._first_reviewer.pop(uid) if new else None
        if source is not None and source not in self._proven_sources:
            log.info(
                "maintenance admission: reviews from %s are the apiserver's (one became %s)",
                source,
                (obj.get("metadata") or {}).get("name"),
                extra={"source": source},
            )
        if source is not None:
            self._proven_sources.add(source)
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

    # -- who pays -------------------------------------------------------------

    def for_requester(self, requester: str) -> Lookups:
        """The lookups of one review from peer address ``requester``, charged to it."""
        pool = self.proven if requester in self._proven_sources else self.unproven
        return _Charged(self, requester, pool.for_key(requester))

    def reviewed(self, uid: str, requester: str) -> None:
        """A review from ``requester`` claimed a node for the CR ``uid``: noted
        when it is the first, for a CR not in the cache yet (a uid copied from
        an existing CR proves nothing)."""
        if self._first_reviewer.get(uid) is not None:
            return
        if any(
            (o.get("metadata") or {}).get("uid") == uid for o in self._maintenances.store.values()
        ):
            return
        self._first_reviewer.put(uid, requester)

    # -- Lookups protocol ----------------------------------------------------

    async def get_node(self, name: str, *, kube: KubeClient | None = None) -> Obj | None:
        if self._nodes.synced.is_set():
            cached = self._nodes.store.get(name)
            if cached is not None:
                return cached
        if name in self._missing:
            return None
        try:
            return await (kube or self._kube).request(
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

    async def _list(
        self, path: str, params: Params | None = None, *, kube: KubeClient | None = None
    ) -> list[Obj]:
        try:
            page = await (kube or self._kube).request(
                "GET", path, params=params, retry=False, timeout=self.settings.request_timeout
            )
        except KubeError as exc:
            raise LookupFailed(str(exc)) from exc
        return [o for o in page.get("items") or [] if isinstance(o, dict)]

    async def list_etcd_pdbs(self, *, kube: KubeClient | None = None) -> Sequence[Obj]:
        return await self._list(
            api_path("policy/v1", "poddisruptionbudgets", namespace=c.ETCD_NAMESPACE), kube=kube
        )

    async def list_etcd_pods(
        self, selector: Mapping[str, Any] | None, *, kube: KubeClient | None = None
    ) -> Sequence[Obj]:
        params: dict[str, str] = {}
        query = selector_query(selector)
        if query:
            params["labelSelector"] = query
        return await self._list(
            api_path("v1", "pods", namespace=c.ETCD_NAMESPACE), params, kube=kube
        )

    async def node_budgets(
        self, node_name: str, *, kube: KubeClient | None = None
    ) -> tuple[Sequence[Obj], Sequence[Obj]]:
        known = self._budgets.get(node_name)
        if known is not None and self._clock() - known[0] < self.settings.budgets_ttl:
            return known[1]
        reading = self._budget_reads.get(node_name)
        if reading is None:
            reading = asyncio.create_task(
                self._read_budgets(node_name, kube or self._kube),
                name=f"nmo-webhook-budgets-{node_name}",
            )
            self._budget_reads[node_name] = reading
            reading.add_done_callback(lambda task: self._budgets_read(node_name, task))
        if known is not None:
            return known[1]  # the read goes on without this review
        return await asyncio.shield(reading)

    async def _read_budgets(self, node_name: str, kube: KubeClient) -> Budgets:
        try:
            found = await asyncio.wait_for(
                self._node_budgets(node_name, kube), self.settings.budget_timeout
            )
        except TimeoutError as exc:
            raise LookupFailed(
                f"pods and PodDisruptionBudgets not read within {self.settings.budget_timeout:g}s"
            ) from exc
        self._budgets.put(node_name, (self._clock(), found))
        return found

    def _budgets_read(self, node_name: str, task: asyncio.Task[Budgets]) -> None:
        """The read is over: the next review may start another. Its failure was
        logged by the reviews that waited for it, if any; here only in debug."""
        if self._budget_reads.get(node_name) is task:
            del self._budget_reads[node_name]
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.debug(
                "maintenance admission: pods and PDBs of node %s not read: %s", node_name, exc
            )

    async def _node_budgets(self, node_name: str, kube: KubeClient) -> Budgets:
        pods = await self._list(
            PODS_PATH, {"fieldSelector": f"spec.nodeName={node_name}"}, kube=kube
        )
        namespaces = sorted({str((p.get("metadata") or {}).get("namespace", "")) for p in pods})
        if not namespaces:
            return pods, []
        if len(namespaces) > MAX_PDB_NAMESPACES:
            wanted = set(namespaces)
            pdbs = [
                b
                for b in await self._list(PDBS_PATH, kube=kube)
                if (b.get("metadata") or {}).get("namespace") in wanted
            ]
            return pods, pdbs
        pages = await asyncio.gather(
            *(
                self._list(api_path("policy/v1", "poddisruptionbudgets", namespace=ns), kube=kube)
                for ns in namespaces
            )
        )
        return pods, [b for page in pages for b in page]


class _Charged:
    """:class:`ClusterLookups` for one review: API requests are charged to
    its sender's share, and its claims note the sender (see ``reviewed``)."""

    def __init__(self, lookups: ClusterLookups, requester: str, kube: KubeClient) -> None:
        self._lookups, self._requester, self._kube = lookups, requester, kube

    def for_requester(self, requester: str) -> Lookups:
        return self._lookups.for_requester(requester)

    async def get_node(self, name: str) -> Obj | None:
        return await self._lookups.get_node(name, kube=self._kube)

    async def claim_node(self, node_name: str, claimant: str, *, dry_run: bool = False) -> bool:
        claimed = await self._lookups.claim_node(node_name, claimant, dry_run=dry_run)
        if claimed and not dry_run:
            self._lookups.reviewed(claimant, self._requester)
        return claimed

    def release_node(self, node_name: str, claimant: str) -> None:
        self._lookups.release_node(node_name, claimant)

    async def is_openshift(self) -> bool:
        return await self._lookups.is_openshift()  # cached for every sender alike

    async def list_etcd_pdbs(self) -> Sequence[Obj]:
        return await self._lookups.list_etcd_pdbs(kube=self._kube)

    async def list_etcd_pods(self, selector: Mapping[str, Any] | None) -> Sequence[Obj]:
        return await self._lookups.list_etcd_pods(selector, kube=self._kube)

    async def node_budgets(self, node_name: str) -> tuple[Sequence[Obj], Sequence[Obj]]:
        return await self._lookups.node_budgets(node_name, kube=self._kube)

    async def may_delete_pods(self) -> bool | None:
        return await self._lookups.may_delete_pods()  # cached for every sender alike


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
