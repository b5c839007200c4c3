"""What nmo's own identity may do, asked of the API server and cached.

Why this module exists: ``spec.drain.onTimeout: Delete`` deletes pods, a
right the chart grants only with ``drain.allowPodDeletion`` (the Go NMO
never deletes a pod, so its RBAC never allowed it). The webhook warns when a
NodeMaintenance asks for Delete that nmo cannot perform, and the drain
learns when a refused deletion may be tried again: both ask here.

Guarantees:

* One ``SelfSubjectAccessReview`` (no RBAC needed: every authenticated user
  may ask about itself) answers for the process's own credentials, whatever
  they are (a pod's ServiceAccount, a kubeconfig).
* An answer is kept for ``ttl`` seconds (allowed or not), so a review per
  admission or per drain pass costs no API traffic; a grant made with
  ``helm upgrade`` is seen within ``ttl``.
* A review that fails (timeout, refused, unreadable) answers ``None``
  (unknown) and never raises: callers decide nothing on an unknown.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from nmo.kube.client import KubeClient, api_path
from nmo.kube.errors import KubeError

log = logging.getLogger("nmo.access")

REVIEWS_PATH = api_path("authorization.k8s.io/v1", "selfsubjectaccessreviews")

# Named in every message about a refused pod deletion: the chart value that
# grants it (templates/clusterrole.yaml).
POD_DELETION_VALUE = "drain.allowPodDeletion=true"


def review(verb: str, resource: str, namespace: str = "") -> dict[str, Any]:
    """A SelfSubjectAccessReview for a core-group resource ("" namespace: all)."""
    attributes = {"verb": verb, "group": "", "resource": resource}
    if namespace:
        attributes["namespace"] = namespace
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }


class Access:
    """Cached answers to "may I <verb> <resource> [in <namespace>]?"."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        ttl: float = 30.0,
        timeout: float = 4.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self.ttl = ttl
        self.timeout = timeout
        self._clock = clock
        self._answers: dict[tuple[str, str, str], tuple[bool, float]] = {}
        self._lock = asyncio.Lock()
        self.reviews = 0  # reviews sent (tests count them)

    async def allowed(self, verb: str, resource: str, namespace: str = "") -> bool | None:
        """Whether this process may; None when the API server could not say."""
        key = (verb, resource, namespace)
        async with self._lock:  # concurrent askers share one review
            cached = self._answers.get(key)
            now = self._clock()
            if cached is not None and now - cached[1] < self.ttl:
                return cached[0]
            self.reviews += 1
            try:
                answer = await self._kube.request(
                    "POST",
                    REVIEWS_PATH,
                    body=review(verb, resource, namespace),
                    retry=False,
                    timeout=self.timeout,
                )
                allowed = bool((answer.get("status") or {}).get("allowed"))
            except KubeError as exc:
                log.warning(
                    "could not ask the API server whether nmo may %s %s: %s",
                    verb,
                    resource,
                    exc,
                    extra={"error": str(exc)},
                )
                return None
            if cached is None or cached[0] != allowed:
                log.info(
                    "nmo %s %s %s",
                    "may" if allowed else "may not",
                    verb,
                    f"{resource} in namespace {namespace}" if namespace else resource,
                    extra={"verb": verb, "resource": resource, "allowed": allowed},
                )
            self._answers[key] = (allowed, now)
            return allowed

    async def may_delete_pods(self, namespace: str = "") -> bool | None:
        """``delete pods`` (``onTimeout: Delete``), in ``namespace`` or everywhere."""
        return await self.allowed("delete", "pods", namespace)
