"""A kubeconfig someone named must be there (issue 20): never the pod's own account instead.

kr8s skips a missing kubeconfig file silently and then authenticates as the
pod's service account, so ``nmo cleanup --kubeconfig <typo>`` in a CI pod
acted as that pod. Now every command (``nmo run``, ``cleanup``, ``status``,
``plan``, ``gather``, and ``kubectl nm``) stops as kubectl does:
``error: stat <path>: no such file or directory``, exit code 1.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import respx
import yaml

from conftest import KUBECONFIG
from nmo import cli
from nmo.cli import plugin
from nmo.kube.client import Kube, check_kubeconfig
from nmo.kube.errors import KubeconfigError

# Every command that connects, as its user types it (the plugin takes --kubeconfig
# before or after the subcommand; after, here).
COMMANDS: dict[str, tuple[Callable[[list[str]], int], list[str]]] = {
    "nmo cleanup": (cli.main, ["cleanup", "node-1", "--yes"]),
    "nmo status": (cli.main, ["status"]),
    "nmo plan": (cli.main, ["plan", "node-1"]),
    "nmo gather": (cli.main, ["gather", "--dest", "{tmp}"]),
    "kubectl nm status": (plugin.main, ["status"]),
    "kubectl nm plan": (plugin.main, ["plan", "node-1"]),
    "kubectl nm cleanup": (plugin.main, ["cleanup", "node-1", "--yes"]),
    "kubectl nm start": (plugin.main, ["start", "node-1"]),
    "kubectl nm stop": (plugin.main, ["stop", "node-1"]),
}


@pytest.fixture
def missing(tmp_path: Path) -> str:
    return str(tmp_path / "kubeconfig-typo")


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("how", ["flag", "env"])
def test_every_command_refuses_a_missing_kubeconfig(
    command: str,
    how: str,
    missing: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    main, template = COMMANDS[command]
    argv = [a.replace("{tmp}", str(tmp_path)) for a in template]
    if how == "flag":
        monkeypatch.delenv("KUBECONFIG", raising=False)
        argv += ["--kubeconfig", missing]
    else:
        monkeypatch.setenv("KUBECONFIG", missing)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"error: stat {missing}: no such file or directory" in err, err
    assert "cannot connect" not in err


@pytest.mark.parametrize("how", ["flag", "env"])
async def test_nmo_run_refuses_a_missing_kubeconfig(
    how: str, missing: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    argv = ["run"]
    if how == "flag":
        monkeypatch.delenv("KUBECONFIG", raising=False)
        argv += ["--kubeconfig", missing]
    else:
        monkeypatch.setenv("KUBECONFIG", missing)
    args = cli.build_parser().parse_args(argv)
    with caplog.at_level(logging.ERROR, logger="nmo.cli"):
        assert await cli.run(args) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"cannot read the kubeconfig: stat {missing}: no such file or directory"
    ]


def test_what_kubectl_would_say(tmp_path: Path) -> None:
    """The file named, each of a $KUBECONFIG list, in kubectl's words."""
    config = tmp_path / "config"
    config.write_text("{}")
    check_kubeconfig(str(config))
    check_kubeconfig(f"{config}::{config}")  # empty entries name nothing
    cases = {
        str(tmp_path / "nope"): f"stat {tmp_path / 'nope'}: no such file or directory",
        f"{config}:{tmp_path / 'nope'}": f"stat {tmp_path / 'nope'}: no such file or directory",
        str(tmp_path): f"read {tmp_path}: is a directory",
        str(config / "below-a-file"): f"stat {config / 'below-a-file'}: not a directory",
    }
    for value, message in cases.items():
        with pytest.raises(KubeconfigError) as info:
            check_kubeconfig(value)
        assert str(info.value) == message


async def test_a_named_kubeconfig_is_the_only_credential(
    api_server: respx.MockRouter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A readable one connects, and kr8s may never fall back to the pod's account,
    not even when it re-reads its credentials after a 401."""
    config = tmp_path / "config"
    config.write_text(yaml.safe_dump(KUBECONFIG))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    kube = await Kube.connect(kubeconfig=str(config))
    try:
        assert kube.server == KUBECONFIG["clusters"][0]["cluster"]["server"]  # type: ignore[index]
        assert kube._api.auth._serviceaccount == ""
    finally:
        await kube.close()
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nope"))
    with pytest.raises(KubeconfigError, match="no such file or directory"):
        await Kube.connect()
