"""Internal errors as a caller sees them: a reference, never the exception text.

The webhook, probe and metrics ports answer callers nmo does not trust (any
pod that can reach them). An unexpected exception's text can name files,
hosts, tokens or object contents, so it goes to the operator log only, with
a short random reference; the answer carries the same reference, so a
support case can find the log line without the caller learning the detail.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any


def report(log: logging.Logger, what: str, **extra: Any) -> str:
    """Log the exception being handled under a new reference; the text for the caller.

    Call from an ``except`` block: the traceback is logged with the reference.
    """
    ref = secrets.token_hex(6)
    log.error("%s (ref %s)", what, ref, exc_info=True, extra={**extra, "ref": ref})
    return f"internal error (ref {ref}); the details are in the operator log"
