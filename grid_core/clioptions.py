"""Command-line options that several ``grid`` commands declare alike, as ``Annotated`` types.

A command declares one as ``grid: GridOption = None``: the flag, its help and its type are
written here once, so every command that takes it shows and parses it the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from grid_core.grids import GRID_OPTION_HELP

GridOption = Annotated[str | None, typer.Option("--grid", help=GRID_OPTION_HELP)]
"""``--grid``: the server to talk to (URL, configured grid name or ``local``)."""

OperatorTokenOption = Annotated[
    Path | None, typer.Option("--token-file", help="File holding the operator capability.")
]
"""``--token-file``: the operator capability an operator-only request carries."""

EtcdCaOption = Annotated[Path | None, typer.Option("--etcd-ca", help="CA of etcd's certificate.")]
"""``--etcd-ca``: the CA etcd's server certificate is verified with."""

EtcdCertOption = Annotated[Path | None, typer.Option("--etcd-cert", help="Client certificate.")]
"""``--etcd-cert``: the client certificate presented to etcd (with ``--etcd-key``)."""

EtcdUserOption = Annotated[str | None, typer.Option("--etcd-user", help="etcd user (RBAC).")]
"""``--etcd-user``: the etcd user (with ``--etcd-password-file``)."""

EtcdPasswordFileOption = Annotated[
    Path | None,
    typer.Option("--etcd-password-file", help="File holding that user's password."),
]
"""``--etcd-password-file``: the file holding ``--etcd-user``'s password (never the password
itself on the command line)."""
