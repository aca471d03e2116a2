"""Daemon logging: one line per decision or event on stderr, which the launchers send to
``server.log`` / ``agent.log``.

Uvicorn only configures its own loggers, so without this the ``grid.*`` loggers would stay at
Python's default WARNING level and the logs would not say why an engine was started or
stopped. The standard library's logging does the work; this only picks the level and format.
"""

from __future__ import annotations

import logging
import os
import sys

LOG_LEVEL_ENV = "GRID_LOG_LEVEL"
"""Environment variable overriding the daemons' log level (``DEBUG``, ``INFO``, ``WARNING``)."""
DEFAULT_LOG_LEVEL = "INFO"
"""Decisions and command outcomes are a few lines per minute on a busy fleet: INFO keeps them."""
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_daemon_logging() -> None:
    """Send the ``grid`` loggers to stderr at :data:`DEFAULT_LOG_LEVEL` (or ``$GRID_LOG_LEVEL``).

    Idempotent: a second call does not add a second handler. An unknown level name falls back
    to the default and says so once.
    """
    root = logging.getLogger("grid")
    if any(getattr(h, "_grid_daemon", False) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler._grid_daemon = True  # type: ignore[attr-defined]  # marks our own handler
    root.addHandler(handler)
    root.propagate = False
    wanted = os.environ.get(LOG_LEVEL_ENV, DEFAULT_LOG_LEVEL).upper()
    level = logging.getLevelName(wanted)
    if not isinstance(level, int):
        root.setLevel(DEFAULT_LOG_LEVEL)
        root.warning("%s=%r is not a log level; using %s", LOG_LEVEL_ENV, wanted, DEFAULT_LOG_LEVEL)
        return
    root.setLevel(level)
