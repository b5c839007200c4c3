"""nmo's own error vocabulary for talking to the API server.

Only :mod:`nmo.kube.client` raises these (translating kr8s/httpx failures with
``raise ... from``); everything else catches these and never a client's
exception types.

    KubeError
    ├── NotFound            404
    │   └── InvalidName     a name no object can have, refused before any request
    ├── Conflict            409 (resourceVersion mismatch)
    │   └── AlreadyExists   409 with reason AlreadyExists
    ├── Gone                410 (watch resourceVersion too old)
    ├── Invalid             422
    ├── Forbidden           403 (RBAC, or NamespaceTerminating on eviction)
    ├── Unauthorized        401
    ├── TooManyRequests     429 (PDB on eviction, or API priority and fairness)
    └── Transient           5xx, timeouts, dropped connections

    KubeconfigError         a kubeconfig named by --kubeconfig or $KUBECONFIG
                            cannot be read (before any request)
"""

from __future__ import annotations

from typing import Any


class KubeError(Exception):
    """An API request failed."""

    status_code: int = 0

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        reason: str = "",
        body: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status_code is not None:
            self.status_code = status_code
        self.reason = reason
        self.body: dict[str, Any] = body or {}
        self.retry_after = retry_after

    @property
    def causes(self) -> list[dict[str, Any]]:
        """The Status object's ``details.causes`` (e.g. NamespaceTerminating)."""
        details = self.body.get("details") or {}
        causes = details.get("causes") or []
        return [c for c in causes if isinstance(c, dict)]

    def has_cause(self, cause_type: str) -> bool:
        return any(c.get("type") == cause_type for c in self.causes)


class NotFound(KubeError):
    status_code = 404


class InvalidName(NotFound):
    """A name that is not a valid Kubernetes name was about to become a path.

    Raised by :func:`nmo.kube.client.api_path` before any request is made. It is
    a :class:`NotFound` because no object can have such a name: a caller that
    treats a missing object as missing (a DaemonSet owner that does not exist,
    a node that is not there) does the right thing without knowing of it.
    """


class Conflict(KubeError):
    status_code = 409


class AlreadyExists(Conflict):
    """409 with reason AlreadyExists (a create raced another)."""


class Gone(KubeError):
    status_code = 410


class Invalid(KubeError):
    status_code = 422


class Forbidden(KubeError):
    status_code = 403


class Unauthorized(KubeError):
    status_code = 401


class TooManyRequests(KubeError):
    status_code = 429


class Transient(KubeError):
    """A failure worth retrying: 5xx, a timeout or a dropped connection."""


class KubeconfigError(Exception):
    """A kubeconfig someone named is missing or unreadable: said as kubectl says it
    (``stat <path>: no such file or directory``), never worked around."""


_BY_STATUS: dict[int, type[KubeError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def retry_after_seconds(body: dict[str, Any]) -> float | None:
    """A Status's ``details.retryAfterSeconds`` (the API server's own field,
    also sent as the Retry-After header), when positive."""
    details = body.get("details")
    value = details.get("retryAfterSeconds") if isinstance(details, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return float(value)


def error_for_status(
    status_code: int, body: dict[str, Any], *, retry_after: float | None = None
) -> KubeError:
    """Build the nmo error for an HTTP error response; ``retry_after`` is the
    Retry-After header, else the body's ``details.retryAfterSeconds``."""
    message = str(body.get("message") or f"HTTP {status_code}")
    reason = str(body.get("reason") or "")
    if retry_after is None:
        retry_after = retry_after_seconds(body)
    cls = _BY_STATUS.get(status_code)
    if status_code == 409 and reason == "AlreadyExists":
        cls = AlreadyExists
    if cls is None:
        cls = Transient if status_code >= 500 else KubeError
    return cls(
        message,
        status_code=status_code,
        reason=reason,
        body=body,
        retry_after=retry_after,
    )


PATCH_REJECTED = "the server rejected our request due to an error in our request"


def changed_meanwhile(exc: KubeError) -> bool:
    """A patch refused because its object changed (or went) since it was read:
    409, 404, or the bare 422 a failed JSON-patch ``test`` on its
    resourceVersion gets. The pass that sent it ends; the next one reads again.

    Any other 422 (an admission policy or webhook refusing the change) is an
    error like a 403: reported in lastError and retried with backoff, not
    retried at once forever.
    """
    if exc.status_code in (404, 409):
        return True
    return exc.status_code == 422 and exc.message == PATCH_REJECTED and not exc.body.get("details")
