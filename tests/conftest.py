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
