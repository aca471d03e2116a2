"""Node agent configuration: flags first, then environment, then defaults.

Several agents may run on one machine (a logical fleet) when each has its own state
directory, credential, port range and capacity share.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from grid_core.client import PlainHttpRefused, check_credential_transport
from grid_core.errors import ValidationError
from grid_core.system import grid_home
from grid_core.system.runtime_host import DEFAULT_ENGINE_PORT_RANGE

DEFAULT_GRID_URL = "http://127.0.0.1:22100"
DEFAULT_PORT_RANGE = DEFAULT_ENGINE_PORT_RANGE
"""Managed engine ports (defined with the runtime host): away from the server's 22100."""
HEARTBEAT_INTERVAL_S = 5.0
"""Seconds between heartbeats: well inside the server's 60 s record TTL, cheap on loopback."""
MIN_CAPACITY_SHARE = 0.01
"""Smallest capacity share a logical node may claim (1% of the machine)."""


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
    if not 1024 <= lo <= hi <= 65535:
        msg = f"--port-range {text!r}: need 1024 <= LOW <= HIGH <= 65535"
        raise ValidationError(msg)
    return lo, hi


@dataclass
class NodeConfig:
    """Everything one node agent needs.

    Attributes:
        state_dir: owner-only state directory (node.json, engine key, logs, artifacts).
        grid_url: the Grid server.
        token_file: file holding the host-scoped node credential (else
            ``GRID_ALLOCATOR_NODE_TOKEN``).
        host_id: stable host id override (else the stored or a generated one).
        dedicated: always-on server (battery and user activity ignored).
        port_range: managed engine ports (inclusive).
        capacity_share: fraction of this machine's memory this agent offers (0..1].
        model_dirs: where local GGUFs named after model ids are found.
        llama_server: explicit llama-server path.
        failure_domain / tags: placement facts reported in resources.
        heartbeat_interval_s: seconds between heartbeats.
        bind_host: address engine children listen on.
        unknown_sensors: ``ignore`` or ``throttle`` (how protection treats missing sensors).
    """

    state_dir: Path = field(default_factory=lambda: grid_home() / "node")
    grid_url: str = DEFAULT_GRID_URL
    token_file: Path | None = None
    host_id: str | None = None
    dedicated: bool = False
    port_range: tuple[int, int] = DEFAULT_PORT_RANGE
    capacity_share: float = 1.0
    model_dirs: tuple[Path, ...] = ()
    llama_server: str | None = None
    failure_domain: str | None = None
    tags: tuple[str, ...] = ()
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    bind_host: str = "127.0.0.1"
    unknown_sensors: str = "ignore"
    throttle_fraction: float | None = None
    """Share of capacity offered while throttled (None: the protection default)."""

    @property
    def unknown_sensor_policy(self) -> Literal["ignore", "throttle"]:
        """``unknown_sensors`` as the protection policy spells it (validated on construction)."""
        return "throttle" if self.unknown_sensors == "throttle" else "ignore"

    def __post_init__(self) -> None:
        if self.throttle_fraction is not None and not 0.0 <= self.throttle_fraction <= 1.0:
            msg = f"--throttle-fraction {self.throttle_fraction}: use 0..1"
            raise ValidationError(msg)
        if not MIN_CAPACITY_SHARE <= self.capacity_share <= 1.0:
            msg = (
                f"--capacity-share {self.capacity_share}: use {MIN_CAPACITY_SHARE}..1 "
                "(fraction of this machine offered by this agent)"
            )
            raise ValidationError(msg)
        if self.unknown_sensors not in ("ignore", "throttle"):
            msg = f"--unknown-sensors {self.unknown_sensors!r}: use ignore or throttle"
            raise ValidationError(msg)
        check_grid_url(self.grid_url)
        self.state_dir = Path(self.state_dir).expanduser().resolve()
        if not self.model_dirs:
            self.model_dirs = (grid_home() / "models",)

    @property
    def artifact_dir(self) -> Path:
        """Content-addressed artifact cache of this agent."""
        return self.state_dir / "artifacts"

    def read_token(self) -> str | None:
        """The node credential from ``token_file`` or ``GRID_ALLOCATOR_NODE_TOKEN``."""
        if self.token_file is not None:
            try:
                return Path(self.token_file).read_text().strip() or None
            except OSError as exc:
                msg = f"--token-file {self.token_file}: cannot read ({exc})"
                raise ValidationError(msg) from exc
        return os.environ.get("GRID_ALLOCATOR_NODE_TOKEN") or None
