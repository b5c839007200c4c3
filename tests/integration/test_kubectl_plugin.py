"""``kubectl nm`` through the real kubectl binary, which finds the plugin on PATH.

kubectl runs ``kubectl-nm`` from PATH for ``kubectl nm ...``. The PATH given
to kubectl holds the venv's bin directory; when this checkout has not been
``pip install``-ed since ``kubectl-nm`` was declared, a directory with the
same console-script shim pip writes (from ``[project.scripts]`` in
pyproject.toml) comes first. Either way the code run is this checkout's
(``PYTHONPATH`` is inherited). The session operator drains; the webhook
(``test_webhook.py``'s module fixture) refuses and warns as in production.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
from objects import NM, Api, pdb, uid
from operator_fixtures import Operator, wait_for
from test_webhook import webhook  # noqa: F401 - the module fixture, used by name
from workloads import bare_pod, running

from nmo.api.constants import DRAIN_TAINT_KEY, WEBHOOK_NAME, Messages
from nmo_sandbox import Sandbox, find_binaries
from nmo_sandbox.process import run_command

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CREATED = "nodemaintenance.nodemaintenance.medik8s.io/{name} created"
PDBS = "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets"


@pytest.fixture
async def api(kube: httpx.AsyncClient) -> Api:
    return Api(kube)


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PATH on which kubectl finds ``kubectl-nm``."""
    venv_bin = Path(sys.executable).parent
    dirs = [str(venv_bin)]
    if not (venv_bin / "kubectl-nm").exists():
        scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
        module, _, func = scripts["kubectl-nm"].partition(":")
        shim_dir = tmp_path_factory.mktemp("plugin-bin")
        shim = shim_dir / "kubectl-nm"
        shim.write_text(
            f"#!{sys.executable}\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n"
        )
        shim.chmod(0o755)
        dirs.insert(0, str(shim_dir))
    return os.pathsep.join([*dirs, os.environ.get("PATH", "")])


async def kubectl_nm(
    plugin_path: str, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``kubectl nm ARGS``: the real kubectl, the plugin found on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "LEASE_NAMESPACE")}
    env |= {"PATH": plugin_path, "COLUMNS": "200"}
    kubectl = str(find_binaries().path("kubectl"))
    result = await run_command([kubectl, "nm", *args], env=env, timeout=timeout)
    print(f"$ kubectl nm {' '.join(args)}  -> {result.returncode}\n{result.stdout}{result.stderr}")
    return result


def maintained(node: dict[str, Any]) -> bool:
    return any(t.get("key") == DRAIN_TAINT_KEY for t in node.get("spec", {}).get("taints") or [])


async def test_start_wait_status_stop(
    operator: Operator,
    sandbox: Sandbox,
    api: Api,
    namespace: str,
    node_factory: Any,
    plugin_path: str,
) -> None:
    (node,) = await node_factory(1)
    await bare_pod(api, namespace, "app", node, {"app": "plugin"})
    await running(api, namespace, ["app"])
    name = f"nm-{node}"
    kubeconfig = str(sandbox.kubeconfig)

    started = await kubectl_nm(
        plugin_path, "start", node, "--reason", "plugin test", "--wait", "--kubeconfig", kubeconfig
    )
    assert started.returncode == 0, started.stderr
    assert CREATED.format(name=name) in started.stdout.splitlines()
    assert f"nodemaintenance/{name}" in started.stdout  # the status panel, as nmo status draws it
    assert "Succeeded" in started.stdout
    assert f"node {node} is in maintenance (nodemaintenance/{name} Succeeded)" in started.stderr
    obj = await api.nm(name)
    assert obj is not None
    assert obj["spec"] == {"nodeName": node, "reason": "plugin test"}
    assert maintained(await api.node(node))
    assert await api.pods(namespace, node=node) == []

    # kubectl's flags before the subcommand, and --context.
    status = await kubectl_nm(
        plugin_path, "--kubeconfig", kubeconfig, "--context", "nmo-sandbox", "status", name,
        "-o", "json",
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    (item,) = json.loads(status.stdout)["items"]
    assert (item["name"], item["node"], item["phase"]) == (name, node, "Succeeded")

    stopped = await kubectl_nm(plugin_path, "--kubeconfig", kubeconfig, "stop", node, "--wait")
    assert stopped.returncode == 0, stopped.stderr
    assert f'nodemaintenance.nodemaintenance.medik8s.io "{name}" deleted' in stopped.stdout
    assert f"node {node} is out of maintenance" in stopped.stderr
    assert await api.nm(name) is None
    after = await api.node(node)
    assert not maintained(after)
    assert not after["spec"].get("unschedulable")

    again = await kubectl_nm(plugin_path, "stop", node, "--kubeconfig", kubeconfig)
    assert again.returncode == 1
    assert f'no NodeMaintenance for node "{node}"' in again.stderr


@pytest.mark.usefixtures("webhook")
async def test_denial_warning_and_plan(
    operator: Operator,
    sandbox: Sandbox,
    api: Api,
    namespace: str,
    node_factory: Any,
    plugin_path: str,
) -> None:
    kubeconfig = f"--kubeconfig={sandbox.kubeconfig}"
    missing = f"no-such-node-{uid()}"
    denied = await kubectl_nm(plugin_path, "start", missing, "--reason", "x", kubeconfig)
    assert denied.returncode == 1
    assert denied.stderr.strip() == (
        f'Error from server (Forbidden): admission webhook "{WEBHOOK_NAME}" denied the request: '
        + Messages.WEBHOOK_NO_NODE.format(node=missing)
    )
    assert await api.nm(f"nm-{missing}") is None

    (node,) = await node_factory(1)
    for pod in ("web-1", "web-2"):
        await bare_pod(api, namespace, pod, node, {"app": "web"})
    await running(api, namespace, ["web-1", "web-2"])
    await api.create(PDBS.format(ns=namespace), pdb("web-pdb", {"app": "web"}, 2))

    async def settled() -> bool:
        obj = await api.get(f"{PDBS.format(ns=namespace)}/web-pdb")
        st = (obj or {}).get("status") or {}
        return st.get("currentHealthy") == 2 and st.get("disruptionsAllowed") == 0

    await wait_for(settled, what="web-pdb computed")

    plan = await kubectl_nm(plugin_path, "plan", node, kubeconfig)
    assert plan.returncode == 3, plan.stderr
    assert plan.stdout.splitlines()[-1].startswith(f"{node}: 2 pods to evict, 0 waited on")
    assert f"BLOCKED now by PodDisruptionBudget {namespace}/web-pdb needs 2 healthy" in plan.stdout

    name = f"drain-{uid()}"
    started = await kubectl_nm(
        plugin_path, "start", node, "--name", name, "--timeout-seconds", "600",
        "--on-timeout", "Abort", kubeconfig,
    )  # fmt: skip
    try:
        assert started.returncode == 0, started.stderr
        assert CREATED.format(name=name) in started.stdout.splitlines()
        assert (
            f"Warning: PodDisruptionBudget {namespace}/web-pdb allows no disruption now "
            f"(needs 2 healthy, has 2): the drain of {node} will wait for it"
        ) in started.stderr.splitlines()
        obj = await api.nm(name)
        assert obj is not None
        assert obj["spec"]["drain"] == {"timeoutSeconds": 600, "onTimeout": "Abort"}

        async def cordoned() -> bool:
            return maintained(await api.node(node))

        await wait_for(cordoned, what=f"{node} tainted by the operator")
        stopped = await kubectl_nm(plugin_path, "stop", node, "--wait", kubeconfig)
        assert stopped.returncode == 0, stopped.stderr
        assert not maintained(await api.node(node))
        assert len(await api.pods(namespace, node=node)) == 2  # the PDB held them
    finally:
        await api.delete(f"{NM}/{name}")
