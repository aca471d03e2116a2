"""The local host-protection state machine (pure: samples in, state out).

Each machine judges its own telemetry without asking the controller (specification, "Local
host-protection loop"). One call of :func:`step` takes the previous :class:`ProtectionState`,
one :class:`Sample`, the durable local :class:`Override` (if any) and the number of requests
running now, and returns the next state plus a :class:`ProtectionDecision` that status shows.

Rules implemented here:

* six lifecycle states, ordered by strictness (:data:`SEVERITY`);
* debounce: a sensor must exceed its entry threshold on :data:`DEBOUNCE_SAMPLES` consecutive
  samples before the host escalates, so a one-sample spike changes nothing;
* hysteresis: leaving a state needs the sensor below a separate, lower recovery threshold for
  :data:`RECOVERY_COOLDOWN_S` seconds;
* drain grace: a host that must pause while requests are running reports ``draining`` until
  they finish or :data:`DRAIN_GRACE_S` passes;
* unknown sensors are ``None`` (never zero); policy either ignores them or throttles;
* a local override (drain, pause, quarantine) outranks global desired state, and confirmed
  local danger can only make it stricter (the stricter of the two always wins).

Nothing here reads a clock: ``now`` (seconds, one clock per caller) comes in with the sample.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from grid_core.wire import HostState

SEVERITY: dict[HostState, int] = {
    "accepting": 0,
    "throttled": 1,
    "draining": 2,
    "paused": 3,
    "unhealthy": 4,
    "quarantined": 5,
}
"""Strictness order: the effective state is the strictest of sensors and override."""

DEBOUNCE_SAMPLES = 3
"""Consecutive samples a sensor must stay past its entry threshold: at a 5 s sample period a
spike must last ~10 s before the host reacts, which ignores a compile or a GC burst."""
RECOVERY_COOLDOWN_S = 60.0
"""Seconds every sensor must stay below its recovery threshold before the host relaxes; long
enough that a machine oscillating around a threshold does not flap its placement."""
DRAIN_GRACE_S = 120.0
"""Seconds running requests may keep going after the host decided to pause; a long chat
completion on a small machine finishes well inside two minutes."""
DEFAULT_THROTTLE_FRACTION = 0.5
"""Share of capacity offered while throttled: half, so the owner clearly gets the machine back."""

OverrideKind = Literal["drain", "pause", "quarantine"]
OVERRIDE_STATE: dict[str, HostState] = {
    "drain": "draining",
    "pause": "paused",
    "quarantine": "quarantined",
}


class Thresholds(msgspec.Struct, frozen=True, kw_only=True):
    """Entry and recovery thresholds (percent, degrees Celsius, seconds).

    Entry thresholds escalate; recovery thresholds (always less strict) must be crossed back
    before the host relaxes. The defaults suit a laptop or workstation.
    """

    cpu_throttle_pct: float = 90.0
    cpu_recover_pct: float = 70.0
    memory_throttle_pct: float = 90.0
    memory_recover_pct: float = 80.0
    memory_pause_pct: float = 97.0
    """System memory this full means the owner's applications are being squeezed."""
    memory_pause_recover_pct: float = 92.0
    gpu_memory_throttle_pct: float = 95.0
    gpu_memory_recover_pct: float = 85.0
    load_throttle_per_cpu: float = 1.5
    """Run-queue length per core above which interactive latency suffers."""
    load_recover_per_cpu: float = 1.0
    battery_throttle_pct: float = 50.0
    battery_pause_pct: float = 20.0
    """On battery below this level the owner needs the charge more than the grid does."""
    battery_recover_margin_pct: float = 10.0
    temp_throttle_c: float = 85.0
    temp_recover_c: float = 78.0
    temp_critical_c: float = 95.0
    """Confirmed over-temperature: unhealthy until it cools below ``temp_recover_c``."""
    user_active_idle_s: float = 60.0
    """A user who touched the machine within this many seconds is 'active'."""


class ProtectionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How a host protects its owner.

    Attributes:
        dedicated: an always-on server: battery and user activity are not considered.
        unknown: ``"ignore"`` treats a missing sensor as fine; ``"throttle"`` treats it
            conservatively as a reason to throttle.
        throttle_fraction: share of capacity offered while throttled (0..1).
        thresholds: the numbers.
    """

    dedicated: bool = False
    unknown: Literal["ignore", "throttle"] = "ignore"
    throttle_fraction: float = DEFAULT_THROTTLE_FRACTION
    thresholds: Thresholds = msgspec.field(default_factory=Thresholds)


class Sample(msgspec.Struct, frozen=True, kw_only=True):
    """One telemetry reading; ``None`` means the sensor is missing or unreadable (unknown).

    Attributes:
        at: when it was taken (seconds on the caller's clock; only differences matter).
        cpu_pct / memory_pct / gpu_memory_pct: utilisation in percent.
        load_per_cpu: 1-minute load average divided by logical CPUs.
        battery_pct / charging: battery level and whether on external power; a machine
            without battery reports ``battery_pct=None``.
        temperature_c: hottest reported sensor.
        network_up: whether a non-loopback interface is up.
        user_idle_s: seconds since last user input, where detectable.
    """

    at: float
    cpu_pct: float | None = None
    memory_pct: float | None = None
    gpu_memory_pct: float | None = None
    load_per_cpu: float | None = None
    battery_pct: float | None = None
    charging: bool | None = None
    temperature_c: float | None = None
    network_up: bool | None = None
    user_idle_s: float | None = None


class Override(msgspec.Struct, frozen=True, kw_only=True):
    """A durable local operator override.

    Attributes:
        kind: ``drain``, ``pause`` or ``quarantine``.
        reason: operator's words, shown in status.
        set_at: when it was set (wall-clock Unix seconds).
        expires_at: when it lapses by itself (wall-clock Unix seconds), or ``None``.
    """

    kind: OverrideKind
    reason: str
    set_at: float
    expires_at: float | None = None

    def active(self, wall_now: float) -> bool:
        """Whether the override still applies at ``wall_now`` (Unix seconds)."""
        return self.expires_at is None or wall_now < self.expires_at


class ProtectionState(msgspec.Struct, frozen=True, kw_only=True):
    """What the machine remembers between samples (persisted by the node).

    Attributes:
        sensor_state: the debounced state the sensors justify (override not applied).
        sensor_reason: why.
        pending_state: a stricter state being debounced; ``pending_count`` samples so far.
        calm_since: when every sensor first went below its recovery threshold, or ``None``.
        drain_started_at: when the host began draining running work before a pause.
    """

    sensor_state: HostState = "accepting"
    sensor_reason: str = ""
    pending_state: HostState | None = None
    pending_count: int = 0
    pending_reason: str = ""
    calm_since: float | None = None
    drain_started_at: float | None = None


class ProtectionDecision(msgspec.Struct, frozen=True, kw_only=True):
    """The effective result of one step, as status shows it.

    Attributes:
        state: effective lifecycle state (strictest of sensors and override).
        reason: the reason for ``state``.
        sensor_state / sensor_reason: what telemetry alone says (debounced).
        raw_state / raw_reasons: what this one sample says before debouncing.
        override: the active override, if any.
        throttle_fraction: share of capacity offered for new placement (0 when no new work).
    """

    state: HostState
    reason: str
    sensor_state: HostState
    sensor_reason: str
    raw_state: HostState
    raw_reasons: tuple[str, ...] = ()
    override: Override | None = None
    throttle_fraction: float = 1.0

    @property
    def admits_new_work(self) -> bool:
        """Whether load/warm commands and new requests may start (accepting or throttled)."""
        return SEVERITY[self.state] <= SEVERITY["throttled"]


def stricter(a: HostState, b: HostState) -> HostState:
    """The stricter of two states."""
    return a if SEVERITY[a] >= SEVERITY[b] else b


def _judge(
    sample: Sample, policy: ProtectionPolicy, recovering: bool
) -> tuple[HostState, list[str]]:
    """State one sample justifies; with ``recovering`` the (laxer) recovery thresholds apply."""
    t = policy.thresholds
    found: list[tuple[HostState, str]] = []

    def over(value: float | None, enter: float, leave: float) -> bool:
        return value is not None and value >= (leave if recovering else enter)

    unknown: list[str] = []
    if sample.network_up is False:
        found.append(("unhealthy", "network unavailable"))
    elif sample.network_up is None:
        unknown.append("network")
    if over(sample.temperature_c, t.temp_critical_c, t.temp_recover_c):
        found.append(("unhealthy", f"temperature {sample.temperature_c:.0f} C"))
    elif over(sample.temperature_c, t.temp_throttle_c, t.temp_recover_c):
        found.append(("throttled", f"temperature {sample.temperature_c:.0f} C"))
    elif sample.temperature_c is None:
        unknown.append("temperature")
    if over(sample.memory_pct, t.memory_pause_pct, t.memory_pause_recover_pct):
        found.append(("paused", f"system memory {sample.memory_pct:.0f}%"))
    elif over(sample.memory_pct, t.memory_throttle_pct, t.memory_recover_pct):
        found.append(("throttled", f"system memory {sample.memory_pct:.0f}%"))
    elif sample.memory_pct is None:
        unknown.append("memory")
    if over(sample.cpu_pct, t.cpu_throttle_pct, t.cpu_recover_pct):
        found.append(("throttled", f"cpu {sample.cpu_pct:.0f}%"))
    if over(sample.load_per_cpu, t.load_throttle_per_cpu, t.load_recover_per_cpu):
        found.append(("throttled", f"load {sample.load_per_cpu:.2f} per cpu"))
    if over(sample.gpu_memory_pct, t.gpu_memory_throttle_pct, t.gpu_memory_recover_pct):
        found.append(("throttled", f"gpu memory {sample.gpu_memory_pct:.0f}%"))
    if not policy.dedicated:
        on_battery = sample.charging is False
        if sample.battery_pct is not None and on_battery:
            margin = t.battery_recover_margin_pct if recovering else 0.0
            if sample.battery_pct < t.battery_pause_pct + margin:
                found.append(("paused", f"battery {sample.battery_pct:.0f}% and discharging"))
            elif sample.battery_pct < t.battery_throttle_pct + margin:
                found.append(("throttled", f"battery {sample.battery_pct:.0f}% and discharging"))
        if sample.user_idle_s is not None:
            if sample.user_idle_s < t.user_active_idle_s:
                found.append(("throttled", "user active"))
        else:
            unknown.append("user idle time")
    if unknown and policy.unknown == "throttle":
        found.append(("throttled", "unknown sensors: " + ", ".join(unknown)))
    state: HostState = "accepting"
    for s, _ in found:
        state = stricter(state, s)
    return state, [r for s, r in found if s == state]


def step(
    prev: ProtectionState,
    sample: Sample,
    policy: ProtectionPolicy,
    *,
    override: Override | None = None,
    wall_now: float,
    active_requests: int | None = 0,
) -> tuple[ProtectionState, ProtectionDecision]:
    """Advance the protection state machine by one sample.

    Args:
        prev: state after the previous sample (``ProtectionState()`` at first start).
        sample: this reading; ``sample.at`` drives debounce, cooldown and drain grace.
        policy: thresholds and how to treat unknowns.
        override: the durable local override, if any (expired ones are ignored).
        wall_now: wall-clock Unix seconds, only for override expiry (overrides survive
            restarts, so they are stamped in wall time).
        active_requests: requests running on this host now; ``None`` (unknown) is treated as
            busy so drain grace still protects them.

    Returns:
        The new state to persist and the decision to publish. Source: specification,
        "Local host-protection loop".
    """
    enter_state, enter_reasons = _judge(sample, policy, recovering=False)
    sensed = _advance_sensor(prev, sample, policy, (enter_state, enter_reasons))
    sensor, sensor_reason = sensed.sensor_state, sensed.sensor_reason
    active = override if override is not None and override.active(wall_now) else None
    state, reason = sensor, sensor_reason or "normal"
    if active is not None:
        o_state = OVERRIDE_STATE[active.kind]
        if SEVERITY[o_state] >= SEVERITY[sensor]:
            state, reason = o_state, f"local {active.kind}: {active.reason}"
    state, reason, drain_started = _drain_grace(
        state, reason, prev.drain_started_at, sample.at, active_requests
    )
    fraction = {"accepting": 1.0, "throttled": policy.throttle_fraction}.get(state, 0.0)
    new = msgspec.structs.replace(sensed, drain_started_at=drain_started)
    decision = ProtectionDecision(
        state=state,
        reason=reason,
        sensor_state=sensor,
        sensor_reason=sensor_reason,
        raw_state=enter_state,
        raw_reasons=tuple(enter_reasons),
        override=active,
        throttle_fraction=fraction,
    )
    return new, decision


def _advance_sensor(
    prev: ProtectionState,
    sample: Sample,
    policy: ProtectionPolicy,
    entered: tuple[HostState, list[str]],
) -> ProtectionState:
    """The sensor half of the state machine: escalate after ``DEBOUNCE_SAMPLES`` agreeing
    samples (to the mildest level the streak agreed on), recover one level only after
    ``RECOVERY_COOLDOWN_S`` seconds below the recovery thresholds. ``drain_started_at`` is
    carried over unchanged. ``entered`` is the sample's judgement at the entry thresholds.
    """
    enter_state, enter_reasons = entered
    at = sample.at
    hold_state, hold_reasons = _judge(sample, policy, recovering=True)
    sensor, sensor_reason = prev.sensor_state, prev.sensor_reason
    pending, count, pending_reason = prev.pending_state, prev.pending_count, prev.pending_reason
    calm_since = prev.calm_since

    if SEVERITY[enter_state] > SEVERITY[sensor]:
        # Escalate only to the level every sample of the streak agreed on.
        if pending is None:
            pending, count, pending_reason = enter_state, 1, "; ".join(enter_reasons)
        else:
            if SEVERITY[enter_state] < SEVERITY[pending]:
                pending, pending_reason = enter_state, "; ".join(enter_reasons)
            count += 1
        if count >= DEBOUNCE_SAMPLES:
            sensor, sensor_reason = pending, pending_reason
            pending, count, pending_reason = None, 0, ""
        calm_since = None
    else:
        pending, count, pending_reason = None, 0, ""
        if SEVERITY[hold_state] < SEVERITY[sensor]:
            if calm_since is None:
                calm_since = at
            if at - calm_since >= RECOVERY_COOLDOWN_S:
                sensor = hold_state
                sensor_reason = "; ".join(hold_reasons) if hold_reasons else "recovered"
                calm_since = None
        else:
            calm_since = None
            if hold_state == sensor and hold_reasons:
                sensor_reason = "; ".join(hold_reasons)
    return ProtectionState(
        sensor_state=sensor,
        sensor_reason=sensor_reason,
        pending_state=pending,
        pending_count=count,
        pending_reason=pending_reason,
        calm_since=calm_since,
        drain_started_at=prev.drain_started_at,
    )


def _drain_grace(
    state: HostState,
    reason: str,
    drain_started: float | None,
    at: float,
    active_requests: int | None,
) -> tuple[HostState, str, float | None]:
    """``(state, reason, drain_started_at)`` after the drain grace: a host going to
    ``paused`` stays ``draining`` while requests run, for at most ``DRAIN_GRACE_S`` seconds
    (unknown activity counts as busy)."""
    if state == "paused":
        busy = active_requests is None or active_requests > 0
        if drain_started is None:
            drain_started = at
        if busy and at - drain_started < DRAIN_GRACE_S:
            state, reason = "draining", f"{reason} (letting running requests finish)"
    elif state != "draining":
        drain_started = None
    if state == "draining" and drain_started is None:
        drain_started = at
    return state, reason, drain_started
