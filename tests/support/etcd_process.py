"""A real etcd server for tests: Debian's ``etcd-server`` on free loopback ports.

``etcd_server`` is a pytest fixture (import it into a conftest) that starts one single-member
etcd with a temporary data directory and yields :class:`EtcdServer`. It is stopped by its
proven PID at teardown, pass or fail. Tests that need etcd never skip: without the binary they
fail with the install hint (``make etcd`` installs it as root; ``make test`` depends on it).
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from grid_core.system import ProcessIdentity, spawn_detached, stop_process_sync, wait_until_sync

ETCD_BINARY = os.environ.get("GRID_TEST_ETCD", "/usr/bin/etcd")
"""Where Debian's etcd-server installs the daemon (override with GRID_TEST_ETCD)."""
START_TIMEOUT_S = 60.0
"""A single-member etcd elects itself in about a second; a loaded two-core CI box is far slower."""
STOP_GRACE_S = 5.0
"""etcd flushes its WAL on SIGTERM in well under a second."""


def free_port() -> int:
    """A port nothing listens on right now (bind port 0 on loopback, read it, close)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EtcdServer:
    """One running etcd member.

    Attributes:
        url: its client URL (``http://127.0.0.1:PORT``).
        identity: its process, for stopping by proven identity.
        data_dir: its data directory.
        log: its log file.
    """

    url: str
    identity: ProcessIdentity
    data_dir: Path
    log: Path

    @property
    def state_store(self) -> str:
        """``etcd://127.0.0.1:PORT`` for ``grid up --state-store``."""
        return "etcd://" + self.url.split("://", 1)[1]

    def stop(self) -> None:
        """Stop it by proven PID (a no-op once stopped)."""
        stop_process_sync(self.identity, grace_s=STOP_GRACE_S)


def start_etcd(workdir: Path, name: str = "grid-test") -> EtcdServer:
    """Start a single-member etcd with its data under ``workdir``.

    Raises:
        RuntimeError: the binary is missing (with the install hint) or etcd did not become
            healthy (with its log tail).
    """
    if not os.access(ETCD_BINARY, os.X_OK):
        hint = shutil.which("etcd") or "apt-get install etcd-server (or: sudo make etcd)"
        msg = f"etcd is not installed at {ETCD_BINARY}; {hint}"
        raise RuntimeError(msg)
    workdir.mkdir(parents=True, exist_ok=True)
    client, peer = free_port(), free_port()
    url = f"http://127.0.0.1:{client}"
    peer_url = f"http://127.0.0.1:{peer}"
    data_dir = workdir / "etcd-data"
    log = workdir / "etcd.log"
    argv = [
        ETCD_BINARY,
        "--name", name,
        "--data-dir", str(data_dir),
        "--listen-client-urls", url,
        "--advertise-client-urls", url,
        "--listen-peer-urls", peer_url,
        "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"{name}={peer_url}",
        "--log-level", "warn",
    ]  # fmt: skip
    pid = spawn_detached(argv, log_path=log, truncate_log=True)
    identity = ProcessIdentity(pid, _birth(pid), args=(("--data-dir", str(data_dir)),))
    server = EtcdServer(url=url, identity=identity, data_dir=data_dir, log=log)

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=1.0).json().get("health") == "true"
        except (httpx.HTTPError, ValueError):
            return False

    if not wait_until_sync(healthy, timeout_s=START_TIMEOUT_S, interval_s=0.2):
        server.stop()
        tail = log.read_text(errors="replace")[-2000:]
        msg = f"etcd at {url} did not become healthy in {START_TIMEOUT_S:.0f} s:\n{tail}"
        raise RuntimeError(msg)
    return server


def _birth(pid: int) -> float | None:
    from grid_core.system import birth_of

    for _ in range(50):
        birth = birth_of(pid)
        if birth is not None:
            return birth
        time.sleep(0.01)
    return None


@pytest.fixture
def etcd_server(tmp_path: Path) -> Iterator[EtcdServer]:
    """A fresh etcd for this test, stopped by PID afterwards (pass or fail)."""
    server = start_etcd(tmp_path / "etcd")
    try:
        yield server
    finally:
        server.stop()
