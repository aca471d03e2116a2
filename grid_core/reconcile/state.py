"""The controller's durable state document and its strict encoding.

Everything a restarted controller needs to continue safely: profiles, retirement tombstones,
issued actions (active ones plus bounded history), backoff records, destructive blocks,
the generation epoch and sequence, the mode, and the demand history. Decoding is strict: any
malformed document is treated as corrupt (quarantined by the controller), never half-used.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from grid_core.errors import StateError
from grid_core.profile import ModelProfile, validate_profile
from grid_core.reconcile.actions import Action, FailureRecord
from grid_core.reconcile.quality import QualityEvidence
from grid_core.reconcile.timings import LearnedTiming
from grid_core.wire import Mode

STATE_SCHEMA = "grid-controller-state/1"


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
