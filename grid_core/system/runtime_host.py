"""A concrete :class:`grid_core.runtime.RuntimeHost`: what a machine offers runtime adapters.

The node agent hands one to its adapters; ``grid allocator qualify`` builds a throw-away one
to run an adapter's real lifecycle outside a node. Port allocation binds a socket to prove a
port is free right now, which is why this lives in the host-OS toolkit.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from grid_core.errors import UnavailableError
from grid_core.runtime import ChildRecord

DEFAULT_ENGINE_PORT_RANGE = (22200, 22299)
"""Ports engine children listen on unless configured: 100 ports hold far more engines than
one machine's memory allows, and the range sits away from common service ports."""


@dataclass
class LocalRuntimeHost:
    """Paths, ports, the engine key and durable publication for adapters on this machine.

    Attributes:
        bind_host: address engine children listen on.
        state_dir / artifact_dir: the node's state and artifact directories.
        model_dirs: directories searched for local weights.
        api_key / api_key_file: the per-host engine key and its owner-only key file.
        port_range: inclusive managed port range for engine children.
        publish_fn: durably records a child (raises StateError on failure).
        used_ports: ports already held by this host's children.
    """

    bind_host: str
    state_dir: Path
    artifact_dir: Path
    model_dirs: tuple[Path, ...]
    api_key: str
    api_key_file: Path
    port_range: tuple[int, int]
    publish_fn: Callable[[ChildRecord], None]
    used_ports: Callable[[], set[int]]

    def allocate_port(self) -> int:
        """The first port of the managed range that no child uses and that binds now.

        Raises:
            UnavailableError: every port of the range is taken.
        """
        taken = self.used_ports()
        lo, hi = self.port_range
        for port in range(lo, hi + 1):
            if port in taken:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((self.bind_host, port))
                except OSError:
                    continue
            return port
        msg = f"no free port in the managed range {lo}-{hi}; widen --port-range"
        raise UnavailableError(msg)

    def publish(self, child: ChildRecord) -> None:
        """Durably record ``child`` (raises StateError on failure)."""
        self.publish_fn(child)
