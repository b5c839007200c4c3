"""The Go NMO's command line, accepted by ``nmo run`` (issue 11 item 1).

Why this module exists: a cluster that swaps the Go operator's image for
nmo's keeps its Deployment or CSV, whose container runs ``/manager`` with Go
flags: ``--health-probe-bind-address=:8081``, ``--metrics-bind-address=:8443``,
``--leader-elect``, ``--enable-http2=false``, and controller-runtime's
``--zap-*`` logging flags. Go's ``flag`` package reads them differently from
argparse, so this module turns them into argparse's forms first and gives
their values nmo's meaning. Everything here is pure: no I/O.

What it guarantees, as Go's ``flag`` package and controller-runtime do:

* a Go flag may start with one dash or two (``-leader-elect``,
  ``--leader-elect``), and its value follows ``=`` or, for non-boolean flags,
  the next argument;
* a boolean flag alone means true; ``=`` takes ``1 0 t f T F true false TRUE
  FALSE True False`` (strconv.ParseBool) and nothing else;
* a bind address is ``[host]:port`` (``:8081``, ``0.0.0.0:8081``,
  ``127.0.0.1:8080``, ``[::]:8081``); an empty host means every interface;
  ``0`` turns the server off (an empty metrics address is controller-runtime's
  ``:8080``, an empty probe address is off);
* the ``--zap-*`` values are the ones controller-runtime accepts, case-
  insensitively; anything else fails with its message.

Unknown flags are left alone, so argparse still refuses them by name.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

BOOL_FLAGS: Final = frozenset({"leader-elect", "enable-http2", "zap-devel"})
VALUE_FLAGS: Final = frozenset(
    {
        "metrics-bind-address",
        "health-probe-bind-address",
        "zap-encoder",
        "zap-log-level",
        "zap-stacktrace-level",
        "zap-time-encoding",
        "kubeconfig",  # controller-runtime's config package registers it
    }
)
GO_FLAGS: Final = BOOL_FLAGS | VALUE_FLAGS

_TRUE: Final = frozenset({"1", "t", "T", "true", "TRUE", "True"})
_FALSE: Final = frozenset({"0", "f", "F", "false", "FALSE", "False"})
_FLAG = re.compile(r"^--?([a-z0-9][a-z0-9-]*)(?:=(.*))?$", re.DOTALL)

ZAP_ENCODERS: Final = {"json": "json", "console": "text"}
ZAP_LEVELS: Final = {"debug": "debug", "info": "info", "error": "error", "panic": "critical"}
ZAP_STACKTRACE_LEVELS: Final = frozenset({"info", "error", "panic"})
ZAP_TIME_ENCODINGS: Final = frozenset(
    {"rfc3339nano", "rfc3339", "iso8601", "millis", "nanos", "epoch"}
)


class GoFlagError(ValueError):
    """A Go flag with a value Go would refuse too; the message says which."""


def parse_bool(flag: str, value: str) -> bool:
    """``strconv.ParseBool``, with the ``flag`` package's message."""
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise GoFlagError(f'invalid boolean value "{value}" for -{flag}: parse error')


def normalize(argv: Sequence[str]) -> list[str]:
    """``nmo run``'s arguments with every Go flag in argparse's form.

    ``-leader-elect`` becomes ``--leader-elect``, ``--leader-elect=false``
    becomes ``--no-leader-elect``, ``-zap-log-level=debug`` becomes
    ``--zap-log-level=debug``. nmo's own flags, unknown flags and everything
    after ``--`` pass unchanged.
    """
    out: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--":
            return [*out, *argv[i:]]
        match = _FLAG.match(arg)
        name = match.group(1) if match else ""
        if match is None or name not in GO_FLAGS:
            out.append(arg)
            continue
        value = match.group(2)
        if name in BOOL_FLAGS and value is not None:
            out.append(f"--{name}" if parse_bool(name, value) else f"--no-{name}")
        elif value is not None:
            out.append(f"--{name}={value}")
        else:
            out.append(f"--{name}")
    return out


@dataclass(frozen=True)
class BindAddress:
    """Where one server listens; ``host`` ``""`` means every interface."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_bind_address(flag: str, value: str) -> BindAddress | None:
    """A Go bind address (``[host]:port``); None when the server is off (``0``)."""
    if value == "0" or (value == "" and flag == "health-probe-bind-address"):
        return None
    if value == "" and flag == "metrics-bind-address":
        value = ":8080"  # controller-runtime's metrics default for an empty address
    host, sep, port = value.rpartition(":")
    if not sep:
        raise GoFlagError(
            f"--{flag}={value}: missing port in address (want [host]:port, e.g. :8081, "
            f"0.0.0.0:8081, [::]:8081, or 0 to turn the server off)"
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise GoFlagError(
            f"--{flag}={value}: too many colons in address (write an IPv6 host in "
            f"brackets, e.g. [::]:8081)"
        )
    if not port.isdigit() or int(port) > 65535:
        raise GoFlagError(f'--{flag}={value}: invalid port "{port}" (want 0-65535)')
    return BindAddress(host=host, port=int(port))


@dataclass(frozen=True)
class ZapOptions:
    """controller-runtime's ``--zap-*`` flags as given (None: not given)."""

    devel: bool | None = None
    encoder: str | None = None
    log_level: str | None = None
    stacktrace_level: str | None = None
    time_encoding: str | None = None


@dataclass(frozen=True)
class LogChoice:
    """nmo's logging as the nmo and zap flags decide it."""

    level: str
    fmt: str
    time_encoding: str | None = None


def zap_log_level(value: str) -> str:
    """A ``--zap-log-level`` as a Python level name (any integer > 0 is debug)."""
    level = ZAP_LEVELS.get(value.lower())
    if level is not None:
        return level
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number > 0:
        return "debug"
    raise GoFlagError(f'--zap-log-level: invalid log level "{value}"')


def check_zap(zap: ZapOptions) -> None:
    """Refuse the values controller-runtime refuses, with its wording."""
    if zap.encoder is not None and zap.encoder.lower() not in ZAP_ENCODERS:
        raise GoFlagError(f'--zap-encoder: invalid encoder value "{zap.encoder}"')
    if zap.log_level is not None:
        zap_log_level(zap.log_level)
    stack, encoding = zap.stacktrace_level, zap.time_encoding
    if stack is not None and stack.lower() not in ZAP_STACKTRACE_LEVELS:
        raise GoFlagError(f'--zap-stacktrace-level: invalid stacktrace level "{stack}"')
    if encoding is not None and encoding.lower() not in ZAP_TIME_ENCODINGS:
        raise GoFlagError(f'--zap-time-encoding: invalid time-encoding value "{encoding}"')


def log_choice(zap: ZapOptions, *, level: str, fmt: str) -> LogChoice:
    """Logging from nmo's ``--log-level``/``--log-format`` and the zap flags.

    ``--zap-devel`` picks zap's mode defaults (true: console and debug; false:
    JSON and info) over nmo's own; ``--zap-encoder`` and ``--zap-log-level``
    win over both, as in controller-runtime.
    """
    check_zap(zap)
    if zap.devel is not None:
        level, fmt = ("debug", "text") if zap.devel else ("info", "json")
    if zap.encoder is not None:
        fmt = ZAP_ENCODERS[zap.encoder.lower()]
    if zap.log_level is not None:
        level = zap_log_level(zap.log_level)
    encoding = zap.time_encoding.lower() if zap.time_encoding is not None else None
    return LogChoice(level=level, fmt=fmt, time_encoding=encoding)
