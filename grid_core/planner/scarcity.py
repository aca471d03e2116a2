"""Scarcity prices: how much the still-unplaced demand needs each host.

Source: specification, "Global placement loop" (the future-compatible host set), extended
from the most constrained models to all. When a priority class starts, every model of that
class or below that still misses replicas spreads its need over the hosts where it fits
now (:func:`scarcity_table`); a new replica is then charged the placements of those models
it would cost on its host (:func:`lost_placements`, priced by
:meth:`grid_core.planner.core.PlanState.scored`).
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate

from grid_core.planner.ledger import HostBook, Ledger
from grid_core.profile import ModelProfile

MIN_SCARCE_NEED = 0.1
"""A model that needs fewer than one in ten of the hosts where it fits is not squeezed out
anywhere: it is left out of the prices (on the bench fleets this placed as much or more and
cut pricing work on roomy fleets by a third)."""
SLOT_WASTE_WEIGHT = 0.5
"""Share of a contended slot's price that depends on fit: a slot stands for its host's free
memory divided by its free slots, and a replica much smaller than that share wastes what
only a larger model could use. Half the price is for taking the slot at all, half for
wasting it (measured on the bench fleets: a full weight over-corrects, none ignores it)."""
Scarce = tuple[tuple[int, ...], list[float], dict[int, float]]
"""One host's scarcity entry: sizes (MB, ascending) of the still-short models that fit it,
prefix sums of their needs (0..1 each) and need by model index."""


def scarcity_table(
    ledger: Ledger,
    profiles: list[ModelProfile],
    cands: list[list[int]],
    mem_rows: list[dict[int, int]],
    desired: list[int],
    priority: int | None,
) -> dict[int, Scarce]:
    """Per host with needy models, its :data:`Scarce` entry.

    For each model of priority ``<= priority`` (all models when ``None``) that still misses
    replicas (``desired`` per model against the ``ledger``'s count), ``need = missing /
    hosts where it fits now`` (at most 1) is the chance it needs any one of those hosts
    (``cands``: candidate hosts per model; ``mem_rows``: MB of one replica per candidate);
    needs below :data:`MIN_SCARCE_NEED` are left out. Each host keeps its needy models
    sorted by footprint with prefix sums, so :func:`lost_placements` prices one placement
    in O(log n).
    """
    books = ledger.books
    free = [
        min(b.inc_free, b.raw_free)
        if b.eligible and not b.blocked and not (b.max_models and len(b.present) >= b.max_models)
        else -1
        for b in books
    ]
    presents = [b.present for b in books]
    rows: list[list[tuple[int, float, int]]] = [[] for _ in books]
    count = ledger.count
    for mi, hs in enumerate(cands):
        p = profiles[mi]
        if priority is not None and p.priority > priority:
            continue
        missing = desired[mi] - count[mi]
        if missing <= 0 or not hs:
            continue
        mid = p.model_id
        mems = mem_rows[mi]
        fits = [hi for hi in hs if free[hi] >= mems[hi] and mid not in presents[hi]]
        if not fits:
            continue
        need = missing / len(fits)
        need = need if need < 1.0 else 1.0  # at most 1
        if need < MIN_SCARCE_NEED:
            continue
        for hi in fits:
            rows[hi].append((mems[hi], need, mi))
    out: dict[int, Scarce] = {}
    for hi, row in enumerate(rows):
        if not row:
            continue
        row.sort()
        sizes, needs, mis = zip(*row, strict=True)
        out[hi] = (sizes, [0.0, *accumulate(needs)], dict(zip(mis, needs, strict=True)))
    return out


def lost_placements(
    got: Scarce,
    mi: int,
    mem: int,
    free: int,
    max_models: int,
    book: HostBook,
) -> float:
    """Expected placements of other still-short models lost if ``mi`` (``mem`` MB) takes a
    host now (0..1); ``got`` is the host's entry of :func:`scarcity_table`, ``free`` its free
    MB, ``max_models`` its model-slot ceiling (0: none), ``book`` its ledger book.

    Two scarce dimensions, whichever binds harder: the model slot (the others that fit
    here compete for the slots left after this one; a replica that uses little of the
    memory its slot stands for pays more, see :data:`SLOT_WASTE_WEIGHT`) and memory
    (others that fit now but would not fit in what this replica leaves). Disk,
    colocation and failure domains are hard fit rules or have their own terms.
    """
    sizes, prefix, own = got
    fit_now = bisect_right(sizes, free)
    self_need = own.get(mi, 0.0) if mem <= free else 0.0
    harm = 0.0
    if max_models:
        slots_free = max_models - len(book.present)
        harm = prefix[fit_now] - self_need - (slots_free - 1)
        harm = harm if harm < 1.0 else 1.0  # clamped to 0..1 as max(0, min(1, harm))
        harm = harm if harm > 0.0 else 0.0
        if harm and free > 0:
            share = free / slots_free  # memory one of the free slots stands for
            left = share - mem
            waste = (left if left > 0.0 else 0.0) / share
            harm *= 1.0 - SLOT_WASTE_WEIGHT + SLOT_WASTE_WEIGHT * waste
    lost = prefix[fit_now] - prefix[bisect_right(sizes, free - mem)]
    if self_need and free - mem < mem:
        lost -= self_need  # its own entry: one replica per host, it never needed more
    lost = lost if lost < 1.0 else 1.0
    return lost if lost > harm else harm
