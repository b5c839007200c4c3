"""Serving certificates that can be rotated without a restart.

Why this module exists: the webhook certificate is injected by OLM
(``apiserver.crt``/``apiserver.key`` in ``/apiserver.local.config/certificates``)
or by cert-manager (a Secret with ``tls.crt``/``tls.key``), and both rotate it
in place. controller-runtime's certwatcher reloads it; nmo does the same by
polling the files' identity (mtime, inode, size) and calling
``load_cert_chain`` again on the *same* :class:`ssl.SSLContext`: the listening
socket keeps its context and every new TLS handshake presents the new
certificate, while open connections finish with the old one.

Guarantees: TLS 1.2 or newer; ALPN offers only ``http/1.1`` (HTTP/2 is off:
uvicorn's h11 protocol does not serve it, and controller-runtime disables it
by default since CVE-2023-44487); a half-written or mismatched pair during a
rotation is logged and the previous certificate and key stay in use, intact,
until the next poll finds a good pair (:func:`load_pair_safely`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import logging
import os
import ssl
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

log = logging.getLogger("nmo.webhooks.tls")

# (certificate, key) file names tried in order when none is given.
KNOWN_PAIRS: tuple[tuple[str, str], ...] = (
    ("apiserver.crt", "apiserver.key"),  # OLM
    ("tls.crt", "tls.key"),  # cert-manager / kubernetes.io/tls Secrets
)

_Identity = tuple[int, int, int]


class CertificatesMissing(FileNotFoundError):
    """The cert dir holds no usable certificate/key pair."""


def find_pair(
    cert_dir: Path, *, cert_name: str | None = None, key_name: str | None = None
) -> tuple[Path, Path]:
    """The certificate and key files to serve; raises CertificatesMissing."""
    if cert_name or key_name:
        candidates = [(cert_name or "tls.crt", key_name or "tls.key")]
    else:
        candidates = list(KNOWN_PAIRS)
    for cert, key in candidates:
        cert_file, key_file = cert_dir / cert, cert_dir / key
        if cert_file.is_file() and key_file.is_file():
            return cert_file, key_file
    names = " or ".join(f"{c}/{k}" for c, k in candidates)
    raise CertificatesMissing(f"no certificate in {cert_dir} (looked for {names})")


def _identity(path: Path) -> _Identity:
    st = os.stat(path)  # follows the ..data symlinks of a mounted Secret
    return (st.st_mtime_ns, st.st_ino, st.st_size)


def new_server_context() -> ssl.SSLContext:
    """A server context with nmo's TLS policy (no certificate yet)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def load_pair_safely(context: ssl.SSLContext, cert_file: Path, key_file: Path) -> None:
    """Put the pair into ``context``, or raise and leave ``context`` as it was.

    ``SSLContext.load_cert_chain`` is not atomic: OpenSSL installs the new
    certificate first and drops a private key that does not match it, so a
    pair caught mid-rotation (new certificate, old key) would leave the live
    context with no key at all and fail every handshake. The files are read
    once, a scratch context must accept exactly those bytes, and only then
    are they loaded into the live one (private copies, so a rotation that goes
    on meanwhile cannot slip a different pair in between).
    """
    cert_pem, key_pem = cert_file.read_bytes(), key_file.read_bytes()
    with tempfile.TemporaryDirectory(prefix="nmo-cert-") as tmp:  # mode 0700
        cert_copy, key_copy = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        cert_copy.write_bytes(cert_pem)
        key_copy.write_bytes(key_pem)
        new_server_context().load_cert_chain(cert_copy, key_copy)
        context.load_cert_chain(cert_copy, key_copy)


def require_client_certificates(context: ssl.SSLContext, ca_file: Path) -> None:
    """Make ``context`` refuse a handshake without a client certificate signed
    by a CA in ``ca_file``; raises OSError or ssl.SSLError for an unusable file.

    The CA file is read once: rotating the apiserver's client CA means a
    restart (the serving certificate itself still reloads in place).
    """
    try:
        context.load_verify_locations(cafile=str(ca_file))
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"webhook client CA file {ca_file} not found") from exc
    context.verify_mode = ssl.CERT_REQUIRED


class ReloadingCertificate:
    """An SSLContext whose certificate follows the files in a directory."""

    def __init__(
        self,
        cert_dir: Path | str,
        *,
        cert_name: str | None = None,
        key_name: str | None = None,
    ) -> None:
        self.cert_dir = Path(cert_dir)
        self.cert_name = cert_name
        self.key_name = key_name
        self.context = new_server_context()
        self.loaded: tuple[Path, Path] | None = None
        self._identity: tuple[_Identity, _Identity] | None = None
        self.reloads = 0
        self.checks = 0  # calls of reload_if_changed (the watcher's polls)

    def load(self) -> None:
        """Load the pair now; raises CertificatesMissing or ssl.SSLError."""
        cert_file, key_file = find_pair(
            self.cert_dir, cert_name=self.cert_name, key_name=self.key_name
        )
        identity = (_identity(cert_file), _identity(key_file))
        load_pair_safely(self.context, cert_file, key_file)
        first = self.loaded is None
        self.loaded, self._identity = (cert_file, key_file), identity
        if not first:
            self.reloads += 1
        log.info(
            "serving certificate %s",
            "loaded" if first else "reloaded",
            extra={"cert": str(cert_file), "subject": certificate_subject(cert_file)},
        )

    def changed(self) -> bool:
        """Whether the files differ from what was loaded last."""
        try:
            cert_file, key_file = find_pair(
                self.cert_dir, cert_name=self.cert_name, key_name=self.key_name
            )
            return (_identity(cert_file), _identity(key_file)) != self._identity
        except OSError:
            return False  # mid-rotation or gone: keep serving what we have

    def reload_if_changed(self) -> bool:
        """Reload when the files changed; True when a new pair was loaded."""
        self.checks += 1
        if not self.changed():
            return False
        try:
            self.load()
        except (OSError, ssl.SSLError) as exc:
            log.warning(
                "serving certificate changed but cannot be loaded yet, keeping the old one",
                extra={"cert_dir": str(self.cert_dir), "error": str(exc)},
            )
            return False
        return True

    async def watch(self, interval: float = 5.0) -> None:
        """Poll for rotations forever (cancel to stop)."""
        while True:
            await asyncio.sleep(interval)
            # On the loop thread on purpose: the context is shared with
            # handshakes in progress, and loading a PEM pair takes microseconds.
            self.reload_if_changed()


def certificate_subject(cert_file: Path) -> str:
    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    except (OSError, ValueError):
        return ""
    return cert.subject.rfc4514_string()


def write_self_signed(
    cert_dir: Path, hosts: Sequence[str], *, common_name: str = "nmo-metrics"
) -> tuple[Path, Path]:
    """Write a fresh self-signed ``tls.crt``/``tls.key`` (as controller-runtime
    does for a secure metrics server without a cert dir)."""
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_dir.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = cert_dir / "tls.crt", cert_dir / "tls.key"
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_file.chmod(0o600)
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_file, key_file
