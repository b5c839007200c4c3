"""Process plumbing for the sandbox: spawn, watch, measure and kill components.

Each component runs as the leader of its own process group
(``start_new_session=True``) with stdout and stderr in ``DIR/logs/<name>.log``,
so stopping it means signalling the group, which also reaches anything it
forked. A pid alone is not a safe handle across processes (``down`` runs in
another process, possibly much later): :class:`ProcessRef` pairs it with the
kernel's start time from ``/proc/<pid>/stat``, and nothing is signalled unless
both still match, so a recycled pid is never killed.

Killing is synchronous on purpose: it must also work from ``atexit`` and from a
signal handler, where no event loop can be relied on.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ProcessRef",
    "free_ports",
    "kill_groups",
    "log_tail",
    "rss_kib",
    "spawn",
]

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ProcessRef:
    """A pid plus the start time that proves it is still the same process."""

    pid: int
    start_time: int

    @classmethod
    def of(cls, pid: int) -> ProcessRef:
        return cls(pid=pid, start_time=_start_time(pid) or 0)

    def alive(self) -> bool:
        """True while the process exists, is not a zombie and is the one we started."""
        stat = _stat_fields(self.pid)
        if stat is None or stat[0] in ("Z", "X"):
            return False
        return int(stat[19]) == self.start_time

    def to_json(self) -> dict[str, int]:
        return {"pid": self.pid, "start_time": self.start_time}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcessRef:
        return cls(pid=int(data["pid"]), start_time=int(data["start_time"]))


def spawn(
    argv: Sequence[str],
    *,
    log_file: Path,
    env: Mapping[str, str] | None = None,
    die_with_parent: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session, appending its output to ``log_file``.

    With ``die_with_parent`` the kernel SIGKILLs the child when the spawning
    thread dies, so even a SIGKILLed test runner leaves nothing behind.
    """
    log_file.parent.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    with log_file.open("ab") as log:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,
            preexec_fn=_set_pdeathsig(os.getpid()) if die_with_parent else None,
        )


def kill_groups(refs: Iterable[ProcessRef], *, grace: float = 5.0) -> None:
    """SIGTERM each live process group, then SIGKILL what is left after ``grace`` s.

    Returns once every listed process is gone (or after a final short wait).
    """
    all_refs = list(refs)
    targets = [r for r in all_refs if r.alive()]
    for ref in targets:
        _signal_group(ref, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while targets and time.monotonic() < deadline:
        _reap(targets)
        targets = [r for r in targets if r.alive()]
        if targets:
            time.sleep(0.05)
    for ref in targets:
        _signal_group(ref, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while targets and time.monotonic() < deadline:
        _reap(targets)
        targets = [r for r in targets if r.alive()]
        if targets:
            time.sleep(0.05)
    _reap_all(all_refs)


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file ('' if it does not exist)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read()
    except FileNotFoundError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def rss_kib(pid: int) -> int | None:
    """Resident set size of ``pid`` in KiB (VmRSS), or None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 right now.

    All sockets stay bound until every port is picked, so the ports are
    distinct; another process may still grab one before the component binds
    it, which start-up reports as that component failing.
    """
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _signal_group(ref: ProcessRef, sig: signal.Signals) -> None:
    # Components are session leaders, so pgid == pid; fall back to the pid
    # alone if the group is already gone.
    try:
        os.killpg(ref.pid, sig)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(ref.pid, sig)
    except PermissionError:
        pass


def _reap(refs: Iterable[ProcessRef]) -> None:
    """Collect exit statuses of our own children so they stop being zombies."""
    for ref in refs:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(ref.pid, os.WNOHANG)


def _reap_all(refs: Iterable[ProcessRef], timeout: float = 2.0) -> None:
    """Wait for our own dead children so none is left a zombie.

    A multi-threaded process shows as a zombie as soon as its main thread
    exits but can only be reaped once every thread is gone, hence the loop.
    """
    pending = list(refs)
    deadline = time.monotonic() + timeout
    while pending:
        still = []
        for ref in pending:
            try:
                pid, _ = os.waitpid(ref.pid, os.WNOHANG)
            except ChildProcessError:
                continue  # not our child (down from another process) or reaped
            if pid == 0:
                still.append(ref)
        pending = still
        if not pending or time.monotonic() > deadline:
            return
        time.sleep(0.02)


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state is index 0)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces.
    return raw[raw.rfind(")") + 2 :].split()


def _start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def _set_pdeathsig(parent_pid: int) -> Any:
    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The parent may have died between fork and prctl.
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


async def run_command(
    argv: Sequence[str],
    *,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """Run a command to completion and capture its output; killed on timeout or cancel."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env) if env is not None else None,
        cwd=cwd,
    )
    try:
        out, err = await asyncio.wait_for(
            proc.communicate(input.encode() if input is not None else None), timeout
        )
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    return subprocess.CompletedProcess(
        list(argv), proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")
    )
