"""Sequence learning from affinity keys: which stage of a session's work follows which.

Source: specification, "Proactive observation and portfolio planning" (the paragraph on
``X-Grid-Affinity-Key``) and the scenario lab's "projects with stable work stages".

A *stage* is what one request asked for: the configured model it named, or ``workload:<name>``
for an ``auto`` request the classifier named. A *cursor* remembers, per session (the request
features' ``affinity_hash``, already a double hash of the client's key: the raw key never
reaches this module), the stage and completion time of its latest request. When the next
request of the same session completes at a strictly later time on another stage, that is one
observed *transition* ``source → target`` with its lead time (seconds between the two
completions). A repeat of the same stage only moves the cursor.

Evidence rules, each a named bound below:

* a transition needs :data:`MIN_REPEATS` observations before it predicts anything;
* its confidence is its count over *every* observed departure from the source: transitions to
  any other stage plus sessions that ended on the source (a cursor that expired or was evicted),
  so a stage that usually ends the work cannot look like a reliable predictor;
* out-of-order or simultaneous completions (``at`` not after the cursor's) never establish an
  ordering; the demand tracker still counts them as ordinary demand;
* adjacent requests of different sessions are never evidence: cursors are per session;
* state is bounded (:data:`MAX_WORKFLOWS` cursors, :data:`MAX_TRANSITIONS` edges,
  :data:`LEAD_SAMPLES` lead times per edge) and forgotten after :data:`EXPIRY_S`.

Pure: time is passed in; nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

import msgspec

from grid_core.demand.features import RequestFeatures
from grid_core.demand.saved_state import restore_versioned

MIN_REPEATS = 5
"""Observed transitions an edge needs before it predicts (specification: five repeats)."""
MAX_WORKFLOWS = 512
"""Session cursors kept at once (specification); the least recently seen is dropped first."""
MAX_TRANSITIONS = 4096
"""Learned edges kept at once (specification); the least recently reinforced goes first."""
EXPIRY_S = 3600.0
"""Cursors and edges are forgotten one hour after they were last seen (specification)."""
LEAD_SAMPLES = 16
"""Lead times kept per edge for its median: enough for a stable median, bounded state."""
MAX_LEAD_S = 1800.0
"""A gap longer than half an hour is not a stage-to-stage lead; it still counts as a
transition but its timing is not learned (a lunch break is not the workflow's rhythm)."""
MIN_CONFIDENCE = 0.5
"""An edge predicts only when at least half of the source's departures went to it: below that
the next stage is more often something else (or nothing), and a cache download would more
often be wasted than used."""
ACTIVE_CURSOR_S = 900.0
"""A session whose latest request is older than this (15 minutes) no longer predicts its next
stage; it is still remembered for learning until :data:`EXPIRY_S`."""
WORKLOAD_PREFIX = "workload:"
"""Stage prefix for ``auto`` requests named by the classifier (models use their bare id)."""
STATE_VERSION = 1
"""Version of :meth:`SequenceBook.to_state`; an unknown version is refused, never guessed."""


class Cursor(msgspec.Struct, kw_only=True):
    """One session's latest request: stage and completion time (Unix seconds)."""

    key: str
    stage: str
    at: float


class Edge(msgspec.Struct, kw_only=True):
    """One learned transition ``source → target`` (counts, recency, lead-time samples)."""

    source: str
    target: str
    count: int = 0
    last_at: float = 0.0
    leads_s: list[float] = []


class SequencePrediction(msgspec.Struct, frozen=True, kw_only=True):
    """One predicted next stage for the sessions currently on a source stage.

    Attributes:
        source: stage the sessions are on now.
        target: stage predicted next (a model id, or ``workload:<name>``).
        confidence: edge count over every departure from ``source`` (0..1).
        repeats: transitions observed on this edge.
        sessions: active sessions on ``source`` (each contributes ``confidence``).
        expected_sessions: ``sessions × confidence``: sessions expected to ask for ``target``.
        lead_s: median seconds from a request on ``source`` to one on ``target``; ``None``
            while no bounded sample was learned.
        due_at: earliest time the target request is expected (latest cursor time on the
            source plus ``lead_s``), ``None`` without a lead time.
    """

    source: str
    target: str
    confidence: float
    repeats: int
    sessions: int
    expected_sessions: float
    lead_s: float | None = None
    due_at: float | None = None

    @property
    def edge(self) -> str:
        """The learned edge as status shows it (``source→target``)."""
        return f"{self.source}→{self.target}"


class Ending(msgspec.Struct, kw_only=True):
    """Sessions that ended on a stage without moving on (a departure to nowhere)."""

    stage: str
    count: int = 0
    last_at: float = 0.0


class _State(msgspec.Struct, kw_only=True):
    version: int
    cursors: list[Cursor] = []
    edges: list[Edge] = []
    endings: list[Ending] = []


def stage_of(features: RequestFeatures, configured: Iterable[str]) -> str | None:
    """The stage one request belongs to, or ``None`` when it is no sequence evidence.

    Args:
        features: the request's bounded features.
        configured: configured model ids (other names never create state).

    Returns:
        The named model id, ``workload:<name>`` for a classified ``auto`` request, or
        ``None`` (unknown model, unclassified, caller-caused error, evaluation, retry).
    """
    if features.evaluation or features.retry or features.outcome == "client_error":
        return None
    if features.requested_model == "auto":
        return f"{WORKLOAD_PREFIX}{features.workload}" if features.workload else None
    return features.requested_model if features.requested_model in set(configured) else None


class SequenceBook:
    """Bounded per-session cursors and learned transitions (see the module text)."""

    def __init__(self) -> None:
        self._cursors: dict[str, Cursor] = {}
        self._edges: dict[tuple[str, str], Edge] = {}
        self._endings: dict[str, Ending] = {}

    # --- learning ---------------------------------------------------------------------------
    def observe(self, key: str | None, stage: str | None, at: float) -> bool:
        """Fold one completed request of a session into the cursors and edges.

        Args:
            key: the session's double-hashed affinity key (``None``: no session, no evidence).
            stage: :func:`stage_of` the request (``None``: no evidence).
            at: completion time (Unix seconds).

        Returns:
            Whether a transition was counted.
        """
        if key is None or stage is None:
            return False
        self.expire(at)
        cur = self._cursors.get(key)
        if cur is None:
            self._add_cursor(Cursor(key=key, stage=stage, at=at), at)
            return False
        if at <= cur.at:
            return False  # out of order or simultaneous: never an ordering
        gap = at - cur.at
        source = cur.stage
        cur.at = at
        cur.stage = stage
        # Keep the dict ordered by recency (eviction drops the least recently seen first).
        self._cursors[key] = self._cursors.pop(key)
        if source == stage:
            return False
        edge = self._edges.pop((source, stage), None) or Edge(source=source, target=stage)
        edge.count += 1
        edge.last_at = at
        if gap <= MAX_LEAD_S:
            edge.leads_s = [*edge.leads_s, gap][-LEAD_SAMPLES:]
        self._edges[(source, stage)] = edge
        while len(self._edges) > MAX_TRANSITIONS:
            del self._edges[next(iter(self._edges))]
        return True

    def _add_cursor(self, cursor: Cursor, now: float) -> None:
        self._cursors[cursor.key] = cursor
        while len(self._cursors) > MAX_WORKFLOWS:
            self._end_session(self._cursors.pop(next(iter(self._cursors))), now)

    def _end_session(self, cursor: Cursor, now: float) -> None:
        """A session ended on its stage: one departure that went nowhere."""
        ending = self._endings.pop(cursor.stage, None) or Ending(stage=cursor.stage)
        ending.count += 1
        ending.last_at = now
        self._endings[cursor.stage] = ending
        while len(self._endings) > MAX_TRANSITIONS:
            del self._endings[next(iter(self._endings))]

    def expire(self, now: float) -> None:
        """Forget cursors, edges and endings last seen :data:`EXPIRY_S` or more before ``now``.

        An expiring cursor is a session that ended on its stage (one departure to nowhere).
        """
        for key in [k for k, c in self._cursors.items() if now - c.at >= EXPIRY_S]:
            self._end_session(self._cursors.pop(key), now)
        for pair in [k for k, e in self._edges.items() if now - e.last_at >= EXPIRY_S]:
            del self._edges[pair]
        for stage in [s for s, e in self._endings.items() if now - e.last_at >= EXPIRY_S]:
            del self._endings[stage]

    def departures(self, source: str) -> int:
        """Every observed departure from ``source``: transitions anywhere plus endings."""
        ending = self._endings.get(source)
        moved = sum(e.count for (s, _), e in self._edges.items() if s == source)
        return moved + (ending.count if ending is not None else 0)

    # --- reading ----------------------------------------------------------------------------
    def confidence(self, source: str, target: str) -> float:
        """Edge count over every observed departure from ``source`` (0 when unknown)."""
        edge = self._edges.get((source, target))
        total = self.departures(source)
        return edge.count / total if edge is not None and total else 0.0

    def edges(self) -> list[Edge]:
        """Learned edges, oldest reinforcement first (read-only use)."""
        return list(self._edges.values())

    @property
    def workflows(self) -> int:
        """Session cursors held now."""
        return len(self._cursors)

    def predict(self, now: float) -> list[SequencePrediction]:
        """Next stages of the sessions active at ``now``, one row per proven edge.

        An edge predicts only with at least :data:`MIN_REPEATS` transitions and
        :data:`MIN_CONFIDENCE`; a session predicts only while its latest request is younger
        than :data:`ACTIVE_CURSOR_S`. Predictions are never chained: a predicted target does
        not become a source.

        Returns:
            Rows sorted by (target, source).
        """
        self.expire(now)
        active: dict[str, list[Cursor]] = {}
        for c in self._cursors.values():
            if now - c.at < ACTIVE_CURSOR_S:
                active.setdefault(c.stage, []).append(c)
        totals: dict[str, int] = {s: e.count for s, e in self._endings.items()}
        for (source, _), edge in self._edges.items():
            totals[source] = totals.get(source, 0) + edge.count
        out: list[SequencePrediction] = []
        for (source, target), edge in self._edges.items():
            sessions = active.get(source)
            if not sessions or edge.count < MIN_REPEATS:
                continue
            conf = edge.count / totals[source]
            if conf < MIN_CONFIDENCE:
                continue
            lead = statistics.median(edge.leads_s) if edge.leads_s else None
            latest = max(c.at for c in sessions)
            out.append(
                SequencePrediction(
                    source=source,
                    target=target,
                    confidence=round(conf, 6),
                    repeats=edge.count,
                    sessions=len(sessions),
                    expected_sessions=round(len(sessions) * conf, 6),
                    lead_s=lead,
                    due_at=latest + lead if lead is not None else None,
                )
            )
        return sorted(out, key=lambda p: (p.target, p.source))

    # --- persistence ------------------------------------------------------------------------
    def to_state(self) -> dict[str, object]:
        """A JSON-compatible snapshot (bounded by the caps above)."""
        state = _State(
            version=STATE_VERSION,
            cursors=list(self._cursors.values()),
            edges=list(self._edges.values()),
            endings=list(self._endings.values()),
        )
        document: dict[str, object] = msgspec.to_builtins(state)
        return document

    def from_state(self, data: dict[str, object]) -> None:
        """Restore :meth:`to_state` output wholly or not at all.

        Raises:
            StateError: malformed or of an unknown version (nothing changes).
        """
        state = restore_versioned(data, _State, STATE_VERSION, "sequence", "sequences")
        self._cursors = {c.key: c for c in state.cursors[-MAX_WORKFLOWS:]}
        self._edges = {(e.source, e.target): e for e in state.edges[-MAX_TRANSITIONS:]}
        self._endings = {e.stage: e for e in state.endings[-MAX_TRANSITIONS:]}
