"""Real-node configuration as data: containerd patches, CNI ranges, kubelet settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from nmo_sandbox.binaries import Binaries
from nmo_sandbox.errors import MissingBinariesError, SandboxError
from nmo_sandbox.network import BridgeNet
from nmo_sandbox.realnodes import (
    RealNode,
    check_socket_paths,
    cni_conflist,
    containerd_config,
    kubelet_config,
    patch_toml,
)

DEFAULT = """\
disabled_plugins = []
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins]

  [plugins."io.containerd.grpc.v1.cri"]
    netns_mounts_under_state_dir = false
    restrict_oom_score_adj = false
    sandbox_image = "registry.k8s.io/pause:3.6"

    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/opt/cni/bin"
      conf_dir = "/etc/cni/net.d"

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          Root = ""
          SystemdCgroup = false

  [plugins."io.containerd.internal.v1.opt"]
    path = "/opt/containerd"
"""


def test_containerd_config_moves_everything_under_the_node_dir(tmp_path: Path) -> None:
    node = RealNode(tmp_path / "real", 2)
    text = containerd_config(DEFAULT, node, pause_ref="localhost/p:1")
    assert f'root = "{tmp_path}/real/real-2/containerd"' in text
    assert f'  address = "{tmp_path}/real/real-2/containerd.sock"' in text
    assert 'sandbox_image = "localhost/p:1"' in text
    assert "restrict_oom_score_adj = true" in text
    assert "netns_mounts_under_state_dir = true" in text
    assert 'bin_dir = "/usr/lib/cni"' in text
    assert f'Root = "{tmp_path}/real/real-2/runc"' in text
    assert "/var/lib/containerd" not in text and "/run/containerd" not in text
    assert "/opt/" not in text


def test_patch_toml_refuses_a_key_it_cannot_find() -> None:
    with pytest.raises(SandboxError, match=r"\[grpc\] nope"):
        patch_toml(DEFAULT, {("grpc", "nope"): 1})


def test_each_node_gets_its_own_slice_of_the_sandbox_subnet(tmp_path: Path) -> None:
    net = BridgeNet(name="nmo-sb3", index=3)
    assert (net.subnet, net.gateway, net.node_ip(1)) == (
        "10.163.0.0/16",
        "10.163.0.1",
        "10.163.0.2",
    )
    ranges = []
    for k in (1, 2):
        conf = cni_conflist(net, RealNode(tmp_path, k))
        bridge = conf["plugins"][0]
        assert bridge["bridge"] == "nmo-sb3" and bridge["ipMasq"] is False
        ranges.append(bridge["ipam"]["ranges"][0][0])
        assert bridge["ipam"]["routes"] == [{"dst": "10.96.0.0/16"}]  # no default route
    assert ranges[0]["rangeStart"] == "10.163.1.2" and ranges[1]["rangeEnd"] == "10.163.2.254"


def test_kubelet_config_carries_this_machines_cgroup_v1_settings(tmp_path: Path) -> None:
    node = RealNode(tmp_path, 1)
    config = kubelet_config(
        node,
        node_ip="10.160.0.2",
        port=1,
        healthz_port=2,
        ca_file=tmp_path / "ca.crt",
        serving_cert=tmp_path / "k.crt",
        serving_key=tmp_path / "k.key",
    )
    expected = {
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "readOnlyPort": 0,
        "containerRuntimeEndpoint": f"unix://{node.socket}",
    }
    assert {k: config[k] for k in expected} == expected
    assert config["authentication"]["anonymous"] == {"enabled": False}


def test_a_directory_too_long_for_unix_sockets_is_refused() -> None:
    with pytest.raises(SandboxError, match=r"too long for real nodes.*at most"):
        check_socket_paths(RealNode(Path("/tmp/" + "d" * 80) / "real", 1))
    check_socket_paths(RealNode(Path("/tmp/sbx/real"), 1))


def test_a_missing_kubelet_names_make_sandbox_bin(tmp_path: Path) -> None:
    with pytest.raises(MissingBinariesError, match=r"real nodes need kubelet.*make sandbox-bin"):
        Binaries(tmp_path).check_real_nodes()
