"""``grid allocator explain`` as an operator reads it."""

from __future__ import annotations

from rich.console import Console

from grid_server.cli_render import explain_view


def test_demand_line_prints_the_queue_as_a_short_number() -> None:
    # The queue is a time-averaged depth: a raw float printed as 7.222060000913188e-05.
    doc = {
        "summary": "'m': 1 of 1 desired replica(s) placed (h1)",
        "configured": True,
        "desired": 1,
        "placed": 1,
        "binding": None,
        "hosts": [],
        "demand": {
            "request_rate_rps": 0.2,
            "offered_concurrency": 0.4,
            "queue_depth": 7.222060000913188e-05,
            "reasons": ["demand"],
        },
    }
    console = Console(width=200, record=True)
    console.print(explain_view(doc))
    text = console.export_text()
    assert "demand: 0.200 req/s, offered concurrency 0.40, queue 0.00; count set by: demand" in text
