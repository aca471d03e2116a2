"""Grid's pure core: wire contract, hooks, placement, reconciliation, routing, protection.

Nothing in this package opens a socket, starts a process or reads a clock inside a decision;
time and inputs are passed in, and decisions come back as values.
"""

from grid_core.errors import GridError
from grid_core.hookspecs import hookimpl

__all__ = ["GridError", "hookimpl"]
