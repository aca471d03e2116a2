"""Fixed ports for tests that must name them, apart for every pytest-xdist worker.

Most tests bind port 0 and read the port back. The few that cannot (a fleet's engine port
range, a node agent's managed range) take a *base* from the table in docs/testing.md and pass
it through :func:`port` or :func:`port_range`: worker ``gwN`` adds ``N * WORKER_STRIDE``, so two
workers running the same or neighbouring modules never bind the same port. Outside xdist (a
plain ``pytest`` run) the base is used as is.
"""

from __future__ import annotations

import os

WORKER_STRIDE = 2000
"""Ports between two workers' copies of one base: wider than the whole block of bases the
suite hands out (22100-23999), so worker N's block never overlaps worker M's."""
MAX_WORKERS = 16
"""Workers the stride is planned for: 22100 + 16 * 2000 stays well below 65535."""


def worker_index() -> int:
    """This pytest-xdist worker's number (``gw3`` → 3), 0 outside xdist.

    Raises:
        RuntimeError: more than :data:`MAX_WORKERS` workers (``-n`` too high for the stride).
    """
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0
    if index >= MAX_WORKERS:
        msg = (
            f"pytest worker {name}: at most {MAX_WORKERS} workers fit the test port plan; "
            f"use -n {MAX_WORKERS} or fewer"
        )
        raise RuntimeError(msg)
    return index


def port(base: int) -> int:
    """``base`` shifted into this worker's block (see the table in docs/testing.md)."""
    return base + WORKER_STRIDE * worker_index()


def port_range(low: int, high: int) -> tuple[int, int]:
    """The inclusive range ``low..high`` shifted into this worker's block."""
    shift = WORKER_STRIDE * worker_index()
    return low + shift, high + shift
