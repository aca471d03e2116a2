"""The node launch contract: how a tool starts, inspects and stops a node agent.

A node agent is a separate program. A tool that runs agents (the single-machine logical
fleet, a test harness, an installer) fills the node configuration document
(:class:`~grid_core.nodeconfig.NodeConfig`), writes it (``NodeConfig.save()``) and hands the
file to a :class:`NodeLauncher`, which the node package provides through the
``grid_node_launcher`` hook. The document file is the whole interface, exactly as for
``grid allocator node start --config FILE``: the tool never builds the daemon's command line
and never reads its private files; what it learns back is a :class:`NodeProcesses` value.

This module is pure (types only) so the plugin facade can name the contract without pulling
the host-OS toolkit into the decision core.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

import msgspec

NODE_LAUNCHER_METHODS: tuple[str, ...] = ("start", "stop", "processes")
"""Methods a :class:`NodeLauncher` must have (checked when the hook answers)."""


class NodeProcesses(msgspec.Struct, frozen=True, kw_only=True):
    """What a node's state directory records about its processes.

    Attributes:
        agent_pid: the recorded daemon's process id (``None``: no daemon was recorded).
        agent_birth: its creation time (Unix seconds), the marker that defeats PID reuse.
        agent_running: the recorded daemon is alive and proven to be itself (PID, birth
            and its instance flag on the command line).
        engines: ``(pid, birth)`` of every engine child in the node's durable state.
    """

    agent_pid: int | None = None
    agent_birth: float | None = None
    agent_running: bool = False
    engines: tuple[tuple[int, float | None], ...] = ()


@runtime_checkable
class NodeLauncher(Protocol):
    """Starts, inspects and stops node agent daemons (provided by the node package).

    Every method is synchronous (a CLI-style operation that waits); call it from a worker
    thread in async code.
    """

    def start(self, config_file: Path, *, env: Mapping[str, str] | None = None) -> NodeProcesses:
        """Start the daemon of a saved configuration document; wait until it registers.

        Args:
            config_file: a node configuration document (``NodeConfig.save()`` wrote it).
            env: the daemon's environment (default: the caller's). The node credential may
                arrive as ``GRID_ALLOCATOR_NODE_TOKEN`` here, never in the document.

        Returns:
            The running daemon's processes.

        Raises:
            ValidationError: the document is invalid (the field is named).
            ConflictError: a daemon already runs for its state directory.
            UnavailableError: the daemon exited during its start or did not register in time.
        """
        ...

    def stop(self, state_dir: Path, *, force: bool = False) -> list[str]:
        """Drain and stop the daemon of ``state_dir`` (or, without one, its proven engines).

        Returns:
            One line per thing stopped, for the operator.

        Raises:
            ConflictError: the recorded PID is alive but not provably the daemon.
            UnavailableError: the daemon is still draining at the deadline.
        """
        ...

    def processes(self, state_dir: Path) -> NodeProcesses:
        """The daemon and engine processes ``state_dir`` records (empty when none)."""
        ...
