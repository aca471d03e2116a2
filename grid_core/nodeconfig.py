"""The node configuration document: every option of one node agent, defined once.

``grid allocator node start`` turns its flags into a :class:`NodeConfig`, writes it to
``$STATE_DIR/node-config.json`` (0600) and starts the daemon with ``--config`` pointing at
it; the daemon reads nothing else. Tools that run agents (the logical fleet) build the same
document in Python, save it and hand the file to the node launcher
(:class:`~grid_core.nodelaunch.NodeLauncher`, the ``grid_node_launcher`` hook). It lives in
the core, re-exported by :mod:`grid_core.api`, because it is the contract between the node
agent and whoever starts one. Defaults, bounds and the checks that name a bad value live here
and nowhere else.

Several agents may run on one machine (a logical fleet) when each has its own state
directory, credential, port range and capacity share.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec

from grid_core import grids
from grid_core.client import PlainHttpRefused, check_credential_transport, is_loopback_host
from grid_core.errors import StateError, ValidationError
from grid_core.system import grid_home, write_atomic
from grid_core.system.runtime_host import DEFAULT_ENGINE_PORT_RANGE

CONFIG_FILE = "node-config.json"
"""Name of the configuration document inside the node's state directory."""
SCHEMA_VERSION: Literal[1] = 1
DEFAULT_GRID_URL = grids.DEFAULT_URL
"""The local server (``grid up``'s default address)."""
DEFAULT_PORT_RANGE = DEFAULT_ENGINE_PORT_RANGE
"""Managed engine ports (defined with the runtime host): away from the server's 22100."""
HEARTBEAT_INTERVAL_S = 5.0
"""Seconds between heartbeats: well inside the server's 60 s record TTL, cheap on loopback."""
MAX_HEARTBEAT_INTERVAL_S = 30.0
"""Longest heartbeat interval: half the server's 60 s lease, so one lost beat is survivable."""
MIN_HEARTBEAT_INTERVAL_S = 0.1
"""Shortest interval: faster beats only load the server (tests use 0.2-1 s)."""
MIN_CAPACITY_SHARE = 0.01
"""Smallest capacity share a logical node may claim (1% of the machine)."""
MIN_PORT = 1024
"""Managed engines never take privileged ports."""
MAX_PORT = 65535
TOKEN_ENV = "GRID_ALLOCATOR_NODE_TOKEN"
"""Environment variable that may carry the node credential (never argv, never the document)."""

Port = Annotated[int, msgspec.Meta(ge=MIN_PORT, le=MAX_PORT)]
UnknownSensors = Literal["ignore", "throttle"]


def check_grid_url(url: str) -> str:
    """Refuse a Grid URL over which the node credential would travel in clear text.

    The rule (plain HTTP only to loopback) is the one client's, :mod:`grid_core.client`.

    Raises:
        ValidationError: not http(s), no host, or plain HTTP off loopback.
    """
    try:
        return check_credential_transport(url, "node credential")
    except PlainHttpRefused as exc:
        msg = f"--grid {url!r}: {exc}"
        raise ValidationError(msg) from None


def parse_port_range(text: str) -> tuple[int, int]:
    """``"22200-22299"`` → ``(22200, 22299)``.

    Raises:
        ValidationError: malformed or outside 1024..65535.
    """
    try:
        lo_s, hi_s = text.split("-", 1)
        lo, hi = int(lo_s), int(hi_s)
    except ValueError:
        msg = f"--port-range {text!r}: use LOW-HIGH, e.g. 22200-22299"
        raise ValidationError(msg) from None
    if not MIN_PORT <= lo <= hi <= MAX_PORT:
        msg = f"--port-range {text!r}: need {MIN_PORT} <= LOW <= HIGH <= {MAX_PORT}"
        raise ValidationError(msg)
    return lo, hi


def check_advertise(advertise_host: str | None, has_tls: bool) -> None:
    """Refuse an engine address the server would reach without TLS.

    Raises:
        ValidationError: a non-loopback advertised host without ``--engine-tls-cert/-key``.
    """
    if advertise_host and not has_tls and not is_loopback_host(advertise_host.strip("[]")):
        msg = (
            f"--advertise-host {advertise_host}: engines off loopback need TLS; pass "
            "--engine-tls-cert and --engine-tls-key (and --engine-tls-ca for a private CA)"
        )
        raise ValidationError(msg)


class NodeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything one node agent needs (the document ``node-config.json``).

    Attributes:
        schema_version: document version (1).
        state_dir: owner-only state directory (node.json, engine key, logs, artifacts).
        grid_url: the Grid server (plain HTTP only on loopback).
        peer_urls: further servers of the same grid (several servers on one etcd store);
            the agent registers with each and takes commands from the leader.
        grid_ca: CA certificate an ``https://`` Grid is verified with (``None``: the system
            trust store); a join token pins it by fingerprint.
        token_file: file holding the host-scoped node credential (else
            ``$GRID_ALLOCATOR_NODE_TOKEN``, else one minted with this machine's operator token).
        host_id: stable host id override (else the stored or a generated one).
        dedicated: always-on server (battery and user activity ignored).
        port_range: managed engine ports, inclusive ``[low, high]``.
        capacity_share: fraction of this machine's memory and disk this agent offers (0.01..1).
        model_dirs: where local GGUFs named after model ids are found.
        llama_server: explicit llama-server path.
        failure_domain / tags: placement facts reported in resources.
        heartbeat_interval_s: seconds between heartbeats.
        bind_host: address engine children listen on (loopback: off-loopback traffic reaches
            them only through the node's TLS fronts).
        advertise_host: host name or IP the server reaches this node's engines at (``None``:
            the engines' loopback address, for a node on the Grid's own machine).
        engine_tls_cert / engine_tls_key: PEM chain and owner-only key of the engine TLS
            fronts; required when ``advertise_host`` is not loopback.
        engine_tls_ca: CA bundle the server verifies the engines with (a private intranet
            CA); ``None`` = the Grid's CA (``grid_ca``) if set, else the server's system trust
            store.
        unknown_sensors: ``ignore`` or ``throttle`` (how protection treats missing sensors).
        throttle_fraction: share of capacity offered while throttled (None: protection default).
        runtimes: the engine families this node offers (names of installed runtime plugins,
            e.g. ``("comfyui",)`` for a media node); empty = every installed runtime plugin.
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    state_dir: Path = msgspec.field(default_factory=lambda: grid_home() / "node")
    grid_url: str = DEFAULT_GRID_URL
    peer_urls: tuple[str, ...] = ()
    token_file: Path | None = None
    grid_ca: Path | None = None
    host_id: str | None = None
    dedicated: bool = False
    port_range: tuple[Port, Port] = DEFAULT_PORT_RANGE
    capacity_share: float = 1.0
    model_dirs: tuple[Path, ...] = ()
    llama_server: str | None = None
    failure_domain: str | None = None
    tags: tuple[str, ...] = ()
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    bind_host: str = "127.0.0.1"
    advertise_host: str | None = None
    engine_tls_cert: Path | None = None
    engine_tls_key: Path | None = None
    engine_tls_ca: Path | None = None
    unknown_sensors: UnknownSensors = "ignore"
    throttle_fraction: float | None = None
    runtimes: tuple[str, ...] = ()

    @property
    def unknown_sensor_policy(self) -> Literal["ignore", "throttle"]:
        """``unknown_sensors`` as the protection policy spells it (the document's type already
        limits it to these two values)."""
        return self.unknown_sensors

    def __post_init__(self) -> None:
        if self.throttle_fraction is not None and not 0.0 <= self.throttle_fraction <= 1.0:
            msg = f"throttle_fraction (--throttle-fraction) {self.throttle_fraction}: use 0..1"
            raise ValidationError(msg)
        if not MIN_CAPACITY_SHARE <= self.capacity_share <= 1.0:
            msg = (
                f"capacity_share (--capacity-share) {self.capacity_share}: use "
                f"{MIN_CAPACITY_SHARE}..1 (fraction of this machine offered by this agent)"
            )
            raise ValidationError(msg)
        if not MIN_HEARTBEAT_INTERVAL_S <= self.heartbeat_interval_s <= MAX_HEARTBEAT_INTERVAL_S:
            msg = (
                f"heartbeat_interval_s (--heartbeat-interval) {self.heartbeat_interval_s}: use "
                f"{MIN_HEARTBEAT_INTERVAL_S}..{MAX_HEARTBEAT_INTERVAL_S} seconds"
            )
            raise ValidationError(msg)
        if self.unknown_sensors not in ("ignore", "throttle"):
            msg = (
                f"unknown_sensors (--unknown-sensors) {self.unknown_sensors!r}: "
                "use ignore or throttle"
            )
            raise ValidationError(msg)
        lo, hi = self.port_range
        if not MIN_PORT <= lo <= hi <= MAX_PORT:
            msg = (
                f"port_range (--port-range) {lo}-{hi}: need {MIN_PORT} <= LOW <= HIGH <= {MAX_PORT}"
            )
            raise ValidationError(msg)
        check_grid_url(self.grid_url)
        for url in self.peer_urls:
            check_grid_url(url)
        if len({self.grid_url, *self.peer_urls}) != 1 + len(self.peer_urls):
            msg = "peer_urls (--grid-peer): each Grid server once, and not the --grid one again"
            raise ValidationError(msg)
        self._check_engine_address()
        self.state_dir = Path(self.state_dir).expanduser().resolve()
        if self.token_file is not None:
            self.token_file = Path(self.token_file).expanduser().resolve()
        if self.grid_ca is not None:
            self.grid_ca = Path(self.grid_ca).expanduser().resolve()
        if not self.model_dirs:
            self.model_dirs = (grid_home() / "models",)
        self.model_dirs = tuple(Path(d).expanduser().resolve() for d in self.model_dirs)
        for name in ("engine_tls_cert", "engine_tls_key", "engine_tls_ca"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, Path(value).expanduser().resolve())

    def _check_engine_address(self) -> None:
        """Engines off loopback only over TLS; a remote Grid needs an advertised address."""
        if (self.engine_tls_cert is None) != (self.engine_tls_key is None):
            msg = "engine_tls_cert / engine_tls_key (--engine-tls-cert/--engine-tls-key): give both"
            raise ValidationError(msg)
        if self.engine_tls_ca is not None and self.engine_tls_cert is None:
            msg = "engine_tls_ca (--engine-tls-ca) needs --engine-tls-cert and --engine-tls-key"
            raise ValidationError(msg)
        if self.engine_tls_cert is not None and not self.advertise_host:
            msg = (
                "engine_tls_cert (--engine-tls-cert): also pass --advertise-host, the name or IP "
                "the certificate covers and the server reaches this node at"
            )
            raise ValidationError(msg)
        check_advertise(self.advertise_host, self.engine_tls_cert is not None)
        host = urlsplit(self.grid_url).hostname or ""
        if not is_loopback_host(host) and not self.advertise_host:
            msg = (
                f"--grid {self.grid_url}: the server is on another machine and cannot reach "
                "engines on this machine's loopback; pass --advertise-host with "
                "--engine-tls-cert/--engine-tls-key"
            )
            raise ValidationError(msg)

    @property
    def engine_ca(self) -> Path | None:
        """The CA the server verifies this node's engines with: ``engine_tls_ca``, else the
        Grid's own CA (``grid_ca``, or the one a join pinned): a private CA usually signs both."""
        return self.engine_tls_ca or self.grid_ca

    @property
    def engine_tls_enabled(self) -> bool:
        """Whether engines are served through the node's TLS fronts."""
        return self.engine_tls_cert is not None

    @property
    def artifact_dir(self) -> Path:
        """Content-addressed artifact cache of this agent."""
        return self.state_dir / "artifacts"

    @property
    def path(self) -> Path:
        """Where this document lives: ``state_dir/node-config.json``."""
        return self.state_dir / CONFIG_FILE

    def read_token(self) -> str | None:
        """The node credential from ``token_file`` or ``$GRID_ALLOCATOR_NODE_TOKEN``."""
        if self.token_file is not None:
            try:
                return Path(self.token_file).read_text().strip() or None
            except OSError as exc:
                msg = f"--token-file {self.token_file}: cannot read ({exc})"
                raise ValidationError(msg) from exc
        return os.environ.get(TOKEN_ENV) or None

    def save(self) -> Path:
        """Write this document to :attr:`path` (0600, atomic, durable); returns the path.

        Raises:
            StateError: the state directory is not writable.
        """
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(self.path, msgspec.json.format(msgspec.json.encode(self, enc_hook=_enc)))
        return self.path


def _enc(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    msg = f"cannot encode {type(obj).__name__} in a node configuration"
    raise NotImplementedError(msg)


def _dec(kind: type, obj: Any) -> Any:
    if kind is Path and isinstance(obj, str):
        return Path(obj)
    msg = f"expected {kind.__name__}"
    raise NotImplementedError(msg)


def load_config(path: Path) -> NodeConfig:
    """Read and validate a node configuration document.

    Raises:
        ValidationError: unreadable, not JSON, an unknown field (named), a wrong type (the
            message names the field path) or a value out of bounds.
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        msg = f"node configuration {path}: cannot read ({exc.strerror})"
        raise ValidationError(msg) from None
    try:
        return msgspec.json.decode(raw, type=NodeConfig, dec_hook=_dec)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        msg = f"node configuration {path}: {exc}"
        raise ValidationError(msg) from None


__all__ = [
    "CONFIG_FILE",
    "DEFAULT_GRID_URL",
    "NodeConfig",
    "StateError",
    "check_grid_url",
    "grid_home",
    "load_config",
    "parse_port_range",
]
