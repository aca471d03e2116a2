"""The controller's causal revision counters.

Every input advances the dirty revision; inputs that matter to destructive safety (membership,
residency state, activity, lifecycle, operator edits, receipts) also advance the safety
revision. A tick records which revisions it started from, so a heartbeat's delivery can tell
whether the plan it would act on already reflects that heartbeat and whether anything
safety-relevant changed since (specification, "Local wire contract": dirty and safety
revisions, destructive revalidation).
"""

from __future__ import annotations

import msgspec


class Revisions(msgspec.Struct, kw_only=True):
    """Causal counters (status shows a copy under ``revisions``).

    Attributes:
        dirty: advances on every input.
        processed: dirty revision the last tick started from (``-1`` before the first).
        success: dirty revision the last successful tick started from.
        safety: advances only on inputs that matter to destructive safety.
        tick_safety: safety revision the last successful tick saw.
    """

    dirty: int = 0
    processed: int = -1
    success: int = -1
    safety: int = 0
    tick_safety: int = -1

    def note(self, *, safety: bool) -> None:
        """An input changed; ``safety`` marks a change that matters to destructive safety."""
        self.dirty += 1
        if safety:
            self.safety += 1

    def begin_tick(self) -> tuple[int, int]:
        """Mark the dirty revision a tick starts from; returns ``(dirty, safety)`` to finish."""
        self.processed = self.dirty
        return self.dirty, self.safety

    def finish_tick(self, started: tuple[int, int]) -> None:
        """A tick that began at ``started`` (from :meth:`begin_tick`) succeeded."""
        self.success, self.tick_safety = started

    def reflects(self, poll_revision: int) -> bool:
        """Whether the last successful tick saw every input up to ``poll_revision``."""
        return self.success >= poll_revision

    def safety_current(self) -> bool:
        """Whether nothing safety-relevant changed since the last successful tick."""
        return self.tick_safety == self.safety

    def copy(self) -> Revisions:
        """A detached copy (status must not change when the counters move on)."""
        return msgspec.structs.replace(self)
