"""Read the neutral ``grid-bench-fleet/1`` JSON into Grid's planning inputs.

The format is planner-neutral: hosts with what they hold, a model catalog and observed demand.
Grid decides the policy itself (heartbeat staleness, throttled share, headroom) and derives
desired replicas with its own demand rules. Unknown keys are ignored, as the format asks.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import get_args

from grid_core.api import (
    Forecast,
    ForecastPolicy,
    HostSnapshot,
    ModelProfile,
    PlanInputs,
    PlannerPolicy,
    ResidencySnapshot,
    ValidationError,
    desired_for,
    established,
    validate_profile,
)
from grid_core.wire import HostState, Ownership, ResidencyState

SCHEMA = "grid-bench-fleet/1"


def load_fleet(path: str | Path) -> dict:
    """Parse a fleet file.

    Raises:
        ValidationError: the file does not exist (or is a directory), is not JSON, or is not the
            ``grid-bench-fleet/1`` schema (all are a wrong ``--fleet`` value: exit 2).
    """
    p = Path(path)
    if p.is_dir():
        msg = f"fleet file '{p}' is a directory; pass a file made by 'grid bench fleet --out FILE'"
        raise ValidationError(msg)
    if not p.is_file():
        msg = f"fleet file '{p}' does not exist; generate one with 'grid bench fleet --out FILE'"
        raise ValidationError(msg)
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        msg = f"fleet file '{p}' is not valid JSON ({exc}); regenerate it"
        raise ValidationError(msg) from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        msg = f"fleet file '{p}' is not schema {SCHEMA!r}; generate one with 'grid bench fleet'"
        raise ValidationError(msg)
    return data


def _residency(r: dict, catalog: set[str]) -> ResidencySnapshot:
    managed = bool(r.get("managed", True))
    ownership: Ownership = (
        "managed" if managed else ("manual" if r["model_id"] in catalog else "external")
    )
    return ResidencySnapshot(
        model_id=r["model_id"],
        memory_mb=int(r["memory_mb"]),
        state=r["state"],
        ownership=ownership,
        active_requests=r.get("active_requests"),
        routable=managed,
    )


Types = tuple[type, ...]
NUMBER: Types = (int, float)
TEXT: Types = (str,)
LIST: Types = (list,)
TOP_FIELDS: dict[str, Types] = {"now": NUMBER, "hosts": LIST, "models": LIST, "demand": LIST}
HOST_FIELDS: dict[str, Types] = {
    "host_id": TEXT,
    "capacity_mb": NUMBER,
    "reserved_mb": NUMBER,
    "state": TEXT,
    "heartbeat_age_s": NUMBER,
    "runtimes": LIST,
    "backends": LIST,
    "tags": LIST,
    "max_models": NUMBER,
    "residencies": LIST,
}
RESIDENCY_FIELDS: dict[str, Types] = {"model_id": TEXT, "memory_mb": NUMBER, "state": TEXT}
MODEL_FIELDS: dict[str, Types] = {
    "model_id": TEXT,
    "memory_mb": NUMBER,
    "runtimes": LIST,
    "min_replicas": NUMBER,
    "max_replicas": NUMBER,
    "priority": NUMBER,
    "min_failure_domains": NUMBER,
}
DEMAND_FIELDS: dict[str, Types] = {
    "model_id": TEXT,
    "request_rate_per_s": NUMBER,
    "service_time_s": NUMBER,
    "queue_depth": NUMBER,
    "p95_latency_ms": NUMBER,
}
"""The keys this reader needs per entry and their JSON types (the format's other keys are
optional or ignored)."""
NON_NEGATIVE: dict[str, tuple[str, ...]] = {
    "hosts": ("capacity_mb", "reserved_mb", "max_models", "heartbeat_age_s"),
    "residencies": ("memory_mb", "active_requests"),
    "demand": ("request_rate_per_s", "service_time_s", "queue_depth", "p95_latency_ms"),
}
"""Numbers the format states as counts, sizes, ages or rates: a negative one is refused (a
negative capacity or slot ceiling would otherwise plan as "no room" or "no ceiling")."""
TEXT_LISTS: dict[str, tuple[str, ...]] = {
    "hosts": ("runtimes", "backends", "tags"),
    "models": ("runtimes", "backends", "required_tags", "pinned_hosts"),
}
"""Lists of names, checked when present (a model's last three are optional): a string in
their place would be read letter by letter (``"backends": "cuda"`` as the back-ends c, u, d,
a, so the model fits no host) and a number inside one stops the plan with a traceback."""
WHOLE: dict[str, tuple[str, ...]] = {
    "hosts": ("capacity_mb", "reserved_mb", "max_models"),
    "residencies": ("memory_mb", "active_requests"),
    "models": ("memory_mb", "min_replicas", "max_replicas", "priority", "min_failure_domains"),
    "demand": ("queue_depth",),
}
"""Numbers the format states as integers (MB, counts, priorities), checked when present: a
fraction would be cut off silently (``max_models`` 2.5 planned as 2, ``memory_mb`` 1.9 as
1 MB). A whole number written as a float (``4096.0``) is accepted."""
ID_KEYS: dict[str, str] = {
    "hosts": "host_id",
    "models": "model_id",
    "demand": "model_id",
    "residencies": "model_id",
}
"""Each entry kind's id key: an empty id is refused (other entries refer to it by name)."""
HOST_STATES: tuple[str, ...] = get_args(HostState)
"""A host's ``state`` must be one of these (the format's list and Grid's own)."""
RESIDENCY_STATES: tuple[str, ...] = get_args(ResidencyState)
"""A residency's ``state`` must be one of these (the format's list and Grid's own)."""


def _check(entry: object, fields: dict[str, Types], where: str) -> None:
    """Refuse an entry that lacks a needed key, has one of the wrong JSON type or a number
    that is not finite (NaN, Infinity), naming the entry (``hosts[3] (host-004)``) and the key.

    Raises:
        ValidationError: the first problem found.
    """
    if not isinstance(entry, dict):
        msg = f"fleet: {where} is {type(entry).__name__}, not an object; regenerate the file"
        raise ValidationError(msg)
    for key, types in fields.items():
        if key not in entry:
            msg = f"fleet: {where} has no {key!r}; regenerate the file"
            raise ValidationError(msg)
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, types):
            kind = "a number" if types is NUMBER else f"a {types[0].__name__}"
            msg = f"fleet: {where}.{key} is {value!r}, not {kind}; regenerate the file"
            raise ValidationError(msg)
        if isinstance(value, float) and not math.isfinite(value):  # json reads NaN, Infinity
            msg = f"fleet: {where}.{key} is {value!r}, not a finite number; regenerate the file"
            raise ValidationError(msg)


def _check_values(entry: dict, kind: str, where: str) -> None:
    """Refuse, for an entry of ``kind`` (``hosts``, ``residencies``, ``models``, ``demand``),
    an empty id (:data:`ID_KEYS`), a list of names (:data:`TEXT_LISTS`) that is not a list of
    strings, a negative value among :data:`NON_NEGATIVE` and a fraction among :data:`WHOLE`.

    Raises:
        ValidationError: names the entry, the key and the value.
    """
    if not entry[ID_KEYS[kind]]:
        msg = f"fleet: {where}.{ID_KEYS[kind]} is empty; give the entry an id"
        raise ValidationError(msg)
    for key in TEXT_LISTS.get(kind, ()):
        value = entry.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            msg = f"fleet: {where}.{key} is {value!r}, not a list of names; regenerate the file"
            raise ValidationError(msg)
    for key in NON_NEGATIVE.get(kind, ()):
        value = entry.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
            msg = f"fleet: {where}.{key} is {value!r}; it must be 0 or more. Regenerate the file"
            raise ValidationError(msg)
    for key in WHOLE[kind]:
        value = entry.get(key)
        if isinstance(value, float) and not value.is_integer():
            msg = f"fleet: {where}.{key} is {value!r}, not a whole number; regenerate the file"
            raise ValidationError(msg)


def _check_host(h: dict, where: str) -> None:
    """Refuse a host whose ``state`` is not one of :data:`HOST_STATES`, whose
    ``reserved_mb`` exceeds its ``capacity_mb`` (its placeable memory would be negative) or
    whose ``failure_domain`` is present but not a name.

    Raises:
        ValidationError: names the host, the key and the value.
    """
    _check_state(h, HOST_STATES, where)
    if h["reserved_mb"] > h["capacity_mb"]:
        msg = (
            f"fleet: {where}.reserved_mb ({h['reserved_mb']!r}) exceeds capacity_mb "
            f"({h['capacity_mb']!r}); reserve at most the host's capacity"
        )
        raise ValidationError(msg)
    domain = h.get("failure_domain")
    if domain is not None and not (isinstance(domain, str) and domain):
        msg = (
            f"fleet: {where}.failure_domain is {domain!r}, not a name; name the domain "
            "(fd-1, ...) or leave the key out"
        )
        raise ValidationError(msg)


def _check_residency(r: dict, where: str) -> None:
    """Refuse a residency whose ``state`` is not one of :data:`RESIDENCY_STATES` or whose
    ``managed`` is not true or false (``"no"`` would read as managed).

    Raises:
        ValidationError: names the residency, the key and the value.
    """
    _check_state(r, RESIDENCY_STATES, where)
    if not isinstance(r.get("managed", True), bool):
        msg = f"fleet: {where}.managed is {r['managed']!r}, not true or false; regenerate the file"
        raise ValidationError(msg)


def _check_unique(entries: list, kind: str, key: str) -> None:
    """Refuse two entries of one list with the same id: the planner would otherwise see one
    host (model, demand) twice, or the later entry would replace the earlier silently.

    Raises:
        ValidationError: names both entries' places and the id.
    """
    seen: dict[object, int] = {}
    for i, entry in enumerate(entries):
        ident = entry[key]
        if ident in seen:
            msg = (
                f"fleet: {kind}[{seen[ident]}] and {kind}[{i}] share the {key} {ident!r}; "
                f"give each entry its own {key} (or remove the repeated entry)"
            )
            raise ValidationError(msg)
        seen[ident] = i


def _check_state(entry: dict, allowed: tuple[str, ...], where: str) -> None:
    """Refuse a ``state`` outside ``allowed``: the planner would otherwise read a misspelt host
    state as "takes no new work" and a misspelt residency state as "holds nothing".

    Raises:
        ValidationError: names the entry, the value and the allowed states.
    """
    if entry["state"] not in allowed:
        msg = (
            f"fleet: {where}.state is {entry['state']!r}, not one of {', '.join(allowed)}; "
            "regenerate the file"
        )
        raise ValidationError(msg)


def _where(kind: str, i: int, entry: object, key: str) -> str:
    """``hosts[3] (host-004)``: an entry's place in the file and, when it has one, its id."""
    label = entry.get(key) if isinstance(entry, dict) else None
    return f"{kind}[{i}]" + (f" ({label})" if isinstance(label, str) and label else "")


def check_entries(data: dict) -> None:
    """Check every entry :func:`fleet_inputs` reads before converting any of them.

    Raises:
        ValidationError: names the entry (list and index, and its id) and the key. Also
            refused: a host or residency ``state`` outside the format's states, a negative
            count, size, age or rate, a fraction where the format has an integer, a list of
            names holding anything but strings (or a string in its place), a ``managed``
            that is not a boolean, an empty id or failure domain, reserved memory above
            capacity, and two hosts, models or demand entries with one id (or two
            residencies of one model on one host).
    """
    _check(data, TOP_FIELDS, "the file")
    for i, h in enumerate(data["hosts"]):
        where = _where("hosts", i, h, "host_id")
        _check(h, HOST_FIELDS, where)
        _check_values(h, "hosts", where)
        _check_host(h, where)
        for j, r in enumerate(h["residencies"]):
            at = f"{where}.residencies[{j}]"
            _check(r, RESIDENCY_FIELDS, at)
            _check_values(r, "residencies", at)
            _check_residency(r, at)
        # the format allows one replica of a model per host, cached weights included
        _check_unique(h["residencies"], f"{where}.residencies", "model_id")
    for i, m in enumerate(data["models"]):
        where = _where("models", i, m, "model_id")
        _check(m, MODEL_FIELDS, where)
        _check_values(m, "models", where)
    for i, d in enumerate(data["demand"]):
        where = _where("demand", i, d, "model_id")
        _check(d, DEMAND_FIELDS, where)
        _check_values(d, "demand", where)
    _check_unique(data["hosts"], "hosts", "host_id")
    _check_unique(data["models"], "models", "model_id")
    _check_unique(data["demand"], "demand", "model_id")


def fleet_inputs(data: dict, policy: PlannerPolicy | None = None) -> PlanInputs:
    """Convert a parsed fleet into :class:`PlanInputs` (demand through Grid's own rules).

    Raises:
        ValidationError: an entry lacks a key or has one of the wrong type (the entry and
            the key are named), or breaks Grid's profile/snapshot rules.
    """
    check_entries(data)
    try:
        return _convert(data, policy or PlannerPolicy())
    except ValidationError:
        raise  # already names the entry
    except (KeyError, TypeError, ValueError) as exc:
        msg = f"fleet: malformed entry ({type(exc).__name__}: {exc}); regenerate the file"
        raise ValidationError(msg) from None


def _profile(i: int, m: dict) -> ModelProfile:
    """One catalog entry as a checked :class:`ModelProfile`.

    Raises:
        ValidationError: Grid's profile rules refuse it (replica bounds, priority, pins, ...);
            the message names the entry first, then the profile field and its fix.
    """
    try:
        return validate_profile(
            ModelProfile(
                model_id=m["model_id"],
                memory_mb=int(m["memory_mb"]),
                runtimes=tuple(m["runtimes"]),
                backends=tuple(m.get("backends", ())),
                min_replicas=int(m["min_replicas"]),
                max_replicas=int(m["max_replicas"]),
                priority=int(m["priority"]),
                min_failure_domains=int(m["min_failure_domains"]),
                required_tags=tuple(m.get("required_tags", ())),
                pins=tuple(m.get("pinned_hosts", ())),
            )
        )
    except ValidationError as exc:
        msg = f"fleet: {_where('models', i, m, 'model_id')}: {exc}"
        raise ValidationError(msg) from None


def _convert(data: dict, policy: PlannerPolicy) -> PlanInputs:
    now = float(data["now"])
    catalog = {m["model_id"] for m in data["models"]}
    profiles = tuple(_profile(i, m) for i, m in enumerate(data["models"]))
    hosts = tuple(
        HostSnapshot(
            host_id=h["host_id"],
            capacity_mb=int(h["capacity_mb"]),
            reserved_mb=int(h["reserved_mb"]),
            state=h["state"],
            heartbeat_age_s=float(h["heartbeat_age_s"]),
            runtimes=tuple(h["runtimes"]),
            backends=tuple(h["backends"]),
            tags=tuple(h["tags"]),
            failure_domain=h.get("failure_domain"),
            max_models=int(h["max_models"]),
            residencies=tuple(
                _residency(r, catalog) for r in h["residencies"] if r["state"] != "cached"
            ),
            cached={r["model_id"]: None for r in h["residencies"] if r["state"] == "cached"},
        )
        for h in data["hosts"]
    )
    fpolicy = ForecastPolicy()
    by_id = {p.model_id: p for p in profiles}
    demand = {}
    for d in data["demand"]:
        profile = by_id.get(d["model_id"])
        if profile is None:
            continue
        fc = Forecast(
            rate_rps=float(d["request_rate_per_s"]),
            service_time_s=float(d["service_time_s"]) or None,
            queued=float(d["queue_depth"]),
            p95_ms=float(d["p95_latency_ms"]) or None,
        )
        got, _ = desired_for(profile, fc, list(hosts), now, fpolicy, None, policy)
        # one instant without history: a shortfall in the file is taken as established
        demand[profile.model_id] = established(got, now)
    return PlanInputs(now=now, profiles=profiles, hosts=hosts, demand=demand, policy=policy)


HOLDING_STATES = frozenset(RESIDENCY_STATES) - {"cached"}
"""Residency states that hold host memory and a model slot: every state of the fleet format
but ``cached``, which is weights on disk only. Read from the format's own list, not from the
planner's, so the checker stays independent of the code it checks."""


def overcommitted_hosts(data: dict, assignments: list[dict]) -> list[str]:
    """Hosts whose memory the placement overcommits, checked from the fleet file alone.

    Independent of the planner: uses only the file's capacities, the catalog's memory sizes
    and the assignment list. A host is overcommitted when either
    * the desired footprint (new replicas at catalog size, kept live replicas as
      :func:`_kept_mb` sizes them, plus unmanaged processes not themselves assigned) exceeds
      ``capacity_mb - reserved_mb``, or
    * the transition (everything live now plus every newly assigned replica) exceeds it.

    A host the file already overcommits (reserved or unmanaged memory above its capacity)
    counts only where the placement keeps or adds a replica there (the desired test) or
    adds one (the transition test): an overcommit the plan found and did not add to is the
    file's, not the plan's.
    """
    size = {m["model_id"]: int(m["memory_mb"]) for m in data["models"]}
    by_host: dict[str, list[str]] = {}
    for a in assignments:
        by_host.setdefault(a["host_id"], []).append(a["model_id"])
    bad = []
    for h in data["hosts"]:
        placeable = int(h["capacity_mb"]) - int(h["reserved_mb"])
        assigned = by_host.get(h["host_id"], [])
        live = [r for r in h["residencies"] if r["state"] in HOLDING_STATES]
        live_ids = {r["model_id"] for r in live}
        kept = {r["model_id"]: _kept_mb(r, size.get(r["model_id"], 0)) for r in live}
        desired = sum(kept.get(m, size[m]) for m in assigned) + sum(
            int(r["memory_mb"])
            for r in live
            if not r.get("managed", True) and r["model_id"] not in assigned
        )
        added = sum(size[m] for m in assigned if m not in live_ids)
        transition = sum(int(r["memory_mb"]) for r in live) + added
        if (
            len(set(assigned)) != len(assigned)
            or (assigned and desired > placeable)
            or (added and transition > placeable)
        ):
            bad.append(h["host_id"])
    return bad


def _kept_mb(residency: dict, catalog_mb: int) -> int:
    """Memory (MB) a kept live replica occupies in the desired footprint.

    A process started outside Grid (``managed: false``) cannot be reloaded, so it stays at the
    size it holds, whatever the catalog says; one Grid manages may be reloaded at catalog size,
    so the larger of the two is charged.
    """
    live_mb = int(residency["memory_mb"])
    return live_mb if not residency.get("managed", True) else max(live_mb, catalog_mb)


LIVE_STATES = ("accepting", "throttled")
"""Host states that may receive new replicas (the format's other states only drain)."""
STALE_HEARTBEAT_S = 90.0
"""Checker's staleness bound: a host silent this long must not receive a new replica."""


def violations(data: dict, assignments: list[dict]) -> dict[str, list[str]]:
    """Every hard-rule violation of a placement, checked from the fleet file alone.

    Independent of the planner (only the file and the assignment list are read). Kinds:
    ``memory`` (see :func:`overcommitted_hosts`), ``slots`` (models resident after the plan,
    live or assigned, above a non-zero ``max_models``), ``duplicate`` (two replicas of one
    model on one host), ``compatibility`` (runtime, back-end or required tags), ``eligibility``
    (a new replica on a host that is not accepting/throttled or whose heartbeat is stale),
    ``unknown`` (a model or host id the file does not have).

    Returns:
        kind → sorted ``"model@host"`` (or host) entries; empty lists when the plan is clean.
    """
    models = {m["model_id"]: m for m in data["models"]}
    hosts = {h["host_id"]: h for h in data["hosts"]}
    out: dict[str, list[str]] = {
        k: [] for k in ("memory", "slots", "duplicate", "compatibility", "eligibility", "unknown")
    }
    out["memory"] = (
        sorted(overcommitted_hosts(data, assignments)) if _known(assignments, models, hosts) else []
    )
    by_host: dict[str, list[str]] = {}
    for a in assignments:
        mid, hid = a["model_id"], a["host_id"]
        if mid not in models or hid not in hosts:
            out["unknown"].append(f"{mid}@{hid}")
            continue
        by_host.setdefault(hid, []).append(mid)
        m, h = models[mid], hosts[hid]
        if not (
            set(m["runtimes"]) & set(h["runtimes"])
            and (not m.get("backends") or set(m["backends"]) & set(h["backends"]))
            and set(m.get("required_tags", ())) <= set(h["tags"])
        ):
            out["compatibility"].append(f"{mid}@{hid}")
        live = {r["model_id"] for r in h["residencies"] if r["state"] in HOLDING_STATES}
        if mid not in live and (
            h["state"] not in LIVE_STATES or float(h["heartbeat_age_s"]) > STALE_HEARTBEAT_S
        ):
            out["eligibility"].append(f"{mid}@{hid}")
    for hid, mids in by_host.items():
        h = hosts[hid]
        if len(set(mids)) != len(mids):
            out["duplicate"].append(hid)
        live = {r["model_id"] for r in h["residencies"] if r["state"] in HOLDING_STATES}
        new = set(mids) - live
        if h["max_models"] and new and len(live | set(mids)) > h["max_models"]:
            out["slots"].append(hid)
    return {k: sorted(v) for k, v in out.items()}


def _known(assignments: list[dict], models: dict, hosts: dict) -> bool:
    return all(a["model_id"] in models and a["host_id"] in hosts for a in assignments)
