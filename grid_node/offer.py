"""Which runtimes this node offers the planner: installed *and* able to run here.

An installed runtime plugin is not yet a runtime the host can run: vLLM needs its executable,
Ollama and ComfyUI a service that answers. Advertising the plugin alone would let the planner
place a vLLM replica on a laptop without vLLM, where the load can only fail. Each adapter's
optional ``inventory()`` (the same probe ``grid allocator node qualify`` starts with) says
whether the engine is there; the node advertises the runtimes whose probe passed, re-probes on
a schedule, and records every change as a node event (shown in status and ``agent.log``).

Source: the specification's node telemetry advertises the *installed* runtimes; a runtime whose
engine is missing is not installed in that sense.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping

from grid_core.errors import GridError

PROBE_TIMEOUT_S = 5.0
"""Longest one runtime probe may take (a service's ``/api/tags`` or ``/object_info`` answers in
milliseconds on a healthy host): a hung service must not delay the heartbeat for long."""
RECHECK_AVAILABLE_S = 60.0
"""Seconds between probes of a runtime that passed: an engine removed from a host drops out of
the offer within a minute."""
RECHECK_MISSING_S = 10.0
"""Seconds between probes of a runtime that failed: a service started after the node is
offered within seconds."""


class RuntimeOffer:
    """The offered subset of a node's runtime adapters, refreshed by :meth:`refresh`.

    Args:
        adapters: runtime name → adapter (those the node's configuration wants).
        note: records one notable event line (node status and log).

    Attributes:
        missing: runtime name → why it is not offered right now (the probe's one-line error).
    """

    def __init__(self, adapters: Mapping[str, object], note: Callable[[str], None]) -> None:
        self.adapters = dict(adapters)
        self.note = note
        self.missing: dict[str, str] = {}
        self._due: dict[str, float] = dict.fromkeys(self.adapters, 0.0)

    @property
    def offered(self) -> list[str]:
        """Runtime names to advertise, sorted."""
        return sorted(name for name in self.adapters if name not in self.missing)

    async def refresh(self, now_mono: float) -> None:
        """Probe each runtime whose re-check is due (``now_mono``: monotonic seconds)."""
        for name, adapter in self.adapters.items():
            if now_mono < self._due[name]:
                continue
            why = await probe(adapter)
            was = self.missing.get(name)
            if why is None:
                self.missing.pop(name, None)
                if was is not None:
                    self.note(f"runtime {name} is offered again")
                self._due[name] = now_mono + RECHECK_AVAILABLE_S
            else:
                self.missing[name] = why
                if was is None:
                    self.note(f"runtime {name} is not offered: {why}")
                self._due[name] = now_mono + RECHECK_MISSING_S


async def probe(adapter: object) -> str | None:
    """``None`` when the adapter's engine can run here, else the reason (one line).

    An adapter without ``inventory()`` has nothing to check and is always offered.
    """
    inventory = getattr(adapter, "inventory", None)
    if inventory is None:
        return None
    try:
        answer = inventory()
        if inspect.isawaitable(answer):
            await asyncio.wait_for(answer, PROBE_TIMEOUT_S)
    except TimeoutError:
        return f"its probe did not answer within {PROBE_TIMEOUT_S:.0f} s"
    except (GridError, OSError) as exc:
        return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
    return None
