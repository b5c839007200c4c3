"""The sandbox PKI: every certificate chains to the CA and says what Kubernetes reads."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from nmo_sandbox.pki import PKI, generate_pki, issue_serving_cert


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return generate_pki(tmp_path_factory.mktemp("pki"))


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _sans(cert: x509.Certificate) -> tuple[set[str], set[str]]:
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = {str(ip) for ip in ext.get_values_for_type(x509.IPAddress)}
    return ips, set(ext.get_values_for_type(x509.DNSName))


def _eku(cert: x509.Certificate) -> set[x509.ObjectIdentifier]:
    return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_ca_is_a_self_signed_ca(pki: PKI) -> None:
    ca = _load(pki.ca_file)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    ca.verify_directly_issued_by(ca)


@pytest.mark.parametrize("attr", ["serving_cert_file", "admin_cert_file"])
def test_leaf_certificates_chain_to_the_ca(pki: PKI, attr: str) -> None:
    cert = _load(getattr(pki, attr))
    cert.verify_directly_issued_by(_load(pki.ca_file))
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


@pytest.mark.parametrize(
    ("cert_attr", "key_attr"),
    [("serving_cert_file", "serving_key_file"), ("admin_cert_file", "admin_key_file")],
)
def test_keys_match_certificates(pki: PKI, cert_attr: str, key_attr: str) -> None:
    key = serialization.load_pem_private_key(getattr(pki, key_attr).read_bytes(), None)
    assert key.public_key() == _load(getattr(pki, cert_attr)).public_key()
    assert getattr(pki, key_attr).stat().st_mode & 0o077 == 0


def test_serving_cert_covers_loopback_and_in_cluster_names(pki: PKI) -> None:
    cert = _load(pki.serving_cert_file)
    ips, dns = _sans(cert)
    assert "127.0.0.1" in ips
    assert {"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"} <= dns
    assert ExtendedKeyUsageOID.SERVER_AUTH in _eku(cert)


def test_admin_client_cert_is_in_system_masters(pki: PKI) -> None:
    cert = _load(pki.admin_cert_file)
    org = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert [a.value for a in org] == ["system:masters"]
    assert [a.value for a in cn] == ["nmo-admin"]
    assert _eku(cert) == {ExtendedKeyUsageOID.CLIENT_AUTH}


def test_service_account_key_pair_is_rsa_and_matches(pki: PKI) -> None:
    private = serialization.load_pem_private_key(pki.sa_key_file.read_bytes(), None)
    public = serialization.load_pem_public_key(pki.sa_pub_file.read_bytes())
    assert isinstance(private, rsa.RSAPrivateKey)
    assert isinstance(public, rsa.RSAPublicKey)
    signature = private.sign(b"token", padding.PKCS1v15(), hashes.SHA256())
    public.verify(signature, b"token", padding.PKCS1v15(), hashes.SHA256())


def test_issue_serving_cert_for_webhook(pki: PKI, tmp_path: Path) -> None:
    served = issue_serving_cert(pki.dir, ["127.0.0.1", "nmo-webhook.nmo.svc"], out_dir=tmp_path)
    cert = _load(served.cert_file)
    cert.verify_directly_issued_by(_load(served.ca_file))
    assert served.cert_file.parent == tmp_path
    assert served.ca_bundle == pki.ca_file.read_bytes()
    ips, dns = _sans(cert)
    assert ips == {"127.0.0.1"}
    assert dns == {"nmo-webhook.nmo.svc"}
    assert ExtendedKeyUsageOID.SERVER_AUTH in _eku(cert)


def test_issue_serving_cert_needs_a_ca(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no sandbox CA"):
        issue_serving_cert(tmp_path, ["127.0.0.1"])


def test_issue_serving_cert_needs_sans(pki: PKI) -> None:
    with pytest.raises(ValueError, match="SAN"):
        issue_serving_cert(pki.dir, [])
