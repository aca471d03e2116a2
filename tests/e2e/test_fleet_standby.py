"""Standby: a workload's model waits on an idle host before its first request, and gives the
host back the moment direct demand needs it (issue 13, on real engines).

One three-host logical fleet with real llama-server engines, started through the shipped CLI;
every model fills a host. The operator scores ``tiny-coder`` for coding and ``tiny-general``
for general use (the fleet's baseline, one host). Nobody has asked for anything coding yet.

1. With two hosts idle, one is the fleet's node-failure reserve and the other may hold the
   coding workload's leader: the allocator loads ``tiny-coder`` there on its own, shows the
   decision in status (``portfolio.standby`` and its reason) and evicts nothing. The first
   ``auto`` coding request is then answered by the coder at once, with no cold start.
2. A client starts using ``tiny-writer`` by name: it takes the last idle host. Then a burst
   of named writer requests wants more writer replicas than that host gives. The only host
   left is the coder's standby host, and standby never holds capacity that direct demand can
   use: the coder is unloaded there and the writer loads in its place, while the baseline
   stays where it was.

Assertions are on what the operator and the clients see (placements, status, answers,
actions), never on wall-clock times (specification, "Proactive observation and portfolio
planning": counterfactual demand fills spare capacity, never evicts, and direct demand
reclaims it first).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_cli import CONVERGE_S as WAIT_S
from fleet_cli import ChatFleet, chat_fleet, wait_for
from ports import port

pytestmark = pytest.mark.e2e

ENGINE_PORT_BASE = port(22900)
"""Engine ports for this module's fleet (docs/testing.md's table)."""
MACHINES = 3
"""Hosts: the baseline's, the coder's standby host and the node-failure reserve."""
HOST_GIB = 3
"""Each logical host's memory (GiB): any two of the fleet's models exceed one host."""
GENERAL, CODER, WRITER = "tiny-general.gguf", "tiny-coder.gguf", "tiny-writer.gguf"
"""The baseline, the coding workload's leader, and the model a client uses by name."""
PROFILES: dict[str, dict[str, object]] = {
    GENERAL: {"workload_scores": {"general": 1.0}},
    CODER: {"workload_scores": {"coding": 1.0}},
    WRITER: {"priority": 20, "max_replicas": MACHINES},
}
"""The operator's changes to the fleet's default profiles."""
CODING_PROMPT = "Why does this python function raise a KeyError?"
"""A request the built-in classifier reads as coding."""
BURST_PROMPT = "Write a long story about rain, part {i}."
"""The burst's named writer request (``{i}``: the client's number)."""
BURST_CLIENTS = 16
"""Concurrent named writer clients: more than one writer replica's four slots."""
BURST_S = 12.0
"""How long each burst client keeps sending (s)."""
BURST_MAX_TOKENS = 48
"""Tokens per burst reply (``ignore_eos``): each request occupies an engine slot a while."""


class Fleet(ChatFleet):
    """The fleet as an operator (status, profiles) and a client (chat) see it."""

    def __init__(self, home: Path, url: str, token: str) -> None:
        super().__init__(home, url, token, max_connections=4 * BURST_CLIENTS)

    def portfolio(self) -> dict[str, object]:
        """The status's portfolio section (standby decisions and admission rows)."""
        return self.controller().get("portfolio") or {}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    home = tmp_path_factory.mktemp("standby-home")
    with chat_fleet(
        Fleet, home, machines=MACHINES, engine_port_base=ENGINE_PORT_BASE, gib=HOST_GIB
    ) as f:
        yield f


def test_a_workload_model_stands_by_on_idle_capacity_until_direct_demand_needs_the_host(
    fleet: Fleet,
) -> None:
    since = time.time()
    for model, fields in PROFILES.items():
        fleet.put_profile(model, fields)
    wait_for(lambda: fleet.ready_on(GENERAL), "the baseline ready", WAIT_S)

    # 1. Before any request, the coder stands by on one of the two idle hosts.
    standby_host = wait_for(
        lambda: (hosts := fleet.ready_on(CODER)) and hosts[0], "the coder standing by", WAIT_S
    )
    # Right after its load the scale-down cooldown also holds the coder; status names standby
    # as the reason once the cooldown has passed and only standby keeps it.
    portfolio = wait_for(
        lambda: (p := fleet.portfolio()).get("standby") == {"coding": CODER} and p,
        "status naming the coder's standby",
        WAIT_S,
    )
    assert "stand by on idle capacity" in str(portfolio.get("standby_reason")), portfolio
    assert fleet.ready_on(CODER) == [standby_host]
    placed = fleet.placement()
    assert sum(1 for ms in placed.values() if not ms) == 1, placed  # the reserve stays empty
    loads = [
        (a["kind"], a["host_id"], a["eviction"])
        for a in fleet.actions(since)
        if a["model_id"] == CODER
    ]
    assert loads and all(not ev and h == standby_host for _, h, ev in loads), loads
    assert fleet.chat("auto", CODING_PROMPT) == (200, CODER)  # no cold start for the first one

    # 2. Direct use of the writer takes the reserve host, then wants more than it gives.
    assert fleet.answered(WRITER, "Write a short poem about rain.") == WRITER
    [first_writer] = wait_for(lambda: fleet.ready_on(WRITER), "the writer ready", WAIT_S)
    assert first_writer != standby_host
    assert fleet.ready_on(CODER) == [standby_host]  # a kept standby outlives a full reserve
    answers = fleet.burst(WRITER, BURST_PROMPT, BURST_CLIENTS, BURST_S, BURST_MAX_TOKENS)
    assert answers[(200, WRITER)] > 0 and {c for c, _ in answers} <= {200, 503}, answers
    wait_for(
        lambda: standby_host in fleet.ready_on(WRITER),
        "the writer on the coder's standby host",
        WAIT_S,
    )
    assert fleet.ready_on(CODER) == []
    after = fleet.placement()
    assert GENERAL in set().union(*after.values()), after
    given_back = [
        (a["kind"], a["status"])
        for a in fleet.actions(since)
        if a["model_id"] == CODER and a["host_id"] == standby_host and a["kind"] == "unload"
    ]
    assert ("unload", "succeeded") in given_back, fleet.actions(since)
    print(
        f"coder stood by on {standby_host} before any coding request and answered the first "
        f"one; writer burst answers {dict(answers)}; the writer then took {standby_host} "
        f"(writer ready on {fleet.ready_on(WRITER)})"
    )
