"""The gather bundle carries no secret of the workloads it describes, and is
private to its writer (issue 14, item 5). respx stands in for the apiserver;
tests/integration/test_ops.py does the same against the sandbox."""

from __future__ import annotations

import stat
import tarfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import respx

from builders import pod
from nmo.kube.client import Kube
from nmo.ops.gather import Gatherer, GatherSettings

PEM = (
    "-----BEGIN PRIVATE KEY-----\n"
    "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\n"
    "-----END PRIVATE KEY-----\n"
)
SECRETS = ["db-pass-value-1", "url-password-2", "abc123secret", "MIIEvQIBADANBgkqhkiG9w0BAQEF"]


# A pod whose annotations, arguments and environment hold secrets.
POD = pod(
    "app-0",
    namespace="shop",
    uid="u1",
    annotations={
        "example.com/db": "postgres://app:url-password-2@db:5432/app",
        "example.com/key": PEM,
    },
    node="n1",
    containers=[
        {
            "name": "app",
            "args": ["--token", "abc123secret"],
            "env": [{"name": "DB_PASS", "value": "db-pass-value-1"}],
        }
    ],
    phase="Running",
)


def _items(*items: dict[str, Any]) -> httpx.Response:
    return httpx.Response(200, json={"metadata": {}, "items": list(items)})


async def test_gather_writes_no_secret_and_private_files(
    api_server: respx.MockRouter, kube: Kube, tmp_path: Path
) -> None:
    nm = {"metadata": {"name": "nm-1"}, "spec": {"nodeName": "n1"}}
    event = {
        "metadata": {"name": "e1", "namespace": "default"},
        "reason": "BeginMaintenance",
        "message": "evicting app-0 (--password=abc123secret)",
    }
    api_server.get("/api/v1").respond(json={"kind": "APIResourceList"})
    api_server.get(path__regex=r".*/nodemaintenances$").mock(return_value=_items(nm))
    api_server.get("/api/v1/pods", params={"fieldSelector": "spec.nodeName=n1"}).mock(
        return_value=_items(POD)
    )
    api_server.get("/api/v1/events").mock(return_value=_items(event))
    api_server.route().mock(return_value=_items())
    dest = tmp_path / "out"
    gatherer = Gatherer(
        kube, GatherSettings(dest=dest), clock=lambda: datetime(2026, 12, 1, tzinfo=UTC)
    )
    bundle = await gatherer.run()

    files = [p for p in bundle.directory.rglob("*") if p.is_file()]
    assert any(p.name == "pods-on-maintained-nodes.yaml" for p in files)
    for path in files:
        text = path.read_text()
        for secret in SECRETS:
            assert secret not in text, f"{secret} in {path.name}"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for directory in [bundle.directory, *(p for p in bundle.directory.rglob("*") if p.is_dir())]:
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    assert stat.S_IMODE(bundle.archive.stat().st_mode) == 0o600
    with tarfile.open(bundle.archive) as tar:
        for member in tar.getmembers():
            assert member.mode & 0o077 == 0, member.name
            if member.isfile():
                data = tar.extractfile(member)
                assert data is not None
                text = data.read().decode()
                assert not [s for s in SECRETS if s in text], member.name
