"""The controller's durable state document and its strict encoding.

Everything a restarted controller needs to continue safely: profiles, retirement tombstones,
issued actions (active ones plus bounded history), backoff records, destructive blocks,
the generation epoch and sequence, the mode, and the demand history. Decoding is strict: any
malformed document is treated as corrupt (quarantined), never half-used. :class:`DurableState`
is the controller's handle on the document in its store: the only place that reads, writes or
quarantines it.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from grid_core.errors import GridError, StateError
from grid_core.portfolio.evidence import OutcomeEvidence
from grid_core.portfolio.types import AdmissionThresholds
from grid_core.profile import ModelProfile, validate_profile
from grid_core.reconcile.actions import Action, FailureRecord
from grid_core.reconcile.quality import QualityEvidence
from grid_core.reconcile.timings import LearnedTiming
from grid_core.store import StateConflictError, StateStore, state_digest
from grid_core.wire import Mode

STATE_SCHEMA: Final = "grid-controller-state/1"


class ControllerState(msgspec.Struct, kw_only=True):
    """The persisted controller document (schema ``grid-controller-state/1``).

    Attributes:
        schema: document schema tag.
        epoch: random id of this state's history; part of every plan generation.
        sequence: last plan sequence number issued (monotonic across restarts).
        mode: operating mode.
        profiles: configured model profiles.
        tombstones: retired model id → retirement time (wall-clock seconds).
        actions: active actions and bounded finished history.
        failures: backoff records keyed by (kind, host, model).
        blocks: model id → withdrawn delivered destructive action ids awaiting a receipt.
        demand: the demand tracker's own state document (opaque here).
        quality: labelled quality evidence (model, workload, artifact revision).
        timings: learned warm/load/fetch durations (host, model, artifact revision, phase).
        outcomes: measured outcome evidence of unbound work (model, workload, revision).
        admission: the portfolio admission gate's thresholds (``None``: the defaults).
    """

    schema: Literal["grid-controller-state/1"] = STATE_SCHEMA
    epoch: str
    sequence: int = 0
    mode: Mode = "recommend"
    profiles: list[ModelProfile] = []
    tombstones: dict[str, float] = {}
    actions: list[Action] = []
    failures: dict[str, FailureRecord] = {}
    blocks: dict[str, list[str]] = {}
    demand: dict[str, object] | None = None
    quality: list[QualityEvidence] = []
    timings: list[LearnedTiming] = []
    outcomes: list[OutcomeEvidence] = []
    admission: AdmissionThresholds | None = None


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(ControllerState)


def encode_state(state: ControllerState) -> bytes:
    """Canonical JSON bytes of ``state``."""
    return _encoder.encode(state)


def decode_state(data: bytes) -> ControllerState:
    """Decode and validate a state document.

    Raises:
        StateError: the bytes are not a valid ``grid-controller-state/1`` document (the
            message says which field); the caller quarantines the file.
    """
    try:
        state = _decoder.decode(data)
        state.profiles = [validate_profile(p) for p in state.profiles]
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        msg = f"controller state is corrupt ({exc}); it will be quarantined"
        raise StateError(msg) from None
    ids = [a.action_id for a in state.actions]
    if len(set(ids)) != len(ids):
        msg = "controller state is corrupt (duplicate action ids); it will be quarantined"
        raise StateError(msg)
    return state


WRITE_FAILED = "controller state could not be written"
"""Prefix of the warning a failed (non-conflicting) write leaves until a later write works."""


class DurableState:
    """The controller's durable document in its store: load, conditional save, quarantine.

    Every save is conditional on the digest of the bytes this instance last loaded or wrote,
    so a stale instance can never overwrite a newer writer's state (specification, "Local
    wire contract": a single writer).

    Args:
        store: where the document lives.

    Attributes:
        warning: the persistent-state warning status shows (corruption, a failed write, a
            conflict), if any.
        refusal: why automatic mode must be refused (no durable store, or a corrupt document
            that could not be moved aside), if it must.
        loaded: :meth:`load` has run.
    """

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._digest: str | None = None
        self.warning: str | None = None
        self.refusal: str | None = None
        self.loaded = False
        if not store.durable:
            self.refusal = (
                "the controller has no durable state path; configure "
                "one (GRID_HOME/state) before selecting automatic mode"
            )

    @property
    def store(self) -> StateStore:
        """The underlying store (it also holds the single-writer lease)."""
        return self._store

    def load(self) -> ControllerState | None:
        """Read and decode the document (the only read of the store).

        Returns:
            The document, or ``None`` when there is none or it was corrupt (then it is
            quarantined and :attr:`warning` says where it went; if it could not be moved,
            :attr:`refusal` refuses automatic mode until it is repaired).
        """
        self.loaded = True
        try:
            raw = self._store.load()
            self._digest = state_digest(raw)
            return decode_state(raw) if raw is not None else None
        except StateError as exc:
            if self._quarantine(str(exc)):
                self._digest = None  # the corrupt file was moved away
            return None

    def _quarantine(self, cause: str) -> bool:
        """Move corrupt state aside; returns whether it was moved."""
        try:
            where = self._store.quarantine(cause)
        except GridError as exc:
            self.warning = (
                f"{cause}; quarantining it failed ({exc}); automatic mode is "
                "refused until the state file is repaired or removed"
            )
            self.refusal = self.warning
            return False
        self.warning = (
            f"{cause}; the corrupt file was moved to {where} and the "
            "controller started clean in recommend mode"
        )
        return True

    def save(self, state: ControllerState) -> bool:
        """Write ``state`` if the stored bytes are still the ones this instance saw.

        A plain write failure leaves a warning and returns False (the next save retries).

        Raises:
            StateConflictError: another controller wrote the document since; nothing was
                written and :attr:`warning` says so. The caller must stop acting.
        """
        data = encode_state(state)
        try:
            self._store.save(data, self._digest)
        except StateConflictError as exc:
            self.warning = str(exc)
            raise
        except GridError as exc:
            self.warning = f"{WRITE_FAILED}: {exc}"
            return False
        self._digest = state_digest(data)
        if self.warning and self.warning.startswith(WRITE_FAILED):
            self.warning = None
        return True
