"""Structured logging for the operator.

Text for humans (``--log-format text``) or one JSON object per line for log
pipelines (``--log-format json``). Extra fields passed with ``extra=`` (the
maintenance, node, pod...) are kept in both forms, so
``kubectl logs ... | grep -i "maintenance\\|lease\\|drain"`` finds the story.
The JSON keys are zap's (``ts``, ``level``, ``logger``, ``msg``); ``ts`` is
ISO 8601 in milliseconds unless a zap time encoding is chosen
(``--zap-time-encoding``: ``epoch``, ``millis``, ``nanos``, ``iso8601``,
``rfc3339``, ``rfc3339nano``), written as zap writes it.

Text lines are one record each, whatever the record holds: control
characters, Unicode line separators and bidirectional overrides in the
message and in every field are written escaped (``\\n``, ``\\x1b``,
``\\u2028``), so a request's content (a review's ``userInfo.username``, a node
name, a header) cannot forge or hide log lines; a traceback keeps its lines.
JSON escapes them by itself.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(char: re.Match[str]) -> str:
    c = char.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def printable(text: str) -> str:
    """``text`` on one line: control and line-breaking characters escaped."""
    return _UNSAFE.sub(_escaped, text)


def _extras(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


def _timestamp(created: float, encoding: str | None) -> object:
    """``ts`` of one record in zap's ``encoding`` (None: nmo's ISO 8601, ms)."""
    when = datetime.fromtimestamp(created, UTC)
    if encoding == "epoch":
        return created
    if encoding == "millis":
        return created * 1000
    if encoding == "nanos":
        return int(created * 1_000_000_000)
    if encoding == "iso8601":
        return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"
    if encoding == "rfc3339":
        return when.strftime("%Y-%m-%dT%H:%M:%SZ")
    if encoding == "rfc3339nano":  # Go drops the fraction's trailing zeros
        fraction = f"{when.microsecond:06d}".rstrip("0")
        return when.strftime("%Y-%m-%dT%H:%M:%S") + (f".{fraction}" if fraction else "") + "Z"
    return when.isoformat(timespec="milliseconds")


class JsonFormatter(logging.Formatter):
    def __init__(self, time_encoding: str | None = None) -> None:
        super().__init__()
        self.time_encoding = time_encoding

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, object] = {
            "ts": _timestamp(record.created, self.time_encoding),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        data.update(_extras(record))
        if record.exc_info:
            data["error"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC).strftime("%H:%M:%S.%f")[:-3]
        extras = " ".join(f"{printable(k)}={printable(str(v))}" for k, v in _extras(record).items())
        line = f"{stamp} {record.levelname:<7} {record.name}: {printable(record.getMessage())}"
        if extras:
            line += f"  [{extras}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup(level: str = "info", fmt: str = "text", *, time_encoding: str | None = None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(time_encoding) if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpcore", "kr8s", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
