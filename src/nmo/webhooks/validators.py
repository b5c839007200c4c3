"""The admission rules for NodeMaintenance, as plain functions (behavior.md A6).

Why this module exists: the rules are the compatibility contract with the Go
operator (same order, same messages), and they are easiest to get right when
they are separate from HTTP, JSON and the API server. Everything the rules need
to know about the cluster comes through the small :class:`Lookups` protocol,
so unit tests drive them with a table of fakes and the HTTP adapter
(:mod:`nmo.server.app`) only translates.

Guarantees:

* CREATE checks run in NMO's order: node exists (a name no Node can have is
  refused without a lookup), no NodeMaintenance for the node (one being
  deleted counts), then the OpenShift etcd quorum check for control-plane
  nodes; the first failing rule decides the message.
* A lookup failure always denies, with a ``..., please try again: <err>`` text;
  the node, NodeMaintenance and quorum-node lookups read exactly as NMO's
  (``could not get node for validating spec.NodeName, please try again:
  could not get node: <err>``).
* The duplicate check claims the node through :meth:`Lookups.claim_node`; a
  claim is released again whenever this function ends up denying, so a denied
  create never blocks a later one.
* UPDATE refuses a changed ``spec.nodeName`` and a changed ``spec.drain``
  that is invalid; everything else is allowed, without a lookup.
* An admitted CREATE (dry run or not) carries admission warnings when a
  PodDisruptionBudget covering a pod the drain would evict allows no
  disruption right now (:func:`budget_warnings`); finding out never refuses
  the CREATE: a failed or slow lookup means no warning, and is logged.
* An admitted CREATE, or an UPDATE that turns ``spec.drain.onTimeout`` to
  ``Delete``, carries a warning when nmo may not delete pods (the chart
  grants it only with ``drain.allowPodDeletion``): at the deadline the
  deletion would be refused (:func:`deletion_warnings`); an unknown answer
  means no warning.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from nmo.api.constants import Messages
from nmo.core.maintenance.disruption import budgets_for, disruption_warnings
from nmo.core.maintenance.podselect import select_pods
from nmo.core.maintenance.quorum import (
    disruptions_allowed,
    etcd_disruption_allowed,
    is_control_plane,
)
from nmo.core.maintenance.selectors import selector_error
from nmo.core.maintenance.volumes import timeout_error
from nmo.kube.access import POD_DELETION_VALUE

log = logging.getLogger("nmo.webhooks")

Obj = Mapping[str, Any]

# The "<what>" halves of NMO's "<what>, please try again: <err>" texts.
GET_NODE_FAILED = "could not get node for validating spec.NodeName"
LIST_MAINTENANCES_FAILED = "could not list NodeMaintenances for validating spec.NodeName"
QUORUM_GET_NODE_FAILED = "could not get node for master/control-plane quorum validation"
# NMO's node GET wraps the client error once more before either text above.
GET_NODE_ERROR = "could not get node: {err}"
# NMO returns the raw client error in these two cases; nmo keeps the
# "please try again" shape so every lookup failure reads the same.
QUORUM_DISCOVERY_FAILED = "could not check for OpenShift for master/control-plane quorum validation"
QUORUM_GUARD_FAILED = (
    "could not check the etcd quorum guard for master/control-plane quorum validation"
)
POD_DELETION_WARNING = (
    "spec.drain.onTimeout is Delete, but nmo may not delete pods: at the drain deadline the "
    "deletion of the pods left on the node will be refused (reported in lastError and the "
    f"Drained condition) and they stay; set the chart value {POD_DELETION_VALUE} (or grant "
    "nmo's ServiceAccount delete on pods), or use onTimeout Report or Abort"
)


class LookupFailed(Exception):
    """A lookup could not answer (cache not synced, API error); the rule denies."""


class Lookups(Protocol):
    """What the rules need to know about the cluster."""

    def for_requester(self, requester: str) -> Lookups:
        """These lookups for one review sent from peer address ``requester``:
        the API requests they make are charged to it."""
        ...

    async def get_node(self, name: str) -> Obj | None:
        """The Node, or None when it does not exist; raises LookupFailed."""
        ...

    async def claim_node(self, node_name: str, claimant: str, *, dry_run: bool = False) -> bool:
        """True when no other NodeMaintenance exists or is being admitted for
        the node; unless ``dry_run``, the node is then held for ``claimant``.
        Raises LookupFailed."""
        ...

    def release_node(self, node_name: str, claimant: str) -> None:
        """Drop a claim taken by :meth:`claim_node` (no-op if not held)."""
        ...

    async def is_openshift(self) -> bool:
        """Whether discovery serves ``config.openshift.io/v1``; raises LookupFailed."""
        ...

    async def list_etcd_pdbs(self) -> Sequence[Obj]:
        """Every PodDisruptionBudget in ``openshift-etcd``; raises LookupFailed."""
        ...

    async def list_etcd_pods(self, selector: Obj | None) -> Sequence[Obj]:
        """Pods in ``openshift-etcd`` matching a label selector; raises LookupFailed."""
        ...

    async def node_budgets(self, node_name: str) -> tuple[Sequence[Obj], Sequence[Obj]]:
        """The pods bound to the node and the PDBs of their namespaces, read
        recently (bounded in time); raises LookupFailed."""
        ...

    async def may_delete_pods(self) -> bool | None:
        """Whether nmo's own identity may delete pods in every namespace (cached);
        None when the API server could not say."""
        ...


@dataclass(frozen=True)
class Decision:
    """The answer to one admission request.

    ``result`` is the metrics label: ``allowed``, ``denied`` (a rule said no)
    or ``error`` (a lookup failed or the request was unusable).
    """

    allowed: bool
    message: str = ""
    code: int = 200
    reason: str = ""
    result: str = "allowed"
    warnings: tuple[str, ...] = ()  # admission warnings (kubectl prints them)

    @classmethod
    def allow(cls, warnings: Sequence[str] = ()) -> Decision:
        return cls(allowed=True, warnings=tuple(warnings))

    @classmethod
    def deny(cls, message: str) -> Decision:
        return cls(False, message, 403, "Forbidden", "denied")

    @classmethod
    def failed(cls, what: str, err: object) -> Decision:
        """A lookup failure: denied (403) with NMO's retry wording."""
        return cls(
            False, Messages.WEBHOOK_RETRY.format(what=what, err=err), 403, "Forbidden", "error"
        )

    @classmethod
    def bad_request(cls, message: str) -> Decision:
        return cls(False, message, 400, "BadRequest", "error")


def node_name_of(obj: Obj | None) -> str:
    """``spec.nodeName`` of a NodeMaintenance object, or "" when absent."""
    spec = (obj or {}).get("spec")
    if not isinstance(spec, Mapping):
        return ""
    value = spec.get("nodeName")
    return value if isinstance(value, str) else ""


# Node names are RFC 1123 subdomains (apimachinery's IsDNS1123Subdomain).
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_MAX_NAME = 253


def valid_node_name(name: str) -> bool:
    """Whether a Node could have this name; no lookup is made for one that could not
    (it could also reach the API as a path like ``../namespaces``)."""
    return len(name) <= _MAX_NAME and _SUBDOMAIN.fullmatch(name) is not None


def shown_name(name: str) -> str:
    """A name as quoted in messages and logs, cut short when absurdly long."""
    return name if len(name) <= _MAX_NAME else name[:_MAX_NAME] + "..."


async def _quorum(node_name: str, lookups: Lookups) -> Decision | None:
    """Rule 3; None when it does not object."""
    try:
        node = await lookups.get_node(node_name)
    except LookupFailed as exc:
        return Decision.failed(QUORUM_GET_NODE_FAILED, GET_NODE_ERROR.format(err=exc))
    if node is None:
        return Decision.deny(Messages.WEBHOOK_NO_NODE.format(node=node_name))
    # Consulted only for control-plane nodes so that a discovery outage
    # cannot block maintenance of ordinary workers.
    if not is_control_plane(node):
        return None
    try:
        if not await lookups.is_openshift():
            return None
    except LookupFailed as exc:
        return Decision.failed(QUORUM_DISCOVERY_FAILED, exc)
    try:
        pdbs = await lookups.list_etcd_pdbs()
        pods: Sequence[Obj] = ()
        # Guard pods matter only when the single PDB allows no disruption.
        if len(pdbs) == 1 and disruptions_allowed(pdbs[0]) < 1:
            pods = await lookups.list_etcd_pods((pdbs[0].get("spec") or {}).get("selector"))
    except LookupFailed as exc:
        return Decision.failed(QUORUM_GUARD_FAILED, exc)
    if etcd_disruption_allowed(pdbs, pods, node_name):
        return None
    return Decision.deny(Messages.WEBHOOK_QUORUM.format(node=node_name))


def drain_spec_error(obj: Obj) -> str | None:
    """What is wrong with ``spec.drain`` that the CRD schema cannot say, if anything.

    The schema checks types, the onTimeout values and timeoutSeconds >= 0;
    a label selector's requirements also need values exactly when their
    operator compares against values (metav1.LabelSelector's rule), and the
    volume detach wait needs a deadline of 1 s to a day.
    """
    spec = obj.get("spec")
    drain = spec.get("drain") if isinstance(spec, dict) else None
    if not isinstance(drain, dict):
        return None  # a malformed spec is the CRD schema's to refuse
    volumes = drain.get("waitForVolumeDetach")
    if isinstance(volumes, dict) and (problem := timeout_error(volumes.get("timeoutSeconds"))):
        return problem
    return selector_error(drain.get("podSelector"), "spec.drain.podSelector")


async def validate_create(
    new: Obj, lookups: Lookups, *, claimant: str, dry_run: bool = False
) -> Decision:
    """Rules for a new NodeMaintenance. ``claimant`` identifies this create
    (the object's uid, else the admission uid) for the duplicate claim."""
    node_name = node_name_of(new)
    if not node_name:
        return Decision.bad_request("spec.nodeName is required")
    if not valid_node_name(node_name):
        return Decision.deny(Messages.WEBHOOK_NO_NODE.format(node=shown_name(node_name)))
    if (problem := drain_spec_error(new)) is not None:
        return Decision.deny(problem)
    try:
        node = await lookups.get_node(node_name)
    except LookupFailed as exc:
        return Decision.failed(GET_NODE_FAILED, GET_NODE_ERROR.format(err=exc))
    if node is None:
        return Decision.deny(Messages.WEBHOOK_NO_NODE.format(node=node_name))
    try:
        claimed = await lookups.claim_node(node_name, claimant, dry_run=dry_run)
    except LookupFailed as exc:
        return Decision.failed(LIST_MAINTENANCES_FAILED, exc)
    if not claimed:
        return Decision.deny(Messages.WEBHOOK_DUPLICATE.format(node=node_name))
    try:
        objection = await _quorum(node_name, lookups)
    except BaseException:
        if not dry_run:
            lookups.release_node(node_name, claimant)
        raise
    if objection is not None:
        if not dry_run:
            lookups.release_node(node_name, claimant)
        return objection
    warnings = await budget_warnings(new, node_name, lookups)
    return Decision.allow([*warnings, *await deletion_warnings(new, None, lookups)])


async def budget_warnings(new: Obj, node_name: str, lookups: Lookups) -> list[str]:
    """Warnings for the PDBs that would hold the drain right now; [] when unknown.

    The pods are those the drain would evict under this CR's
    ``spec.drain.podSelector`` and drain rules; DaemonSet pods count as
    managed (no DaemonSet lookups at admission time).
    """
    try:
        pods, pdbs = await lookups.node_budgets(node_name)
        drain = (new.get("spec") or {}).get("drain")
        selector = drain.get("podSelector") if isinstance(drain, Mapping) else None
        selection = select_pods([dict(p) for p in pods], lambda _ds: True, selector)
        return disruption_warnings(budgets_for(selection.evict, pdbs), node_name)
    except Exception as exc:  # a warning is a courtesy: it must never refuse the CREATE
        log.warning(
            "maintenance admission: could not check the PodDisruptionBudgets of node %s: %s",
            node_name,
            exc,
            extra={"node": node_name, "error": str(exc)},
        )
        return []


def _drain_of(obj: Obj) -> object:
    spec = obj.get("spec")
    return spec.get("drain") if isinstance(spec, Mapping) else None


def asks_for_deletion(obj: Obj | None) -> bool:
    """Whether the CR's ``spec.drain.onTimeout`` is ``Delete``."""
    drain = _drain_of(obj or {})
    return isinstance(drain, Mapping) and drain.get("onTimeout") == "Delete"


async def deletion_warnings(new: Obj, old: Obj | None, lookups: Lookups) -> list[str]:
    """A warning when ``new`` newly asks for ``onTimeout: Delete`` that nmo may
    not perform; [] when it does not, when nmo may, or when that is unknown."""
    if not asks_for_deletion(new) or asks_for_deletion(old):
        return []
    try:
        allowed = await lookups.may_delete_pods()
    except Exception as exc:  # a warning is a courtesy: it must never refuse the request
        log.warning(
            "maintenance admission: could not check whether nmo may delete pods: %s",
            exc,
            extra={"error": str(exc)},
        )
        return []
    return [POD_DELETION_WARNING] if allowed is False else []


def validate_update(old: Obj | None, new: Obj) -> Decision:
    """Rules for a changed NodeMaintenance: the node cannot be swapped, and a
    changed ``spec.drain`` must be valid.

    Without lookups, so it answers at once. Exactly the UPDATEs the chart's
    matchConditions keep from the webhook (same nodeName, same drain:
    finalizer, label, annotation changes) are allowed whatever the object
    holds, so the finalizer of a CR whose old ``spec.drain`` would no longer
    pass can still be removed where the webhook sees every UPDATE
    (Kubernetes before 1.28, see the chart's templates/webhook.yaml).
    """
    if old is not None and node_name_of(old) != node_name_of(new):
        return Decision.deny(Messages.WEBHOOK_NODENAME_CHANGED)
    if old is not None and _drain_of(old) == _drain_of(new):
        return Decision.allow()
    if (problem := drain_spec_error(new)) is not None:
        return Decision.deny(problem)
    return Decision.allow()
