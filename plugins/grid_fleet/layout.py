"""The logical fleet's settings, files and capacity arithmetic (no processes here).

Source: the specification's "Single-machine scenario lab and logical fleet test" (persistent
fixture): one server plus N logical hosts on this machine, each with its own host id, failure
domain, state directory, node credential, engine port range and capacity share; the shares
partition the machine's usable memory instead of multiplying it.

Everything lives under ``$GRID_HOME/fleet`` so the fixture never touches the operator's own
Grid configuration::

    fleet/fleet.json            settings + identity-proof records of the processes started
    fleet/policy.json           the demo fleet's controller policy (short windows/cooldowns)
    fleet/server/               the fleet server's own GRID_HOME (operator-token 0600, state/)
    fleet/tokens/<host>.token   node credentials (0600, written through the token-write path)
    fleet/hosts/<host>/         node agent state directories (0700)
    fleet/models/*.gguf         generated tiny models (or nothing when --model is given)
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TypedDict

import msgspec
import psutil

from grid_core.api import ProcessIdentity, ValidationError, grid_home, write_atomic

MIN_MACHINES = 1
MAX_MACHINES = 32
"""Spec bound: 1–32 logical machines; the real limit is memory and process capacity."""
DEFAULT_MACHINES = 4
"""Logical machines of a new fleet when neither ``--machines`` nor ``--text-capacities-gib``
says how many."""
DEFAULT_PORT = 22100
"""The fleet's API port (the documented Grid default)."""
DEFAULT_ENGINE_PORT_BASE = 22200
"""First engine port; host i gets ``base + i * ENGINE_PORTS_PER_HOST`` onwards."""
ENGINE_PORTS_PER_HOST = 10
"""Engine ports per logical host: a few models plus restarts without reusing a busy port."""
OS_RESERVE_MB = 2048
"""Memory kept back from the shares for the server, the agents and the rest of the machine."""
MIN_MACHINES_WITH_MEDIA = 2
"""A fleet with a media node needs one text node besides it for the text baseline."""
MEDIA_HOST_MB = 4096
"""The media node's share with explicit text capacities: the fake or a small image model's
gateway plus one workflow budget; ComfyUI's weights live in accelerator memory, which the
fixture does not partition."""
MIN_HOST_MB = 1024
"""Smallest logical host: one tiny replica plus the planner's 512 MB admission headroom."""
MB = 1024 * 1024
GIB_MB = 1024
FLEET_GRID_NAME = "test-fleet"
"""The named grid a running test fleet registers, so that ``--grid test-fleet`` (or the bare
URL) finds the fleet server's operator token and its restart command."""
COMPETE_JOURNAL = "compete-edits.json"
"""``grid test compete``'s journal of temporary profile edits, under the fleet directory
(present only while an edit is applied: during a run, or after a run that was killed)."""

# Demo fleet policy. Every number is a fleet setting sent to the real server; none of it is a
# shortcut inside the controller. Short, but long enough that each decision is honest.
HEARTBEAT_INTERVAL_S = 1.0
"""Node heartbeats every second: loopback is cheap and the demo's phases take seconds."""
DEMAND_BUCKET_S = 5.0
"""Demand buckets of 5 s: a request burst shows within one bucket."""
DEMAND_WINDOW_BUCKETS = 6
"""30 s of demand history: demand expires half a minute after the last request."""
MUTATION_COOLDOWN_S = 5.0
"""Gap between different mutations of one (host, model): a few 1 s heartbeats, so the
next decision sees the previous result."""
MIN_RESIDENCY_S = 15.0
"""A fresh replica is protected from preemption and scale-down for 15 s (anti-flap)."""
SCALE_DOWN_COOLDOWN_S = 15.0
"""Replicas used within the last 15 s, and the recent demand high-water mark, are kept."""
PREDICTIVE_FLOOR_MB = 1024
"""Free disk a predictive transfer must leave on a logical host (MB). Each logical host
reports its capacity share of this machine's one disk, so the default 10 GiB of a one-eighth
share would forbid every transfer; 1 GiB of the share keeps the rule visible and the node's
own check of the real disk still keeps the full default floor."""
THROTTLED_FRACTION = 1.0
"""All logical hosts share one CPU, so one host's CPU throttle is mostly its siblings' load;
a throttled logical host still offers its whole memory share (the state stays visible)."""


class DefaultModel(TypedDict):
    """One generated default model: its GGUF shape, budget and placement policy."""

    name: str
    embedding: int
    """Embedding width of the generated GGUF."""
    layers: int
    share: float
    """Memory budget as a fraction of the smallest host's memory."""
    priority: int
    min_replicas: int
    max_replicas: int


# Default models: three distinct tiny GGUFs of clearly different sizes. Budgets are declared
# as fractions of the smallest host so that any two replicas never share a host (the fleet
# genuinely fills up and a high-priority burst needs preemption) while one always fits.
DEFAULT_MODELS: tuple[DefaultModel, ...] = (
    {
        "name": "tiny-general",
        "embedding": 64,
        "layers": 2,
        "share": 0.51,
        "priority": 50,
        "min_replicas": 1,
        "max_replicas": 3,
    },
    {
        "name": "tiny-coder",
        "embedding": 128,
        "layers": 2,
        "share": 0.56,
        "priority": 10,
        "min_replicas": 0,
        "max_replicas": 1,
    },
    {
        "name": "tiny-writer",
        "embedding": 192,
        "layers": 3,
        "share": 0.62,
        "priority": 100,
        "min_replicas": 0,
        "max_replicas": 1,
    },
)
"""Baseline ``tiny-general`` (min 1), low-priority ``tiny-coder`` and high-priority
``tiny-writer`` (min 0). Budgets are shares of the smallest host's memory: any two exceed a
whole host (shares sum above 1), each alone leaves 38 % of the host for the 512 MB admission
headroom and other programs' memory."""
MODEL_CONTEXT = 2048
"""Context of the generated models: room for a replayed prompt plus the generated tokens."""
OPERATOR_MODEL_SHARE = 0.51
"""Budget share of the smallest host for an operator-supplied ``--model`` GGUF."""


class HostSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One logical host (MB, ports inclusive)."""

    host_id: str
    failure_domain: str
    capacity_mb: int
    capacity_share: float
    port_low: int
    port_high: int
    runtimes: tuple[str, ...] = ()
    """The runtimes the host's agent offers (empty: every installed runtime plugin)."""
    comfyui_url: str | None = None
    """The media node's ComfyUI (started by the fixture), ``None`` on a text node."""


class ModelSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One model the fleet serves and the profile it is registered with."""

    model_id: str
    path: str
    sha256: str
    memory_mb: int
    priority: int
    min_replicas: int
    max_replicas: int
    runtime: str = "llama.cpp"
    """The runtime that serves it (``comfyui`` for a media bundle's workflow)."""


class FleetSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What ``grid test start`` was asked for; a second start must match it exactly."""

    machines: int
    port: int
    engine_port_base: int
    capacities_mb: tuple[int, ...]
    models: tuple[str, ...]
    """Operator GGUF paths (resolved), empty for the generated defaults."""
    include_comfyui: bool = False
    """The last logical machine is a ComfyUI media node (``--include-comfyui``)."""
    media_bundle: str | None = None
    """The media bundle directory (resolved): workflow manifests and their checkpoints."""
    comfyui: str | None = None
    """The ComfyUI launcher (resolved path) the fixture starts for the media node."""


_SETTING_LABELS = {
    "machines": "--machines",
    "port": "--port",
    "engine_port_base": "--engine-port-base",
    "capacities_mb": "host memory in GiB (--text-capacities-gib)",
    "models": "--model",
    "include_comfyui": "--include-comfyui",
    "media_bundle": "--media-bundle",
    "comfyui": "--comfyui",
}
"""How each :class:`FleetSettings` field is named to the operator: the flag that sets it."""
_COUNTED_MACHINES_LABEL = "machines (one per --text-capacities-gib value)"
"""The machine count's name when ``--machines`` was left out and the capacities gave it."""
_DERIVED_SPLIT_LABEL = (
    "host memory in GiB (not asked: an equal split derived from --machines, "
    "as --text-capacities-gib was not given)"
)
"""How a host memory split the operator did not give is named in a settings refusal."""
_SPLIT_IN_MB_LABEL = "host memory in MB (--text-capacities-gib)"
"""The host memory split's name when its GiB text (two places) reads the same both ways."""


def setting_text(field: str, value: object) -> str:
    """A setting's value as the operator gives it (GiB for host memory, not MB tuples)."""
    if field == "capacities_mb" and isinstance(value, tuple):
        return ",".join(f"{mb / GIB_MB:.2f}".rstrip("0").rstrip(".") for mb in value)
    if field == "models" and isinstance(value, tuple):
        return ", ".join(value) if value else "the generated tiny models"
    if isinstance(value, bool):
        return "on" if value else "off"
    return "none" if value is None else str(value)


GIB_TEXT_MAX_PLACES = 10
"""A whole number of MB over 1024 has at most ten decimal places (1/1024 = 2^-10), so GiB to
ten places always reads back as the same MB."""


def exact_gib_text(mb_values: tuple[int, ...]) -> str:
    """Host memory as ``--text-capacities-gib`` takes it, each value to the fewest places
    (two or more) that :func:`text_capacities` reads back as the same MB: ``5.2256`` for an
    equal split of 5351 MB, where two places (``5.23``) would ask for 5355 MB."""
    out = []
    for mb in mb_values:
        for places in range(2, GIB_TEXT_MAX_PLACES + 1):
            text = f"{mb / GIB_MB:.{places}f}".rstrip("0").rstrip(".")
            if int(float(text) * GIB_MB) == mb:
                break
        out.append(text)
    return ",".join(out)


def settings_conflicts(
    running: FleetSettings,
    asked: FleetSettings,
    *,
    capacities_given: bool = True,
    machines_given: bool = True,
) -> list[str]:
    """One ``LABEL: running X, asked Y`` phrase per setting in which ``asked`` differs from
    the running fleet's, named by its ``grid test start`` flag and in the flag's units.

    Args:
        running: the running fleet's settings (``fleet.json``).
        asked: the settings this start was asked for.
        capacities_given: ``False`` when the operator gave no ``--text-capacities-gib`` and
            ``asked.capacities_mb`` is the equal split :func:`start_capacities` derived from
            ``--machines``. A split that differs then follows from another setting the
            operator did ask differently and is left out; only when nothing else differs is
            it named, as derived (``..., derived from --machines: running X, would be Y``),
            never as asked.
        machines_given: ``False`` when ``--machines`` was left out and ``asked.machines``
            counts the ``--text-capacities-gib`` values: the phrase then says so.

    Returns:
        The phrases in :class:`FleetSettings` field order (empty when nothing differs).
    """
    out, derived = [], []
    for field in running.__struct_fields__:
        was, now = getattr(running, field), getattr(asked, field)
        if was == now:
            continue
        if field == "capacities_mb" and not capacities_given:
            derived.append(
                f"{_DERIVED_SPLIT_LABEL}: running {setting_text(field, was)}, "
                f"would be {setting_text(field, now)}"
            )
            continue
        label = _SETTING_LABELS.get(field, field)
        if field == "machines" and not machines_given:
            label = _COUNTED_MACHINES_LABEL
        was_text, now_text = setting_text(field, was), setting_text(field, now)
        if field == "capacities_mb" and was_text == now_text:
            # GiB to two places hides the difference (an equal split is rarely a round
            # number of GiB): name the values in MB, as the fleet records them.
            label = _SPLIT_IN_MB_LABEL
            was_text, now_text = (",".join(map(str, v)) for v in (was, now))
        out.append(f"{label}: running {was_text}, asked {now_text}")
    return out or derived


class ProcessRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Identity proof of a process the fleet started: PID plus birth time plus a marker."""

    pid: int
    birth: float
    marker: tuple[str, str]
    """A ``(flag, value)`` pair that must appear in the process's command line."""

    def identity(self) -> ProcessIdentity:
        """The recorded process as a provable identity (PID, birth, marker pair)."""
        return ProcessIdentity(self.pid, self.birth, args=(self.marker,))


class FleetRecord(msgspec.Struct, kw_only=True):
    """``fleet.json``."""

    settings: FleetSettings
    url: str
    hosts: tuple[HostSpec, ...]
    models: tuple[ModelSpec, ...]
    server: ProcessRecord | None = None
    started_at: float = 0.0
    media: tuple[ModelSpec, ...] = ()
    """The media bundle's workflows (served by the media node's ComfyUI)."""
    comfyui: ProcessRecord | None = None
    """The ComfyUI process the fixture started for the media node."""


def fleet_dir() -> Path:
    """``$GRID_HOME/fleet`` (the fixture's whole world)."""
    return grid_home() / "fleet"


def record_path(root: Path) -> Path:
    return root / "fleet.json"


def load_record(root: Path) -> FleetRecord | None:
    """The fleet record, or ``None`` when no fleet was started here."""
    try:
        return msgspec.json.decode(record_path(root).read_bytes(), type=FleetRecord)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        msg = f"{record_path(root)} is unreadable ({exc}); inspect it, then delete it"
        raise ValidationError(msg) from None


def save_record(root: Path, rec: FleetRecord) -> None:
    """Write ``fleet.json`` atomically and durably (owner-only).

    Raises:
        StateError: the file could not be written (the previous record is kept).
    """
    write_atomic(record_path(root), msgspec.json.format(msgspec.json.encode(rec)))


def usable_memory_mb() -> int:
    """Memory this machine can give the fleet now: available minus the OS reserve (MB)."""
    return int(psutil.virtual_memory().available / MB) - OS_RESERVE_MB


def plan_capacities(
    machines: int, capacities_gib: str | None, *, media: bool = False
) -> tuple[int, ...]:
    """Per-host memory (MB): explicit GiB values, or an equal split of usable memory.

    With ``media`` the last host is the ComfyUI media node: the explicit values are the text
    nodes' (one fewer than ``machines``) and the media node gets an equal share of what is
    left of the usable memory, at most :data:`MEDIA_HOST_MB`.

    Raises:
        ValidationError: wrong count, a non-positive or too small value, or a sum that does
            not fit this machine's usable memory (names the numbers and the fix).
    """
    if not MIN_MACHINES <= machines <= MAX_MACHINES:
        msg = f"--machines {machines}: use {MIN_MACHINES}..{MAX_MACHINES}"
        raise ValidationError(msg)
    if media and machines < MIN_MACHINES_WITH_MEDIA:
        msg = (
            f"--machines {machines} --include-comfyui: the media node is one of the machines; "
            f"use --machines {MIN_MACHINES_WITH_MEDIA} or more (a text node serves the baseline)"
        )
        raise ValidationError(msg)
    text = machines - 1 if media else machines
    usable = usable_memory_mb()
    if capacities_gib:
        caps = text_capacities(capacities_gib, text, media=media)
        if media:
            caps += (min(MEDIA_HOST_MB, max(0, usable - sum(caps))),)
    else:
        caps = tuple([usable // machines] * machines)
    small = [i + 1 for i, c in enumerate(caps) if c < MIN_HOST_MB]
    if small:
        msg = (
            f"logical hosts {small} would get less than {MIN_HOST_MB} MB; use fewer "
            f"--machines or larger --text-capacities-gib"
        )
        raise ValidationError(msg)
    if sum(caps) > usable:
        msg = (
            f"the shares add up to {sum(caps)} MB but this machine can give only "
            f"{usable} MB (available memory minus {OS_RESERVE_MB} MB reserve); "
            "lower --text-capacities-gib or --machines"
        )
        raise ValidationError(msg)
    return caps


def text_capacities(capacities_gib: str, text: int, *, media: bool = False) -> tuple[int, ...]:
    """The text nodes' memory (MB) from ``--text-capacities-gib`` as typed, one value per
    text node (``text``: ``--machines``, less the media node with ``media``).

    Raises:
        ValidationError: not comma-separated numbers, or the wrong count (names the fix).
    """
    try:
        values = [float(v) for v in capacities_gib.split(",")]
    except ValueError:
        msg = f"--text-capacities-gib {capacities_gib!r}: use comma-separated GiB, e.g. 4,4,2"
        raise ValidationError(msg) from None
    if len(values) != text:
        per = "text node (--machines minus the media node)" if media else "logical machine"
        msg = (
            f"--text-capacities-gib has {len(values)} values for {text} text node(s); "
            f"give one capacity per {per}"
        )
        raise ValidationError(msg)
    return tuple(int(v * GIB_MB) for v in values)


class StartFlags(msgspec.Struct, frozen=True, kw_only=True):
    """``grid test start``'s flags as typed: ``None`` where the operator left one out."""

    machines: int | None = None
    capacities_gib: str | None = None
    models: tuple[str, ...] | None = None
    """Resolved ``--model`` paths."""
    port: int | None = None
    engine_port_base: int | None = None
    include_comfyui: bool | None = None
    media_bundle: Path | None = None
    comfyui: Path | None = None


def fill_left_out(flags: StartFlags, running: FleetSettings | None) -> FleetSettings:
    """The settings ``flags`` ask for, each flag the operator left out filled in: from the
    recorded fleet's settings when one is recorded (so a bare ``grid test start`` confirms
    the fleet that runs here instead of asking for a default one), else from the defaults.

    ``--machines`` left out follows ``--text-capacities-gib`` when that is given (one value
    per text node, plus the media node with ``--include-comfyui``). The media bundle and
    launcher are taken from the record only for a media fleet asked for again, and are
    returned as typed (the caller resolves and checks them). ``capacities_mb`` is left empty:
    :func:`start_capacities` decides the split.

    Raises:
        ValidationError: ``--text-capacities-gib`` that sets the machine count holds a value
            that is not a number (named before any comparison with a running fleet).
    """
    rec = running
    media = flags.include_comfyui
    if media is None:
        media = rec.include_comfyui if rec is not None else False
    machines = flags.machines
    if machines is None and flags.capacities_gib:
        count = len(flags.capacities_gib.split(","))
        text_capacities(flags.capacities_gib, count)  # a bad value is named as such first
        machines = count + (1 if media else 0)
    if machines is None:
        machines = rec.machines if rec is not None else DEFAULT_MACHINES
    bundle = str(flags.media_bundle) if flags.media_bundle is not None else None
    launcher = str(flags.comfyui) if flags.comfyui is not None else None
    if media and rec is not None and rec.include_comfyui:
        bundle = bundle if bundle is not None else rec.media_bundle
        launcher = launcher if launcher is not None else rec.comfyui
    port, base = flags.port, flags.engine_port_base
    return FleetSettings(
        machines=machines,
        port=port if port is not None else (rec.port if rec else DEFAULT_PORT),
        engine_port_base=(
            base
            if base is not None
            else (rec.engine_port_base if rec else DEFAULT_ENGINE_PORT_BASE)
        ),
        capacities_mb=(),
        models=flags.models if flags.models is not None else (rec.models if rec else ()),
        include_comfyui=media,
        media_bundle=bundle,
        comfyui=launcher,
    )


def start_capacities(
    machines: int,
    capacities_gib: str | None,
    running: FleetSettings | None,
    *,
    media: bool = False,
) -> tuple[int, ...]:
    """Per-host memory (MB) for ``grid test start``: :func:`plan_capacities`, except that
    a request without ``capacities_gib`` for the running fleet's number of ``machines``
    keeps the running fleet's split.

    An equal split depends on the memory free at start time; the same request a second time
    means the same fleet, so it must not differ from the running one only because the
    running fleet now uses some of that memory.

    Args:
        machines: ``--machines``.
        capacities_gib: ``--text-capacities-gib`` as typed, ``None`` when not given.
        running: the recorded fleet's settings, ``None`` when none was recorded.
        media: ``--include-comfyui``.

    The running fleet's own request (same ``machines`` and ``media``, and either no
    ``capacities_gib`` or the text nodes' values it runs with) is answered with its split
    before this machine's free memory is checked: the running fleet holds part of that
    memory itself, so checking again would refuse the very request it was started with.

    Raises:
        ValidationError: as :func:`plan_capacities` (every other request is checked).
    """
    if running is not None and running.machines == machines and running.include_comfyui == media:
        text = machines - 1 if media else machines
        if not capacities_gib:
            return running.capacities_mb
        if text_capacities(capacities_gib, text, media=media) == running.capacities_mb[:text]:
            return running.capacities_mb
    return plan_capacities(machines, capacities_gib, media=media)


def host_specs(
    caps: tuple[int, ...], engine_port_base: int, *, media: bool = False
) -> tuple[HostSpec, ...]:
    """Host ids ``host-01``…, one failure domain each, disjoint engine port ranges.

    Text hosts offer llama.cpp. With ``media`` the last host is the ComfyUI media node: it
    offers only ``comfyui`` and the last port of its range is its ComfyUI's, the rest its
    workflow gateways'.

    Raises:
        ValidationError: the port ranges would leave 1024..65535.
    """
    total_mb = psutil.virtual_memory().total / MB
    last = engine_port_base + len(caps) * ENGINE_PORTS_PER_HOST - 1
    if engine_port_base < 1024 or last > 65535:
        msg = (
            f"--engine-port-base {engine_port_base}: the {len(caps)} hosts need ports "
            f"{engine_port_base}..{last} inside 1024..65535"
        )
        raise ValidationError(msg)
    out = []
    for i, cap in enumerate(caps):
        low = engine_port_base + i * ENGINE_PORTS_PER_HOST
        high = low + ENGINE_PORTS_PER_HOST - 1
        is_media = media and i == len(caps) - 1
        out.append(
            HostSpec(
                host_id=f"host-{i + 1:02d}",
                failure_domain=f"rack-{i + 1:02d}",
                capacity_mb=cap,
                capacity_share=round(cap / total_mb, 6),
                port_low=low,
                port_high=high - 1 if is_media else high,
                runtimes=("comfyui",) if is_media else ("llama.cpp",),
                comfyui_url=f"http://127.0.0.1:{high}" if is_media else None,
            )
        )
    return tuple(out)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def policy_document() -> dict[str, object]:
    """The demo fleet's ``ControllerPolicy`` (JSON for ``grid_server.serve --policy``)."""
    return {
        "planner": {
            "throttled_fraction": THROTTLED_FRACTION,
            "predictive_floor_mb": PREDICTIVE_FLOOR_MB,
        },
        "governor": {"mutation_cooldown_s": MUTATION_COOLDOWN_S},
        "forecast": {"bucket_s": DEMAND_BUCKET_S, "window_buckets": DEMAND_WINDOW_BUCKETS},
    }


def profile_document(m: ModelSpec) -> dict[str, object]:
    """The placement profile registered for ``m`` (short demo residency and cooldown)."""
    return {
        "model_id": m.model_id,
        "memory_mb": m.memory_mb,
        "artifact_sha256": m.sha256,
        "min_replicas": m.min_replicas,
        "max_replicas": m.max_replicas,
        "priority": m.priority,
        "expected_service_time_s": 0.5,
        "load_estimate_s": 2.0,
        "warm_estimate_s": 3.0,
        "min_residency_s": MIN_RESIDENCY_S,
        "scale_down_cooldown_s": SCALE_DOWN_COOLDOWN_S,
        "runtimes": [m.runtime],
    }
