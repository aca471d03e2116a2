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

ETCD_HELP = {
    "etcd-ca": "CA certificate that signed etcd's server certificate (etcds:// stores).",
    "etcd-cert": "Client certificate presented to etcd (with --etcd-key).",
    "etcd-key": "Private key of --etcd-cert (give both or neither).",
    "etcd-user": "etcd user, when etcd's role-based access control is on "
    "(with --etcd-password-file).",
    "etcd-password-file": "File holding --etcd-user's password (never the password itself).",
}
"""Help text of each ``--etcd-*`` option by flag name (without ``--``): the one text every
command that takes the option shows (``grid up``, ``grid allocator state copy``)."""

EtcdCaOption = Annotated[Path | None, typer.Option("--etcd-ca", help=ETCD_HELP["etcd-ca"])]
"""``--etcd-ca``: the CA etcd's server certificate is verified with."""

EtcdCertOption = Annotated[Path | None, typer.Option("--etcd-cert", help=ETCD_HELP["etcd-cert"])]
"""``--etcd-cert``: the client certificate presented to etcd (with ``--etcd-key``)."""

EtcdKeyOption = Annotated[Path | None, typer.Option("--etcd-key", help=ETCD_HELP["etcd-key"])]
"""``--etcd-key``: the private key of ``--etcd-cert`` (the two go together)."""

EtcdUserOption = Annotated[str | None, typer.Option("--etcd-user", help=ETCD_HELP["etcd-user"])]
"""``--etcd-user``: the etcd user (with ``--etcd-password-file``)."""

EtcdPasswordFileOption = Annotated[
    Path | None,
    typer.Option("--etcd-password-file", help=ETCD_HELP["etcd-password-file"]),
]
"""``--etcd-password-file``: the file holding ``--etcd-user``'s password (never the password
itself on the command line)."""
