"""Suite-wide test settings.

Property tests explore fresh random examples on a developer's machine; in CI (``CI`` set) they
replay a fixed derivation of examples so a landing run is reproducible, while still covering the
same number of examples per property.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, deadline=None)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
