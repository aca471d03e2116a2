"""Residency transitions and command outcomes, derived from successive allocator status reads.

``grid test watch``, the demo and the replay all use one :class:`Observer`: it reads
``GET /allocator/status?detail=1``, compares each host's residencies and the action history
with the previous read, and yields one event per change. Nothing here decides anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from grid_core.api import GridClient

POLL_S = 0.5
"""Status reads per second while watching: residency states last seconds, so 0.5 s catches
each one; a read costs the server a few milliseconds."""
GONE = "absent"
"""Pseudo-state of a residency that disappeared from its host (unloaded)."""
ADJACENT: frozenset[tuple[str, str]] = frozenset(
    {
        (GONE, "loading"),
        (GONE, "cached"),
        ("loading", "cached"),
        ("cached", "warming"),
        ("warming", "ready"),
        ("ready", "draining"),
        ("draining", "cached"),
        ("cached", GONE),
        ("failed", GONE),
        ("failed", "cached"),
    }
)
"""Residency changes that are one lifecycle step (wire ``ResidencyState``). Any other change
seen between two status reads skipped states this poller did not see; ``failed`` can follow
any state, so a change into it is always one step."""


@dataclass(frozen=True)
class Event:
    """One observed change.

    Attributes:
        at: wall-clock Unix seconds of the read that saw it.
        kind: ``residency`` (a state change) or ``command`` (an action's status change).
        host_id / model_id: where.
        before / after: residency states (``absent`` when missing), or action statuses.
        detail: action kind and reason for commands.
    """

    at: float
    kind: str
    host_id: str
    model_id: str
    before: str
    after: str
    detail: str = ""
    note: str = ""
    """Why the line is not a plain one-step change (first read, or unobserved states)."""

    def line(self, t0: float) -> str:
        """One human-readable line, time relative to ``t0``."""
        what = "residency" if self.kind == "residency" else f"command {self.detail}"
        change = f"{self.before} -> {self.after}"
        if self.note == FIRST_READ:
            change = self.after
        return f"[{self.at - t0:7.1f}s] {self.host_id:<8} {self.model_id:<20} {what}: {change}" + (
            f" ({self.note})" if self.note else ""
        )


FIRST_READ = "state when watching began"


def unobserved_steps(before: str, after: str) -> tuple[str, ...] | None:
    """The states a residency passed through between two reads (shortest lifecycle path in
    :data:`ADJACENT`), or ``None`` when no lifecycle path joins them."""
    paths: dict[str, tuple[str, ...]] = {before: ()}
    frontier = [before]
    while frontier:
        nxt = []
        for state in frontier:
            for a, b in sorted(ADJACENT):
                if a == state and b not in paths:
                    paths[b] = (*paths[state], b)
                    nxt.append(b)
        frontier = nxt
    path = paths.get(after)
    return path[:-1] if path else None


def skipped_note(before: str, after: str) -> str:
    """The note of a change that skipped states between two reads: the states it must have
    passed through, as ``via cached, warming`` (short: most changes skip one or two)."""
    steps = unobserved_steps(before, after)
    return f"via {', '.join(steps)}" if steps else "states in between not observed"


def residencies(status: dict[str, Any]) -> dict[tuple[str, str], str]:
    """``(host_id, model_id) → state`` from a detailed status document."""
    out: dict[tuple[str, str], str] = {}
    ctl = status.get("controller") or {}
    for host in ctl.get("hosts") or ():
        for r in host.get("residencies") or ():
            out[(host["host_id"], r["model_id"])] = str(r.get("state"))
    return out


def actions(status: dict[str, Any]) -> dict[str, tuple[str, str, str, str, str]]:
    """``action_id → (kind, host, model, status, reason)`` from history and pending lists."""
    ctl = status.get("controller") or {}
    out: dict[str, tuple[str, str, str, str, str]] = {}
    for key in ("history", "pending_commands"):
        for a in ctl.get(key) or ():
            if isinstance(a, dict) and a.get("action_id"):
                out[a["action_id"]] = (
                    str(a.get("kind")),
                    str(a.get("host_id")),
                    str(a.get("model_id")),
                    str(a.get("status", "pending")),
                    str(a.get("reason", "")),
                )
    return out


def ready_counts(status: dict[str, Any]) -> dict[str, int]:
    """Model id → ready replicas."""
    out: dict[str, int] = {}
    for (_host, model), state in residencies(status).items():
        if state == "ready":
            out[model] = out.get(model, 0) + 1
    return out


def _status_time(doc: dict[str, Any], status: str, now: float) -> float:
    """When an action reached ``status``: completed_at for outcomes, delivered_at for
    delivery, created_at otherwise; ``now`` when the record has no such time. Never later
    than ``now`` (the read that saw it)."""
    field_name = {
        "succeeded": "completed_at",
        "failed": "completed_at",
        "rejected": "completed_at",
        "delivered": "delivered_at",
    }.get(status, "created_at")
    value = doc.get(field_name)
    return min(float(value), now) if isinstance(value, int | float) else now


@dataclass
class Observer:
    """Polls the fleet's status and turns differences into :class:`Event` values.

    Attributes:
        url: the fleet API.
        events: every event seen so far (the demo checks phases against them).
        last: the latest status document.
    """

    url: str
    events: list[Event] = field(default_factory=list)
    last: dict[str, Any] = field(default_factory=dict)
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Every action document read so far, by id (status keeps only a bounded history)."""
    _res: dict[tuple[str, str], str] | None = None
    _acts: dict[str, tuple[str, str, str, str, str]] = field(default_factory=dict)

    def read(self, client: GridClient) -> dict[str, Any]:
        """One detailed status document from the fleet's server."""
        return client.status(detail=True)

    def update(self, status: dict[str, Any], now: float | None = None) -> list[Event]:
        """Fold one status document in; return the new events.

        The first read reports the live residencies as a snapshot (cached weights and past
        commands are history, not news); later reads report every change.
        """
        now = time.time() if now is None else now
        self.last = status
        res = residencies(status)
        acts = actions(status)
        new: list[Event] = []
        first = self._res is None
        prev = self._res or {}
        for key in sorted(set(prev) | set(res)):
            before, after = prev.get(key, GONE), res.get(key, GONE)
            if before != after and not (first and after == "cached"):
                if first:
                    note = FIRST_READ
                elif (before, after) in ADJACENT or after == "failed":
                    note = ""
                else:
                    note = skipped_note(before, after)
                new.append(Event(now, "residency", key[0], key[1], before, after, note=note))
        self._res = res
        ctl = status.get("controller") or {}
        docs = {
            a["action_id"]: a
            for key in ("history", "pending_commands")
            for a in ctl.get(key) or ()
            if isinstance(a, dict) and a.get("action_id")
        }
        for aid, (kind, host, model, st, reason) in sorted(acts.items()):
            old = self._acts.get(aid)
            if not first and (old is None or old[3] != st):
                new.append(
                    Event(
                        _status_time(docs.get(aid, {}), st, now),
                        "command",
                        host,
                        model,
                        old[3] if old else "new",
                        st,
                        f"{kind} ({reason})" if reason else kind,
                    )
                )
        self._acts.update(acts)
        self.seen.update(docs)
        # Causal order: a command's outcome at the time it completed (server clock, same
        # machine), residency changes at the read that saw them, which is after the
        # commands that caused them. Python's sort is stable for equal times.
        new.sort(key=lambda e: e.at)
        self.events.extend(new)
        return new

    def poll(self, client: GridClient) -> list[Event]:
        """Read once and fold it in."""
        return self.update(self.read(client))
