"""The node daemon's exit when a server refuses its run for the host id."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import ClassVar

import pytest

from grid_core.errors import ConflictError
from grid_core.nodeconfig import NodeConfig
from grid_node import daemon


class RefusedAgent:
    """Stands in for NodeAgent: its loop ends refused; records what the daemon does next."""

    ever_registered = False
    calls: ClassVar[list[str]] = []

    def __init__(self, *_args: object, **_kwargs: object) -> None:
        self.refused = "host id 'host-05' is in use by another node agent"

    async def open(self) -> None:
        self.calls.append("open")

    async def run(self, _stop: asyncio.Event) -> None:
        self.calls.append("run")

    async def shutdown(self) -> list[str]:
        self.calls.append("shutdown")
        return []

    def mark_stopped(self) -> None:
        self.calls.append("mark_stopped")

    async def close(self) -> None:
        self.calls.append("close")


@pytest.mark.parametrize("registered", [True, False])
def test_a_refused_run_exits_with_the_reason_and_stops_engines_only_if_it_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registered: bool
) -> None:
    agent = type("Agent", (RefusedAgent,), {"ever_registered": registered, "calls": []})
    monkeypatch.setattr(daemon, "NodeAgent", agent)
    monkeypatch.setattr(daemon, "load_plugins", lambda: None)
    with pytest.raises(ConflictError, match="host-05"):
        asyncio.run(daemon.serve(NodeConfig(state_dir=tmp_path / "node"), "a" * 32))
    stop = ["shutdown"] if registered else []
    assert agent.calls == ["open", "run", *stop, "mark_stopped", "close"]
