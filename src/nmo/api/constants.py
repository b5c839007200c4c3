"""Names, keys and messages shared with the Go medik8s operators.

These strings are the compatibility contract (behavior.md part A): clusters,
scripts, alerts and neighbouring operators (NHC, SNR) depend on them, so they
live in exactly one place and are never spelled elsewhere.
"""

from typing import Final

GROUP: Final = "nodemaintenance.medik8s.io"
VERSION: Final = "v1beta1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "NodeMaintenance"
LIST_KIND: Final = "NodeMaintenanceList"
PLURAL: Final = "nodemaintenances"
SINGULAR: Final = "nodemaintenance"
SHORT_NAMES: Final = ("nm",)
CRD_NAME: Final = f"{PLURAL}.{GROUP}"

FINALIZER: Final = "foregroundDeleteNodeMaintenance"

# Labels and taints put on the node under maintenance.
EXCLUDE_FROM_REMEDIATION_LABEL: Final = "remediation.medik8s.io/exclude-from-remediation"
# The key the user's troubleshooting guide names (section 6); only cleaned up.
GUIDE_EXCLUDE_LABEL: Final = "medik8s.io/exclude-from-remediation"
UNSCHEDULABLE_TAINT_KEY: Final = "node.kubernetes.io/unschedulable"
DRAIN_TAINT_KEY: Final = "medik8s.io/drain"
TAINT_EFFECT: Final = "NoSchedule"
MAINTENANCE_TAINT_KEYS: Final = (UNSCHEDULABLE_TAINT_KEY, DRAIN_TAINT_KEY)
# Annotation on the Node recording what it looked like before nmo took it (B7).
PRIOR_STATE_ANNOTATION: Final = "nodemaintenance.medik8s.io/prior-node-state"

# Lease shared with the other medik8s operators.
LEASE_NAMESPACE_DEFAULT: Final = "medik8s-leases"
LEASE_NAMESPACE_ENV: Final = "LEASE_NAMESPACE"
LEASE_HOLDER: Final = "node-maintenance"
LEASE_DURATION_SECONDS: Final = 3600
LEASE_PREFIX: Final = "node-"
MAX_LEASE_ERRORS: Final = 3

# Events (reason, message).
EVENT_BEGIN: Final = ("BeginMaintenance", "Begin a node maintenance")
EVENT_FAILED: Final = ("FailedMaintenance", "Failed a node maintenance")
EVENT_SUCCEEDED: Final = ("SucceedMaintenance", "Node maintenance was succeeded")
EVENT_UNCORDON: Final = ("UncordonNode", "Uncordon a node")
EVENT_REMOVED: Final = ("RemovedMaintenance", "Removed a node maintenance")
EVENT_COMPONENT: Final = "NodeMaintenance"
# nmo additions (issue 12): reasons only, the messages name the deadline or pod.
EVENT_DRAIN_TIMED_OUT: Final = "DrainTimedOut"
EVENT_POD_FORCE_DELETED: Final = "PodForceDeleted"
# Pods' own drain rules ignored: their namespace is not allowed to set them (issue 20).
EVENT_DRAIN_RULES_IGNORED: Final = "DrainRulesIgnored"
# B7: the node was cordoned before the maintenance, so it stays cordoned (the Go
# NMO would uncordon it and could put a broken node back in service).
EVENT_KEPT_CORDONED: Final = (
    "NodeKeptCordoned",
    "The node was cordoned before the maintenance began, so it stays cordoned; "
    "kubectl uncordon the node to return it to service",
)

# Webhook.
WEBHOOK_NAME: Final = "vnodemaintenance.kb.io"
WEBHOOK_PATH: Final = "/validate-nodemaintenance-medik8s-io-v1beta1-nodemaintenance"
MASTER_ROLE_LABEL: Final = "node-role.kubernetes.io/master"
CONTROL_PLANE_ROLE_LABEL: Final = "node-role.kubernetes.io/control-plane"
ETCD_NAMESPACE: Final = "openshift-etcd"
ETCD_GUARD_PDB: Final = "etcd-guard-pdb"
ETCD_GUARD_PDB_OLD: Final = "etcd-quorum-guard"
OPENSHIFT_CONFIG_GROUP_VERSION: Final = "config.openshift.io/v1"

# Drain (kubectl drain's wording).
MIRROR_POD_ANNOTATION: Final = "kubernetes.io/config.mirror"
# Drain rules and order, set on pods by their owners (nmo additions, issue 12).
DRAIN_RULE_LABEL: Final = "nodemaintenance.medik8s.io/drain"
DRAIN_RULE_SKIP: Final = "skip"
DRAIN_RULE_WAIT_COMPLETED: Final = "wait-completed"
DRAIN_ORDER_ANNOTATION: Final = "nodemaintenance.medik8s.io/drain-order"
CRITICAL_PRIORITY_CLASSES: Final = ("system-cluster-critical", "system-node-critical")
DEFAULT_GRACE_SECONDS: Final = 30  # a pod's terminationGracePeriodSeconds when unset
# The Go NMO drains in passes of kubectl's helper with a 30 s timeout and
# writes lastError only when a pass ends with pods left.
DRAIN_PASS_SECONDS: Final = 30
MAX_LAST_ERROR_PODS: Final = 10  # pods named in that lastError (pendingPods has all)
# The status condition nmo maintains (Kubernetes condition type).
CONDITION_DRAINED: Final = "Drained"
CONDITION_QUEUED: Final = "Queued"  # held back by the fleet budget or the window
# Volume-safe completion (issue 23, opt-in): after the last pod left, the
# maintenance waits for the VolumeAttachments of the drained pods' volumes.
CONDITION_VOLUMES_DETACHED: Final = "VolumesDetached"
EVENT_VOLUME_DETACH_TIMED_OUT: Final = "VolumeDetachTimedOut"
VOLUME_DETACH_TIMEOUT_DEFAULT: Final = 360  # seconds: the attach/detach controller's force-detach
VOLUME_DETACH_TIMEOUT_MAX: Final = 86400  # one day

# Install names the troubleshooting guide uses.
OPERATOR_NAMESPACE: Final = "node-maintenance-operator-system"
OPERATOR_SERVICE_ACCOUNT: Final = "node-maintenance-operator-controller-manager"
OPERATOR_POD_LABEL: Final = ("control-plane", "controller-manager")
LEADER_ELECTION_ID: Final = "135b1886.medik8s.io"
DEFAULT_CERT_DIR: Final = "/apiserver.local.config/certificates"
FIELD_MANAGER: Final = "nmo"


def lease_name(node_name: str) -> str:
    """The medik8s lease name for a node (lower case, as the Go operators do)."""
    return f"{LEASE_PREFIX}{node_name}".lower()


class Messages:
    """Exact message texts of the Go operator (errors, statuses, webhook)."""

    NODE_NOT_FOUND: Final = 'nodes "{node}" not found'
    LEASE_FOREIGN: Final = (
        "can't update or invalidate the lease because it is held by different owner: {holder}"
    )
    LEASE_EXHAUSTED: Final = (
        "maintenance failed: lease could not be extended after {count} attempts"
    )
    # lastError for a foreign lease (the Go NMO's wording, spacing included):
    # before any drain progress (not counted), and after it (counted).
    LEASE_NOT_OWNED: Final = (
        "failed to obtain a lease that is not owned by us : {error} errorOnLeaseCount {count}"
    )
    LEASE_EXTEND_FAILED: Final = (
        "failed to extend a lease that used to be owned by us, incrementing error on lease "
        "count: {error}, errorOnLeaseCount: {count}"
    )
    # lastError after a drain pass of DRAIN_PASS_SECONDS left pods (kubectl's
    # drain helper, aggregated as apimachinery's errors.NewAggregate does).
    DRAIN_EVICT_TIMEOUT: Final = (
        'error when evicting pods/"{name}" -n "{namespace}": global timeout reached: {timeout}'
    )
    DRAIN_WAIT_TIMEOUT: Final = (
        'error when waiting for pod "{name}" in namespace "{namespace}" to terminate: '
        "context deadline exceeded"
    )
    # The Go NMO's log line when a drain pass timed out and it requeues (5 s).
    FIXED_DURATION_RECONCILE: Final = "Reconciling with fixed duration"
    WEBHOOK_NO_NODE: Final = "invalid nodeName, no node with name {node} found"
    WEBHOOK_DUPLICATE: Final = "invalid nodeName, a NodeMaintenance for node {node} already exists"
    WEBHOOK_QUORUM: Final = (
        "can not put master/control-plane node into maintenance at this moment, "
        "disrupting node {node} will violate etcd quorum"
    )
    WEBHOOK_NODENAME_CHANGED: Final = "updating spec.NodeName isn't allowed"
    WEBHOOK_RETRY: Final = "{what}, please try again: {err}"
