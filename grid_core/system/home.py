"""``GRID_HOME``: the one directory where a Grid user's server, node and fleet files live."""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "GRID_HOME"
"""Environment variable naming the Grid home directory."""
DEFAULT_HOME = "~/.grid"
"""Where the home is when ``GRID_HOME`` is unset."""
HOME_MODE = 0o700
"""The home holds credentials: only its owner may list or enter it."""


def grid_home(explicit: str | os.PathLike[str] | None = None, *, create: bool = False) -> Path:
    """The Grid home: ``explicit``, else ``$GRID_HOME``, else ``~/.grid`` (``~`` expanded).

    Args:
        explicit: a path given on the command line, which wins over the environment.
        create: create it (and parents) owner-only when missing.

    Returns:
        The home directory path.

    Raises:
        OSError: ``create`` is set and the directory cannot be created.
    """
    raw = explicit or os.environ.get(HOME_ENV) or DEFAULT_HOME
    path = Path(raw).expanduser()
    if create:
        path.mkdir(mode=HOME_MODE, parents=True, exist_ok=True)
    return path
