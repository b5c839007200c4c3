"""The sandbox's own errors, so callers (the CLI, fixtures) can tell them apart.

::

    SandboxError                      anything the sandbox could not do
    ├── MissingBinariesError          a cached binary is missing: run `make sandbox-bin`
    ├── SandboxAlreadyRunningError    `up` on a directory whose sandbox is alive
    ├── SandboxNotRunningError        `down`/`env` on a directory without state.json
    └── ComponentError                a component exited or missed its deadline;
                                      the message ends with the tail of its log
"""

from __future__ import annotations

__all__ = [
    "ComponentError",
    "MissingBinariesError",
    "SandboxAlreadyRunningError",
    "SandboxError",
    "SandboxNotRunningError",
]


class SandboxError(RuntimeError):
    """The sandbox could not be started, stopped or found."""


class MissingBinariesError(SandboxError):
    """A sandbox binary (or kwok's stage sets) is not in the cache."""


class SandboxAlreadyRunningError(SandboxError):
    """``DIR`` already holds a running sandbox."""


class SandboxNotRunningError(SandboxError):
    """``DIR`` holds no sandbox state (nothing to stop or describe)."""


class ComponentError(SandboxError):
    """A component exited or did not get ready; the message ends with its log tail."""

    def __init__(self, component: str, problem: str, tail: str) -> None:
        self.component = component
        self.tail = tail
        super().__init__(f"{problem}\n--- last lines of {component}'s log ---\n{tail}")
