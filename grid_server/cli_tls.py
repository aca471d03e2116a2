"""``grid tls init|issue|fingerprint`` — a private CA and certificates for the control plane.

The material itself is made by :mod:`grid_core.tls` (the ``cryptography`` library); these
commands only name files and print what to do next. Private keys are written 0600 and never
printed.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from grid_core.errors import GridError
from grid_core.tls import (
    CA_CERT,
    CA_KEY,
    CERT_DAYS,
    ca_fingerprint,
    init_tls,
    issue_cert,
)
from grid_server.client import CliError

SanOpt = typer.Option(
    [],
    "--san",
    help="Hostname or IP the certificate must cover (repeatable).",
)


DirArg = typer.Argument(..., help="Directory for ca.pem, ca-key.pem, server.pem, server-key.pem.")
CertArg = typer.Argument(..., help="Where to write the certificate chain (PEM).")
KeyArg = typer.Argument(..., help="Where to write its private key (0600).")
CaDirOpt = typer.Option(..., "--ca-dir", help="Directory holding ca.pem and ca-key.pem.")
CaCertArg = typer.Argument(..., help="A CA certificate (PEM).")


def init(
    directory: Path = DirArg,
    san: list[str] = SanOpt,
    days: int = typer.Option(CERT_DAYS, "--days", help="Server certificate lifetime in days."),
    as_json: bool = typer.Option(
        False, "--json", help="The written paths and fingerprint as JSON."
    ),
) -> None:
    """Create a private CA and a server certificate whose SANs cover --san names (and loopback).

    Start the server with ``grid up --tls-cert DIR/server.pem --tls-key DIR/server-key.pem
    --tls-ca DIR/ca.pem``; give DIR/ca.pem (public) to operators and nodes. Keep
    DIR/ca-key.pem on this machine.
    """
    try:
        files = init_tls(directory.expanduser().resolve(), san, days=days)
    except GridError as exc:
        raise CliError(str(exc), exc.exit_code) from None
    doc = {
        "ca_cert": str(files.ca_cert),
        "ca_key": str(files.ca_key),
        "cert": str(files.cert),
        "key": str(files.key),
        "ca_sha256": files.ca_sha256,
    }
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
        return
    typer.echo(f"grid: wrote a private CA and a server certificate to {directory}")
    typer.echo(f"  CA certificate  {files.ca_cert}  (public: give it to clients and nodes)")
    typer.echo(f"  CA key          {files.ca_key}  (0600: keep it here)")
    typer.echo(f"  server chain    {files.cert}")
    typer.echo(f"  server key      {files.key}  (0600)")
    typer.echo(f"  CA fingerprint  sha256:{files.ca_sha256}")
    typer.echo(
        f"start: grid up --host ADDRESS --tls-cert {files.cert} --tls-key {files.key} "
        f"--tls-ca {files.ca_cert}"
    )


def issue(
    cert: Path = CertArg,
    key: Path = KeyArg,
    san: list[str] = SanOpt,
    ca_dir: Path = CaDirOpt,
    days: int = typer.Option(CERT_DAYS, "--days", help="Lifetime in days."),
    force: bool = typer.Option(False, "--force", help="Replace existing files (rotation)."),
) -> None:
    """Sign another certificate with the CA in --ca-dir (a node's engine, a renewed server).

    Unlike ``init``, loopback is not added: an engine certificate covers exactly the address
    the node advertises.
    """
    for path in (cert, key):
        if path.exists() and not force:
            msg = f"{path} already exists; pass --force to replace it (rotation)"
            raise CliError(msg, 2)
    ca_dir = ca_dir.expanduser().resolve()
    try:
        issue_cert(ca_dir / CA_CERT, ca_dir / CA_KEY, san, cert, key, days=days)
    except GridError as exc:
        raise CliError(str(exc), exc.exit_code) from None
    typer.echo(f"grid: wrote {cert} and {key} (0600), valid {days} days for {', '.join(san)}")


def fingerprint(
    ca_cert: Path = CaCertArg,
) -> None:
    """Print the SHA-256 fingerprint of a CA certificate (what join tokens pin)."""
    try:
        typer.echo("sha256:" + ca_fingerprint(ca_cert.read_bytes()))
    except OSError as exc:
        raise CliError(f"{ca_cert}: cannot read ({exc.strerror})", 2) from None
    except GridError as exc:
        raise CliError(f"{ca_cert}: {exc}", 2) from None


def register(cli: object) -> None:
    """Mount ``grid tls``."""
    from grid_core.cliregistry import CliRegistry

    assert isinstance(cli, CliRegistry)
    group = cli.group("tls", help="A private CA and certificates for HTTPS control and engines.")
    group.command("init")(init)
    group.command("issue")(issue)
    group.command("fingerprint")(fingerprint)
