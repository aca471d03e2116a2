"""Run the server in the foreground: ``python -m grid_server.serve [--host --port ...]``.

The socket is bound before the app starts so ``--port 0`` works: the actual URL is printed
and written to ``$GRID_HOME/server.json`` (with the PID and process birth time that
``grid down`` uses to prove identity before it signals anything).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import msgspec

from grid_core import grids
from grid_core.errors import EXIT_USAGE, GridError
from grid_core.planner import NATIVE as PLANNER_BUILD
from grid_core.store import StoreIdentity
from grid_core.system import ProcessIdentity, write_atomic
from grid_core.system.logs import configure_daemon_logging
from grid_core.tls import server_context
from grid_server.home import SERVER_FILE, grid_home

if TYPE_CHECKING:
    from grid_server.app import GridApp
    from grid_server.context import ServerContext

DEFAULT_HOST = grids.DEFAULT_HOST
DEFAULT_PORT = grids.DEFAULT_PORT
LISTEN_BACKLOG = 2048
"""Accept queue: a benchmark burst at concurrency 32 never sees a refused connection."""
MAX_PORT = 65535
"""TCP ports are 16-bit; 0 asks the kernel for any free port."""
SERVER_MARKER = "grid_server.serve"
"""Command-line marker ``grid down`` checks before it signals a PID."""
ANNOUNCE_MODE = 0o644
"""``server.json`` and the URL file hold no secret (URL, PID, birth): as before, readable."""


ETCD_FLAGS = {
    "etcd-ca": "ca_file",
    "etcd-cert": "cert_file",
    "etcd-key": "key_file",
    "etcd-user": "username",
    "etcd-password-file": "password_file",
}
"""``grid up`` flags for the etcd store → :func:`grid_server.store.open_state_store` fields."""


def check_port(port: int, flag: str = "--port") -> None:
    """Refuse a port outside 0..65535 before anything is bound or started.

    Raises:
        ValidationError: the message names the flag, the value and the accepted range.
    """
    from grid_core.errors import ValidationError

    if not 0 <= port <= MAX_PORT:
        msg = f"{flag} {port}: use a TCP port in 1-{MAX_PORT}, or 0 for any free port"
        raise ValidationError(msg)


class ServerTls(NamedTuple):
    """The server's TLS files (``grid up --tls-cert --tls-key [--tls-ca]``).

    Attributes:
        cert: certificate chain (PEM) whose SANs cover the names clients use.
        key: its private key (owner-only).
        ca: the CA that signed ``cert``, if private: announced in ``server.json`` for local
            clients and pinned by fingerprint in join tokens (it holds no secret).
    """

    cert: Path
    key: Path
    ca: Path | None = None

    def check(self) -> None:
        """Refuse unusable files before anything is bound (one line naming the problem).

        Raises:
            TlsError: a missing or unreadable file, a key others can read, a key that does
                not match the certificate, or an unreadable CA file.
        """
        from grid_core.tls import client_context

        server_context(self.cert, self.key)
        if self.ca is not None:
            client_context(self.ca)


def tls_from_flags(cert: Path | None, key: Path | None, ca: Path | None) -> ServerTls | None:
    """The TLS files from ``--tls-cert/--tls-key/--tls-ca`` (checked), or ``None`` for HTTP.

    Raises:
        ValidationError: only one of the certificate and the key, or a CA without them.
        TlsError: the files are unusable (see :meth:`ServerTls.check`).
    """
    from grid_core.errors import ValidationError

    if cert is None and key is None:
        if ca is not None:
            raise ValidationError("--tls-ca needs --tls-cert and --tls-key (the server's own)")
        return None
    if cert is None or key is None:
        raise ValidationError("--tls-cert and --tls-key go together: give both (or neither)")
    tls = ServerTls(
        cert.expanduser().resolve(),
        key.expanduser().resolve(),
        ca.expanduser().resolve() if ca is not None else None,
    )
    tls.check()
    return tls


CLIENT_KEY_MODES = ("required", "open")


def client_keys_required(host: str, mode: str | None) -> bool:
    """Whether ``/v1`` requires client keys: as ``mode`` says, else only off loopback.

    Raises:
        ValidationError: ``mode`` is neither ``required`` nor ``open``.
    """
    from grid_core.errors import ValidationError
    from grid_server.registry import is_loopback_host

    if mode is None:
        return not is_loopback_host(host)
    if mode not in CLIENT_KEY_MODES:
        raise ValidationError(f"--client-keys {mode!r}: use required or open")
    return mode == "required"


def exposure_warning(host: str, tls: bool = False) -> str | None:
    """A one-line warning when ``host`` is not loopback (others on the network can connect)."""
    from grid_server.registry import is_loopback_host

    if is_loopback_host(host):
        return None
    where = "every network interface" if host in ("0.0.0.0", "::", "") else host
    if tls:
        return (
            f"grid: warning: --host {host} accepts connections on {where} (HTTPS): other "
            "machines can reach the API; credentials are required for control, client keys for "
            "/v1 (see docs/security.md)"
        )
    return (
        f"grid: warning: --host {host} accepts connections on {where}: other machines can reach "
        "the API and the models (plain HTTP; credentials are refused off loopback); bind "
        "127.0.0.1, or serve HTTPS with --tls-cert/--tls-key"
    )


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port`` 0 picks a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must be IPPROTO_TCP explicitly: asyncio only sets TCP_NODELAY on accepted sockets
    # whose proto says TCP, and without it Nagle adds ~40 ms to small responses.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(LISTEN_BACKLOG)
    sock.set_inheritable(True)
    return sock


WILDCARD_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1"}
"""A TLS server bound to every interface announces its loopback address: a certificate never
covers the wildcard address, and ``grid tls init`` always covers loopback."""


def url_of(sock: socket.socket, tls: bool = False) -> str:
    """``http(s)://host:port`` of a bound socket (IPv6 in brackets)."""
    host, port = sock.getsockname()[:2]
    if tls:
        host = WILDCARD_LOOPBACK.get(host, host)
    scheme = "https" if tls else "http"
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def server_record(
    url: str,
    home: Path,
    ca_file: Path | None = None,
    bind_host: str | None = None,
    state_store: StoreIdentity | None = None,
) -> dict[str, object]:
    """What ``server.json`` holds: enough to find and identity-check this process, the CA
    file local clients verify it with (a public certificate, no secret), the state store
    it uses (``grid allocator state copy`` refuses to copy to or from that one) and the
    planner build it runs (``grid up --detach`` prints it)."""
    me = ProcessIdentity.of_current()
    return {
        "url": url,
        "pid": me.pid,
        "create_time": me.birth,
        "home": str(home),
        "marker": SERVER_MARKER,
        "cmdline": list(me.cmdline or ()),
        "ca_file": str(ca_file) if ca_file is not None else None,
        "bind_host": bind_host,
        "state_store": msgspec.to_builtins(state_store) if state_store is not None else None,
        "planner_build": PLANNER_BUILD.reason,
    }


class Announcement:
    """The files that tell local clients where this server listens: ``server.json`` in the
    Grid home and, when asked, ``--url-file``.

    Args:
        url: the server's URL.
        home: the Grid home.
        bind_host: the address the listener is bound to.
        ca_file: the CA certificate clients verify a TLS server with (``None``: plain HTTP).
        url_file: a second copy of the record (``None``: none).
        state_store: the store this server keeps its controller state in.
    """

    def __init__(
        self,
        url: str,
        home: Path,
        bind_host: str,
        ca_file: Path | None,
        url_file: Path | None,
        state_store: StoreIdentity | None = None,
    ) -> None:
        self.url, self.home, self.bind_host, self.ca_file = url, home, bind_host, ca_file
        self.state_store = state_store
        self.paths = [p for p in (home / SERVER_FILE, url_file) if p is not None]

    def ready(self, ctx: ServerContext) -> None:
        """Write the record (atomically, owner-readable) once the socket listens, and say so."""
        ctx.url = self.url
        record = server_record(self.url, self.home, self.ca_file, self.bind_host, self.state_store)
        data = json.dumps(record)
        for path in self.paths:
            write_atomic(path, data, mode=ANNOUNCE_MODE)
        print(f"grid: serving on {self.url}", flush=True)
        print(f"grid: planner build: {PLANNER_BUILD.reason}", flush=True)

    def withdraw(self) -> None:
        """Remove the records this process wrote (never another server's); idempotent."""
        for path in self.paths:
            try:
                if json.loads(path.read_text()).get("pid") == os.getpid():
                    path.unlink()
            except (OSError, ValueError):
                pass


def serve(
    host: str,
    port: int,
    home: Path,
    state_dir: Path | None,
    url_file: Path | None,
    tick_interval_s: float | None = None,
    policy_file: Path | None = None,
    tls: ServerTls | None = None,
    client_keys: str | None = None,
    state_store: str | None = None,
    etcd_options: dict[str, str | None] | None = None,
    registration_grace_s: float | None = None,
) -> None:
    """Bind, announce the URL, serve until SIGINT/SIGTERM, then clean up the server file.

    ``state_store`` (``etcd://host:port[,…]``) replaces the file store with etcd, and this
    server then takes part in leader election; ``etcd_options`` carries ``ca_file``,
    ``cert_file``, ``key_file``, ``username`` and ``password_file``.

    ``policy_file`` is a JSON ``ControllerPolicy`` (planner, governor and demand tunables);
    a logical test fleet uses it for short demand windows and cooldowns. With ``tls`` the
    listener speaks HTTPS only (uvicorn's SSL options) and the URL is ``https://``.
    ``client_keys`` is ``required`` or ``open``; ``None`` means required off loopback.
    ``registration_grace_s`` overrides :data:`grid_server.runner.REGISTRATION_GRACE_S`.

    Raises:
        ValidationError: the policy file is unreadable or not a valid policy.
        TlsError: the TLS files are unusable.
        StateError: the controller state directory cannot be created.
        OSError: the address cannot be bound.
    """
    from grid_core.plugins import get_plugins
    from grid_server.app import build_app
    from grid_server.runner import REGISTRATION_GRACE_S, TICK_INTERVAL_S

    policy = load_policy(policy_file) if policy_file is not None else None
    if tls is not None:
        tls.check()
    sock = bind(host, port)
    url = url_of(sock, tls is not None)
    from grid_server.store import file_store, open_state_store, store_identity

    store = None
    if state_store is not None:
        store = open_state_store(state_store, advertise_url=url, **(etcd_options or {}))
    used = store_identity(store if store is not None else file_store(home, state_dir))
    announce = Announcement(url, home, host, tls.ca if tls else None, url_file, used)
    app = build_app(
        home,
        get_plugins(),
        state_dir=state_dir,
        on_ready=announce.ready,
        on_stopped=announce.withdraw,
        tick_interval_s=tick_interval_s or TICK_INTERVAL_S,
        policy=policy,
        tls_ca=tls.ca if tls is not None else None,
        client_keys_required=client_keys_required(host, client_keys),
        state_store=store,
        registration_grace_s=(
            REGISTRATION_GRACE_S if registration_grace_s is None else registration_grace_s
        ),
    )
    _run_uvicorn(app, sock, tls, announce)


def _run_uvicorn(
    app: GridApp, sock: socket.socket, tls: ServerTls | None, announce: Announcement
) -> None:
    """Serve ``app`` on the bound ``sock`` (HTTPS with ``tls``) until SIGINT/SIGTERM, then
    withdraw the announcement whatever the way out."""
    ssl_files: dict[str, str] = {}
    if tls is not None:
        ssl_files = {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)}
    import uvicorn  # the ASGI server: only a process that serves needs it

    config = uvicorn.Config(
        app,
        lifespan="on",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=10,
        **ssl_files,  # type: ignore[arg-type]  # str paths for uvicorn's SSL options
    )
    configure_daemon_logging()
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        # uvicorn re-raises SIGTERM after a graceful shutdown, so clean up here too.
        announce.withdraw()


def load_policy(path: Path) -> object:
    """The ``ControllerPolicy`` in JSON file ``path`` (missing fields keep their defaults).

    Raises:
        ValidationError: unreadable file or a field of the wrong type.
    """
    import msgspec

    from grid_core.controller import ControllerPolicy
    from grid_core.errors import ValidationError

    try:
        return msgspec.json.decode(path.read_bytes(), type=ControllerPolicy)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        msg = f"--policy {path}: {exc}; give a JSON ControllerPolicy (planner, governor, forecast)"
        raise ValidationError(msg) from None


def registration_grace(text: str) -> float:
    """``--registration-grace``: seconds in [0, MAX_REGISTRATION_GRACE_S].

    Raises:
        argparse.ArgumentTypeError: not a number, negative, not finite or above the bound.
    """
    from grid_server.runner import MAX_REGISTRATION_GRACE_S

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= MAX_REGISTRATION_GRACE_S:  # NaN fails every comparison
        msg = f"{text!r}: give seconds from 0 to {MAX_REGISTRATION_GRACE_S:.0f}"
        raise argparse.ArgumentTypeError(msg)
    return value


def main(argv: list[str] | None = None) -> None:
    """Command-line entry for the foreground server."""
    p = argparse.ArgumentParser(prog="grid-server")
    p.add_argument("--host", default=DEFAULT_HOST)
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--state-dir", type=Path, default=None)
    p.add_argument("--url-file", type=Path, default=None)
    p.add_argument("--tick-interval", type=float, default=None)
    p.add_argument(
        "--registration-grace",
        type=registration_grace,
        default=None,
        help="seconds after start before a model no registered host can run is called "
        "unplaceable (default: one host lease, 60)",
    )
    p.add_argument(
        "--policy",
        type=Path,
        default=None,
        help="JSON ControllerPolicy file (planner, governor, forecast tunables)",
    )
    p.add_argument("--tls-cert", type=Path, default=None, help="certificate chain (PEM)")
    p.add_argument("--tls-key", type=Path, default=None, help="its private key (0600)")
    p.add_argument("--tls-ca", type=Path, default=None, help="the CA that signed it")
    p.add_argument("--client-keys", choices=CLIENT_KEY_MODES, default=None)
    p.add_argument("--state-store", default=None, help="etcd://host:port[,host:port…][/prefix]")
    for flag in ETCD_FLAGS:
        p.add_argument(f"--{flag}", default=None)
    args = p.parse_args(argv)
    try:
        check_port(args.port)
        tls = tls_from_flags(args.tls_cert, args.tls_key, args.tls_ca)
    except GridError as exc:
        print(f"grid: error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code if exc.exit_code else EXIT_USAGE) from None
    warning = exposure_warning(args.host, tls is not None)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    try:
        serve(
            args.host,
            args.port,
            grid_home(),
            args.state_dir,
            args.url_file,
            args.tick_interval,
            args.policy,
            tls,
            args.client_keys,
            args.state_store,
            {field: getattr(args, flag.replace("-", "_")) for flag, field in ETCD_FLAGS.items()},
            args.registration_grace,
        )
    except OSError as exc:
        print(
            f"grid: error: cannot listen on {args.host}:{args.port}: {exc.strerror}",
            file=sys.stderr,
        )
        raise SystemExit(1) from None
    except GridError as exc:
        # A refused start (a secret file readable by others: exit 1; a bad --policy file:
        # exit 2) is the operator's to fix: one line naming the file and the fix.
        print(f"grid: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(exc.exit_code) from None


if __name__ == "__main__":
    main()
