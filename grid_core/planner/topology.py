"""The hard-topology context shared by every plan of one planning instant.

Specification, "Proactive observation and portfolio planning": counterfactual portfolio
plans over the exact same timestamp, node objects, model profiles and policy share one
bounded hard-topology context — compatibility, runtime footprint, the hosts each model could
ever use, host classes and startup paths — and only demand differs between them. One tick
asks the planner for up to 64 counterfactual portfolios plus the authoritative plan; without
the context each of them re-derives those facts from scratch.

A context is keyed by the *identity* of the profile and host objects (plus the timestamp and
policy value): a new heartbeat, a changed profile or a new learned timing map arrives as a new
object and therefore gets a new context, while demand-only alternatives reuse the one built
for their snapshot. At most :data:`MAX_CONTEXTS` contexts are kept (least recently used
first out), so the cache never grows with the number of ticks.

What is shared is only what a plan never mutates: the canonical (sorted) inputs, the
ledger's compatibility and footprint tables, each model's candidate hosts and their
footprints, host classes and residency maps, and the canonical encoding of everything except
demand (the plan digest hashes that encoding followed by the demand, byte for byte the same
as hashing the whole inputs).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

import msgspec

from grid_core.demand.types import ModelDemand
from grid_core.planner.types import PlanInputs
from grid_core.profile import ModelProfile
from grid_core.snapshot import HostSnapshot, ResidencySnapshot

MAX_CONTEXTS = 2
"""Contexts kept: the tick's planning snapshot and the structural (clean-fleet) proof's one
alternate within a tick; a third would only ever hold a previous tick's stale snapshot."""


Opening = tuple[str | None, int, int, frozenset[str], frozenset[str]]
"""One host's book before a plan keeps or places anything: (why it is ineligible or
``None``, free MB in the incremental ledger, free MB in the desired ledger, live model ids,
model ids desired because they are unmanaged) (:class:`~grid_core.planner.ledger.Ledger`)."""


@dataclass
class LedgerTables:
    """Memo tables of :class:`~grid_core.planner.ledger.Ledger` that depend only on the
    profiles, hosts and policy (filled lazily by whichever plan asks first)."""

    mem: dict[tuple[int, tuple[str, ...]], tuple[str, int]] = field(default_factory=dict)
    pair: list[dict[int, tuple[str, int]]] = field(default_factory=list)
    compat: dict[tuple[int, int], str | None] = field(default_factory=dict)
    extra: list[dict[int, int]] = field(default_factory=list)
    """Per model index, host index → admission headroom beyond the policy floor (MB)."""
    opening: list[Opening] | None = None
    """Per host index, its opening book values (filled by the first ledger)."""


@dataclass(frozen=True)
class Statics:
    """A plan state's static indexes (never mutated by a plan).

    Attributes:
        cands: per model index, the eligible host indexes passing every static rule.
        mem_rows: per model index, host index → MB of one new replica there.
        host_class / class_rep: class per host and representative host per class.
        res_maps: per host index, model id → its (serving-first) residency.
    """

    cands: list[list[int]]
    mem_rows: list[dict[int, int]]
    host_class: list[int]
    class_rep: list[int]
    res_maps: list[dict[str, ResidencySnapshot]]


@dataclass
class Topology:
    """Demand-independent facts of one planning snapshot (see the module docstring).

    Attributes:
        now / profiles / hosts / policy: the canonical snapshot (sorted by id).
        tables: the ledger memo tables.
        statics: the plan state's static indexes (candidate hosts, their footprints, host
            classes, residency maps), filled by the first plan of the snapshot.
        builds: plans that used this context (status and benchmarks).
    """

    canon: PlanInputs
    keep: tuple[object, ...]
    """The input objects the key's identities refer to (held so no id is reused)."""
    tables: LedgerTables
    tail: bytes | None
    statics: Statics | None = None
    builds: int = 0

    def digest(self, demand: dict[str, ModelDemand]) -> str:
        """SHA-256 (hex) of the canonical inputs with ``demand`` (sorted by model id): the
        same value as :func:`grid_core.planner.input_digest` of the whole inputs."""
        if self.tail is None:
            whole = msgspec.structs.replace(self.canon, demand=demand)
            return hashlib.sha256(msgspec.json.encode(whole, order="sorted")).hexdigest()
        h = hashlib.sha256(b'{"demand":')
        h.update(msgspec.json.encode(demand, order="sorted"))
        h.update(self.tail)
        return h.hexdigest()


_CONTEXTS: OrderedDict[tuple[object, ...], Topology] = OrderedDict()


def _key(inputs: PlanInputs) -> tuple[object, ...]:
    return (
        inputs.now,
        inputs.policy,
        tuple(id(p) for p in inputs.profiles),
        tuple(id(h) for h in inputs.hosts),
    )


def topology_for(
    inputs: PlanInputs,
    canonical: tuple[tuple[ModelProfile, ...], tuple[HostSnapshot, ...]],
) -> Topology:
    """The shared context of ``inputs``' snapshot (built once, then reused).

    Args:
        inputs: the plan inputs as given (their object identities form the key).
        canonical: the canonical profiles and hosts, computed by the caller only when the
            context does not exist yet (a callable would hide that cost; see
            :func:`grid_core.planner.plan`).

    Raises:
        ValidationError: two profiles or two hosts share an id (from canonicalisation).
    """
    key = _key(inputs)
    got = _CONTEXTS.get(key)
    if got is not None:
        _CONTEXTS.move_to_end(key)
        return got
    profiles, hosts = canonical
    canon = PlanInputs(
        now=inputs.now, profiles=profiles, hosts=hosts, demand={}, policy=inputs.policy
    )
    whole = msgspec.json.encode(canon, order="sorted")
    empty = b'{"demand":{}'
    topo = Topology(
        canon=canon,
        keep=(inputs.profiles, inputs.hosts, inputs.policy),
        tables=LedgerTables(pair=[{} for _ in profiles], extra=[{} for _ in profiles]),
        # Demand sorts first in the canonical encoding; should that ever change, every
        # digest is computed from the whole inputs instead (tail None).
        tail=whole[len(empty) :] if whole.startswith(empty) else None,
    )
    _CONTEXTS[key] = topo
    while len(_CONTEXTS) > MAX_CONTEXTS:
        _CONTEXTS.popitem(last=False)
    return topo


def lookup(inputs: PlanInputs) -> Topology | None:
    """The existing context of ``inputs``' snapshot, or ``None`` (never builds one)."""
    return _CONTEXTS.get(_key(inputs))


def clear() -> None:
    """Drop every context (benchmarks measure the cost without sharing this way)."""
    _CONTEXTS.clear()
