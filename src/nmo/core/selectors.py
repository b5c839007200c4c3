"""metav1.LabelSelector matching, as pure functions.

Used by the webhook's etcd quorum check (which guard pod a PDB selects) and by
``nmo gather`` (which PDBs cover pods under maintenance). An empty selector
matches every pod; what a *null* selector means depends on the caller, so it
is a parameter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def selector_matches(
    selector: Mapping[str, Any] | None,
    labels: Mapping[str, str],
    *,
    null_matches: bool = True,
) -> bool:
    """Whether ``selector`` (matchLabels and matchExpressions) selects ``labels``."""
    if selector is None:
        return null_matches
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op = expr.get("key", ""), expr.get("operator", "")
        values = expr.get("values") or []
        if (
            (op == "In" and labels.get(key) not in values)
            or (op == "NotIn" and key in labels and labels[key] in values)
            or (op == "Exists" and key not in labels)
            or (op == "DoesNotExist" and key in labels)
        ):
            return False
    return True


def selector_error(selector: Mapping[str, Any] | None, where: str) -> str | None:
    """What makes ``selector`` invalid (metav1.LabelSelector's rules), if anything:
    In and NotIn need values, Exists and DoesNotExist take none."""
    if not isinstance(selector, Mapping):
        return None
    for i, expr in enumerate(selector.get("matchExpressions") or []):
        op, values = expr.get("operator"), expr.get("values") or []
        if op in ("In", "NotIn") and not values:
            return f"{where}.matchExpressions[{i}]: operator {op} needs at least one value"
        if op in ("Exists", "DoesNotExist") and values:
            return f"{where}.matchExpressions[{i}]: operator {op} takes no values"
    return None
