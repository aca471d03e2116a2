"""Fixtures: the real Grid server and FAKE engines as loopback child processes.

Every child is stopped by PID in the fixture's ``finally`` (even when the test fails), and
all files live under pytest's ``tmp_path``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from server_testbed import Engine, Grid

from grid_server.harness import Child, GridClient, start_fake_engine, start_server


@pytest.fixture
def grid(tmp_path: Path) -> Iterator[Grid]:
    """A fresh real server on a free loopback port with its own GRID_HOME."""
    home = tmp_path / "home"
    child = start_server(home)
    client = GridClient(child.url, home)
    try:
        yield Grid(child, home, client)
    finally:
        client.close()
        child.stop()


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[Callable[[str], Engine]]:
    """Factory of FAKE engines; all are stopped at teardown."""
    started: list[Child] = []
    work = tmp_path / "engines"
    work.mkdir()

    def make(model: str) -> Engine:
        child, key = start_fake_engine(work, model)
        started.append(child)
        return Engine(child, key, model)

    try:
        yield make
    finally:
        for child in started:
            child.stop()
