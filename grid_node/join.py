"""``grid allocator node start --join FILE``: one file and one command provision a machine.

The join file (``grid allocator join write``, 0600) holds the server URL, the SHA-256 of the
server's CA certificate and a one-time join token. Joining:

1. fetches the CA the server serves at ``/tls/ca.pem`` and accepts it only if its fingerprint
   equals the pinned one (the one unverified request; nothing secret is sent with it);
2. spends the join token over HTTPS verified against that CA, receiving a host-scoped node
   credential;
3. stores the CA (``grid-ca.pem``) and the credential (``node-token``, 0600) in the node's
   state directory, and removes the spent join file.

A replayed, expired or forged join token is refused by the server with one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec

from grid_core.bodies import JoinFile
from grid_core.client import Calls, GridClient, check_credential_transport, fetch_pinned_ca
from grid_core.errors import ValidationError
from grid_core.system import write_atomic

CA_FILE = "grid-ca.pem"
"""The pinned Grid CA certificate inside the node's state directory (public)."""
TOKEN_FILE = "node-token"
"""The node credential a join produced, inside the node's state directory (0600)."""
JOIN_TIMEOUT_S = 30.0
"""One join request: the server signs a credential and writes one small file."""


@dataclass(frozen=True)
class Joined:
    """What a join produced: where the Grid is and the files the node agent uses."""

    grid_url: str
    host_id: str
    token_file: Path
    ca_file: Path | None


def read_join_file(path: Path) -> JoinFile:
    """The join file, refused if others can read it or it is not a join file.

    Raises:
        ValidationError: missing, readable by others, or malformed (names the file).
    """
    try:
        mode = path.stat().st_mode & 0o777
        raw = path.read_bytes()
    except OSError as exc:
        raise ValidationError(f"--join {path}: cannot read it ({exc.strerror})") from None
    if mode & 0o077:
        msg = f"--join {path} is readable by other users (mode {mode:o}); run 'chmod 600 {path}'"
        raise ValidationError(msg)
    try:
        return msgspec.json.decode(raw, type=JoinFile)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        msg = f"--join {path}: not a join file ({exc}); write one with 'grid allocator join write'"
        raise ValidationError(msg) from None


def join(path: Path, state_dir: Path) -> Joined:
    """Spend the join file at ``path`` and store the CA and credential under ``state_dir``.

    Raises:
        ValidationError: the join file is unreadable or malformed, or names plain HTTP off
            loopback.
        TlsRefused: the server's CA does not match the pin, or its certificate fails
            verification against it.
        RequestRefused: the server refused the token (replayed, expired, forged).
        ServerUnreachable: no server answered.
    """
    doc = read_join_file(path)
    url = check_credential_transport(doc.grid_url, "join token")
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca_file: Path | None = None
    if url.startswith("https://") and doc.ca_sha256:
        pem = fetch_pinned_ca(url, doc.ca_sha256, timeout=JOIN_TIMEOUT_S)
        ca_file = state_dir / CA_FILE
        write_atomic(ca_file, pem, mode=0o644)
    with GridClient(url, ca_file=ca_file, timeout=JOIN_TIMEOUT_S) as client:
        client.join_token = doc.join_token
        credential = client.send(Calls.redeem_join())
    token_file = state_dir / TOKEN_FILE
    write_atomic(token_file, msgspec.json.encode(credential) + b"\n")
    path.unlink(missing_ok=True)  # spent: it can never work again
    return Joined(url, credential.host_id, token_file, ca_file)
