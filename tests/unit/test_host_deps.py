"""hack/host-deps.sh --check: what it finds missing and how it says so.

``--check`` never installs, so these run anywhere; the install path (apt-get
as root on Debian/Ubuntu) is what ``make host-deps`` runs on the CI machine.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "host-deps.sh"
COMMANDS = ["containerd", "ctr", "runc", "buildah", "podman", "mmdebstrap", "iptables", "ip", "gcc"]


def check(path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/bash", SCRIPT, "--check"],
        env={"PATH": path},
        capture_output=True,
        text=True,
        timeout=10,
    )


def missing(stderr: str) -> list[str]:
    found = re.fullmatch(r"error: missing host tools: ([^(]+) \(--check, .*\n", stderr)
    assert found is not None, stderr
    return found.group(1).split()


def test_missing_tools_are_named_in_one_line_with_the_packages(tmp_path: Path) -> None:
    done = check(str(tmp_path))  # an empty PATH: only sbin (always searched) may hold some
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    named = missing(done.stderr)
    assert {"containerd", "ctr", "buildah", "podman", "mmdebstrap"} <= set(named)
    install = re.search(r"apt-get install -y --no-install-recommends ([^;]+);", done.stderr)
    assert install is not None, done.stderr
    packages = install.group(1).split()
    assert {"containerd", "buildah", "podman", "mmdebstrap"} <= set(packages)
    assert len(packages) == len(set(packages)), "a package is named twice (containerd gives ctr)"


def test_nothing_is_said_when_the_commands_are_there(tmp_path: Path) -> None:
    for name in COMMANDS:
        (tmp_path / name).symlink_to("/bin/true")
    start = time.monotonic()
    done = check(str(tmp_path))
    elapsed = time.monotonic() - start
    assert elapsed < 1, f"{elapsed:.2f} s for a check that finds everything"
    if done.returncode == 0:
        assert (done.stdout, done.stderr) == ("", "")
    else:  # this host lacks what is looked up by path (CNI plugins, libc6-dev's headers)
        assert done.returncode == 1
        assert all(tool.startswith("/") for tool in missing(done.stderr)), done.stderr
