"""The lab's outside world: installed plugins and throwaway durable controller stores.

Automatic mode refuses a store that is not durable, so every simulated controller gets a
real :class:`~grid_core.api.FileStateStore` in a private temporary directory that is
removed when the command ends (even on failure).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from grid_core.api import (
    PREDICTIVE_PLUGINS,
    LabEnv,
    Plugins,
    disabled_names,
    get_plugins,
    load_plugins,
)

SCRATCH_DIRS = ("/dev/shm",)
"""Memory-backed scratch space, preferred when present: the simulated controller saves its
state several times per simulated minute, and a disk fsync per save would dominate run time
while protecting nothing (the store is deleted when the run ends)."""


def scratch_dir() -> str | None:
    """A writable memory-backed directory for throwaway stores, or ``None`` (system temp)."""
    for d in SCRATCH_DIRS:
        if os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK):
            return d
    return None


@contextlib.contextmanager
def lab_env(plugins: Plugins | None = None, reactive: Plugins | None = None) -> Iterator[LabEnv]:
    """A :class:`LabEnv` whose stores live in a temporary directory for the ``with`` block.

    Args:
        plugins: the full set (defaults to the installed plugins).
        reactive: the set without predictive plugins (defaults to the installed plugins minus
            :data:`~grid_core.scenario.strategies.PREDICTIVE_PLUGINS`).
    """
    from grid_core.api import FileStateStore

    full = plugins or get_plugins()
    if reactive is None:
        reactive = load_plugins(
            disabled=disabled_names() | frozenset(PREDICTIVE_PLUGINS), report=lambda _line: None
        )
    with tempfile.TemporaryDirectory(prefix="grid-scenario-", dir=scratch_dir()) as tmp:
        counter = iter(range(1, 1 << 30))

        def store_factory() -> FileStateStore:
            path = Path(tmp) / f"controller-{next(counter)}" / "controller.json"
            path.parent.mkdir(mode=0o700)
            return FileStateStore(path)

        yield LabEnv(full, reactive, store_factory)
