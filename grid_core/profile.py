"""Model profiles: what the operator declares about one model for placement.

Set with ``grid allocator model set`` / ``PUT /allocator/models/{model_id}``. Memory is the
resident runtime budget of one replica (not the file size). Validation names the field and the
fix; a profile is either wholly valid or rejected (no half-applied profile).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from typing import Annotated

import msgspec

from grid_core.errors import ValidationError, VersionConflictError
from grid_core.wire import IDENT, MAX_ID_LEN, MAX_LIST, MAX_MB, MODEL_ID

DEFAULT_RUNTIME = "llama.cpp"
BUILTIN_RUNTIMES: tuple[str, ...] = ("llama.cpp", "vllm", "ollama", "comfyui")
"""Runtime names Grid's own adapters and docs use. Not a closed list: a runtime plugin
(a ``RuntimeAdapter``) adds its own name, so a profile may name any runtime that matches
:data:`RUNTIME_NAME`; one no node offers is reported unmet with the ``runtime`` reason."""
MAX_RUNTIME_NAME_LEN = 64
"""Longest runtime name: far above any engine family's name, short enough for a status line."""
RUNTIME_NAME = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._+-]{{0,{MAX_RUNTIME_NAME_LEN - 1}}}$")
"""The runtime name grammar (``llama.cpp``, ``vllm``, a plugin's ``echo``): a letter or digit,
then letters, digits, ``.``, ``_``, ``+`` or ``-``; no spaces, slashes or control characters."""
MAX_REPLICAS_LIMIT = 256
"""Upper bound on max_replicas: above any fleet Grid plans for; keeps search bounded."""
MAX_PRIORITY = 1000
"""Priorities are small integers, higher is more important."""
HF_SOURCE = re.compile(r"^hf://[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+(@[A-Za-z0-9_.-]+)?/.+$")
"""An exact, credential-free Hugging Face file URI (``hf://owner/repo[@rev]/path``)."""
HF_SEGMENT = re.compile(r"^[A-Za-z0-9_.+-]+(@[A-Za-z0-9_.-]+)?$")
"""One path segment of an ``hf://`` source: no ``%``, ``?``, ``#``, ``\\``, spaces or control
characters (nothing a URL or a file system would reinterpret)."""
MAX_SOURCE_LEN = 1000
"""Longest artifact source URI: far above any repository path, short enough for status."""
MAX_REPLICA_CONCURRENCY = 4096
"""Most request slots one replica may declare: above the widest batch an engine runs at once
(vLLM's default is 256 sequences); a larger number is a typo that would make one replica
look able to absorb any demand."""
MAX_GPU_COUNT = 1024
"""Most GPUs a profile may require on one host: above any single machine."""
MAX_COLOCATED_MODELS = MAX_LIST
"""Highest per-host model ceiling a profile may declare: a host reports at most this many
residencies."""
MAX_FAILURE_DOMAINS = 256
"""Most failure domains a profile may require: one per replica at the replica ceiling."""
HF_SNAPSHOT_SOURCE = re.compile(r"^hf://[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+@[0-9a-f]{40}$")
"""A vLLM model snapshot: a whole repository at one commit (never a branch or tag name)."""
OLLAMA_SOURCE = re.compile(r"^ollama://[A-Za-z0-9_.:/-]+$")
"""An Ollama registry tag (``ollama://<tag>``), verified against its declared digest."""


def _exact_source(source: str, runtimes: tuple[str, ...] | list[str], model_id: str) -> bool:
    """Whether ``source`` is an exact fetch form one of the profile's runtimes understands
    (specification, "Current limits": llama.cpp and vLLM fetch exact, size-bounded artifacts,
    Ollama verifies the registry digest)."""
    if HF_SOURCE.match(source) and "@" not in source.split("/")[2]:
        return True
    if HF_SNAPSHOT_SOURCE.match(source):
        return "vllm" in runtimes
    return (
        "ollama" in runtimes
        and source == f"ollama://{model_id}"
        and bool(OLLAMA_SOURCE.match(source))
    )


SHA256 = re.compile(r"^[0-9a-f]{64}$")
WORKLOAD_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
WORKLOADS: tuple[str, ...] = (
    "coding",
    "research",
    "marketing",
    "sales",
    "design",
    "image",
    "video",
    "embedding",
    "general",
)
"""The configured workload vocabulary: what the classifier may answer for ``model: auto`` and
the only names a profile's ``workload_scores`` may use (a typo would silently never match)."""


class ModelProfile(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Placement policy for one model (units in the field names: MB, seconds, ms).

    Rules come from the specification's "CLI workflow" and "Global placement loop".
    """

    model_id: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    memory_mb: int
    """Portable resident budget of one replica (MB)."""
    runtime_memory_mb: dict[str, int] = {}
    """Runtime-specific budgets; the largest one matching the host's runtimes is used."""
    admission_headroom_mb: int | None = None
    """Free MB a new replica must leave on its host, replacing the proportional default
    (:func:`grid_core.headroom.admission_headroom_mb`); never below the policy floor.
    ``None``: the default share of the replica's resident budget."""
    artifact_sha256: str | None = None
    artifact_source: str | None = None
    artifact_size_mb: int | None = None
    runtimes: tuple[str, ...] = (DEFAULT_RUNTIME,)
    backends: tuple[str, ...] = ()
    """Empty: any backend; otherwise the host must offer at least one."""
    min_replicas: int = 0
    max_replicas: int = 1
    priority: int = 0
    data_tier: str | None = None
    """When set, the host must list this tier in its ``data_tiers``."""
    required_tags: tuple[str, ...] = ()
    forbidden_tags: tuple[str, ...] = ()
    min_failure_domains: int = 1
    max_colocated_models: int = 0
    """Models per host including this one; 0 = unlimited, 1 = exclusive."""
    colocation_excludes: tuple[str, ...] = ()
    """Models never placed on the same host (reciprocal even if declared on one side)."""
    pins: tuple[str, ...] = ()
    """Host ids this model must run on (hard); at most ``max_replicas`` of them."""
    min_gpu_count: int = 0
    min_gpu_memory_mb: int = 0
    replica_concurrency: int = 1
    """Conservative service slots of a new replica (requests at once)."""
    target_utilization: float = 0.7
    expected_service_time_s: float = 2.0
    latency_slo_ms: float | None = None
    load_estimate_s: float = 30.0
    """Prior for acquiring/verifying the artifact (seconds)."""
    warm_estimate_s: float = 10.0
    """Prior for starting the engine until ready (seconds)."""
    min_residency_s: float = 300.0
    scale_down_cooldown_s: float = 600.0
    workload_scores: dict[str, float] = {}
    """Capability hints in (0, 1] per workload, for unbound (``auto``) demand."""

    @property
    def serves_embeddings(self) -> bool:
        """Whether this is a dedicated embedding model: ``embedding`` is its single highest
        workload score. Its engines start with the embeddings endpoint enabled (llama-server
        otherwise answers ``/v1/embeddings`` with 501; enabling it on a chat model would cost
        its chat endpoints, so ties do not count)."""
        score = self.workload_scores.get("embedding", 0.0)
        others = (v for k, v in self.workload_scores.items() if k != "embedding")
        return score > 0.0 and all(v < score for v in others)

    def memory_for(self, runtimes: tuple[str, ...] | list[str]) -> int:
        """Resident MB of one replica on a host offering ``runtimes``.

        The largest runtime-specific estimate among the host's matching runtimes wins
        (conservative when several are installed); ``memory_mb`` is the fallback.
        """
        matching = [
            self.runtime_memory_mb[r]
            for r in runtimes
            if r in self.runtime_memory_mb and r in self.runtimes
        ]
        return max(matching) if matching else self.memory_mb


def profile_version(p: ModelProfile) -> str:
    """A profile's version: a digest of its canonical content (the HTTP ETag).

    A write that names the version it read (``If-Match``) is refused with 409 when the stored
    profile changed meanwhile, so two operators editing different fields cannot silently
    undo one another. Content-derived, so it needs no counter in durable state and survives a
    server restart; two writes of identical content share a version, which loses nothing.
    """
    data = msgspec.json.encode(p, order="sorted")
    return hashlib.sha256(data).hexdigest()[:20]


def check_profile_version(
    current: ModelProfile | None, expected: str, proposed: ModelProfile
) -> None:
    """Refuse a write whose writer read another version than the stored one.

    Args:
        current: the stored profile (``None`` when there is none).
        expected: the version the writer read; ``""`` means it read no profile (create
            only); ``"*"`` means any existing profile (update only).
        proposed: the profile the writer wants to store (shown in the conflict).

    Raises:
        VersionConflictError: 409 with both versions and the current content.
    """
    have = profile_version(current) if current is not None else ""
    if expected == have or (expected == "*" and current is not None):
        return
    what = f"version {have}" if current is not None else "no profile"
    read = f"version {expected}" if expected else "no profile"
    msg = (
        f"model '{proposed.model_id}': the profile changed since it was read (you read {read}, "
        f"the server has {what}); re-read it, merge your change and retry"
    )
    raise VersionConflictError(
        msg,
        {
            "model_id": proposed.model_id,
            "expected_version": expected or None,
            "current_version": have or None,
            "current": msgspec.to_builtins(current) if current is not None else None,
            "proposed": msgspec.to_builtins(proposed),
        },
    )


def revision_matches(profile: ModelProfile, artifact_sha256: str | None) -> bool:
    """Whether a residency or cached file of ``artifact_sha256`` is the profile's revision.

    A profile without a digest accepts any weights of that model; one with a digest accepts
    only those exact weights: a missing (unknown) digest is not a match (specification,
    "Managed host actuator": a same-named residency with a missing or different digest does
    not satisfy placement).
    """
    return profile.artifact_sha256 is None or artifact_sha256 == profile.artifact_sha256


def _unsafe_source(source: str) -> str | None:
    """Why a non-file ``source`` (a vLLM snapshot, an Ollama tag) is unsafe, or ``None``."""
    if len(source) > MAX_SOURCE_LEN:
        return f"is longer than {MAX_SOURCE_LEN} characters"
    if ".." in source or any(not c.isprintable() or c.isspace() or c in "%?#\\" for c in source):
        return "holds '..', '%', '?', '#', a backslash, a space or a control character"
    return None


def check_hf_source(source: str) -> str | None:
    """Why ``source`` is not an exact, credential-free ``hf://owner/repo[@rev]/path`` URI.

    Returns:
        ``None`` when acceptable, else the problem (``..`` or ``.`` segments, empty
        segments, characters a URL or file system would reinterpret, a revision on the
        owner, or a URI over :data:`MAX_SOURCE_LEN`).
    """
    if len(source) > MAX_SOURCE_LEN:
        return f"is longer than {MAX_SOURCE_LEN} characters"
    if not HF_SOURCE.match(source):
        return "is not an exact hf:// URI"
    segments = source[len("hf://") :].split("/")
    if "@" in segments[0]:
        return "puts a revision on the owner"
    for seg in segments:
        if seg in ("", ".", "..") or not HF_SEGMENT.fullmatch(seg):
            return f"has the path segment {seg!r}"
    return None


def _fail(field: str, problem: str, fix: str) -> ValidationError:
    return ValidationError(f"profile field '{field}': {problem}; {fix}")


def _check_finite(name: str, value: object, lo: float, hi: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and lo <= value <= hi):
        raise _fail(name, f"{value!r} is out of range", f"use a number in [{lo}, {hi}]")


def validate_profile(p: ModelProfile) -> ModelProfile:
    """Check every rule that crosses fields; return the canonical profile.

    Canonicalises the digest to lowercase and sorts/de-duplicates tag-like tuples so two
    equivalent profiles hash the same.

    Raises:
        ValidationError: the message names the field and the fix.
    """
    if p.memory_mb <= 0 or p.memory_mb > 1 << 32:
        raise _fail(
            "memory_mb",
            f"{p.memory_mb} is not a positive MB value",
            "give the resident runtime budget of one replica in MB",
        )
    for rt, mb in p.runtime_memory_mb.items():
        if mb <= 0 or mb > 1 << 32:
            raise _fail("runtime_memory_mb", f"{rt}={mb} is not positive", "use RUNTIME=MB")
    if p.admission_headroom_mb is not None and not 0 <= p.admission_headroom_mb <= MAX_MB:
        raise _fail(
            "admission_headroom_mb",
            f"{p.admission_headroom_mb} is out of range",
            f"give the free MB a new replica must leave, 0..{MAX_MB} (omit for the default)",
        )
    if not p.runtimes:
        raise _fail("runtimes", "is empty", "name at least one runtime (default llama.cpp)")
    if not 0 <= p.min_replicas <= p.max_replicas <= MAX_REPLICAS_LIMIT or p.max_replicas < 1:
        raise _fail(
            "min_replicas/max_replicas",
            f"{p.min_replicas}/{p.max_replicas} invalid",
            f"need 0 <= min <= max, 1 <= max <= {MAX_REPLICAS_LIMIT}",
        )
    if not -MAX_PRIORITY <= p.priority <= MAX_PRIORITY:
        raise _fail("priority", f"{p.priority} out of range", f"use |priority| <= {MAX_PRIORITY}")
    if p.min_failure_domains < 1:
        raise _fail("min_failure_domains", "must be >= 1", "use 1 for no diversity requirement")
    if p.max_colocated_models < 0:
        raise _fail("max_colocated_models", "is negative", "use 0 (unlimited) or a count >= 1")
    if len(p.pins) > p.max_replicas:
        raise _fail(
            "pins",
            f"{len(p.pins)} pins exceed max_replicas={p.max_replicas}",
            "raise max_replicas or pin fewer hosts",
        )
    if p.min_gpu_count < 0 or p.min_gpu_memory_mb < 0:
        raise _fail("min_gpu_count/min_gpu_memory_mb", "is negative", "use 0 for no requirement")
    if p.replica_concurrency < 1:
        raise _fail("replica_concurrency", "must be >= 1", "declare request slots per replica")
    _check_finite("target_utilization", p.target_utilization, 0.05, 1.0)
    _check_finite("expected_service_time_s", p.expected_service_time_s, 0.001, 3600.0)
    if p.latency_slo_ms is not None:
        _check_finite("latency_slo_ms", p.latency_slo_ms, 1.0, 3_600_000.0)
    for name in ("load_estimate_s", "warm_estimate_s", "min_residency_s", "scale_down_cooldown_s"):
        _check_finite(name, getattr(p, name), 0.0, 86_400.0)
    sha = _checked_artifact(p)
    _check_workload_scores(p.workload_scores)
    if p.model_id in p.colocation_excludes:
        raise _fail("colocation_excludes", "names the model itself", "name other models only")
    return msgspec.structs.replace(
        p,
        artifact_sha256=sha,
        runtimes=tuple(dict.fromkeys(p.runtimes)),
        backends=tuple(sorted(set(p.backends))),
        required_tags=tuple(sorted(set(p.required_tags))),
        forbidden_tags=tuple(sorted(set(p.forbidden_tags))),
        colocation_excludes=tuple(sorted(set(p.colocation_excludes))),
        pins=tuple(sorted(set(p.pins))),
    )


def _checked_artifact(p: ModelProfile) -> str | None:
    """The lowercase artifact digest, after checking the digest, the source and the size.

    Raises:
        ValidationError: a digest that is not 64 hex digits, an unsafe or inexact source, a
            source without its digest and size, or a non-positive size.
    """
    sha = p.artifact_sha256.lower() if p.artifact_sha256 else None
    if sha is not None and not SHA256.match(sha):
        raise _fail("artifact_sha256", "is not 64 hex digits", "pass the file's SHA-256")
    if p.artifact_source is not None:
        src = p.artifact_source
        problem = check_hf_source(src) if HF_SOURCE.match(src) else _unsafe_source(src)
        if problem is None and not _exact_source(src, p.runtimes, p.model_id):
            problem = f"is not an exact source for runtimes {list(p.runtimes)}"
        if problem is not None:
            raise _fail(
                "artifact_source",
                f"{src[:120]!r} {problem}",
                "use hf://owner/repo/path/file.gguf (llama.cpp), hf://owner/repo@<40-hex commit> "
                "(vllm) or ollama://<model id> (ollama), without credentials, '..', '%' or spaces",
            )
        if sha is None or p.artifact_size_mb is None:
            raise _fail(
                "artifact_source",
                "needs artifact_sha256 and artifact_size_mb",
                "give all three fields for autonomous fetch",
            )
    if p.artifact_size_mb is not None and p.artifact_size_mb <= 0:
        raise _fail("artifact_size_mb", "must be positive", "give the download ceiling in MB")
    return sha


def _check_workload_scores(scores: Mapping[str, float]) -> None:
    """Each workload name is simple and each score lies in (0, 1].

    Raises:
        ValidationError: names the workload and the fix.
    """
    for w, score in scores.items():
        if not WORKLOAD_NAME.match(w):
            raise _fail(
                "workload_scores",
                f"workload {w!r} is not a simple name",
                "use lowercase names such as coding or research",
            )
        if not (math.isfinite(score) and 0.0 < score <= 1.0):
            raise _fail(
                "workload_scores",
                f"{w}={score} is outside (0, 1]",
                "use WORKLOAD=SCORE with 0 < SCORE <= 1",
            )


def _check_identifiers(p: ModelProfile) -> None:
    """Every identifier of an operator's profile follows the one grammar (``wire.IDENT``)."""
    named: list[tuple[str, tuple[str, ...]]] = [
        ("model_id", (p.model_id,)),
        ("pins", p.pins),
        ("colocation_excludes", p.colocation_excludes),
        ("required_tags", p.required_tags),
        ("forbidden_tags", p.forbidden_tags),
        ("backends", p.backends),
        ("data_tier", (p.data_tier,) if p.data_tier is not None else ()),
    ]
    for field, values in named:
        if len(values) > MAX_LIST:
            raise _fail(field, f"lists {len(values)} entries", f"give at most {MAX_LIST}")
        models = field in ("model_id", "colocation_excludes")
        grammar = MODEL_ID if models else IDENT
        for v in values:
            if not grammar.fullmatch(v):
                extra = " ('/' only between segments of a model id)" if models else ""
                raise _fail(
                    field,
                    f"{v[:80]!r} is not a valid identifier",
                    f"use 1-{MAX_ID_LEN} letters, digits and . _ : @ + - starting with a "
                    f"letter or digit{extra}, without '..', spaces or control characters",
                )


def _check_bounds(p: ModelProfile) -> None:
    """The documented upper bound of every numeric profile field not checked elsewhere."""
    bounded: list[tuple[str, int | None, int, int]] = [
        ("replica_concurrency", p.replica_concurrency, 1, MAX_REPLICA_CONCURRENCY),
        ("min_failure_domains", p.min_failure_domains, 1, MAX_FAILURE_DOMAINS),
        ("max_colocated_models", p.max_colocated_models, 0, MAX_COLOCATED_MODELS),
        ("min_gpu_count", p.min_gpu_count, 0, MAX_GPU_COUNT),
        ("min_gpu_memory_mb", p.min_gpu_memory_mb, 0, MAX_MB),
        ("artifact_size_mb", p.artifact_size_mb, 1, MAX_MB),
    ]
    for field, value, lo, hi in bounded:
        if value is not None and not lo <= value <= hi:
            raise _fail(field, f"{value} is out of range", f"use a whole number in [{lo}, {hi}]")
    if len(p.runtime_memory_mb) > MAX_LIST:
        raise _fail("runtime_memory_mb", "has too many entries", f"give at most {MAX_LIST}")


def validate_declared_profile(p: ModelProfile) -> ModelProfile:
    """``validate_profile`` plus the checks only new operator input gets.

    A runtime name outside the :data:`RUNTIME_NAME` grammar, or a workload outside the
    configured vocabulary (:data:`WORKLOADS`), is a typo: such a profile would silently never
    be placed or never match ``model: auto`` traffic. A well-formed runtime name that no node
    offers (a plugin's runtime, say ``echo``) is accepted; the planner reports the model
    unmet with the ``runtime`` reason until a node offers it. These checks are not part
    of ``validate_profile`` because that also runs when persisted controller state is loaded,
    where an older profile must keep loading rather than quarantine the whole state.

    Raises:
        ValidationError: the message names the field, the value and the accepted values.
    """
    _check_identifiers(p)
    _check_bounds(p)
    for rt in (*p.runtimes, *p.runtime_memory_mb):
        if not RUNTIME_NAME.fullmatch(rt):
            field = "runtimes" if rt in p.runtimes else "runtime_memory_mb"
            raise _fail(
                field,
                f"runtime name {rt!r} is not valid",
                f"use letters, digits, '.', '_', '+' or '-' (at most {MAX_RUNTIME_NAME_LEN} "
                f"characters), e.g. {', '.join(BUILTIN_RUNTIMES)} or a runtime plugin's name",
            )
    for w in p.workload_scores:
        if w not in WORKLOADS:
            raise _fail(
                "workload_scores",
                f"workload {w!r} is not in the configured vocabulary",
                f"use one of {', '.join(WORKLOADS)}",
            )
    return validate_profile(p)


def profile_from_json(data: bytes | str | dict[str, object]) -> ModelProfile:
    """Decode and validate operator input: a profile as JSON (or an already-parsed object).

    Raises:
        ValidationError: malformed JSON, a field the profile does not have (named), a wrong
            type (the message names the path), an unknown runtime or workload, or a rule
            violation.
    """
    try:
        doc = data if isinstance(data, dict) else msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        msg = f"model profile: {exc}"
        raise ValidationError(msg) from None
    if not isinstance(doc, dict):
        raise ValidationError("model profile: expected a JSON object of profile fields")
    # Checked here, not with forbid_unknown_fields on the struct: persisted controller state
    # must keep loading when a newer Grid adds fields, but an operator's typo must not be
    # dropped silently.
    unknown = sorted(set(doc) - set(ModelProfile.__struct_fields__))
    if unknown:
        raise _fail(
            unknown[0],
            "is not a profile field",
            f"check the spelling; known fields: {', '.join(ModelProfile.__struct_fields__)}",
        )
    try:
        p = msgspec.convert(doc, ModelProfile)
    except msgspec.ValidationError as exc:
        msg = f"model profile: {exc}"
        raise ValidationError(msg) from None
    return validate_declared_profile(p)
