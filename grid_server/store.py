"""The controller's file state store, as the server uses it.

The implementation lives in the host-OS toolkit (:mod:`grid_core.system.state_file`) so tools
that embed a controller reach it through the public plugin API without importing the server.
"""

from __future__ import annotations

from grid_core.system.state_file import LOCK_TIMEOUT_S, FileStateStore, LeaseRecord

__all__ = ["LOCK_TIMEOUT_S", "FileStateStore", "LeaseRecord"]
