"""TLS material for the control plane: a private CA, certificates, verification and its errors.

Source: the specification's "Remote Grid deployment" (remote workers use HTTPS for Grid
control; a private intranet CA; the certificate SAN must cover the exact hostname or IP; the
TLS private key must be owner-only).

What lives here, once, for the server, the node agent and the CLI:

* making a private CA and certificates signed by it (the ``cryptography`` library: EC P-256
  keys, X.509 v3 with SANs), keys written owner-only (0600);
* the SHA-256 fingerprint of a CA certificate (what a join token pins);
* the client-side :class:`ssl.SSLContext` that verifies a server against a given CA;
* :func:`describe_tls_failure`, which turns a failed handshake into one line naming the
  problem (wrong CA, expired, SAN mismatch, not TLS at all) instead of a traceback.

Layering: an edge module of ``grid_core`` (it reads and writes files); decision modules never
import it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import os
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from grid_core.errors import EXIT_RUNTIME_FAILURE, GridError, ValidationError
from grid_core.system import OWNER_ONLY, write_atomic

CA_DAYS = 3650
"""A private CA lives ten years: rotating the trust anchor means touching every machine."""
CERT_DAYS = 397
"""Leaf certificates live 397 days (the public web's ceiling): rotation stays a yearly habit."""
MAX_CERT_DAYS = CA_DAYS
"""No leaf outlives the CA that signs it."""
CLOCK_SKEW_S = 300
"""Certificates start 5 minutes in the past so a peer whose clock lags a little accepts them."""
PUBLIC_MODE = 0o644
"""Certificates are public documents."""
LOOPBACK_SANS = ("localhost", "127.0.0.1", "::1")
"""Every server certificate also covers loopback, so the local CLI verifies its own server."""

CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"
SERVER_CERT = "server.pem"
SERVER_KEY = "server-key.pem"

# OpenSSL X509_V_ERR_* codes a verification failure carries (include/openssl/x509_vfy.h).
_EXPIRED = 10
_NOT_YET_VALID = 9
_HOSTNAME_MISMATCH = 62
_IP_MISMATCH = 64
_UNTRUSTED = frozenset({2, 18, 19, 20, 21, 27})
"""Issuer unknown, self-signed leaf or chain, unable to verify the first certificate, or
untrusted: the server's certificate does not chain to the CA the client was given."""


class TlsError(GridError):
    """A TLS file is missing, unreadable, too widely readable or not what it claims."""

    exit_code = EXIT_RUNTIME_FAILURE


class TlsRefused(GridError):
    """The server's certificate failed verification (one line naming the problem)."""

    http_status = 495
    exit_code = EXIT_RUNTIME_FAILURE


@dataclass(frozen=True)
class IssuedFiles:
    """Paths ``grid tls init`` / ``issue`` wrote.

    Attributes:
        ca_cert: the CA certificate (public; give it to every client and node).
        ca_key: the CA private key (0600; keep it on the controller, offline if possible).
        cert: the leaf certificate (public).
        key: the leaf private key (0600).
        ca_sha256: the CA fingerprint (hex SHA-256 of its DER form).
    """

    ca_cert: Path
    ca_key: Path
    cert: Path
    key: Path
    ca_sha256: str


def parse_san(text: str) -> str:
    """One subject alternative name: a DNS name or an IP literal (IPv6 without brackets).

    Raises:
        ValidationError: empty, or a name that is neither a hostname nor an IP address.
    """
    value = text.strip().strip("[]")
    if not value:
        raise ValidationError("--san: give a hostname or an IP address, e.g. grid.lan")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    labels = value.rstrip(".").split(".")
    ok = all(
        0 < len(lbl) <= 63 and lbl.replace("-", "").replace("*", "").isalnum() for lbl in labels
    )
    if not ok or len(value) > 253:
        msg = f"--san {text!r}: not a hostname or IP address (e.g. grid.lan, 198.18.0.1)"
        raise ValidationError(msg)
    return value.lower()


def _san_entries(names: Iterable[str]) -> list[object]:
    from cryptography import x509

    out: list[object] = []
    seen: set[str] = set()
    for name in names:
        value = parse_san(name)
        if value in seen:
            continue
        seen.add(value)
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(value)))
        except ValueError:
            out.append(x509.DNSName(value))
    return out


def check_private_key_file(path: Path, flag: str) -> None:
    """Refuse a private key that is missing or readable by group or others.

    Raises:
        TlsError: names ``flag``, the file and the fix.
    """
    try:
        mode = path.stat().st_mode & 0o777
    except OSError as exc:
        msg = f"{flag} {path}: cannot read it ({exc.strerror})"
        raise TlsError(msg) from None
    if mode & 0o077:
        msg = (
            f"{flag} {path}: the private key is readable by others (mode {mode:o}); "
            f"run 'chmod 600 {path}'"
        )
        raise TlsError(msg)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _write_key(path: Path, key: object) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    assert isinstance(key, ec.EllipticCurvePrivateKey)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    write_atomic(path, pem, mode=OWNER_ONLY)


def _cert_pem(cert: object) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    assert isinstance(cert, x509.Certificate)
    return cert.public_bytes(serialization.Encoding.PEM)


def make_ca(directory: Path, common_name: str, *, days: int = CA_DAYS) -> tuple[Path, Path]:
    """Create a private CA (``ca.pem``, ``ca-key.pem`` 0600) in ``directory``.

    Returns:
        ``(ca_cert_path, ca_key_path)``.

    Raises:
        StateError: a file could not be written.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start = _now() - dt.timedelta(seconds=CLOCK_SKEW_S)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    ca_cert, ca_key = directory / CA_CERT, directory / CA_KEY
    _write_key(ca_key, key)
    write_atomic(ca_cert, _cert_pem(cert), mode=PUBLIC_MODE)
    return ca_cert, ca_key


def issue_cert(
    ca_cert: Path,
    ca_key: Path,
    sans: Sequence[str],
    cert_out: Path,
    key_out: Path,
    *,
    days: int = CERT_DAYS,
    not_before: dt.datetime | None = None,
) -> None:
    """Sign a server certificate covering ``sans`` with the CA, and write it and its key.

    The certificate file holds the leaf followed by the CA (a full chain); the key is 0600.

    Args:
        ca_cert / ca_key: the signing CA's files (``make_ca``).
        sans: hostnames and IP literals the certificate must cover (at least one).
        cert_out / key_out: where to write the chain (0644) and the key (0600).
        days: validity in days (1..:data:`MAX_CERT_DAYS`).
        not_before: start of validity (default: now minus :data:`CLOCK_SKEW_S`).

    Raises:
        ValidationError: no SAN, a malformed SAN, or ``days`` out of range.
        TlsError: the CA files are unreadable or do not belong together.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not 1 <= days <= MAX_CERT_DAYS:
        raise ValidationError(f"--days {days}: use 1..{MAX_CERT_DAYS}")
    entries = _san_entries(sans)
    if not entries:
        raise ValidationError("--san: give at least one hostname or IP address")
    check_private_key_file(ca_key, "--ca-key")
    try:
        authority = x509.load_pem_x509_certificate(ca_cert.read_bytes())
        signer = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        msg = f"CA {ca_cert} / {ca_key}: cannot load ({exc}); make one with 'grid tls init'"
        raise TlsError(msg) from None
    if not isinstance(signer, ec.EllipticCurvePrivateKey) or (
        signer.public_key().public_numbers() != authority.public_key().public_numbers()  # type: ignore[union-attr]  # EC CA keys only (made here)
    ):
        raise TlsError(f"{ca_key} is not the private key of {ca_cert}")
    key = ec.generate_private_key(ec.SECP256R1())
    first = parse_san(sans[0])
    start = not_before or _now() - dt.timedelta(seconds=CLOCK_SKEW_S)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, first)]))
        .issuer_name(authority.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(entries), critical=False)  # type: ignore[arg-type]  # DNSName | IPAddress
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False
        )
        .sign(signer, hashes.SHA256())
    )
    _write_key(key_out, key)
    write_atomic(cert_out, _cert_pem(cert) + _cert_pem(authority), mode=PUBLIC_MODE)


def init_tls(
    directory: Path, sans: Sequence[str], *, days: int = CERT_DAYS, name: str = "Grid private CA"
) -> IssuedFiles:
    """A new private CA and a server certificate for ``sans`` (plus loopback) in ``directory``.

    Raises:
        ValidationError: a malformed SAN or ``days`` out of range (nothing is written).
        TlsError: ``directory`` already holds a CA (never overwritten: clients trust it).
    """
    all_sans = [*sans, *LOOPBACK_SANS]
    _san_entries(all_sans)  # validate before anything is written
    if not 1 <= days <= MAX_CERT_DAYS:
        raise ValidationError(f"--days {days}: use 1..{MAX_CERT_DAYS}")
    if (directory / CA_CERT).exists() or (directory / CA_KEY).exists():
        msg = (
            f"{directory} already holds a CA ({CA_CERT}); issue more certificates from it with "
            "'grid tls issue', or choose another directory"
        )
        raise TlsError(msg)
    ca_cert, ca_key = make_ca(directory, name)
    cert, key = directory / SERVER_CERT, directory / SERVER_KEY
    issue_cert(ca_cert, ca_key, all_sans, cert, key, days=days)
    return IssuedFiles(ca_cert, ca_key, cert, key, ca_fingerprint(ca_cert.read_bytes()))


def ca_fingerprint(pem: bytes) -> str:
    """Hex SHA-256 of the DER form of the first certificate in ``pem`` (lowercase, no colons).

    Raises:
        TlsError: ``pem`` holds no PEM certificate.
    """
    text = pem.decode("ascii", errors="replace")
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    start = text.find(begin)
    stop = text.find(end, start)
    if start < 0 or stop < 0:
        raise TlsError("not a PEM certificate (no BEGIN CERTIFICATE block)")
    der = ssl.PEM_cert_to_DER_cert(text[start : stop + len(end)] + "\n")
    return hashlib.sha256(der).hexdigest()


def normalize_fingerprint(text: str) -> str:
    """``sha256:AB:CD…`` or ``abcd…`` → 64 lowercase hex digits.

    Raises:
        ValidationError: not a SHA-256 fingerprint.
    """
    hexits = text.strip().lower().removeprefix("sha256:").replace(":", "")
    if len(hexits) != 64 or any(c not in "0123456789abcdef" for c in hexits):
        raise ValidationError(f"CA fingerprint {text!r}: give the 64 hex digits of a SHA-256")
    return hexits


def client_context(ca_file: Path | str | None) -> ssl.SSLContext:
    """The context a client verifies a Grid server with: ``ca_file`` as the only trust anchor,
    or the system store when ``None``. Hostname/IP checking is on.

    Raises:
        TlsError: ``ca_file`` cannot be read or holds no certificate.
    """
    if ca_file is None:
        return ssl.create_default_context()
    try:
        return ssl.create_default_context(cafile=os.fspath(ca_file))
    except (OSError, ssl.SSLError) as exc:
        msg = f"CA file {ca_file}: cannot load it ({exc}); give the CA certificate (ca.pem)"
        raise TlsError(msg) from None


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """Check that ``cert`` and ``key`` load and belong together (what the server will serve).

    Raises:
        TlsError: a file is missing, unreadable, the key is readable by others, or they do
            not match.
    """
    check_private_key_file(key, "--tls-key")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(os.fspath(cert), os.fspath(key))
    except FileNotFoundError as exc:
        msg = f"--tls-cert/--tls-key: {exc.filename} does not exist"
        raise TlsError(msg) from None
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "reason", None) or exc
        msg = f"--tls-cert {cert} / --tls-key {key}: cannot serve with them ({reason})"
        raise TlsError(msg) from None
    return ctx


def describe_tls_failure(exc: BaseException, url: str) -> str | None:
    """One line naming why a TLS connection to ``url`` failed, or ``None`` if ``exc`` (or
    anything it was raised from) is not a TLS failure.

    Recognised: a certificate not signed by the given CA, an expired or not-yet-valid
    certificate, a SAN that does not cover the host, and a peer that does not speak TLS.
    """
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ssl.SSLCertVerificationError):
            return _verification_line(cur, url)
        if isinstance(cur, ssl.SSLError):
            reason = getattr(cur, "reason", None) or str(cur)
            return (
                f"TLS handshake with {url} failed ({reason}); is it an https:// Grid server "
                "(grid up --tls-cert/--tls-key)?"
            )
        cur = cur.__cause__ or cur.__context__
    return None


def _verification_line(err: ssl.SSLCertVerificationError, url: str) -> str:
    code = err.verify_code
    detail = err.verify_message or str(err)
    if code == _EXPIRED:
        what = "the server's certificate has expired; issue a new one with 'grid tls issue'"
    elif code == _NOT_YET_VALID:
        what = "the server's certificate is not valid yet; check both machines' clocks"
    elif code in (_HOSTNAME_MISMATCH, _IP_MISMATCH):
        what = (
            "the server's certificate does not cover this host name (SAN mismatch); connect by "
            "a name it covers or issue one with --san for it"
        )
    elif code in _UNTRUSTED:
        what = "the server's certificate is not signed by the given CA (wrong CA file?)"
    else:
        what = "the server's certificate was refused"
    return f"TLS verification of {url} failed: {what} ({detail})"
