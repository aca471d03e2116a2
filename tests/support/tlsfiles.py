"""Test certificates made with the ``cryptography`` library: a private CA and leaves.

Keys are EC P-256 (fast to make on a loaded machine); files are written owner-only, as an
operator's would be. Nothing here is used by Grid itself.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DAY = datetime.timedelta(days=1)


def _write(path: Path, data: bytes, mode: int = 0o600) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass
class TestCa:
    """A private CA: its certificate file and what is needed to issue leaves."""

    __test__ = False  # not a pytest test class

    cert_path: Path
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def issue(
        self,
        directory: Path,
        name: str,
        hosts: list[str],
        *,
        not_after: datetime.datetime | None = None,
        key_mode: int = 0o600,
    ) -> tuple[Path, Path]:
        """A server certificate for ``hosts`` (IPs become IP SANs); returns (cert, key)."""
        now = datetime.datetime.now(datetime.UTC)
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = []
        for h in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - DAY)
            .not_valid_after(not_after or now + 30 * DAY)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        directory.mkdir(parents=True, exist_ok=True)
        cert_path = _write(
            directory / f"{name}.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644
        )
        key_path = _write(directory / f"{name}-key.pem", _key_pem(key), key_mode)
        return cert_path, key_path


def make_ca(directory: Path, name: str = "grid-test-ca") -> TestCa:
    """A self-signed CA valid for 30 days, written to ``directory/name.pem``."""
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - DAY)
        .not_valid_after(now + 30 * DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    path = _write(directory / f"{name}.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return TestCa(cert_path=path, cert=cert, key=key)
