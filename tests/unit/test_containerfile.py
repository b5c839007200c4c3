"""The Containerfile, read as text: what the image is built from and what it ships.

No image is built here (tests/integration/test_image.py builds and runs
one); these checks pin what the text promises on every base: a base pinned
by digest and swappable by one build argument, every pip download
hash-checked, no installer left in the images that run, and both runnable
images non-root. ``make pin-base-image`` is run against a stand-in skopeo.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


@dataclass
class Stage:
    base: str
    name: str = ""
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARGs and the stages, continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            parts = rest.split()
            stages.append(Stage(parts[0], parts[2] if len(parts) > 2 else ""))
        elif stages:
            stages[-1].instructions.append((keyword, rest))
        elif keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default
    return args, stages


ARGS, STAGES = parse((ROOT / "Containerfile").read_text())
BY_NAME = {s.name: s for s in STAGES if s.name}
FINAL = STAGES[-1]
RUNNABLE = [BY_NAME["must-gather"], FINAL]


def registry_bases() -> list[str]:
    """Each FROM that is not an earlier stage, with ARGs expanded."""
    out = []
    for stage in STAGES:
        base = re.sub(r"\$\{(\w+)\}", lambda m: ARGS[m.group(1)], stage.base)
        if base not in BY_NAME:
            out.append(base)
    return out


def test_one_build_argument_names_every_base() -> None:
    """``--build-arg BASE_IMAGE=...`` (make image's Debian-built base) swaps all of them."""
    assert set(ARGS) == {"BASE_IMAGE"}
    for stage in STAGES:
        assert stage.base in BY_NAME or stage.base == "${BASE_IMAGE}", stage.base
    assert [s.base for s in STAGES].count("${BASE_IMAGE}") == 2  # build and runtime-base


def test_the_pip_ca_is_an_optional_secret_never_stored() -> None:
    """A private CA reaches pip as a build secret, mounted for one step; no build needs it."""
    runs = [cmd for stage in STAGES for cmd in stage.args("RUN")]
    mounts = [m for cmd in runs for m in re.findall(r"--mount=(\S+)", cmd)]
    assert mounts == ["type=secret,id=pipcert"], mounts  # not required=true
    (step,) = [cmd for cmd in runs if "--mount=" in cmd]
    assert "if [ -f /run/secrets/pipcert ]; then export PIP_CERT=/run/secrets/pipcert; fi" in step
    assert "--require-hashes" in step  # the downloading step is the one that gets it
    stored = [
        rest for stage in STAGES for kw, rest in stage.instructions if kw in {"ENV", "COPY", "ADD"}
    ]
    assert not [i for i in stored if "pipcert" in i or "PIP_CERT" in i or ".crt" in i], stored


def test_every_base_image_is_pinned_by_digest() -> None:
    bases = registry_bases()
    assert bases, "no registry base image found"
    for base in bases:
        assert DIGEST.search(base), f"{base} is not pinned by digest"
        assert ":" in base.split("@")[0].rsplit("/", 1)[-1], f"{base} names no tag"


def _pip_installs() -> list[str]:
    runs = [cmd for stage in STAGES for cmd in stage.args("RUN")]
    return [
        part.strip()
        for cmd in runs
        for part in cmd.split("&&")
        if re.search(r"\bpip\b.*\binstall\b", part) and "uninstall" not in part
    ]


def test_every_pip_install_is_hash_checked_or_offline() -> None:
    installs = _pip_installs()
    assert len(installs) >= 3
    for cmd in installs:
        assert "--require-hashes" in cmd or "--no-index" in cmd, cmd
        if "--require-hashes" in cmd:
            assert "--only-binary=:all:" in cmd, f"{cmd}: an sdist would run a build unhashed"
            lock = re.search(r"-r (\S+)", cmd)
            assert lock is not None and (ROOT / lock.group(1)).is_file(), cmd
    assert not any("--constraint" in c or " -c " in c for c in installs)


def _lock(name: str) -> dict[str, tuple[str, list[str]]]:
    text = (ROOT / name).read_text().replace("\\\n", " ")
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        spec, *rest = line.split()
        pkg, _, version = spec.partition("==")
        hashes = [r.removeprefix("--hash=sha256:") for r in rest]
        assert version, f"{name}: {spec} is not pinned"
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), spec
        out[_norm(pkg)] = (version, hashes)
    return out


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.parametrize("name", ["requirements-image.lock", "requirements-build.lock"])
def test_locks_pin_every_package_with_hashes(name: str) -> None:
    assert _lock(name)


def test_image_lock_matches_the_project() -> None:
    """Every runtime dependency is in the image lock, at requirements.lock's version."""
    image = _lock("requirements-image.lock")
    dev: dict[str, str] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if "==" in line:
            pkg, _, version = line.strip().partition("==")
            dev[_norm(pkg)] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for dep in project["project"]["dependencies"]:
        pkg = _norm(re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0])
        assert pkg in image, f"{pkg} missing from requirements-image.lock (make lock-image)"
    for pkg, (version, _) in image.items():
        assert dev.get(pkg) == version, f"{pkg}: image {version}, requirements.lock {dev.get(pkg)}"
    assert "pip" not in image and "setuptools" not in image


def test_runnable_images_carry_no_installer() -> None:
    base = BY_NAME["runtime-base"]
    removal = " ".join(base.args("RUN"))
    # python:3.11-slim: pip, setuptools and wheel under /usr/local; Debian's
    # python3.11-venv: ensurepip in the stdlib and its wheels in /usr/share.
    assert re.search(r"pip uninstall --yes pip setuptools wheel", removal)
    assert 'sysconfig.get_path("stdlib"))\')/ensurepip"' in removal
    assert "/usr/share/python-wheels" in removal
    # and the build fails if the interpreter can still import any of them
    check = re.search(r"for m in \(([^)]*)\) if u\.find_spec\(m\)\]; sys\.exit\(", removal)
    assert check is not None, removal
    assert set(re.findall(r'"(\w+)"', check.group(1))) == {
        "pip",
        "setuptools",
        "wheel",
        "ensurepip",
    }
    for stage in RUNNABLE:
        assert stage.base == "runtime-base"
    build = " ".join(BY_NAME["build"].args("RUN"))
    assert "venv --without-pip /opt/nmo" in build
    copies = [c.split() for s in (base, *RUNNABLE) for c in s.args("COPY")]
    staged = [c for c in copies if c[0].startswith("--from=")]
    assert ["--from=build", "/opt/nmo", "/opt/nmo"] in staged
    for copy in staged:  # only the venv (or a file of it) comes from the build stage
        assert copy[0] == "--from=build" and copy[1].startswith("/opt/nmo"), copy


@pytest.mark.parametrize("stage", RUNNABLE, ids=lambda s: s.name or "runtime")
def test_runnable_images_run_as_a_numeric_non_root_user(stage: Stage) -> None:
    users = stage.args("USER")
    assert users, f"{stage.name or 'runtime'} has no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, users[-1]
    assert not gid or (gid.isdigit() and int(gid) != 0), users[-1]
    last_user = max(i for i, (kw, _) in enumerate(stage.instructions) if kw == "USER")
    assert all(kw != "RUN" for kw, _ in stage.instructions[last_user:]), "RUN after USER"


def test_pin_base_image_rewrites_the_base_image_argument(tmp_path: Path) -> None:
    """hack/pin-base-image.sh pins BASE_IMAGE to the digest of what the registry serves."""
    (tmp_path / "hack").mkdir()
    shutil.copy(ROOT / "hack" / "pin-base-image.sh", tmp_path / "hack")
    shutil.copy(ROOT / "Containerfile", tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    manifest = b'{"manifests": []}'
    skopeo = bin_dir / "skopeo"  # `skopeo inspect --raw docker://REF` prints the index
    skopeo.write_text(f"#!/bin/sh\nprintf '%s' '{manifest.decode()}'\n")
    skopeo.chmod(0o755)
    done = subprocess.run(
        [tmp_path / "hack" / "pin-base-image.sh"],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    digest = hashlib.sha256(manifest).hexdigest()
    tag_ref = ARGS["BASE_IMAGE"].split("@")[0]
    assert done.stdout.strip() == f"{tag_ref} -> sha256:{digest}"
    args, _ = parse((tmp_path / "Containerfile").read_text())
    assert args == {"BASE_IMAGE": f"{tag_ref}@sha256:{digest}"}
