"""Suite-wide test settings.

Property tests explore fresh random examples on a developer's machine; in CI (``CI`` set) they
replay a fixed derivation of examples so a landing run is reproducible, while still covering the
same number of examples per property.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, deadline=None)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """Async tests run on asyncio only: Grid runs on asyncio (uvloop, ``asyncio.to_thread``).

    anyio's plugin would otherwise also run every async test on trio whenever trio happens to
    be installed (selenium, used by the browser test, depends on it).
    """
    return "asyncio"


SERIAL_GROUP = "serial"
"""pytest-xdist group of the tests that load the machine themselves: e2e tests start real
llama-server children and whole fleets, benchmarks print timings. ``make test`` runs with
``--dist loadgroup``, so these run one after another on one worker while the other workers
take the unit and integration tiers (on two cores two fleets at once only make both slow)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put every e2e and benchmark test in :data:`SERIAL_GROUP` (see docs/testing.md)."""
    for item in items:
        if item.get_closest_marker("e2e") or item.get_closest_marker("benchmark"):
            item.add_marker(pytest.mark.xdist_group(SERIAL_GROUP))
