"""The sandbox's private PKI, made in Python so no openssl/cfssl is needed.

A sandbox needs four things signed by one throw-away CA: a serving certificate
for the apiserver on 127.0.0.1 (also reused by the controller-manager and the
scheduler for their health endpoints), an admin client certificate in the
``system:masters`` group, and an RSA key pair for service-account tokens. The
webhook server of nmo additionally needs a serving certificate the apiserver
trusts, which :func:`issue_serving_cert` makes from the same CA.

Everything is written as PEM under ``DIR/pki/``; keys are mode 0600. Validity is
short (one year) because a sandbox lives for minutes to hours.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "ADMIN_GROUP",
    "ADMIN_USER",
    "APISERVER_SANS",
    "PKI",
    "ServingCert",
    "generate_pki",
    "issue_client_cert",
    "issue_serving_cert",
]

ADMIN_USER = "nmo-admin"
ADMIN_GROUP = "system:masters"
APISERVER_SANS: tuple[str, ...] = (
    "127.0.0.1",
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
    # The first address of --service-cluster-ip-range, which the apiserver
    # gives to the `kubernetes` Service; in-cluster clients may dial it.
    "10.96.0.1",
)
_VALIDITY = dt.timedelta(days=365)
_CA_CERT = "ca.crt"
_CA_KEY = "ca.key"

_PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class ServingCert:
    """Paths of a serving certificate and key, and the CA bundle that trusts it."""

    cert_file: Path
    key_file: Path
    ca_file: Path

    @property
    def ca_bundle(self) -> bytes:
        """The CA certificate as PEM bytes (base64-encode it for a webhook caBundle)."""
        return self.ca_file.read_bytes()


@dataclass(frozen=True)
class PKI:
    """Every file the control plane needs, all under one directory."""

    dir: Path
    ca_file: Path
    ca_key_file: Path
    serving_cert_file: Path
    serving_key_file: Path
    admin_cert_file: Path
    admin_key_file: Path
    sa_key_file: Path
    sa_pub_file: Path

    @classmethod
    def at(cls, dir: Path) -> PKI:
        """The file layout inside ``dir`` (nothing is read or written)."""
        return cls(
            dir=dir,
            ca_file=dir / _CA_CERT,
            ca_key_file=dir / _CA_KEY,
            serving_cert_file=dir / "apiserver.crt",
            serving_key_file=dir / "apiserver.key",
            admin_cert_file=dir / "admin.crt",
            admin_key_file=dir / "admin.key",
            sa_key_file=dir / "sa.key",
            sa_pub_file=dir / "sa.pub",
        )


def generate_pki(dir: Path) -> PKI:
    """Create a fresh CA and every certificate of the sandbox in ``dir``.

    Existing files are overwritten: each sandbox start gets new keys.
    """
    pki = PKI.at(dir)
    dir.mkdir(parents=True, exist_ok=True)
    ca_key = _new_key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nmo-sandbox-ca")])
    now = _now()
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_cert(pki.ca_file, ca_cert)
    _write_key(pki.ca_key_file, ca_key)

    _issue(
        ca_cert,
        ca_key,
        subject=_name("kube-apiserver"),
        sans=APISERVER_SANS,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        cert_file=pki.serving_cert_file,
        key_file=pki.serving_key_file,
    )
    _issue(
        ca_cert,
        ca_key,
        subject=_name(ADMIN_USER, ADMIN_GROUP),
        sans=(),
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        cert_file=pki.admin_cert_file,
        key_file=pki.admin_key_file,
    )
    # Service-account tokens are RS256-signed; the apiserver wants RSA here.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.sa_key_file, sa_key)
    pki.sa_pub_file.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


def issue_serving_cert(
    pki_dir: Path,
    sans: Sequence[str],
    *,
    out_dir: Path | None = None,
    name: str = "webhook",
) -> ServingCert:
    """Sign a serving certificate for ``sans`` (IPs or DNS names) with the sandbox CA.

    Writes ``<name>.crt`` and ``<name>.key`` into ``out_dir`` (default: next to
    the CA in ``pki_dir``) and returns their paths together with the CA file to
    put in a webhook's ``caBundle``.
    """
    if not sans:
        raise ValueError("a serving certificate needs at least one SAN")
    pki = PKI.at(pki_dir)
    try:
        ca_cert = x509.load_pem_x509_certificate(pki.ca_file.read_bytes())
        ca_key = serialization.load_pem_private_key(pki.ca_key_file.read_bytes(), password=None)
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"no sandbox CA in {pki_dir}; start the sandbox (or call generate_pki) first"
        ) from exc
    if not isinstance(ca_key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        raise TypeError(f"unsupported CA key type {type(ca_key).__name__}")
    target = pki_dir if out_dir is None else out_dir
    target.mkdir(parents=True, exist_ok=True)
    cert_file = target / f"{name}.crt"
    key_file = target / f"{name}.key"
    _issue(
        ca_cert,
        ca_key,
        subject=_name(sans[0]),
        sans=sans,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        cert_file=cert_file,
        key_file=key_file,
    )
    return ServingCert(cert_file=cert_file, key_file=key_file, ca_file=pki.ca_file)


def issue_client_cert(
    pki_dir: Path, user: str, group: str | None, *, out_dir: Path, name: str
) -> tuple[Path, Path]:
    """Sign a client certificate (CN ``user``, O ``group``) with the sandbox CA.

    Writes ``<name>.crt`` and ``<name>.key`` into ``out_dir`` and returns their paths
    (a real node's kubelet authenticates as ``system:node:<name>`` in ``system:nodes``).
    """
    ca_cert, ca_key = _load_ca(pki_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = out_dir / f"{name}.crt", out_dir / f"{name}.key"
    _issue(
        ca_cert,
        ca_key,
        subject=_name(user, group),
        sans=(),
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        cert_file=cert_file,
        key_file=key_file,
    )
    return cert_file, key_file


def _load_ca(pki_dir: Path) -> tuple[x509.Certificate, _PrivateKey]:
    pki = PKI.at(pki_dir)
    try:
        ca_cert = x509.load_pem_x509_certificate(pki.ca_file.read_bytes())
        ca_key = serialization.load_pem_private_key(pki.ca_key_file.read_bytes(), password=None)
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"no sandbox CA in {pki_dir}; start the sandbox (or call generate_pki) first"
        ) from exc
    if not isinstance(ca_key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        raise TypeError(f"unsupported CA key type {type(ca_key).__name__}")
    return ca_cert, ca_key


def _issue(
    ca_cert: x509.Certificate,
    ca_key: _PrivateKey,
    *,
    subject: x509.Name,
    sans: Iterable[str],
    usage: x509.ObjectIdentifier,
    cert_file: Path,
    key_file: Path,
) -> None:
    key = _new_key()
    now = _now()
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=True,
                key_cert_sign=False,
                crl_sign=False,
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    names = [_general_name(s) for s in sans]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write_cert(cert_file, cert)
    _write_key(key_file, key)


def _new_key() -> rsa.RSAPrivateKey:
    # RSA 2048 is what every Kubernetes component and Go's TLS stack accept.
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    # X.509 caps a CN at 64 characters; a longer DNS name (a Service in a
    # long namespace) stays whole in the SANs, which is what TLS clients check.
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])]
    if organization is not None:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _general_name(san: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(san))
    except ValueError:
        return x509.DNSName(san)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _write_key(path: Path, key: _PrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
