"""Which names may become a segment of an API path.

A name nmo reads from an object (a pod's ownerReference, a CR's nodeName)
is chosen by whoever wrote that object; pasted unescaped into a path, a name
such as ``x/../../../api/v1/secrets/s`` or ``x?watch=1`` would let them pick
what nmo requests with its own ServiceAccount. Every name therefore passes
:func:`name_error` before it becomes a path segment (:func:`nmo.kube.client.api_path`
enforces it). The rules are the apiserver's own for the objects nmo names:
a path segment (not ``.`` or ``..``, no ``/`` or ``%``) that is also a DNS-1123
subdomain (lowercase alphanumerics, ``-`` and ``.``, at most 253
characters); a namespace is a DNS-1123 label (no ``.``, at most 63).
No object with any other name can exist, so refusing one loses nothing.
"""

from __future__ import annotations

import re

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_DNS_LABEL = re.compile(_LABEL)
MAX_NAME = 253
MAX_NAMESPACE = 63


def name_error(name: str, *, namespace: bool = False) -> str | None:
    """Why ``name`` is not a valid Kubernetes object name (or namespace); None if it is."""
    if name in (".", ".."):
        return f"may not be {name!r}"
    for bad in ("/", "%"):
        if bad in name:
            return f"may not contain {bad!r}"
    limit, shape, what = (
        (MAX_NAMESPACE, _DNS_LABEL, "a DNS-1123 label (lowercase alphanumerics and '-')")
        if namespace
        else (MAX_NAME, _SUBDOMAIN, "a DNS-1123 subdomain (lowercase alphanumerics, '-' and '.')")
    )
    if not name:
        return "may not be empty"
    if len(name) > limit:
        return f"must be no more than {limit} characters"
    if shape.fullmatch(name) is None:
        return f"must be {what}"
    return None


def is_valid_name(name: str, *, namespace: bool = False) -> bool:
    return name_error(name, namespace=namespace) is None
