"""Restoring a learner's saved state: one versioned document, restored wholly or not at all.

The sequence and co-activation learners persist their bounded state inside the controller's
document; both restore it through :func:`restore_versioned`.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

import msgspec

from grid_core.errors import StateError


class Versioned(Protocol):
    """A saved state document that names its schema version."""

    version: int


S = TypeVar("S", bound=Versioned)


def restore_versioned(data: object, kind: type[S], version: int, label: str, section: str) -> S:
    """Decode ``data`` into ``kind`` and check it is schema ``version``.

    Args:
        data: the plain document read from the controller's state.
        kind: the msgspec struct of the saved state (it has a ``version`` field).
        version: the schema version this code writes and reads.
        label: what the state is, for the message (e.g. ``"sequence"``).
        section: the state document's section an operator deletes to start over.

    Raises:
        StateError: malformed, or of another version; the message names the section to delete.
    """
    try:
        state = msgspec.convert(data, kind, strict=False)
    except msgspec.ValidationError as exc:
        msg = f"{label} state: {exc}; delete the {section} section to start over"
        raise StateError(msg) from None
    if state.version != version:
        msg = (
            f"{label} state version {state.version} is not {version}; "
            f"delete the {section} section to start over"
        )
        raise StateError(msg)
    return state
