"""A node offers only the runtimes whose engine can run on it (grid_node.offer)."""

from __future__ import annotations

import asyncio

import pytest

from grid_core.errors import NotFoundError
from grid_node.offer import RECHECK_AVAILABLE_S, RECHECK_MISSING_S, RuntimeOffer

pytestmark = pytest.mark.anyio


class Present:
    """An engine whose executable exists (llama.cpp-like, synchronous probe)."""

    def inventory(self) -> str:
        return "engine /usr/bin/engine"


class Service:
    """A service-backed engine (Ollama-like, asynchronous probe) that can be switched."""

    def __init__(self) -> None:
        self.up = False

    async def inventory(self) -> str:
        if not self.up:
            raise NotFoundError("the service is not running at http://127.0.0.1:9; start it")
        return "service: 2 local model(s)"


class Hung:
    async def inventory(self) -> str:
        await asyncio.sleep(3600)
        return "never"


class NoProbe:
    """A third-party adapter without the optional probe: nothing to check."""


async def test_only_runtimes_whose_engine_answers_are_offered_and_changes_are_noted() -> None:
    service = Service()
    events: list[str] = []
    offer = RuntimeOffer(
        {"llama.cpp": Present(), "ollama": service, "echo": NoProbe()}, events.append
    )
    assert offer.offered == ["echo", "llama.cpp", "ollama"]  # before the first probe: as before
    await offer.refresh(0.0)
    assert offer.offered == ["echo", "llama.cpp"]
    assert offer.missing["ollama"].startswith("the service is not running")
    assert events == [
        "runtime ollama is not offered: the service is not running at http://127.0.0.1:9; start it"
    ]
    service.up = True
    await offer.refresh(RECHECK_MISSING_S - 0.1)  # not due yet
    assert "ollama" not in offer.offered
    await offer.refresh(RECHECK_MISSING_S)
    assert offer.offered == ["echo", "llama.cpp", "ollama"]
    assert events[-1] == "runtime ollama is offered again"
    service.up = False
    await offer.refresh(RECHECK_MISSING_S + RECHECK_AVAILABLE_S)
    assert "ollama" not in offer.offered and len(events) == 3


async def test_a_hung_probe_costs_at_most_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("grid_node.offer.PROBE_TIMEOUT_S", 0.05)
    offer = RuntimeOffer({"comfyui": Hung()}, lambda _line: None)
    await offer.refresh(0.0)
    assert offer.offered == []
    assert "did not answer" in offer.missing["comfyui"]
