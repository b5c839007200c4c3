"""The sandbox's state file: what runs where, readable by any later process.

``DIR/state.json`` is written (atomically) after every component start, so at
any moment it lists every process the sandbox owns, with the start time that
guards against recycled pids. ``up`` reads it to refuse a second sandbox in the
same directory, ``down`` to stop one started by another process, ``env`` to
print the kubeconfig and bin directory.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from contextlib import suppress
from typing import Any

from nmo_sandbox.components import COMPONENTS, Layout
from nmo_sandbox.errors import SandboxAlreadyRunningError, SandboxError, SandboxNotRunningError
from nmo_sandbox.process import ProcessRef, kill_groups

__all__ = [
    "STATE_VERSION",
    "kill_in_order",
    "process_refs",
    "read_state",
    "refuse_if_running",
    "remove_all",
    "write_state",
]

STATE_VERSION = 1


def write_state(layout: Layout, state: Mapping[str, Any]) -> None:
    """Replace ``state.json`` atomically (a reader never sees half a file)."""
    tmp = layout.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"version": STATE_VERSION, **state}, indent=2) + "\n")
    tmp.replace(layout.state_file)


def process_refs(state: Mapping[str, Any]) -> dict[str, ProcessRef]:
    """The recorded processes, by component name."""
    return {name: ProcessRef.from_json(c) for name, c in state.get("components", {}).items()}


def remove_all(layout: Layout) -> None:
    """Delete everything the sandbox wrote into its directory, and the directory if empty."""
    for path in layout.owned():
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    layout.state_file.with_suffix(".tmp").unlink(missing_ok=True)
    with suppress(OSError):
        layout.dir.rmdir()  # only if nothing else is left in it


def kill_in_order(refs: dict[str, ProcessRef], *, grace: float = 5.0) -> None:
    """Stop clients first, then the apiserver, then etcd.

    Killed together, the apiserver and etcd each wait on the other and take
    7-11 s to exit; in this order the whole stop takes about a second.
    """
    order = list(reversed(COMPONENTS))
    unknown = [ref for name, ref in refs.items() if name not in order]
    clients = [refs[n] for n in order[:3] if n in refs]
    for group in (unknown + clients, [refs.get("kube-apiserver")], [refs.get("etcd")]):
        kill_groups([ref for ref in group if ref is not None], grace=grace)


def read_state(layout: Layout) -> dict[str, Any]:
    """The parsed state file; :class:`SandboxNotRunningError` if there is none."""
    try:
        text = layout.state_file.read_text()
    except FileNotFoundError:
        raise SandboxNotRunningError(
            f"no sandbox in {layout.dir}: {layout.state_file.name} not found"
        ) from None
    try:
        state = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SandboxError(f"unreadable sandbox state {layout.state_file}: {exc}") from exc
    if not isinstance(state, dict):
        raise SandboxError(f"unreadable sandbox state {layout.state_file}")
    return state


def refuse_if_running(layout: Layout) -> None:
    """Raise :class:`SandboxAlreadyRunningError` if a recorded process is still alive."""
    try:
        state = read_state(layout)
    except SandboxNotRunningError:
        return
    except SandboxError:
        return  # a torn state file from a crash: its processes are unknowable
    running = {name: ref.pid for name, ref in process_refs(state).items() if ref.alive()}
    if running:
        pids = ", ".join(f"{n} pid {p}" for n, p in running.items())
        raise SandboxAlreadyRunningError(
            f"a sandbox is already running in {layout.dir} ({pids}, server "
            f"{state.get('server')}); stop it first with `nmo-sandbox down --dir {layout.dir}`"
        )
