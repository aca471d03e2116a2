"""A profile checked against what exists now: installed runtimes and registered hosts.

:func:`grid_core.profile.validate_profile` checks a profile on its own. These checks need the
fleet: a runtime nothing here provides (a typo, or a plugin installed only on nodes that have
not joined yet), a pin to a host that has not joined yet, or more required replicas than
registered hosts can run. Each is accepted (hosts join later, and a plugin runtime may live
only on nodes) but said out loud with the field named, so the operator sees it when the edit
is made and not only in status (specification,
"Safety invariants" 10: fail honestly; the plan's shortfall says the same in status).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

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


def fit_warnings(profile: ModelProfile, hosts: Sequence[HostSnapshot]) -> list[str]:
    """What keeps an accepted profile from being placed in full on the registered hosts.

    Args:
        profile: the validated profile.
        hosts: the registered hosts now (any state: a paused host still counts as there).

    Returns:
        One line per problem, each naming the field: a pin to a host that is not registered,
        and more required replicas (``min_replicas``) than registered hosts that can run the
        model (one replica per host). Empty when neither applies.
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
    return out
