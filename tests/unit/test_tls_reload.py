"""Certificates rotate under a running server; the servers run in-loop on free ports.

Real uvicorn servers on 127.0.0.1 port 0; the reload is triggered by calling
the reload method directly, so no test sleeps for a poll interval.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from webhook_fakes import FakeLookups

from nmo.api.constants import WEBHOOK_PATH
from nmo.server.servers import Servers, ServerSettings, serve
from nmo.server.tls import CertificatesMissing, ReloadingCertificate, find_pair, write_self_signed
from nmo.telemetry.metrics import Metrics


def make_pair(directory: Path, common_name: str, *, names: tuple[str, str]) -> None:
    """A self-signed pair for 127.0.0.1, swapped in atomically under ``names``."""
    staging = directory.parent / f"staging-{common_name}"
    cert, key = write_self_signed(staging, ["127.0.0.1"], common_name=common_name)
    directory.mkdir(exist_ok=True)
    os.replace(key, directory / names[1])
    os.replace(cert, directory / names[0])


async def served_cn(port: int) -> str:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        assert writer.get_extra_info("ssl_object").version() in ("TLSv1.2", "TLSv1.3")
    finally:
        writer.close()
        await writer.wait_closed()
    cert = x509.load_der_x509_certificate(der)
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


async def until(probe: Callable[[], Awaitable[bool]], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await probe():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


class FakeKube:
    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        return {"status": {"authenticated": False}}


@pytest.fixture
async def running() -> AsyncIterator[Callable[[ServerSettings], Awaitable[Servers]]]:
    started: list[Servers] = []

    async def start(settings: ServerSettings) -> Servers:
        servers = Servers(settings, kube=FakeKube(), lookups=FakeLookups(), metrics=Metrics())
        await servers.start()
        started.append(servers)
        return servers

    yield start
    for servers in started:
        await servers.stop()


def settings(cert_dir: Path, **kw: Any) -> ServerSettings:
    base: dict[str, Any] = {
        "bind_address": "127.0.0.1",
        "webhook_port": 0,
        "probes_port": None,
        "metrics_port": None,
        "cert_dir": cert_dir,
        "cert_poll_interval": 0.05,
        "graceful_shutdown_seconds": 1,
    }
    return ServerSettings(**{**base, **kw})


@pytest.mark.parametrize(
    "names", [("apiserver.crt", "apiserver.key"), ("tls.crt", "tls.key")], ids=["olm", "secret"]
)
async def test_rotated_certificate_is_served_without_restart(
    tmp_path: Path,
    running: Callable[[ServerSettings], Awaitable[Servers]],
    names: tuple[str, str],
) -> None:
    certs = tmp_path / "certs"
    make_pair(certs, "first", names=names)
    servers = await running(settings(certs))
    port = servers.ports["webhook"]
    cert = servers.certificates["webhook"]
    assert await served_cn(port) == "first"

    assert cert.reload_if_changed() is False  # nothing changed yet
    make_pair(certs, "second", names=names)
    assert cert.reload_if_changed() is True
    assert await served_cn(port) == "second"
    assert servers.ports["webhook"] == port
    assert cert.reloads == 1


async def test_watch_picks_up_a_rotation(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    make_pair(certs, "first", names=("tls.crt", "tls.key"))
    cert = ReloadingCertificate(certs)
    cert.load()
    watcher = asyncio.create_task(cert.watch(interval=0.01))
    try:
        make_pair(certs, "second", names=("tls.crt", "tls.key"))

        async def reloaded() -> bool:
            return cert.reloads == 1

        await until(reloaded, "the watcher to reload the certificate")
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


async def test_broken_rotation_keeps_the_old_certificate(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    make_pair(certs, "first", names=("tls.crt", "tls.key"))
    cert = ReloadingCertificate(certs)
    cert.load()
    (certs / "tls.crt").write_text("-----BEGIN CERTIFICATE-----\nhalf written")
    assert cert.reload_if_changed() is False
    assert cert.reload_if_changed() is False
    assert (cert.checks, cert.reloads) == (2, 0)  # looked twice, kept the old pair


def test_tls_policy_and_missing_files(tmp_path: Path) -> None:
    cert = ReloadingCertificate(tmp_path)
    assert cert.context.minimum_version == ssl.TLSVersion.TLSv1_2
    with pytest.raises(
        CertificatesMissing, match=r"apiserver\.crt/apiserver\.key or tls\.crt/tls\.key"
    ):
        find_pair(tmp_path)


async def test_without_certs_the_webhook_is_off_and_readyz_says_why(
    tmp_path: Path, running: Callable[[ServerSettings], Awaitable[Servers]]
) -> None:
    certs = tmp_path / "empty"
    certs.mkdir()
    servers = await running(settings(certs, probes_port=0))
    assert "webhook" not in servers.ports
    base = f"http://127.0.0.1:{servers.ports['probes']}"
    async with httpx.AsyncClient(base_url=base) as http:
        ready = await http.get("/readyz")
        assert ready.status_code == 500
        assert f"[-]webhook failed: webhook server is off: no certificate in {certs}" in ready.text
        assert (await http.get("/healthz")).text == "ok"

        # Certificates appear later (e.g. cert-manager issued them): the server starts.
        make_pair(certs, "late", names=("tls.crt", "tls.key"))

        async def serving() -> bool:
            return "webhook" in servers.ports

        await until(serving, "the webhook server to start")
        assert await served_cn(servers.ports["webhook"]) == "late"
        assert (await http.get("/readyz")).text == "ok"


async def test_webhook_not_required_for_readiness(
    tmp_path: Path, running: Callable[[ServerSettings], Awaitable[Servers]]
) -> None:
    servers = await running(settings(tmp_path, probes_port=0, require_webhook_for_ready=False))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{servers.ports['probes']}") as http:
        assert (await http.get("/readyz")).text == "ok"


async def test_all_three_servers(
    tmp_path: Path, running: Callable[[ServerSettings], Awaitable[Servers]]
) -> None:
    make_pair(tmp_path / "certs", "webhook", names=("tls.crt", "tls.key"))
    servers = await running(settings(tmp_path / "certs", probes_port=0, metrics_port=0))
    async with httpx.AsyncClient(verify=False) as http:
        review = await http.post(
            f"https://127.0.0.1:{servers.ports['webhook']}{WEBHOOK_PATH}", content=b"{}"
        )
        metrics = await http.get(f"https://127.0.0.1:{servers.ports['metrics']}/metrics")
        ready = await http.get(f"http://127.0.0.1:{servers.ports['probes']}/readyz?verbose")
    assert review.status_code == 400  # no uid: plain HTTP 400
    assert metrics.status_code == 401  # secure metrics need a token
    assert ready.status_code == 200
    assert "[+]webhook ok" in ready.text
    assert await served_cn(servers.ports["metrics"]) == "nmo-metrics"


async def test_plain_metrics(
    tmp_path: Path, running: Callable[[ServerSettings], Awaitable[Servers]]
) -> None:
    servers = await running(
        settings(tmp_path, webhook_port=None, metrics_port=0, metrics_secure=False)
    )
    async with httpx.AsyncClient() as http:
        resp = await http.get(f"http://127.0.0.1:{servers.ports['metrics']}/metrics")
    assert resp.status_code == 200


async def test_taken_port_is_a_clear_error(
    tmp_path: Path, running: Callable[[ServerSettings], Awaitable[Servers]]
) -> None:
    first = await running(settings(tmp_path, webhook_port=None, probes_port=0))
    taken = first.ports["probes"]
    with pytest.raises(OSError, match="ddress already in use"):
        await running(settings(tmp_path, webhook_port=None, probes_port=taken))


class Cache:
    def __init__(self) -> None:
        self.store: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()

    def add_handler(self, handler: Any) -> None:
        pass


async def test_serve_runs_until_cancelled_and_reports_readiness(tmp_path: Path) -> None:
    with socket.socket() as probe_sock:
        probe_sock.bind(("127.0.0.1", 0))
        port = probe_sock.getsockname()[1]
    nodes, maintenances = Cache(), Cache()
    task = asyncio.create_task(
        serve(
            settings(tmp_path, probes_port=port),
            kube=FakeKube(),
            nodes=nodes,
            maintenances=maintenances,
            metrics=Metrics(),
            readiness={"extra": lambda: None},
        )
    )
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:

        async def up() -> bool:
            try:
                return (await http.get("/healthz")).status_code == 200
            except httpx.TransportError:
                return False

        await until(up, "the probes server")
        ready = await http.get("/readyz")
        assert "[-]webhook failed: webhook server is off" in ready.text
        assert "[-]webhook-caches failed: node and NodeMaintenance caches" in ready.text
        assert "[+]extra ok" in ready.text
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))  # released on the way out
