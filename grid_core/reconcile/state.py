"""The controller's durable state document and its strict encoding.

Everything a restarted controller needs to continue safely: profiles, retirement tombstones,
issued actions (active ones plus bounded history), backoff records, destructive blocks,
the generation epoch and sequence, the mode, and the demand history. Decoding is strict: any
malformed document is treated as corrupt (quarantined by the controller), never half-used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import msgspec

from grid_core.errors import GridError, StateError
from grid_core.profile import ModelProfile, validate_profile
from grid_core.reconcile.actions import Action, ActionBook, FailureRecord
from grid_core.reconcile.quality import QualityBook, QualityEvidence
from grid_core.reconcile.timings import LearnedTiming, TimingBook
from grid_core.wire import Mode

if TYPE_CHECKING:  # the controller is only read and restored here; importing it is circular
    from grid_core.controller import Controller

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


def snapshot_of(ctl: Controller) -> ControllerState:
    """The durable part of a controller, ready to encode (profiles sorted for stable bytes)."""
    return ControllerState(
        epoch=ctl.epoch,
        sequence=ctl.sequence,
        mode=ctl.mode,
        profiles=[ctl.profiles[k] for k in sorted(ctl.profiles)],
        tombstones=dict(ctl.tombstones),
        actions=list(ctl.book),
        failures=dict(ctl.book.failures),
        blocks={m: list(v) for m, v in ctl.blocks.items()},
        demand=ctl.demand.to_state(),
        quality=ctl.quality.entries(),
        timings=ctl.timings.entries(),
    )


def restore_into(ctl: Controller, state: ControllerState) -> None:
    """Load durable state into a freshly built controller.

    Evidence rows that fail their plausibility checks are dropped with a warning; a restored
    automatic mode resumes only when durable writes are possible, and then takes its lease
    (term + 1) on the first tick or poll, never here (no clock is read).
    """
    ctl.epoch = state.epoch
    ctl.sequence = state.sequence
    ctl.profiles = {p.model_id: p for p in state.profiles}
    ctl.tombstones = dict(state.tombstones)
    ctl.book = ActionBook(state.actions, state.failures)
    ctl.blocks = {m: list(ids) for m, ids in state.blocks.items()}
    ctl._order = max((a.order for a in state.actions), default=0)
    ctl.quality = QualityBook(state.quality)
    ctl.timings = TimingBook(state.timings)
    dropped = (len(state.quality) - len(ctl.quality), len(state.timings) - len(ctl.timings))
    if any(dropped):
        ctl.warnings.append(
            f"implausible evidence discarded on restore: {dropped[0]} "
            f"quality and {dropped[1]} timing rows"
        )
    ctl.demand.set_configured(ctl.profiles)
    if state.demand is not None:
        try:
            ctl.demand.from_state(state.demand)
        except GridError as exc:
            ctl.warnings.append(f"demand history discarded: {exc}")
    ctl._restored = True
    ctl.mode = state.mode
    if state.mode == "automatic":
        if ctl.automatic_refusal is not None:
            ctl.mode = "recommend"
            ctl.warnings.append(
                f"automatic mode not resumed after restart: {ctl.automatic_refusal}"
            )
            stamps = [a.completed_at or a.created_at for a in ctl.book]
            for a in ctl.book.active():
                ctl.book.close(
                    a, "cancelled", max(stamps, default=0.0), "automatic mode not resumed"
                )
        else:
            # No clock here: the lease is taken (term + 1) on the first tick or poll.
            ctl.authority = "pending"
