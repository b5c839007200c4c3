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
  per line (:func:`cri_log_line`).
* ``Exec`` and ``ClusterExec``: ``spec.execs: [{containers: [...], local:
  {workDir, envs: [{name, value}]}}]``. kwok runs the command on this machine,
  resolved through kwok's own ``PATH``.

A real container has its own filesystem, so ``kubectl exec <pod> -- ls
/apiserver.local.config/certificates/`` names a path inside the pod. The
sandbox emulates that for a few file-reading commands (:data:`EXEC_SHIMS`):
kwok's ``PATH`` starts with a directory of wrappers that, when the exec has
the environment variable :data:`POD_ROOT_ENV` set (put it in the exec
target's ``envs``), prefix every absolute path argument with that directory,
as a chroot would. Without the variable they run the real command unchanged.

kwok installs no CRDs itself; :func:`crds` are minimal (the spec is not
validated by a schema) versions of kwok's own, created by the sandbox before
kwok starts.
"""

from __future__ import annotations

import datetime as dt
import os
import shlex
from pathlib import Path
from typing import Any

__all__ = [
    "API_VERSION",
    "EXEC_SHIMS",
    "GROUP",
    "KINDS",
    "POD_ROOT_ENV",
    "crds",
    "cri_log_line",
    "write_exec_shims",
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
POD_ROOT_ENV = "NMO_SANDBOX_POD_ROOT"
EXEC_SHIMS = ("cat", "head", "ls", "stat", "tail")

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


def cri_log_line(line: str, *, stream: str = "stdout", now: dt.datetime | None = None) -> str:
    """``line`` as a kubelet's CRI log file stores it (what kwok's Logs read)."""
    ts = (now or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return f"{ts} {stream} F {line.rstrip(chr(10))}\n"


_SHIM = """\
#!/bin/sh
# nmo-sandbox: kwok runs `kubectl exec` commands on this machine. With
# ${env} set, absolute path arguments are taken relative to it, like in
# the pod's own filesystem (see nmo/sandbox/kwok_api.py).
PATH=${{PATH#"{dir}:"}}
export PATH
if [ -n "${{{env}:-}}" ]; then
  for arg do
    shift
    case $arg in
      /*) arg=${{{env}%/}}$arg ;;
    esac
    set -- "$@" "$arg"
  done
fi
exec {name} "$@"
"""


def write_exec_shims(dir: Path) -> Path:
    """Write the :data:`EXEC_SHIMS` wrappers into ``dir``; put ``dir`` first on kwok's PATH."""
    dir.mkdir(parents=True, exist_ok=True)
    for name in EXEC_SHIMS:
        path = dir / name
        path.write_text(_SHIM.format(env=POD_ROOT_ENV, dir=str(dir), name=shlex.quote(name)))
        os.chmod(path, 0o755)
    return dir
