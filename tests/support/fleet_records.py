"""A recorded logical fleet on disk (``fleet.json``) for tests that need no processes."""

from __future__ import annotations

from pathlib import Path

from grid_fleet import layout
from grid_fleet.layout import FleetRecord, FleetSettings


def saved_fleet(
    root: Path, hosts: int = 2, server: layout.ProcessRecord | None = None
) -> FleetRecord:
    """Write and return a ``hosts``-machine fleet record under ``root`` (2048 MB per host,
    API port 1, engine ports from 30000, no models); ``server`` proves it running."""
    caps = tuple([2048] * hosts)
    rec = FleetRecord(
        settings=FleetSettings(
            machines=hosts, port=1, engine_port_base=30000, capacities_mb=caps, models=()
        ),
        url="http://127.0.0.1:1",
        hosts=layout.host_specs(caps, 30000),
        models=(),
        server=server,
    )
    root.mkdir(parents=True, exist_ok=True)
    layout.save_record(root, rec)
    return rec
