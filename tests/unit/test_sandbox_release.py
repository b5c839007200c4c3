"""The in-cluster install's helm arguments (nmo_sandbox.release), shared by the demo and tests."""

from __future__ import annotations

import pytest

from nmo.api import constants as c
from nmo_sandbox import SandboxError
from nmo_sandbox.release import CHART, RELEASE, install_args


def test_install_args_set_only_the_image_and_the_real_nodes() -> None:
    args = install_args("localhost/nmo:dev")
    assert args[:5] == [RELEASE, str(CHART), "-n", c.OPERATOR_NAMESPACE, "--create-namespace"]
    values = [args[i + 1] for i, a in enumerate(args) if a in ("--set", "--set-string")]
    assert values == [
        "image.repository=localhost/nmo",
        "image.tag=dev",
        "image.pullPolicy=Never",
        "deployment.nodeSelector.type=real",
    ]
    assert (CHART / "Chart.yaml").is_file()


def test_a_registry_port_is_not_a_tag() -> None:
    assert "image.repository=registry:5000/nmo" in install_args("registry:5000/nmo:1.0")
    with pytest.raises(SandboxError, match="has no tag"):
        install_args("registry:5000/nmo")
