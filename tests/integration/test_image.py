"""nmo's image, built by ``hack/image.sh`` (``make image``) and run with podman.

The Containerfile's promises checked on the image itself, not on its text
(tests/unit/test_containerfile.py reads the text): the entry points work,
the operator runs as UID 65532 with a read-only root filesystem, and as
any UID in group 0 (OpenShift's restricted-v2 SCC) with a read-only root and
no /tmp (the Go CSV), nothing in
it can install packages (no pip, setuptools, wheel or ensurepip, for the
venv's interpreter nor the base's), the virtualenv holds exactly the image
lock plus nmo, and none of the development tooling (``nmo_sandbox``, the
demo) is in it. The build is reused when its inputs are unchanged, so this
takes seconds after ``make image``.

podman runs as this machine needs (``sandbox.md``): runc, rlimits no higher
than the machine allows, and no network.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

import nmo

ROOT = Path(__file__).resolve().parents[2]
IMAGE_SH = ROOT / "hack" / "image.sh"
LABEL = "io.github.nmo.inputs"

# A cold build (Debian base from mmdebstrap, then the image) takes minutes.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def image() -> str:
    """The ref of the image, built or found current by hack/image.sh."""
    missing = [tool for tool in ("buildah", "podman") if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not found: run `make host-deps` "
            f"(Debian/Ubuntu: apt-get install {' '.join(missing)})",
            pytrace=False,
        )
    built = subprocess.run([IMAGE_SH], capture_output=True, text=True, check=False)
    if built.returncode != 0:
        pytest.fail(f"hack/image.sh failed:\n{built.stderr[-4000:]}", pytrace=False)
    ref = subprocess.run(
        [IMAGE_SH, "--print-ref"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert ref == "localhost/nmo:dev"
    return ref


def podman_run(
    image: str, *args: str, entrypoint: str | None = None, options: tuple[str, ...] = ()
) -> str:
    """Run the image as the chart does (read-only root), return stdout; fail on exit != 0."""
    cmd = [
        "podman", "run", "--rm", "--runtime", "runc", "--network", "none",
        "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
        "--read-only", *options,
    ]  # fmt: skip
    if entrypoint is not None:
        cmd += ["--entrypoint", entrypoint]
    done = subprocess.run([*cmd, image, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{done.stderr}"
    return done.stdout


# Run inside the image by the venv's interpreter: what it can import and do.
PROBE = r"""
import importlib.metadata as md, importlib.util as u, json, os, subprocess

def write(path):
    try:
        open(path, "w").close()
        return "written"
    except OSError as e:
        return e.strerror

system = subprocess.run(
    ["python3.11", "-c", "import importlib.util as u, json; print(json.dumps("
     "{m: u.find_spec(m) is not None for m in ('pip', 'setuptools', 'wheel', 'ensurepip')}))"],
    capture_output=True, text=True, check=True,
)
nmo = md.distribution("nmo")
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(),
    "venv": {m: u.find_spec(m) is not None
             for m in ("pip", "setuptools", "wheel", "ensurepip", "nmo_sandbox", "nmo")},
    "system": json.loads(system.stdout),
    "python_wheels": os.path.exists("/usr/share/python-wheels"),
    "pip_cert_secret": os.path.exists("/run/secrets/pipcert"),
    "dists": sorted(d.metadata["Name"] for d in md.distributions()),
    "nmo_top": sorted({f.parts[0] for f in nmo.files or [] if f.parts[0] != ".."}),
    "write_root": write("/opt/nmo/probe"), "write_etc": write("/etc/probe"),
}))
"""


# Run as restricted-v2 runs a pod: a UID from the namespace's range, group 0;
# with the Go CSV's read-only root and no volume at /tmp.
ARBITRARY_USER = ("--user", "1000650000:0", "--read-only-tmpfs=false")
ARBITRARY_PROBE = r"""
import json, os, pkgutil, importlib
from pathlib import Path
import nmo
from nmo.cli.defaults import temporary_directory

files = [Path("/manager"), *(p for p in Path("/opt/nmo").rglob("*") if p.is_file())]
modules = [m.name for m in pkgutil.walk_packages(nmo.__path__, "nmo.")
           if not m.name.endswith(".__main__")]  # it runs nmo
for name in modules:
    importlib.import_module(name)
tmp = temporary_directory()
from nmo.server.servers import private_dir
from nmo.server.tls import ReloadingCertificate, write_self_signed
cert_dir = private_dir("nmo-metrics-cert-")
write_self_signed(cert_dir, ["localhost"])
ReloadingCertificate(cert_dir).load()  # the metrics server's start
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(),
    "files": len(files), "unreadable": [str(p) for p in files if not os.access(p, os.R_OK)],
    "not_executable": [str(p) for p in files  # executable by its owner, not by us
                       if p.stat().st_mode & 0o100 and not os.access(p, os.X_OK)],
    "modules": len(modules), "tmp": tmp, "cert_dir": str(cert_dir.parent),
}))
"""


RUNS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "version": (None, ("version",)),
    "help": (None, ("--help",)),
    "crd": (None, ("crd",)),
    "manager": ("/manager", ("--help",)),
    # A pod spec written for the Go NMO's image gives only args: they run the operator.
    "go-args": (None, ("--leader-elect", "--help")),
    "probe": ("/opt/nmo/bin/python", ("-c", PROBE)),
}


@pytest.fixture(scope="module")
def out(image: str) -> dict[str, str]:
    """The stdout of each of RUNS, two at a time (each start costs a second or more)."""
    with ThreadPoolExecutor(2) as pool:  # two cores; podman serialises on its store anyway
        futures = {
            name: pool.submit(podman_run, image, *args, entrypoint=entrypoint)
            for name, (entrypoint, args) in RUNS.items()
        }
        return {name: future.result() for name, future in futures.items()}


@pytest.fixture(scope="module")
def facts(out: dict[str, str]) -> dict[str, Any]:
    probed: dict[str, Any] = json.loads(out["probe"])
    return probed


def test_a_second_build_with_the_same_inputs_is_skipped(image: str) -> None:
    again = subprocess.run([IMAGE_SH], capture_output=True, text=True, check=True, timeout=60)
    label = subprocess.run(
        ["podman", "image", "inspect", "--format", f'{{{{index .Labels "{LABEL}"}}}}', image],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert re.fullmatch(r"[0-9a-f]{16}", label), label
    assert again.stdout.strip() == f"image {image} is current (inputs {label})"


def test_entry_points(out: dict[str, str]) -> None:
    assert out["version"].strip() == f"nmo {nmo.__version__}"
    assert "--in-cluster" in out["manager"] and "--leader-elect" in out["manager"]
    go_args = out["go-args"]  # args alone run the operator, as /manager does
    assert "--in-cluster" in go_args and "--leader-elect" in go_args, go_args


def test_the_cli_is_the_operator_and_its_tools_only(out: dict[str, str]) -> None:
    commands = re.search(r"\{([a-z,]+)\}", out["help"])
    assert commands is not None, out["help"]
    assert set(commands.group(1).split(",")) == {
        "run", "gather", "cleanup", "status", "plan", "crd", "version",
    }  # fmt: skip
    assert "sandbox" not in out["help"] and "demo" not in out["help"]


def test_crd_prints_on_a_read_only_root(out: dict[str, str]) -> None:
    crd = yaml.safe_load(out["crd"])
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == "nodemaintenances.nodemaintenance.medik8s.io"


def test_runs_as_65532_on_a_read_only_root(facts: dict[str, Any]) -> None:
    assert (facts["uid"], facts["gid"]) == (65532, 65532)
    assert facts["write_root"] == "Read-only file system"
    assert facts["write_etc"] == "Read-only file system"


def test_nothing_can_install_packages(facts: dict[str, Any]) -> None:
    for interpreter in ("venv", "system"):
        present = [m for m in ("pip", "setuptools", "wheel", "ensurepip") if facts[interpreter][m]]
        assert not present, f"{interpreter} python3.11 can import {present}"
    assert not facts["python_wheels"], (
        "/usr/share/python-wheels (ensurepip's wheels) is in the image"
    )
    assert not facts["pip_cert_secret"], "the build's pip CA secret was stored in the image"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_venv_holds_the_image_lock_and_nmo_only(facts: dict[str, Any]) -> None:
    lock = {
        _norm(line.split("==")[0])
        for line in (ROOT / "requirements-image.lock").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    assert {_norm(d) for d in facts["dists"]} == lock | {"nmo"}
    assert not facts["venv"]["nmo_sandbox"], "nmo_sandbox is importable in the image"
    assert facts["venv"]["nmo"]
    assert facts["nmo_top"] == ["nmo", f"nmo-{nmo.__version__}.dist-info"]


def test_an_arbitrary_user_in_group_0_runs_it_without_tmp(image: str) -> None:
    """OpenShift's restricted-v2 runs the pod as a UID of the namespace's range
    in group 0: every file is readable (and the entry points executable) by
    it, every module imports, and with the Go CSV's read-only root and no /tmp
    the certificates load from /dev/shm."""
    facts = json.loads(
        podman_run(image, "-c", ARBITRARY_PROBE, entrypoint="/opt/nmo/bin/python",
                   options=ARBITRARY_USER)
    )  # fmt: skip
    assert (facts["uid"], facts["gid"]) == (1000650000, 0)
    assert facts["files"] > 1000 and facts["unreadable"] == [], facts["unreadable"][:10]
    assert facts["not_executable"] == []  # /manager, nmo, python and the rest
    assert facts["modules"] > 50
    assert facts["tmp"][0] == "/dev/shm" and "No usable temporary directory" in facts["tmp"][1]
    assert facts["cert_dir"] == "/dev/shm"
    assert "--leader-elect" in podman_run(
        image, "--help", entrypoint="/manager", options=ARBITRARY_USER
    )
