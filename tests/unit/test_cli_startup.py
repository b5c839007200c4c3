"""Commands start fast: each imports only what it uses (issue 21 item 6).

Every probe runs a real command in a fresh interpreter under ``python -X
importtime``, which names every module the process imports, whenever it
imports it; the test then looks for the libraries the command must not load.
``nmo version`` and ``nmo --help`` print text, so they load no client, server
or model library, and none of nmo's rooms but the CLI's flags; ``kubectl nm``
and ``nmo status`` talk to the API, so they may load the client, but never
the HTTP server. The last test shows the probe sees a heavy import when
there is one, so an eager import added anywhere fails here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nmo.api.models import OnTimeout
from nmo.cli.flags import ON_TIMEOUT

# What printing text never needs: the API client, the HTTP stack, the models,
# the metrics, YAML and the console renderer.
HEAVY = frozenset(
    {
        "kr8s",
        "httpx",
        "fastapi",
        "starlette",
        "uvicorn",
        "pydantic",
        "prometheus_client",
        "yaml",
        "rich",
    }
)
SERVER = frozenset({"fastapi", "starlette", "uvicorn", "nmo.server"})
ROOMS = frozenset(
    {"nmo.kube", "nmo.controller", "nmo.server", "nmo.webhooks", "nmo.ops", "nmo.telemetry"}
)


def imports(*args: str, env: dict[str, str] | None = None) -> tuple[set[str], str, int]:
    """Every module ``python -X importtime <args>`` imported, its stdout and exit code."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    modules = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":  # the header line
                modules.add(name)
    assert modules, f"no import was reported:\n{done.stderr[-2000:]}"
    return modules, done.stdout, done.returncode


def found(modules: set[str], forbidden: frozenset[str]) -> list[str]:
    """The modules that are, or are inside, one of ``forbidden``."""
    return sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in forbidden))


def plugin(*argv: str) -> list[str]:
    """``kubectl-nm <argv>`` as its console script runs it."""
    code = f"import sys; from nmo.cli.plugin import main; sys.exit(main({list(argv)!r}))"
    return ["-c", code]


@pytest.mark.parametrize(
    ("argv", "prints"),
    [
        (["version"], "nmo "),
        (["--help"], "usage: nmo"),
        (["run", "--help"], "usage: nmo run"),
        (["status", "--help"], "usage: nmo status"),
    ],
)
def test_version_and_help_import_only_what_they_print(argv: list[str], prints: str) -> None:
    modules, out, code = imports("-m", "nmo", *argv)
    assert code == 0 and out.startswith(prints), out
    assert found(modules, HEAVY) == []
    assert found(modules, ROOMS) == []


def test_a_usage_error_imports_nothing_heavy() -> None:
    modules, _, code = imports("-m", "nmo", "run", "--no-such-flag")
    assert code == 2
    assert found(modules, HEAVY) == []


def test_importing_the_cli_and_the_plugin_loads_nothing_heavy() -> None:
    modules, _, _ = imports("-c", "import nmo.cli, nmo.cli.plugin, nmo.cli.gomanager")
    assert found(modules, HEAVY) == []
    assert found(modules, ROOMS) == []


def test_kubectl_nm_help_loads_no_client_and_no_server() -> None:
    modules, out, code = imports(*plugin("--help"))
    assert code == 0 and out.startswith("usage: kubectl nm"), out
    assert found(modules, HEAVY) == []


@pytest.mark.parametrize(
    "args",
    [
        plugin("status", "--kubeconfig", "{missing}"),
        ["-m", "nmo", "status", "--kubeconfig", "{missing}"],
    ],
    ids=["kubectl nm status", "nmo status"],
)
def test_status_loads_the_client_but_no_server_code(args: list[str], tmp_path: Path) -> None:
    """The command runs up to its connection (the kubeconfig it names is
    missing, so it stops there with exit code 1): everything ``status``
    imports to run is imported by then."""
    missing = str(tmp_path / "missing-kubeconfig")
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    modules, _, code = imports(*[a.replace("{missing}", missing) for a in args], env=env)
    assert code == 1
    assert "nmo.kube.client" in modules and "nmo.ops.summary" in modules
    assert found(modules, SERVER) == []


def test_the_probe_sees_an_eager_import() -> None:
    """The probe is a real check: the operator's own wiring loads the server."""
    modules, _, _ = imports("-c", "import nmo.cli.runner")
    assert {"fastapi", "uvicorn", "pydantic", "kr8s", "nmo.server.servers"} <= modules


def test_the_help_names_the_same_timeout_actions_as_the_model() -> None:
    assert tuple(a.value for a in OnTimeout) == ON_TIMEOUT
