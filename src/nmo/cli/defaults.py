"""Defaults ``nmo run`` finds in its surroundings, where the Go NMO finds them.

Why this module exists: the Go NMO's Deployment and CSV pass no namespace and
no certificate directory; its manager finds them. A pod that swaps the Go
image for nmo's must find the same ones (issue 11 item 1):

* the leader election namespace: the flag, else ``$POD_NAMESPACE`` (nmo's
  chart), ``$OPERATOR_NAMESPACE`` (the Go Deployment and CSV set it to the
  pod's namespace), the service account's namespace file in a pod (what
  controller-runtime reads), else ``node-maintenance-operator-system``;
* the webhook certificate directory: the flag, else OLM's
  ``/apiserver.local.config/certificates`` (``apiserver.crt``/``.key``),
  else controller-runtime's ``$TMPDIR/k8s-webhook-server/serving-certs``
  (``tls.crt``/``tls.key``, where the Go NMO's kustomize Deployment mounts its
  Secret) when it holds a pair, else OLM's (whose certificate nmo then waits
  for);
* the shutdown delay: the flag, else 5 s in a pod (``$KUBERNETES_SERVICE_HOST``
  is set), where a Service routes the apiserver to several replicas and
  the drain keeps admissions answered while it drops this one, else 0 (a
  process outside the cluster stops at once);
* the temporary directory (where the metrics server's self-signed pair and
  each certificate loaded are written for OpenSSL): Python's usual one
  (``$TMPDIR``, ``/tmp``, ...), else the container's ``/dev/shm``. The Go
  CSV and Deployment run with a read-only root filesystem and no volume at
  ``/tmp``, where :mod:`tempfile` finds no directory and raises at the first
  certificate; ``/dev/shm`` is a writable tmpfs of every container.

The environment and the file system are parameters, so the tests need no pod.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from nmo.api import constants as c
from nmo.core.maintenance.podselect import parse_namespaces

SERVICE_ACCOUNT_NAMESPACE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
IN_POD_SHUTDOWN_DELAY: Final = 5.0
# controller-runtime's default: Go's os.TempDir() ($TMPDIR, else /tmp), which
# looks at no file. tempfile.gettempdir() probes for a writable directory and
# raises where there is none (the Go CSV's read-only root without /tmp).
CONTROLLER_RUNTIME_CERT_DIR: Final = str(
    Path(os.environ.get("TMPDIR") or "/tmp") / "k8s-webhook-server" / "serving-certs"
)


def leader_election_namespace(
    flag: str | None,
    environ: Mapping[str, str],
    *,
    service_account_namespace: Path = SERVICE_ACCOUNT_NAMESPACE,
) -> str:
    """The namespace of the leader Lease; see the module docstring for the order."""
    if flag:
        return flag
    for name in ("POD_NAMESPACE", "OPERATOR_NAMESPACE"):
        if environ.get(name):
            return environ[name]
    try:
        namespace = service_account_namespace.read_text().strip()
    except OSError:
        namespace = ""
    return namespace or c.OPERATOR_NAMESPACE


def _has_pair(directory: Path, cert: str, key: str) -> bool:
    return (directory / cert).is_file() and (directory / key).is_file()


def webhook_cert_dir(
    flag: str | None,
    *,
    olm_dir: str = c.DEFAULT_CERT_DIR,
    controller_runtime_dir: str = CONTROLLER_RUNTIME_CERT_DIR,
) -> str:
    """The webhook certificate directory; see the module docstring for the order."""
    if flag:
        return flag
    if _has_pair(Path(olm_dir), "apiserver.crt", "apiserver.key"):
        return olm_dir
    if _has_pair(Path(controller_runtime_dir), "tls.crt", "tls.key"):
        return controller_runtime_dir
    return olm_dir


SHARED_MEMORY: Final = "/dev/shm"


def temporary_directory(*, fallback: str = SHARED_MEMORY) -> tuple[str, str | None]:
    """Make :mod:`tempfile` usable for this process; see the module docstring.

    Returns (the directory, why the usual one was not used or None). When
    no usual directory is writable and ``fallback`` is, ``tempfile.tempdir``
    becomes ``fallback``: every later :mod:`tempfile` call in the process
    (the webhooks' certificate loading included) writes there.
    """
    try:
        return tempfile.gettempdir(), None
    except FileNotFoundError as exc:
        if not os.access(fallback, os.W_OK | os.X_OK):
            raise
        tempfile.tempdir = fallback
        return fallback, str(exc)


def shutdown_delay(flag: float | None, environ: Mapping[str, str]) -> float:
    """Seconds a shutdown drains; see the module docstring. Raises ValueError."""
    if flag is None:
        return IN_POD_SHUTDOWN_DELAY if environ.get("KUBERNETES_SERVICE_HOST") else 0.0
    if not flag >= 0:  # refuses NaN too
        raise ValueError(f"--shutdown-delay-seconds must be 0 or more (got {flag:g})")
    return flag


def namespaces_arg(text: str) -> frozenset[str]:
    """argparse type of ``--pod-drain-rules-namespaces`` (``nmo run`` and ``nmo plan``)."""
    try:
        return parse_namespaces(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
