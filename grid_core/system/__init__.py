"""The host-OS toolkit: every interaction of Grid with the operating system in one place.

Process identity (PID + creation time + command line), detached spawn, graceful stop by
proven identity, durable atomic writes, the ``GRID_HOME`` directory and deadline polling.
Server, node and plugins use it (plugins through :mod:`grid_core.api`); the pure decision
modules of ``grid_core`` (planner, reconcile, demand, routing, protection, controller,
scenario) must not import it — they take time and facts as inputs.
"""

from __future__ import annotations

from grid_core.system.files import OWNER_ONLY, fsync_dir, replace_durably, write_atomic
from grid_core.system.home import HOME_ENV, grid_home
from grid_core.system.identity import (
    BIRTH_TOLERANCE_S,
    ProcessIdentity,
    Proof,
    ProofStatus,
    Provable,
    SpawnedChild,
    birth_of,
    exe_of,
    exit_status,
    is_gone,
    prove,
    reap,
    same_birth,
    signal_proven,
)
from grid_core.system.poll import wait_until, wait_until_sync
from grid_core.system.spawn import (
    SAFE_PATH_FLAG,
    SECRET_ENV_PREFIXES,
    scrubbed_env,
    spawn_detached,
)
from grid_core.system.stop import StopOutcome, stop_process, stop_process_sync

__all__ = [
    "BIRTH_TOLERANCE_S",
    "HOME_ENV",
    "OWNER_ONLY",
    "SAFE_PATH_FLAG",
    "SECRET_ENV_PREFIXES",
    "ProcessIdentity",
    "Proof",
    "ProofStatus",
    "Provable",
    "SpawnedChild",
    "StopOutcome",
    "birth_of",
    "exe_of",
    "exit_status",
    "fsync_dir",
    "grid_home",
    "is_gone",
    "prove",
    "reap",
    "replace_durably",
    "same_birth",
    "scrubbed_env",
    "signal_proven",
    "spawn_detached",
    "stop_process",
    "stop_process_sync",
    "wait_until",
    "wait_until_sync",
    "write_atomic",
]
