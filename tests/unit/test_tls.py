"""The TLS serving path: rotations caught halfway, and prompt small writes.

OpenSSL's ``load_cert_chain`` installs the new certificate before it checks
the key, and drops the old key when they do not match: loading a new
certificate with the old key used to leave a context with no key, failing
every handshake until the next good poll. These tests catch the pair
mid-rotation on purpose and handshake with a real socket.

The listening sockets must let asyncio turn Nagle's algorithm off, or a
response written in two segments waits for the client's delayed ACK.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from nmo.server.servers import bind
from nmo.server.tls import ReloadingCertificate, write_self_signed


def staged(tmp_path: Path, common_name: str) -> tuple[Path, Path]:
    return write_self_signed(
        tmp_path / f"staging-{common_name}", ["127.0.0.1"], common_name=common_name
    )


async def served_cn(port: int) -> str:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
        await writer.wait_closed()
    name = x509.load_der_x509_certificate(der).subject
    return str(name.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


@pytest.fixture
async def serving(tmp_path: Path) -> AsyncIterator[tuple[ReloadingCertificate, int]]:
    certs = tmp_path / "certs"
    certs.mkdir()
    cert_file, key_file = staged(tmp_path, "first")
    os.replace(cert_file, certs / "tls.crt")
    os.replace(key_file, certs / "tls.key")
    cert = ReloadingCertificate(certs)
    cert.load()

    async def answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=cert.context)
    port = server.sockets[0].getsockname()[1]
    yield cert, port
    server.close()
    await server.wait_closed()


@pytest.mark.parametrize("first", ["tls.crt", "tls.key"], ids=["cert first", "key first"])
async def test_half_rotated_pair_keeps_serving_the_old_one(
    tmp_path: Path, serving: tuple[ReloadingCertificate, int], first: str
) -> None:
    cert, port = serving
    new = dict(zip(("tls.crt", "tls.key"), staged(tmp_path, "second"), strict=True))
    os.replace(new[first], cert.cert_dir / first)

    assert cert.reload_if_changed() is False  # mismatched: logged, not loaded
    assert await served_cn(port) == "first"  # and the old pair still handshakes

    second = "tls.key" if first == "tls.crt" else "tls.crt"
    os.replace(new[second], cert.cert_dir / second)
    assert cert.reload_if_changed() is True
    assert await served_cn(port) == "second"


async def test_half_written_key_keeps_serving_the_old_one(
    tmp_path: Path, serving: tuple[ReloadingCertificate, int]
) -> None:
    cert, port = serving
    cert_file, _key = staged(tmp_path, "second")
    os.replace(cert_file, cert.cert_dir / "tls.crt")
    (cert.cert_dir / "tls.key").write_text("-----BEGIN PRIVATE KEY-----\nhalf wri")
    assert cert.reload_if_changed() is False
    assert await served_cn(port) == "first"


@pytest.mark.parametrize("host", ["127.0.0.1", "::"], ids=["ipv4", "dual-stack"])
def test_accepted_connections_send_small_writes_at_once(host: str) -> None:
    """asyncio disables Nagle only on sockets whose proto is IPPROTO_TCP; without it
    a TLS response waited ~40 ms for the client's delayed ACK."""
    listener = bind(host, 0)
    try:
        assert listener.proto == socket.IPPROTO_TCP
        # "::" is dual-stack: IPv4 clients reach it too.
        client = socket.create_connection(("127.0.0.1", listener.getsockname()[1]))
        conn, _ = listener.accept()
        with client, conn:
            assert conn.proto == socket.IPPROTO_TCP  # so asyncio sets TCP_NODELAY
            assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        listener.close()
