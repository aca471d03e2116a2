"""The node's durable local override (drain, pause, quarantine) as a file in its state dir.

Kept apart from the agent so the ``grid allocator node`` commands that set and clear it do not
import the agent's engine and HTTP machinery.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from grid_core.errors import StateError
from grid_core.protection import Override
from grid_core.system import write_atomic

OVERRIDE_FILE = "override.json"
"""The override's file name inside the node's state dir (owner-only, written atomically)."""


def read_override(state_dir: Path) -> Override | None:
    """The durable local override of this node, if one is set."""
    try:
        return msgspec.json.decode((state_dir / OVERRIDE_FILE).read_bytes(), type=Override)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError) as exc:
        msg = f"override file {state_dir / OVERRIDE_FILE} is unreadable ({exc}); run node resume"
        raise StateError(msg) from exc


def write_override(state_dir: Path, override: Override | None) -> None:
    """Set (or with ``None`` clear) the durable local override."""
    path = state_dir / OVERRIDE_FILE
    if override is None:
        path.unlink(missing_ok=True)
        return
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(path, msgspec.json.encode(override))
