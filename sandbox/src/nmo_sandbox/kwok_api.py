"""kwok's debugging API: ``kubectl logs`` and ``kubectl exec`` for simulated pods.

kwok v0.8.0 serves the kubelet's ``/containerLogs`` and ``/exec`` endpoints
itself (``--server-address``), answering from local files and local
commands. What it serves for which pod comes from four resources in the
``kwok.x-k8s.io/v1alpha1`` group, which the sandbox's kwok watches
(``--enable-crds``):

* ``Logs`` (namespaced, one per pod, named like the pod) and ``ClusterLogs``
  (cluster-wide, ``spec.selector.matchNamespaces``/``matchNames``):
  ``spec.logs: [{containers: [...], logsFile: /abs/path}]``. The file must be
  in the CRI log format a kubelet reads, one ``<RFC3339Nano> stdout F <line>``
  per line.
* ``Exec`` and ``ClusterExec``: ``spec.execs: [{containers: [...], local:
  {workDir, envs: [{name, value}]}}]``. kwok runs the command on this machine,
  resolved through kwok's own ``PATH``.

The operator's own pods run on the sandbox's real nodes, where the kubelet
serves their logs and exec (tests/e2e/test_in_cluster.py); these resources
remain for simulated pods.

kwok installs no CRDs itself; :func:`crds` are minimal (the spec is not
validated by a schema) versions of kwok's own, created by the sandbox before
kwok starts.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "API_VERSION",
    "GROUP",
    "KINDS",
    "crds",
]

GROUP = "kwok.x-k8s.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
# kind -> (plural, singular, scope)
KINDS: dict[str, tuple[str, str, str]] = {
    "ClusterLogs": ("clusterlogs", "clusterlogs", "Cluster"),
    "Logs": ("logs", "logs", "Namespaced"),
    "ClusterExec": ("clusterexecs", "clusterexec", "Cluster"),
    "Exec": ("execs", "exec", "Namespaced"),
}

_OPEN_OBJECT = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def crds() -> list[dict[str, Any]]:
    """The CustomResourceDefinitions of :data:`KINDS`."""
    out = []
    for kind, (plural, singular, scope) in KINDS.items():
        out.append(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{plural}.{GROUP}"},
                "spec": {
                    "group": GROUP,
                    "names": {
                        "kind": kind,
                        "listKind": f"{kind}List",
                        "plural": plural,
                        "singular": singular,
                    },
                    "scope": scope,
                    "versions": [
                        {
                            "name": VERSION,
                            "served": True,
                            "storage": True,
                            "subresources": {"status": {}},
                            "schema": {
                                "openAPIV3Schema": {
                                    "type": "object",
                                    "properties": {"spec": _OPEN_OBJECT, "status": _OPEN_OBJECT},
                                }
                            },
                        }
                    ],
                },
            }
        )
    return out
