"""The OpenShift etcd-quorum rule (behavior.md A6 rule 3), as pure functions.

medik8s/common's ``IsEtcdDisruptionAllowed``: a control-plane node (label
key ``node-role.kubernetes.io/master`` or ``.../control-plane``) of an
OpenShift cluster may go into maintenance only when the single
PodDisruptionBudget in ``openshift-etcd`` allows a disruption, or when this
node's guard pod is not Ready (the node is disrupted already).

The webhook applies the rule at CREATE. A maintenance held back by the
fleet budget or a window can start days later, so the reconciler applies it
again when a queued maintenance is about to start (:func:`refusal`): a
refused one stays queued, with the Go NMO's quorum message, and is looked at
again every :data:`RECHECK_SECONDS`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nmo.api import constants as c
from nmo.core.maintenance.admission import Admission
from nmo.core.maintenance.observed import QuorumFacts
from nmo.core.maintenance.selectors import selector_matches

Obj = Mapping[str, Any]

REASON_QUORUM = "EtcdQuorum"
RECHECK_SECONDS = 10.0


def is_control_plane(node: Obj) -> bool:
    """NMO's test: the node carries the master or control-plane role label key."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    return c.MASTER_ROLE_LABEL in labels or c.CONTROL_PLANE_ROLE_LABEL in labels


def disruptions_allowed(pdb: Obj) -> int:
    try:
        return int((pdb.get("status") or {}).get("disruptionsAllowed") or 0)
    except (TypeError, ValueError):
        return 0


def guard_ready(pod: Obj) -> bool:
    """medik8s/common's reading of a guard pod: Ready when any ``Ready``
    condition is ``True`` or ``Unknown`` (a pod about to become Ready is not
    disrupted yet); ``False``, or no Ready condition at all, is not Ready."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(
        isinstance(cond, Mapping)
        and cond.get("type") == "Ready"
        and cond.get("status") in ("True", "Unknown")
        for cond in conditions
    )


def etcd_disruption_allowed(pdbs: Sequence[Obj], pods: Sequence[Obj], node_name: str) -> bool:
    """No PDB in ``openshift-etcd``, or more than one: the quorum cannot be
    assessed, refuse. ``status.disruptionsAllowed >= 1``: allowed. Otherwise
    the node may only go when it is already disrupted: its guard pod (the
    first pod on the node matched by the PDB selector) is not Ready
    (:func:`guard_ready`), or it has no guard pod.
    """
    if len(pdbs) != 1:
        return False
    pdb = pdbs[0]
    if disruptions_allowed(pdb) >= 1:
        return True
    selector = (pdb.get("spec") or {}).get("selector")
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if (pod.get("spec") or {}).get("nodeName") != node_name:
            continue
        if not selector_matches(selector, labels):
            continue
        return not guard_ready(pod)
    return True


def refusal(node_name: str, *, error: str | None = None) -> Admission:
    """A queued maintenance that may not start now: the quorum would break,
    or (``error``) it could not be checked. It waits, queued."""
    message = c.Messages.WEBHOOK_QUORUM.format(node=node_name)
    if error is not None:
        message = f"could not check the etcd quorum before starting, will try again: {error}"
    return Admission(
        admit=False, reason=REASON_QUORUM, message=message, retry_after=RECHECK_SECONDS
    )


def refusal_of(facts: QuorumFacts, node_name: str) -> Admission | None:
    """The rule on the facts read for a queued control-plane node: None when it
    may start now, else why it waits (a failed read makes it wait too)."""
    if facts.error is not None:
        return refusal(node_name, error=facts.error)
    if not facts.openshift or etcd_disruption_allowed(facts.pdbs, facts.pods, node_name):
        return None
    return refusal(node_name)
