"""nmo: a Node Maintenance Operator for Kubernetes.

A drop-in replacement for the Go medik8s Node Maintenance Operator: the same
NodeMaintenance API, lease, labels, taints, events and webhook messages, run
by one asyncio process with concurrent reconcilers.
"""

__version__ = "0.1.0"
