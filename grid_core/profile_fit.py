"""A profile checked against what exists now: installed runtimes and registered hosts.

:func:`grid_core.profile.validate_profile` checks a profile on its own. These checks need the
fleet: a runtime nothing here provides (a typo, or a plugin installed only on nodes that have
not joined yet), a pin to a host that has not joined yet, more required replicas than
registered hosts can run, or a replica larger than every host that could run it. Each is
accepted (hosts join later, and a plugin runtime may live only on nodes) but said out loud
with the field named, so the operator sees it when the edit is made and not only in status
(specification, "Safety invariants" 10: fail honestly; the plan's shortfall says the same in
status).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence

from grid_core.eligibility import incompatibility
from grid_core.profile import BUILTIN_RUNTIMES, ModelProfile
from grid_core.snapshot import HostSnapshot


def known_runtimes(installed: Collection[str], hosts: Sequence[HostSnapshot]) -> frozenset[str]:
    """Runtime names a profile may use: built in, provided by a runtime plugin on this
    server (``installed``), or offered by a registered host (a plugin installed there)."""
    return (
        frozenset(BUILTIN_RUNTIMES)
        | frozenset(installed)
        | {rt for h in hosts for rt in h.runtimes}
    )


def runtime_warnings(profile: ModelProfile, known: Collection[str]) -> list[str]:
    """Runtimes the profile names that nothing here provides, one line per field.

    Not a refusal: a runtime plugin may be installed only on nodes that have not registered
    yet, and such a profile is meant to stay unmet until one offers it. A typo looks the
    same, so the operator is told at once, with the names that are known.

    Returns:
        Lines naming ``runtimes`` (or ``runtime_memory_mb``), the unknown names, the known
        ones and the fix; empty when every name is known.
    """
    out: list[str] = []
    for field, names in (
        ("runtimes", profile.runtimes),
        ("runtime_memory_mb", tuple(profile.runtime_memory_mb)),
    ):
        unknown = [rt for rt in names if rt not in known]
        if unknown:
            out.append(
                f"{field}: {', '.join(repr(rt) for rt in unknown)} is not provided by any "
                f"plugin on this server or any registered host (known: "
                f"{', '.join(sorted(known))}); check the name, or install the runtime's "
                "plugin on a node: the model stays unplaced until a host offers it"
            )
    return out


RULE_FIELDS = {
    "runtime": "runtimes",
    "backend": "backends",
    "data_tier": "data_tier",
    "required_tags": "required_tags",
    "forbidden_tags": "forbidden_tags",
    "gpu_count": "min_gpu_count",
    "gpu_memory": "min_gpu_memory_mb",
}
"""The profile field behind each :func:`grid_core.eligibility.incompatibility` rule."""


def _names(values: Iterable[str]) -> str:
    return ", ".join(sorted(set(values))) or "none"


def _offered(field: str, hosts: Sequence[HostSnapshot]) -> str | None:
    """What the hosts have for one excluding field, to compare with the profile's value
    (``None`` for ``runtimes``, which is always said first)."""
    if field == "backends":
        return f"backends: {_names(b for h in hosts for b in h.backends)}"
    if field == "data_tier":
        return f"data tiers: {_names(t for h in hosts for t in h.data_tiers)}"
    if field in ("required_tags", "forbidden_tags"):
        return f"tags: {_names(t for h in hosts for t in h.tags)}"
    if field == "min_gpu_count":
        return f"most GPUs on one host: {max(h.gpu_count for h in hosts)}"
    if field == "min_gpu_memory_mb":
        return f"largest GPU memory: {max(h.gpu_memory_mb for h in hosts)} MB"
    return None


def excluded_everywhere(profile: ModelProfile, hosts: Sequence[HostSnapshot]) -> str | None:
    """Why none of ``hosts`` can run the model, naming the profile fields whose rules exclude
    them, the runtimes the hosts offer and, per other excluding field, what they have (their
    tags, backends, data tiers, GPUs); ``None`` when one can or none is registered (a grid
    still waiting for its hosts).

    Such a model will not start by waiting (specification, "Safety invariants" 10).
    """
    reasons = [incompatibility(profile, h) for h in hosts]
    if not hosts or any(r is None for r in reasons):
        return None
    fields = sorted({RULE_FIELDS.get(r, r) for r in reasons if r is not None})
    runtimes = sorted({rt for h in hosts for rt in h.runtimes})
    facts = [f"they offer {', '.join(runtimes) or 'no runtime'}"]
    facts += [fact for f in fields if (fact := _offered(f, hosts)) and fact not in facts]
    return (
        f"{', '.join(fields)}: none of the {len(hosts)} registered host(s) can run it "
        f"({'; '.join(facts)})"
    )


def no_host_warning(
    profile: ModelProfile,
    hosts: Sequence[HostSnapshot],
    known: Collection[str] = (),
    registering_s: float = 0.0,
) -> str | None:
    """:func:`excluded_everywhere` as a ``model set`` warning, or ``None`` when
    ``min_replicas`` is set (its own line says it) or the only rule is a runtime name nothing
    provides (not in ``known``: :func:`runtime_warnings` says it).

    ``registering_s`` is what is left of the server's registration grace (seconds): until it
    ends a request gets ``model_not_ready`` rather than ``model_unplaceable``, since a host
    that can run the model may still register, and the line says so."""
    why = excluded_everywhere(profile, hosts)
    if why is None or profile.min_replicas:
        return None
    if why.startswith("runtimes:") and not any(rt in known for rt in profile.runtimes):
        return None
    final = "model_unplaceable until such a host joins or the profile changes"
    if registering_s > 0:
        return (
            f"{why}; hosts are still registering after a server start, so for the next "
            f"{math.ceil(registering_s)} s a request for it gets model_not_ready, then {final}"
        )
    return f"{why}; a request for it fails with {final}"


def oversized(profile: ModelProfile, hosts: Sequence[HostSnapshot]) -> str | None:
    """Why no registered host that can run the model could hold one replica even if empty.

    The ceiling is a host's capacity minus its reserve (MB): thermal derating and other
    processes' memory pass, so they never make a model look impossible. A model needing more
    than that on every compatible host will not start by waiting, like one no host is
    compatible with (specification, "Safety invariants" 10: fail honestly).

    Returns:
        One line naming ``memory_mb``, the MB one replica needs, the largest host that can
        run it and the fix; ``None`` when some compatible host is large enough, or when no
        host is compatible at all (that is said by the compatibility rules).
    """
    able = [h for h in hosts if incompatibility(profile, h) is None]
    if not able:
        return None
    best = max(able, key=lambda h: h.capacity_mb - h.reserved_mb - profile.memory_for(h.runtimes))
    need, room = profile.memory_for(best.runtimes), best.capacity_mb - best.reserved_mb
    if need <= room:
        return None
    return (
        f"memory_mb: one replica needs {need} MB, more than any registered host that can run "
        f"it holds (largest: {best.host_id}, {room} MB after its reserve); lower memory_mb or "
        "add a larger host"
    )


def fit_warnings(
    profile: ModelProfile,
    hosts: Sequence[HostSnapshot],
    known: Collection[str] = (),
    registering_s: float = 0.0,
) -> list[str]:
    """What keeps an accepted profile from being placed in full on the registered hosts.

    Args:
        profile: the validated profile.
        hosts: the registered hosts now (any state: a paused host still counts as there).
        known: the runtime names something here provides (:func:`known_runtimes`).
        registering_s: seconds left of the server's registration grace (0 once it is over),
            for :func:`no_host_warning`.

    Returns:
        One line per problem, each naming the field: a pin to a host that is not registered,
        more required replicas (``min_replicas``) than registered hosts that can run the
        model (one replica per host), no such host at all (:func:`no_host_warning`) and a
        replica larger than every such host (:func:`oversized`). Empty when none applies.
    """
    out: list[str] = []
    registered = {h.host_id for h in hosts}
    for pin in profile.pins:
        if pin not in registered:
            out.append(
                f"pins: host '{pin}' is not registered; its pinned replica is placed once the "
                "host joins (until then status reports the pin as unmet)"
            )
    able = sum(1 for h in hosts if incompatibility(profile, h) is None)
    if profile.min_replicas > able:
        out.append(
            f"min_replicas: {profile.min_replicas} required replica(s) need as many hosts "
            f"that can run it ({'/'.join(profile.runtimes)}, its backend, tier, tag and GPU "
            f"rules), {able} registered host(s) can; status reports the shortfall until "
            "more join"
        )
    for line in (no_host_warning(profile, hosts, known, registering_s), oversized(profile, hosts)):
        if line is not None:
            out.append(line)
    return out
