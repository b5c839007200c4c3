"""Credentials out of a must-gather bundle: redaction by name and by shape.

A bundle is handed to people outside the cluster. Names alone miss too much
(``MYSQL_ROOT_PW``, ``--db-pw=...``, ``mysql -p x``, ``?sig=...`` in a
presigned URL), so every value is judged by the *name* it goes with, in every
form a name takes:

* object keys and env entries (``{"name": ..., "value": ...}``);
* flags: ``--flag=value``, ``--flag value``, ``-flag value`` (Go's single
  dash), in argument lists and in text, and ``-p value`` (mysql's password);
* ``name=value`` and ``name: value`` pairs in text (env dumps, YAML, JSON,
  logfmt);
* URL query parameters (``?sig=``, ``&access_token=``) and URL user info
  (``scheme://user:password@host``, ``https://token@host``: all of it).

A name is secret when one of its words (split at ``-``, ``_``, ``.`` and
camelCase) contains password, passwd, passphrase, passcode, secret, token or
credential, or is (or ends with) pass, pw, pwd or key, or is sig, signature
or creds, or is the last and auth or authorization (:func:`secret_name`). Words, not substrings, for
the short ones: ``signal``, ``design``, ``passed`` and ``bypass`` are not
secrets. A name that names where a secret is or what it is called
(``secretName``, ``tokenSecretRef``, ``--tls-key-file``, a taint's ``key``)
is kept, and so is ``PWD`` (the working directory).

Shapes need no name: PEM blocks, JWTs, bearer tokens and long random-looking
hex or base64 strings.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "<redacted>"

_CONTAINS = ("password", "passwd", "passphrase", "passcode", "secret", "token", "credential")
_ENDS = ("pass", "pw", "pwd", "key")
_IS = frozenset({"sig", "sigs", "signature", "signatures", "creds"})
_LAST = frozenset({"auth", "authorization"})  # BASIC_AUTH, not --authorization-mode
# Words that end like a secret and are none.
_NOT = frozenset({"bypass", "compass", "surpass", "overpass", "underpass", "trespass"})
# Where a secret is, or what it is called: not the secret.
_NAMES_A_THING = re.compile(
    r"(name|ref|path|file|dir|expirationseconds|audience)s?$|^(keys?|pwd|oldpwd)$", re.IGNORECASE
)
_WORD = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


def secret_name(name: str) -> bool:
    """Whether a value going with ``name`` (a key, an env name, a flag) is a secret."""
    bare = name.strip().lstrip("-")
    if not bare or _NAMES_A_THING.search(bare):
        return False
    words = [w.lower() for w in _WORD.split(bare) if w]
    if words and words[-1] in _LAST:
        return True
    for word in words:
        if word in _NOT:
            continue
        if word in _IS or word.endswith(_ENDS) or any(part in word for part in _CONTAINS):
            return True
    return False


def secret_flag(flag: str) -> bool:
    """``-p`` (mysql's password) or a flag with a secret name: ``--db-pw``, ``-token``."""
    if _FLAG.fullmatch(flag) is None:
        return False
    return flag == "-p" or secret_name(flag)


_FLAG = re.compile(r"--?[A-Za-z][A-Za-z0-9_.-]*")
_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]+-----.*?(?:-----END [A-Z0-9 ]+-----|$)", re.DOTALL)
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/?#@\"'<>]+@")
_QUERY = re.compile(r"([?&])([A-Za-z0-9_.\[\]-]+)=([^&#\s\"'<>]*)")
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}")
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}")
# A value: quoted (escapes included) or a bare word.
_VALUE = r"(\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*'|[^\s\"',;}]+)"
# --flag=value, --flag value, -flag value (not a following flag)
_FLAG_VALUE = re.compile(r"(?<![\w.-])(--?[A-Za-z][A-Za-z0-9_.-]*)(=|[ \t]+)(?!-)" + _VALUE)
# name=value, name: value, "name": "value" (a name after ? or & is a query's, done before)
_PAIR = re.compile(r"(?<![\w.?&-])([\"']?)([A-Za-z_][A-Za-z0-9_.-]*)\1([ \t]*[=:][ \t]*)" + _VALUE)
_BLOB = re.compile(r"(?<![A-Za-z0-9+/_:-])[A-Za-z0-9+/_-]{40,}={0,2}")
_HEX = re.compile(r"(?<![0-9A-Za-z:])[0-9a-fA-F]{32,}(?![0-9A-Za-z])")


def _query(match: re.Match[str]) -> str:
    if not match.group(3) or not secret_name(match.group(2)):
        return match.group(0)
    return f"{match.group(1)}{match.group(2)}={REDACTED}"


def _hidden(value: str) -> str:
    """A value's replacement: its quotes kept, an empty one left empty."""
    quote = value[0] if value[:1] in ("'", '"') and len(value) > 1 else ""
    if value in (REDACTED, quote * 2):
        return value
    return f"{quote}{REDACTED}{quote}"


def _flag_value(match: re.Match[str]) -> str:
    if not secret_flag(match.group(1)):
        return match.group(0)
    return match.group(1) + match.group(2) + _hidden(match.group(3))


def _pair(match: re.Match[str]) -> str:
    if not secret_name(match.group(2)):
        return match.group(0)
    return match.group(0)[: match.start(4) - match.start(0)] + _hidden(match.group(4))


def _blob(match: re.Match[str]) -> str:
    """A long run of base64 with upper, lower and digits looks random: a key,
    not a path or a name (which are lowercase or carry separators)."""
    text = match.group(0)
    mixed = any(ch.isupper() for ch in text) and any(ch.islower() for ch in text)
    return REDACTED if mixed and any(ch.isdigit() for ch in text) else text


def redact_text(text: str) -> str:
    """Scrub credentials from free text (logs, events, summaries), by name and by shape."""
    text = _PEM.sub(REDACTED, text)
    text = _USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", text)
    text = _QUERY.sub(_query, text)
    text = _JWT.sub(REDACTED, text)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    text = _FLAG_VALUE.sub(_flag_value, text)
    text = _PAIR.sub(_pair, text)
    text = _HEX.sub(REDACTED, text)
    return _BLOB.sub(_blob, text)


def redact(value: Any, *, _key: str = "") -> Any:
    """A copy of a collected object with credentials replaced by ``<redacted>``.

    ``metadata.managedFields`` is dropped too: it is bulky and says nothing a
    reader of the bundle needs.
    """
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        env_like = isinstance(value.get("name"), str) and "value" in value
        for k, v in value.items():
            if k == "managedFields":
                continue
            if isinstance(v, str) and secret_name(str(k)):
                out[k] = REDACTED if v else v
            elif k == "value" and env_like and secret_name(str(value["name"])) and v:
                out[k] = REDACTED
            else:
                out[k] = redact(v, _key=str(k))
        return out
    if isinstance(value, list):
        items = [redact(v, _key=_key) for v in value]
        # ["--token", "abc"], ["-p", "x"]: the argument after a secret flag is its value
        for i in range(1, len(items)):
            before, this = value[i - 1], items[i]
            flag = isinstance(before, str) and secret_flag(before)
            if flag and isinstance(this, str) and not this.startswith("-"):
                items[i] = REDACTED
        return items
    if isinstance(value, str):
        return _redact_string(value)
    return value


def _redact_string(text: str) -> str:
    """JSON embedded in a string (last-applied-configuration) is redacted as an object."""
    if text[:1] in "{[":
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict | list):
            return json.dumps(redact(parsed), separators=(",", ":"))
    return redact_text(text)
