"""Interim ``make demo``: start the server in a temporary Grid home, show status, stop it.

Run: ``python -m grid_server.smoke``. Leaves no process or file behind.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from grid_core.client import Calls, GridClient
from grid_server.cli_allocator import render_status
from grid_server.harness import start_server


def main() -> int:
    """Start, query and stop one server; returns the process exit code."""
    with tempfile.TemporaryDirectory(prefix="grid-smoke-") as tmp:
        home = Path(tmp) / "home"
        server = start_server(home)
        try:
            with GridClient(server.url) as client:
                print(f"grid: server up at {server.url} (GRID_HOME={home})")
                health = client.send(Calls.healthz())
                print(f"health: {health['status']}")
                print(render_status(client.status()))
        finally:
            server.stop()
        print("grid: server stopped; nothing left running")
    return 0


if __name__ == "__main__":
    sys.exit(main())
