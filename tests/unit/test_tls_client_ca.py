"""``--webhook-client-ca``: only callers with a certificate from that CA get in
(issue 14, item 2: the apiserver can authenticate itself to webhooks)."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from test_chart_alerts import helm_env, manager_args, of_kind, render
from test_tls_reload import running, settings  # noqa: F401

from nmo.api.constants import WEBHOOK_PATH
from nmo.cli import build_parser, settings_from
from nmo.server.servers import Servers, ServerSettings
from nmo_sandbox.pki import generate_pki, issue_serving_cert

__all__ = ["helm_env"]  # the fixture, shared

Start = Callable[[ServerSettings], Awaitable[Servers]]


def client_context(ca: Path, cert: tuple[Path, Path] | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(*cert)
    return ctx


async def test_a_caller_without_a_client_certificate_is_refused(
    tmp_path: Path,
    running: Start,  # noqa: F811
) -> None:
    pki = generate_pki(tmp_path / "pki")
    issue_serving_cert(pki.dir, ["127.0.0.1"], out_dir=tmp_path / "certs", name="tls")
    servers = await running(settings(tmp_path / "certs", webhook_client_ca=pki.ca_file))
    url = f"https://127.0.0.1:{servers.ports['webhook']}{WEBHOOK_PATH}"
    bare = client_context(pki.ca_file, None)
    with pytest.raises(httpx.TransportError):
        async with httpx.AsyncClient(verify=bare) as http:
            await http.post(url, content=b"{}")
    signed = client_context(pki.ca_file, (pki.admin_cert_file, pki.admin_key_file))
    async with httpx.AsyncClient(verify=signed) as http:
        assert (await http.post(url, content=b"{}")).status_code == 400  # in: no uid


def test_unusable_ca_file_is_a_clear_error(tmp_path: Path) -> None:
    from nmo.server.tls import require_client_certificates

    with pytest.raises(FileNotFoundError, match="webhook client CA file"):
        require_client_certificates(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), tmp_path / "no")


def test_the_flag_reaches_the_settings() -> None:
    args = build_parser().parse_args(["run", "--webhook-client-ca", "/etc/nmo/ca.crt"])
    assert settings_from(args).servers.webhook_client_ca == Path("/etc/nmo/ca.crt")
    assert settings_from(build_parser().parse_args(["run"])).servers.webhook_client_ca is None


def test_chart_mounts_the_client_ca_and_passes_the_flag(helm_env: dict[str, str]) -> None:
    assert not [a for a in manager_args(render(helm_env)) if "client-ca" in a]
    docs = render(helm_env, "--set", "webhook.clientCA.configMap=apiserver-webhook-ca")
    assert "--webhook-client-ca=/etc/nmo/webhook-client-ca/ca.crt" in manager_args(docs)
    (deployment,) = of_kind(docs, "Deployment")
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "webhook-client-ca", "configMap": {"name": "apiserver-webhook-ca"}} in volumes
