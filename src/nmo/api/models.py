"""Typed models of the NodeMaintenance custom resource.

The JSON field names are NMO's exactly (note the lower-case ``totalpods``).
These models are the single source of truth for the CRD schema
(:mod:`nmo.api.crd` derives the OpenAPI schema from them), and every object
read from the API server is parsed into them once, at the edge.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from nmo.api import constants as c


class Phase(StrEnum):
    """Maintenance phases, as NMO spells them (Pending is nmo's: queued by the budget)."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class OnTimeout(StrEnum):
    """What happens when a drain misses its deadline (nmo addition)."""

    REPORT = "Report"  # keep draining; condition, Warning event and metric
    DELETE = "Delete"  # delete the remaining pods with their grace period, bypassing PDBs
    ABORT = "Abort"  # restore the node, release the lease, phase Failed


class SelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class LabelSelectorRequirement(_Model):
    key: str = Field(min_length=1, description="The label key the selector applies to.")
    operator: SelectorOperator = Field(description="In, NotIn, Exists or DoesNotExist.")
    values: list[str] | None = Field(
        default=None, description="Values for In and NotIn; empty for Exists and DoesNotExist."
    )


class LabelSelector(_Model):
    """A Kubernetes label selector (metav1.LabelSelector)."""

    match_labels: dict[str, str] | None = Field(
        default=None, alias="matchLabels", description="Labels a pod must carry, exactly."
    )
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        default=None, alias="matchExpressions", description="Label requirements, all must hold."
    )


class VolumeDetachSpec(_Model):
    """Wait for the drained pods' volumes to detach before Succeeded (nmo addition)."""

    enabled: bool | None = Field(
        default=None,
        description="Wait (true) or not (false) for the VolumeAttachments of the drained "
        "pods' volumes to go from the node before the maintenance succeeds "
        "(default: the operator's --wait-for-volume-detach).",
    )
    timeout_seconds: int | None = Field(
        default=None,
        alias="timeoutSeconds",
        ge=0,
        # The API server's bound (no webhook needed); parsing stays lenient and
        # the planner clamps (nmo.core.maintenance.volumes.timeout_of).
        json_schema_extra={"maximum": c.VOLUME_DETACH_TIMEOUT_MAX},
        description="How long to wait, in seconds from the end of the drain (1 to 86400; "
        "default: the operator's --volume-detach-timeout). At the end the maintenance "
        "reports it (VolumesDetached reason TimedOut, event VolumeDetachTimedOut) and "
        "succeeds.",
    )


class DrainSpec(_Model):
    """How the node is drained (nmo addition; every field optional)."""

    timeout_seconds: int | None = Field(
        default=None,
        alias="timeoutSeconds",
        ge=0,
        description="Deadline for the drain, in seconds from its start; 0: no deadline "
        "(default: the operator's --drain-timeout).",
    )
    on_timeout: OnTimeout | None = Field(
        default=None,
        alias="onTimeout",
        description="At the deadline: Report (default) keeps draining and reports; "
        "Delete deletes the remaining pods with their grace period, bypassing "
        "PodDisruptionBudgets; Abort restores the node and fails the maintenance.",
    )
    pod_selector: LabelSelector | None = Field(
        default=None,
        alias="podSelector",
        description="Only pods matching this selector are evicted; the others are left alone.",
    )
    wait_for_volume_detach: VolumeDetachSpec | None = Field(
        default=None,
        alias="waitForVolumeDetach",
        description="After the last pod left, wait until the node has no VolumeAttachment "
        "of a drained pod's volume (opt-in).",
    )


class NodeMaintenanceSpec(_Model):
    """What the user asks for."""

    node_name: str = Field(
        alias="nodeName", min_length=1, description="Node to put into maintenance."
    )
    reason: str | None = Field(default=None, description="Why the node is in maintenance.")
    drain: DrainSpec | None = Field(
        default=None, description="Drain deadline and pod selection (nmo addition)."
    )


class PodReference(_Model):
    """A pod named by namespace and name (NMO's ``pendingPodsRefs`` items)."""

    namespace: str = Field(description="Namespace of the pod.")
    name: str = Field(description="Name of the pod.")


class PendingPodDetail(_Model):
    """Why one pod is still on the node (nmo addition, B9)."""

    namespace: str = Field(description="Namespace of the pod.")
    name: str = Field(description="Name of the pod.")
    reason: str = Field(
        description="Machine-readable reason: DisruptionBudget, NamespaceTerminating, "
        "MultiplePDBs, EvictionError, Terminating, Evicting or Waiting."
    )
    message: str = Field(default="", description="Human-readable explanation.")
    disruption_budget: str | None = Field(
        default=None, alias="disruptionBudget", description="PDB blocking the eviction."
    )
    since: datetime | None = Field(
        default=None, description="When the pod started to be in this state."
    )


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(_Model):
    """A Kubernetes status condition (metav1.Condition)."""

    type: str = Field(description="Condition type, e.g. Drained.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(description="Machine-readable reason in CamelCase.")
    message: str = Field(default="", description="Human-readable explanation.")
    last_transition_time: datetime | None = Field(
        default=None,
        alias="lastTransitionTime",
        description="When the condition last changed status.",
    )
    observed_generation: int | None = Field(
        default=None,
        alias="observedGeneration",
        description="The CR generation the condition was computed for.",
    )


class NodeMaintenanceStatus(_Model):
    """Observed state of the maintenance (NMO's field names)."""

    phase: Phase | None = Field(
        default=None,
        description="Running, Succeeded or Failed; Pending while the fleet budget or the "
        "maintenance window holds the maintenance back (nmo addition).",
    )

    @property
    def begun(self) -> bool:
        """nmo has started on the node (or ended): any phase but none or Pending."""
        return self.phase is not None and self.phase is not Phase.PENDING

    drain_progress: int | None = Field(
        default=None, alias="drainProgress", description="Percentage of evicted pods."
    )
    last_update: datetime | None = Field(
        default=None, alias="lastUpdate", description="Last time the status changed."
    )
    last_error: str | None = Field(
        default=None, alias="lastError", description="Latest error, cleared on success."
    )
    pending_pods: list[str] | None = Field(
        default=None, alias="pendingPods", description="Names of pods still to evict."
    )
    pending_pods_refs: list[PodReference] | None = Field(
        default=None, alias="pendingPodsRefs", description="Pods still to evict."
    )
    pending_pods_details: list[PendingPodDetail] | None = Field(
        default=None,
        alias="pendingPodsDetails",
        description="Why each pending pod is still pending (nmo addition).",
    )
    total_pods: int | None = Field(
        default=None, alias="totalpods", description="Pods on the node when maintenance began."
    )
    eviction_pods: int | None = Field(
        default=None, alias="evictionPods", description="Pods to evict when maintenance began."
    )
    error_on_lease_count: int | None = Field(
        default=None, alias="errorOnLeaseCount", description="Consecutive lease errors."
    )
    drain_start_time: datetime | None = Field(
        default=None,
        alias="drainStartTime",
        description="When nmo started the drain (nmo addition; kept across restarts).",
    )
    drain_deadline: datetime | None = Field(
        default=None,
        alias="drainDeadline",
        description="When the drain times out, if it has a timeout (nmo addition).",
    )
    conditions: list[Condition] | None = Field(
        default=None,
        description="Conditions (nmo addition): Drained explains where the drain stands.",
    )

    def to_api(self) -> dict[str, Any]:
        """The status as the API expects it (JSON names, RFC 3339 times).

        Zero counts, empty strings and empty lists are left out, as the Go
        types' ``omitempty`` does, so jsonpath prints what it printed with
        the Go NMO (nothing for ``errorOnLeaseCount`` 0 or ``pendingPods`` []);
        ``lastUpdate`` is written at second precision, as metav1.Time is.
        """
        body = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        if self.last_update is not None:
            # metav1.Time: RFC 3339 at second precision, as the Go NMO writes it.
            body["lastUpdate"] = self.last_update.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {k: v for k, v in body.items() if not (k in OMIT_EMPTY and v in (0, "", []))}


OMIT_EMPTY = frozenset(
    {
        "drainProgress",
        "lastError",
        "pendingPods",
        "pendingPodsRefs",
        "pendingPodsDetails",
        "totalpods",
        "evictionPods",
        "errorOnLeaseCount",
        "conditions",
    }
)
"""Status fields written only when they are not zero or empty (Go's ``omitempty``)."""


class ObjectMeta(_Model):
    """The parts of metadata nmo reads."""

    name: str
    uid: str = ""
    resource_version: str = Field(default="", alias="resourceVersion")
    generation: int = 0
    creation_timestamp: datetime | None = Field(default=None, alias="creationTimestamp")
    deletion_timestamp: datetime | None = Field(default=None, alias="deletionTimestamp")
    finalizers: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    owner_references: list[dict[str, Any]] = Field(default_factory=list, alias="ownerReferences")


class NodeMaintenance(_Model):
    """A NodeMaintenance object as read from the API server."""

    api_version: str = Field(default=c.API_VERSION, alias="apiVersion")
    kind: str = c.KIND
    metadata: ObjectMeta
    spec: NodeMaintenanceSpec
    status: NodeMaintenanceStatus = Field(default_factory=NodeMaintenanceStatus)

    @classmethod
    def from_api(cls, obj: dict[str, Any]) -> NodeMaintenance:
        """Parse an object from the API server."""
        return cls.model_validate(obj)
