"""Test certificates: a private CA and leaves, made by Grid's own ``grid tls`` code.

The CA and every leaf come from :func:`grid_core.tls.make_ca` and
:func:`grid_core.tls.issue_cert` (EC P-256, key files owner-only, the certificate file a full
chain), so tests exercise the very files an operator's ``grid tls init|issue`` writes. The
only test-specific knobs are an already expired leaf and a key file with loose permissions.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from grid_core import tls

TEST_CERT_DAYS = 30
"""Validity of a test leaf: longer than any test run, far shorter than a real certificate."""


@dataclass
class TestCa:
    """A private CA in its own directory: its certificate and key files."""

    __test__ = False  # not a pytest test class

    cert_path: Path
    key_path: Path

    def issue(
        self,
        directory: Path,
        name: str,
        hosts: list[str],
        *,
        not_after: datetime.datetime | None = None,
        key_mode: int = 0o600,
    ) -> tuple[Path, Path]:
        """A server certificate for ``hosts`` (IPs become IP SANs); returns (cert, key).

        Args:
            directory: where ``<name>.pem`` (chain) and ``<name>-key.pem`` are written.
            name: file name stem.
            hosts: hostnames and IP literals the certificate covers.
            not_after: end of validity (a past time makes an expired certificate); default
                :data:`TEST_CERT_DAYS` from now.
            key_mode: permissions of the key file (loose ones are refused by the node).
        """
        directory.mkdir(parents=True, exist_ok=True)
        cert, key = directory / f"{name}.pem", directory / f"{name}-key.pem"
        if not_after is None:
            tls.issue_cert(self.cert_path, self.key_path, hosts, cert, key, days=TEST_CERT_DAYS)
        else:
            start = not_after - datetime.timedelta(days=1)
            tls.issue_cert(
                self.cert_path, self.key_path, hosts, cert, key, days=1, not_before=start
            )
        key.chmod(key_mode)
        return cert, key


def make_ca(directory: Path, name: str = "grid-test-ca") -> TestCa:
    """A new private CA named ``name`` in ``directory/name/`` (``ca.pem``, ``ca-key.pem``)."""
    cert, key = tls.make_ca(directory / name, name)
    return TestCa(cert_path=cert, key_path=key)
