"""Fixtures: the real Grid server (in process, or as a child process) and FAKE engines.

``grid`` runs the real application in this process through Litestar's test client (the
ASGI app, its lifespan and the controller task, no socket): most HTTP API tests need no
process of their own. FAKE engines are served from threads on loopback sockets, so the
proxy still relays over real HTTP. ``grid_process`` starts the server as a loopback child
process for the tests that exercise process behaviour (the CLI, restart, graceful stop, the
server's own log, a client hanging up on a real connection). Every child process is stopped
by PID in the fixture's ``finally`` (even when the test fails), and all files live under
pytest's ``tmp_path``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from litestar.testing import TestClient
from server_testbed import Engine, Grid, PeerAs

from grid_core.plugins import get_plugins
from grid_server.app import build_app
from grid_server.context import ServerContext
from grid_server.harness import ThreadServer, fake_engine_in_thread, start_server
from grid_server.runner import REGISTRATION_GRACE_S

IN_PROCESS_URL = "http://127.0.0.1:22100"
"""Base URL the in-process app is addressed by (no socket is bound; loopback, so the
client's plain-HTTP credential rule is the one a local operator meets)."""
REQUEST_TIMEOUT_S = 30.0
IN_PROCESS_PEER = ("127.0.0.1", 50000)
"""The peer address in-process requests carry: a local client, as for a loopback server
(Litestar's test client says ``testclient``, which the plain-HTTP credential rule would refuse
as off loopback)."""


def _in_process(home: Path, registration_grace_s: float) -> Iterator[Grid]:
    def ready(ctx: ServerContext) -> None:
        ctx.url = IN_PROCESS_URL

    app = build_app(home, get_plugins(), on_ready=ready, registration_grace_s=registration_grace_s)
    with TestClient(
        PeerAs(app, IN_PROCESS_PEER), base_url=IN_PROCESS_URL, timeout=REQUEST_TIMEOUT_S
    ) as http:
        yield Grid(IN_PROCESS_URL, home, http)


@pytest.fixture
def grid(tmp_path: Path) -> Iterator[Grid]:
    """A fresh server application in this process with its own GRID_HOME. Its hosts are the
    ones the test registers: no registration grace (a model no registered host can run is
    unplaceable at once)."""
    yield from _in_process(tmp_path / "home", 0.0)


@pytest.fixture
def started_grid(tmp_path: Path) -> Iterator[Grid]:
    """As :func:`grid`, with the production registration grace
    (:data:`grid_server.runner.REGISTRATION_GRACE_S`): a server that has just started, whose
    other hosts may still be on their way to register."""
    yield from _in_process(tmp_path / "home", REGISTRATION_GRACE_S)


@pytest.fixture
def grid_process(tmp_path: Path) -> Iterator[Grid]:
    """A fresh real server process on a free loopback port with its own GRID_HOME (no
    registration grace, as for :func:`grid`)."""
    home = tmp_path / "home"
    child = start_server(home, extra_args=("--registration-grace", "0"))
    bed = Grid(child.url, home, child=child)
    try:
        yield bed
    finally:
        bed.close()
        child.stop()


@pytest.fixture
def engines() -> Iterator[Callable[[str], Engine]]:
    """Factory of FAKE engines served from threads of this process (real loopback HTTP);
    all are stopped at teardown."""
    started: list[ThreadServer] = []

    def make(model: str) -> Engine:
        server, key = fake_engine_in_thread(model)
        started.append(server)
        return Engine(server, key, model)

    try:
        yield make
    finally:
        for server in started:
            server.stop()
