"""The validating webhook, probes and metrics endpoints of nmo.

Public surface (what the CLI wires):

* :func:`nmo.webhooks.servers.serve` and :class:`ServerSettings`: run the
  webhook (:9443, TLS), probes (:8081) and metrics (:8443) servers inside the
  operator's event loop;
* :func:`nmo.webhooks.lookups.build_lookups`: the cluster lookups of the
  admission rules, from the operator's Kube client and informers;
* :mod:`nmo.webhooks.validators`: the admission rules as plain functions.

This package never imports the reconcilers, nor kr8s (import-linter).
"""

from nmo.webhooks.lookups import ClusterLookups, LookupSettings, build_lookups
from nmo.webhooks.servers import Servers, ServerSettings, serve

__all__ = [
    "ClusterLookups",
    "LookupSettings",
    "ServerSettings",
    "Servers",
    "build_lookups",
    "serve",
]
