"""Everything that crosses a process boundary between a node and the server (schema_version 1).

These msgspec Structs are the local wire contract: node registration, heartbeat, heartbeat
response, commands and acknowledgements. Fields are additive: a newer peer may send keys an
older one does not know (they are ignored), and every new field has a default.

Decoding is strict: wrong types, negative or non-finite numbers (a finite upper bound rejects
``1e999``), unknown enum values and oversize strings or lists raise
:class:`WireError` whose message names the field path (``$.allocator.residencies[0].state``).
A residency row that is malformed is the one exception: it is dropped, and the decoded
document says so (``rejected_rows``) so the host snapshot can fail closed as unhealthy.
"""

from __future__ import annotations

import re
from itertools import accumulate
from typing import Annotated, Generic, Literal, TypeVar

import msgspec

from grid_core.errors import ValidationError

SCHEMA_VERSION = 1

# --- bounds (each one a named constant; the numbers leave wide room for real fleets) -----
MAX_ID_LEN = 200
"""Host, node, model and action ids: long enough for an alias plus a digest, short enough to log."""
MAX_TEXT_LEN = 2000
"""Free text (reasons, messages): a one-paragraph explanation, never a dump."""
MAX_LIST = 256
"""Lists of models, tags, commands, acks per document: far above one machine's inventory."""
MAX_MB = 1 << 32
"""Memory and disk in MB: 4 PB, beyond any single host; rejects overflow and ``inf``."""
MAX_SECONDS = 10 * 365 * 24 * 3600.0
"""Durations in seconds: ten years; rejects ``inf`` and absurd values."""
MAX_TIMESTAMP = 4_102_444_800.0
"""Unix timestamps: the year 2100; rejects ``inf`` and overflowed clocks."""
MAX_COUNT = 1_000_000
"""Request counts and queue depths: far beyond one engine's concurrency."""
MAX_RATE = 1e9
"""Measured rates (GB/s, GFLOPS, tokens/s): generous finite ceiling."""
MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects accepted in any JSON body. Wire documents nest about
five levels and OpenAI chat bodies with tool schemas a few dozen; without a bound a body of
10,000 brackets exhausts the decoder's recursion (a 500 instead of a refusal)."""

IDENT_PATTERN = r"^(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._:@+-]{0,199}$"
"""The one identifier grammar (model ids, host ids, pins, tags, runtimes, record and action
ids): a letter or digit, then letters, digits and ``. _ : @ + -``, at most
:data:`MAX_ID_LEN` characters, never ``..``. Identifiers end up in URL paths, registry ids,
status lines, log lines and file names, so NUL, newline, space, ``/`` and ``..`` are refused
everywhere instead of being escaped in each of those places."""
IDENT = re.compile(IDENT_PATTERN)
MODEL_ID_PATTERN = r"^(?!.*\.\.)(?!.*//)(?!.*/$)[A-Za-z0-9][A-Za-z0-9._:@+/-]{0,199}$"
"""Model ids follow the same grammar, plus ``/`` between segments: OpenAI-style names such
as ``org/model`` are what vLLM and other engines serve. Never a leading, trailing or double
``/`` and never ``..``, so a model id can never climb out of a directory or a URL path."""
MODEL_ID = re.compile(MODEL_ID_PATTERN)

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_LEN, pattern=IDENT_PATTERN)]
ModelId = Annotated[
    str, msgspec.Meta(min_length=1, max_length=MAX_ID_LEN, pattern=MODEL_ID_PATTERN)
]
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT_LEN)]
MB = Annotated[int, msgspec.Meta(ge=0, le=MAX_MB)]
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_SECONDS)]
Timestamp = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_TIMESTAMP)]
Rate = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_RATE)]
Sha256 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]

HostState = Literal["accepting", "throttled", "draining", "paused", "unhealthy", "quarantined"]
"""Host lifecycle from the local protection loop (see grid_core.protection)."""
ResidencyState = Literal["loading", "cached", "warming", "ready", "draining", "failed"]
"""One model's lifecycle on one host: LOAD → (CACHED) → WARM → READY → DRAIN → UNLOAD."""
Ownership = Literal["managed", "external", "manual", "pinned"]
"""Who may actuate a residency: only ``managed`` ones are ever loaded, drained or unloaded."""
ActionKind = Literal["load", "warm", "drain", "unload", "evict"]
AckStatus = Literal["succeeded", "failed", "rejected", "running"]
Mode = Literal["observe", "recommend", "automatic"]
Capability = Literal["load", "warm", "drain", "unload", "evict"]


CONTROL_HEADER = "X-Grid-Allocator-Node-Token"
"""Header carrying a host-scoped node credential on every /nodes route."""
OPERATOR_HEADER = "X-Grid-Allocator-Token"
"""Header carrying the operator capability (``Authorization: Bearer`` is accepted too)."""
AFFINITY_HEADER = "X-Grid-Affinity-Key"
"""Optional client session key; hashed on arrival, never stored or forwarded."""


def control_record_id(host_id: str) -> str:
    """Registry id of a host's control record (role ``allocator``): derived, not chosen."""
    return f"ctl.{host_id}"


def engine_record_id(host_id: str, model_id: str) -> str:
    """Registry id of a managed engine record: derived from the host and the model.

    A host credential can therefore only ever write its own records.
    """
    import hashlib

    digest = hashlib.sha256(model_id.encode()).hexdigest()[:16]
    return f"eng.{host_id}.{digest}"


class WireError(ValidationError):
    """A wire document is malformed; the message names the field path."""


def check_ident(field: str, value: str) -> str:
    """Validate one identifier against :data:`IDENT_PATTERN`.

    Args:
        field: the field name for the message (``model_id``, ``pins``, ``host_id``).
        value: the identifier.

    Returns:
        ``value`` unchanged.

    Raises:
        ValidationError: the message names the field, shows the value (escaped) and the fix.
    """
    if not IDENT.fullmatch(value):
        msg = (
            f"field '{field}': {value[:80]!r} is not a valid identifier; use 1-{MAX_ID_LEN} "
            "letters, digits and . _ : @ + - starting with a letter or digit, without '..', "
            "spaces, slashes or control characters"
        )
        raise ValidationError(msg)
    return value


class Struct(msgspec.Struct, frozen=True, kw_only=True):
    """Base for wire structs: frozen, keyword-only; every field is encoded (explicit documents)."""


class GpuDevice(Struct, frozen=True, kw_only=True):
    """One accelerator on a host."""

    index: Count
    name: Text = ""
    memory_total_mb: MB = 0
    memory_used_mb: MB | None = None


class Resources(Struct, frozen=True, kw_only=True):
    """A host's stable capacity and placement facts (memory in MB)."""

    capacity_mb: MB
    reserved_mb: MB = 0
    runtimes: Annotated[list[Id], msgspec.Meta(max_length=MAX_LIST)] = []
    backends: Annotated[list[Id], msgspec.Meta(max_length=MAX_LIST)] = []
    memory_bandwidth_gbps: Rate | None = None
    compute_gflops: Rate | None = None
    failure_domain: Id | None = None
    tags: Annotated[list[Id], msgspec.Meta(max_length=MAX_LIST)] = []
    data_tiers: Annotated[list[Id], msgspec.Meta(max_length=MAX_LIST)] = []
    max_models: Count = 0
    """Ceiling on models resident at once; 0 means no ceiling."""
    gpus: Annotated[list[GpuDevice], msgspec.Meta(max_length=MAX_LIST)] = []
    artifact_disk_free_mb: MB | None = None
    """Authenticated free disk for artifacts; ``None`` is unknown (never treated as free)."""
    artifact_disk_total_mb: MB | None = None
    external_used_mb: MB = 0
    """Memory held by processes Grid does not manage (refreshed every heartbeat)."""
    throttle_fraction: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 1.0
    """Share of capacity offered for new placement while throttled."""
    thermal_derating: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = 0.0
    """Share of capacity withheld for heat; bounds the complete desired footprint."""


class Residency(Struct, frozen=True, kw_only=True):
    """One model on one host, as the host reports it.

    ``loaded_age_s``/``last_used_age_s`` are ages relative to the sender's clock at send time;
    the server rebuilds timestamps from its own receipt time so node clock skew cannot
    bypass minimum residency or scale-down cooldown.
    """

    model_id: ModelId
    memory_mb: MB
    state: ResidencyState
    managed: bool = True
    ownership: Ownership | None = None
    active_requests: Count | None = None
    """In-flight requests; ``None`` means unknown (unknown activity fails safe: no unload)."""
    max_concurrency: Count | None = None
    queue_depth: Count = 0
    loaded_at: Timestamp | None = None
    last_used_at: Timestamp | None = None
    loaded_age_s: Seconds | None = None
    last_used_age_s: Seconds | None = None
    artifact_sha256: Sha256 | None = None
    runtime: Id | None = None
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] | None = None
    route_url: Text | None = None
    predictive: bool = False

    @property
    def effective_ownership(self) -> Ownership:
        """``ownership`` when given, else ``managed``/``external`` from the legacy flag."""
        if self.ownership is not None:
            return self.ownership
        return "managed" if self.managed else "external"


class CachedArtifact(Struct, frozen=True, kw_only=True):
    """Weights present on a host's disk (no memory, no model slot)."""

    model_id: ModelId
    artifact_sha256: Sha256 | None = None
    size_mb: MB = 0
    predictive: bool = False
    """Downloaded by a cache-only predictive prefetch and never started since."""
    cached_age_s: Seconds | None = None
    """For a predictive entry: seconds since its verified download finished (sender's clock
    at send time; the server rebuilds the time from its own receipt clock)."""


class AllocatorEnvelope(Struct, frozen=True, kw_only=True):
    """The allocator-specific part of a registration or heartbeat (namespaced, additive)."""

    schema_version: Literal[1] = 1
    state: HostState = "accepting"
    state_reason: Text = ""
    cached_models: Annotated[list[ModelId], msgspec.Meta(max_length=MAX_LIST)] = []
    cached_artifacts: Annotated[list[CachedArtifact], msgspec.Meta(max_length=MAX_LIST)] = []
    residencies: Annotated[list[Residency], msgspec.Meta(max_length=MAX_LIST)] = []
    actuator_capabilities: Annotated[list[Capability], msgspec.Meta(max_length=16)] = []
    highest_term: Count = 0
    latest_generation: Text | None = None


class Load(Struct, frozen=True, kw_only=True):
    """Instantaneous load the node reports."""

    active_tasks: Count = 0
    queue_depth: Count = 0


_IPV6 = r"[0-9A-Fa-f]{0,4}(:[0-9A-Fa-f]{0,4}){2,7}"
HOST_ADDRESS_PATTERN = rf"^([A-Za-z0-9][A-Za-z0-9.-]{{0,252}}|{_IPV6}|\[{_IPV6}\])$"
"""A host name or IP literal a node advertises (``worker-01.lan``, ``198.18.0.2``, ``[::1]``):
DNS letters, digits, dots and hyphens (at most 253; an IPv4 address is one), or an IPv6
literal with or without brackets; never a scheme, port, path, user or space."""
HostAddress = Annotated[str, msgspec.Meta(max_length=255, pattern=HOST_ADDRESS_PATTERN)]

MAX_ENGINE_CA_PEM = 64 * 1024
"""Largest engine CA bundle accepted (characters): a private intranet chain is a few KB."""


class NodeRegistration(Struct, frozen=True, kw_only=True):
    """Body of ``PUT /nodes/{node_id}``: register or update a node record.

    ``models`` keeps its original meaning: models ready and routable on this record now.
    """

    role: Literal["allocator", "engine"] = "allocator"
    models: Annotated[list[ModelId], msgspec.Meta(max_length=MAX_LIST)] = []
    host_id: Id
    resources: Resources | None = None
    allocator: AllocatorEnvelope | None = None
    url: Text | None = None
    engine_api_key: Annotated[str, msgspec.Meta(max_length=512)] | None = None
    """Private key for the upstream hop to a managed engine; never serialised publicly."""
    engine_ca_pem: Annotated[str, msgspec.Meta(max_length=MAX_ENGINE_CA_PEM)] | None = None
    """PEM CA bundle the server verifies an ``https://`` engine with (hostname checked); kept
    only in the server's memory, never serialised publicly."""
    advertise_host: HostAddress | None = None
    """Control records only: the host name or IP the server reaches this node's engines at
    (``--advertise-host``). ``None``: the node's engines are on the server's loopback. Every
    engine record of the host must use exactly this address."""
    instance_id: Id | None = None
    """The sending node agent's per-run id (random, made when the agent starts). The server
    lets one run speak for a host id at a time; ``None`` (an older agent) is not checked."""
    replaces_instance_id: Id | None = None
    """The per-run id of the previous agent run on the same state directory. That
    directory's lock proves the previous run has ended (crashed or killed), so the server
    lets this run take the host id over at once instead of after the heartbeat lapse."""


class Acknowledgement(Struct, frozen=True, kw_only=True):
    """A node's report on one command.

    ``artifact_fetched`` is true only when a load really invoked the artifact fetch path;
    it stays false for cache hits, verification and every non-load action.
    """

    action_id: Id
    status: AckStatus
    message: Text = ""
    duration_seconds: Seconds | None = None
    artifact_fetched: bool = False
    observed_at: Timestamp | None = None


class Heartbeat(Struct, frozen=True, kw_only=True):
    """A heartbeat: fresh load, resources and allocator state, plus acknowledgements.

    ``request_commands=false`` (early lease and fence heartbeats) updates registry truth and
    returns at once without marking any command delivered.
    """

    node_id: Id
    host_id: Id | None = None
    load: Load | None = None
    resources: Resources | None = None
    allocator: AllocatorEnvelope | None = None
    request_commands: bool = True
    acknowledgements: Annotated[list[Acknowledgement], msgspec.Meta(max_length=MAX_LIST)] = []
    instance_id: Id | None = None
    """The sending node agent's per-run id (random, made when the agent starts). The server
    lets one run speak for a host id at a time; ``None`` (an older agent) is not checked."""


class Command(Struct, frozen=True, kw_only=True):
    """One mutation the controller asks a node to perform.

    Authority is the tuple (``controller_term``, ``controller_id``,
    ``controller_lease_expires_at``); ``plan_generation`` orders plans within one authority.
    """

    action_id: Id
    kind: ActionKind
    node_id: Id
    model_id: ModelId
    memory_mb: MB = 0
    plan_generation: Text
    controller_term: Count = 0
    controller_id: Text = ""
    controller_lease_expires_at: Timestamp = 0.0
    dependencies: Annotated[list[Id], msgspec.Meta(max_length=MAX_LIST)] = []
    executable: bool = False
    reason: Text = ""
    created_at: Timestamp = 0.0
    not_before: Timestamp = 0.0
    artifact_sha256: Sha256 | None = None
    artifact_source: Text | None = None
    artifact_size_mb: MB | None = None
    runtime: Id | None = None
    embeddings: bool = False
    """warm only: start the engine with its embeddings endpoint enabled (an embedding profile)."""
    ready_timeout_s: Seconds | None = None
    """warm only: seconds to wait for readiness before stopping the engine as failed, derived
    from the profile's warm estimate and the learned warm time (``None``: the adapter's own
    default, for a controller that sends none)."""
    force: bool = False
    """unload only: stop the engine even with requests in flight or unknown activity. Set only
    when the controller decided so because the drain deadline passed (reason
    ``drain_deadline``); the node still signals only a proven process."""


class AllocatorResponse(Struct, frozen=True, kw_only=True):
    """The allocator part of a heartbeat response."""

    mode: Mode
    controller_lease_ttl_seconds: Seconds = 0.0
    """Remaining authority in the server's clock; the node subtracts its request duration."""
    commands: Annotated[list[Command], msgspec.Meta(max_length=MAX_LIST)] = []
    follower: bool = False
    """The answering server follows another on a replicated store: it took none of the
    heartbeat's receipts and sends no commands, so the node keeps its receipts for the leader
    (additive field; older servers are always leaders)."""


class HeartbeatResponse(Struct, frozen=True, kw_only=True):
    """What an authenticated heartbeat gets back."""

    ttl_seconds: Seconds = 60.0
    model_last_used_at: dict[ModelId, Timestamp] = {}
    allocator: AllocatorResponse | None = None
    engine_key_required: bool = False


T = TypeVar("T")


class Decoded(msgspec.Struct, Generic[T], frozen=True):
    """A decoded document plus the residency rows dropped as malformed.

    Attributes:
        document: the decoded struct.
        rejected_rows: one message per dropped residency row (path and cause); non-empty
            means the host snapshot must be treated as unhealthy.
    """

    document: T
    rejected_rows: tuple[str, ...] = ()


def _lenient_residencies(obj: object, path: str) -> tuple[object, tuple[str, ...]]:
    """Split ``obj['allocator']['residencies']`` into valid rows and rejection messages."""
    if not isinstance(obj, dict):
        return obj, ()
    env = obj.get("allocator")
    if not isinstance(env, dict) or not isinstance(env.get("residencies"), list):
        return obj, ()
    rows = env["residencies"]
    if len(rows) > MAX_LIST:
        return obj, ()  # let strict decoding report the oversize list
    kept: list[object] = []
    rejected: list[str] = []
    for i, row in enumerate(rows):
        try:
            msgspec.convert(row, Residency)
        except msgspec.ValidationError as exc:
            rejected.append(f"{path}.allocator.residencies[{i}]: {_relative(exc)}")
            continue
        kept.append(row)
    return {**obj, "allocator": {**env, "residencies": kept}}, tuple(rejected)


def _relative(exc: msgspec.ValidationError) -> str:
    return str(exc).replace(" - at `$`", "").replace("`$.", "`.")


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
"""A JSON string literal (unrolled loop: linear time even on long prompts)."""
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_BRACKET_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays/objects in a JSON text (brackets inside strings ignored).

    Malformed text gets a best-effort answer; the decoder reports its own errors afterwards.
    """
    if data.count(b"[") + data.count(b"{") <= MAX_JSON_DEPTH:
        return 0  # cheap path: not enough brackets to exceed the bound
    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    return max(accumulate(_BRACKET_STEP[b] for b in brackets), default=0)


def check_json_depth(data: bytes | str, what: str) -> None:
    """Refuse JSON nested deeper than :data:`MAX_JSON_DEPTH` before any decoder sees it.

    Raises:
        WireError: the body nests deeper than the bound (the message names the limit).
    """
    raw = data.encode() if isinstance(data, str) else data
    if json_depth(raw) > MAX_JSON_DEPTH:
        msg = f"{what}: JSON nests deeper than {MAX_JSON_DEPTH} levels; flatten the body"
        raise WireError(msg)


def decode(data: bytes | str, kind: type[T]) -> Decoded[T]:
    """Decode a JSON wire document strictly, dropping (and reporting) malformed residencies.

    Args:
        data: the JSON body.
        kind: the struct type (``NodeRegistration``, ``Heartbeat``, ``HeartbeatResponse``…).

    Returns:
        The document and the rejected residency rows.

    Raises:
        WireError: the document is not valid JSON, nests deeper than :data:`MAX_JSON_DEPTH`,
            or violates the contract; the message names the field path.
    """
    check_json_depth(data, kind.__name__)
    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        msg = f"{kind.__name__}: body is not valid JSON ({exc}); send a JSON object"
        raise WireError(msg) from None
    raw, rejected = _lenient_residencies(raw, "$")
    try:
        doc = msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        msg = f"{kind.__name__}: {exc}"
        raise WireError(msg) from None
    return Decoded(doc, rejected)


def encode(doc: msgspec.Struct) -> bytes:
    """Encode a wire struct as compact JSON."""
    return msgspec.json.encode(doc)
