"""metav1.LabelSelector matching, as pure functions.

Used by the webhook's etcd quorum check (which guard pod a PDB selects) and by
``nmo gather`` (which PDBs cover pods under maintenance). An empty selector
matches every pod; what a *null* selector means depends on the caller, so it
is a parameter.

:func:`parse_selector` reads kubectl's ``-l`` syntax (``app=web,tier!=db,
env in (a,b),!legacy``) into a metav1.LabelSelector, for the commands that
take a ``--pod-selector``.
"""

from __future__ import annotations

import re
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
    expressions = selector.get("matchExpressions") or []
    if not isinstance(expressions, list):
        return f"{where}.matchExpressions must be a list"
    for i, expr in enumerate(expressions):
        if not isinstance(expr, Mapping):
            return f"{where}.matchExpressions[{i}] must be an object"
        op, values = expr.get("operator"), expr.get("values") or []
        if op in ("In", "NotIn") and not values:
            return f"{where}.matchExpressions[{i}]: operator {op} needs at least one value"
        if op in ("Exists", "DoesNotExist") and values:
            return f"{where}.matchExpressions[{i}]: operator {op} takes no values"
    return None


# A label key (optional DNS-subdomain prefix and a name) and a label value.
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY = re.compile(rf"([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME}")
_VALUE = re.compile(rf"({_NAME})?")
_SET = re.compile(r"(?P<key>[^\s!=(),]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)")


def _split_terms(text: str) -> list[str]:
    """Split on the commas outside parentheses."""
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return [t.strip() for t in terms]


def _key(key: str, term: str) -> str:
    if not _KEY.fullmatch(key):
        raise ValueError(f"{term!r}: {key!r} is not a valid label key")
    return key


def _value(value: str, term: str) -> str:
    if not _VALUE.fullmatch(value):
        raise ValueError(f"{term!r}: {value!r} is not a valid label value")
    return value


def parse_selector(text: str) -> dict[str, Any]:
    """A label selector in kubectl's syntax as a metav1.LabelSelector; raises ValueError.

    ``k=v`` and ``k==v`` become matchLabels; ``k!=v`` NotIn, ``k in (a,b)``
    In, ``k notin (a,b)`` NotIn, ``k`` Exists and ``!k`` DoesNotExist.
    """
    labels: dict[str, str] = {}
    expressions: list[dict[str, Any]] = []
    if not text.strip():
        raise ValueError("the selector is empty")
    for term in _split_terms(text):
        if not term:
            raise ValueError(f"{text!r}: empty requirement")
        if m := _SET.fullmatch(term):
            values = [v.strip() for v in m["values"].split(",")]
            if not any(values):
                raise ValueError(f"{term!r}: {m['op']} needs at least one value")
            op = "In" if m["op"] == "in" else "NotIn"
            expressions.append(
                {
                    "key": _key(m["key"], term),
                    "operator": op,
                    "values": [_value(v, term) for v in values],
                }
            )
        elif "!=" in term:
            key, _, value = term.partition("!=")
            expressions.append(
                {
                    "key": _key(key.strip(), term),
                    "operator": "NotIn",
                    "values": [_value(value.strip(), term)],
                }
            )
        elif "=" in term:
            key, _, value = term.replace("==", "=", 1).partition("=")
            key, value = _key(key.strip(), term), _value(value.strip(), term)
            if labels.get(key, value) != value:
                raise ValueError(f"{text!r}: {key} cannot equal two values")
            labels[key] = value
        elif term.startswith("!"):
            expressions.append({"key": _key(term[1:].strip(), term), "operator": "DoesNotExist"})
        else:
            expressions.append({"key": _key(term, term), "operator": "Exists"})
    selector: dict[str, Any] = {}
    if labels:
        selector["matchLabels"] = labels
    if expressions:
        selector["matchExpressions"] = expressions
    return selector


def format_selector(selector: Mapping[str, Any] | None) -> str:
    """A metav1.LabelSelector in kubectl's syntax (for display)."""
    if selector is None:
        return "<none>"
    terms = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op = expr.get("key", ""), expr.get("operator", "")
        values = ",".join(expr.get("values") or [])
        terms.append(
            {
                "In": f"{key} in ({values})",
                "NotIn": f"{key} notin ({values})",
                "Exists": key,
                "DoesNotExist": f"!{key}",
            }.get(op, f"{key} {op} ({values})")
        )
    return ",".join(terms) or "<everything>"
