"""The constraints of the exact program, built from a plan state (see
:mod:`grid_core.planner.exact`, which solves them).

One binary column per (model, candidate host) a replica could take (an incumbent residency
or a new placement), and the rows that hold every hard rule the planner keeps: memory in both
ledgers with admission headroom, model slots, disk, colocation, failure-domain spread,
baselines and pins. Rows are sparse ``(coefficients, upper bound)`` pairs.
"""

from __future__ import annotations

from grid_core.eligibility import MEMORY_STATES
from grid_core.planner.core import PlanState, serving_incumbents
from grid_core.snapshot import ResidencySnapshot

Column = tuple[int, int, ResidencySnapshot | None]
"""One binary: (model index, host index, the incumbent it keeps or ``None`` for a new one)."""
Row = tuple[list[tuple[int, int]], int]
"""One constraint: sparse (column, coefficient) pairs and its upper bound."""


def columns(state: PlanState) -> list[Column]:
    """(model, host, incumbent residency or ``None``) per binary variable."""
    cols: list[Column] = []
    ledger = state.ledger
    for mi in range(len(state.profiles)):
        if not state.desired[mi]:
            continue
        inc = dict(serving_incumbents(state, mi))
        mid = state.profiles[mi].model_id
        for hi in state.cands[mi]:
            book = ledger.books[hi]
            if hi in inc:
                cols.append((mi, hi, inc[hi]))
            elif mid not in book.present:
                cols.append((mi, hi, None))
    return cols


def by_model(cols: list[Column]) -> dict[int, list[int]]:
    """Model index -> its placement columns, in column order."""
    out: dict[int, list[int]] = {}
    for j, (mi, _hi, _res) in enumerate(cols):
        out.setdefault(mi, []).append(j)
    return out


def capacity_rows(
    state: PlanState, cols: list[Column], first_share: int
) -> tuple[list[Row], list[list[tuple[int, int]]]]:
    """Every constraint but the pins' as (sparse coefficients, upper bound), and per host
    headroom variable ``e[h]`` (columns from ``first_share`` on, one per host where a new
    replica's share exceeds the floor) its (column, share MB) members."""
    ledger = state.ledger
    rows: list[Row] = []
    inc_row: dict[int, list[tuple[int, int]]] = {}
    raw_row: dict[int, list[tuple[int, int]]] = {}
    slot_row: dict[int, list[tuple[int, int]]] = {}
    disk_row: dict[int, list[tuple[int, int]]] = {}
    on_host: dict[int, dict[int, int]] = {}
    for j, (mi, hi, res) in enumerate(cols):
        on_host.setdefault(hi, {})[mi] = j
        book = ledger.books[hi]
        if res is None:
            mem = state.mem_rows[mi][hi]
            inc_row.setdefault(hi, []).append((j, mem))
            raw_row.setdefault(hi, []).append((j, mem))
            if book.max_models:
                slot_row.setdefault(hi, []).append((j, 1))
            disk = ledger.disk_cost(mi, hi)
            if disk and book.disk_free is not None:
                disk_row.setdefault(hi, []).append((j, disk))
        elif res.actuatable:
            raw_row.setdefault(hi, []).append((j, ledger._incumbent_mb(mi, hi, res)))
    for mi, js in by_model(cols).items():
        if len(js) > state.desired[mi]:
            rows.append(([(j, 1) for j in js], state.desired[mi]))
    shares: list[list[tuple[int, int]]] = []
    for hi, coeffs in inc_row.items():
        cap = max(0, ledger.books[hi].inc_free)
        # Each new replica must also leave its own headroom beyond the floor
        # (grid_core.headroom): the host's footprints plus the largest share chosen there,
        # the ledger's max rule, with e = first_share + len(shares) at least every share.
        members = [(j, ledger.headroom_extra(cols[j][0], hi)) for j, _ in coeffs]
        members = [(j, mb) for j, mb in members if mb > 0]
        if not members:
            rows.append((coeffs, cap))
            continue
        e = first_share + len(shares)
        shares.append(members)
        rows.append(([*coeffs, (e, 1)], cap))
        rows.extend(([(j, mb), (e, -1)], 0) for j, mb in members)
    for hi, coeffs in raw_row.items():
        rows.append((coeffs, max(0, ledger.books[hi].raw_free)))
    for hi, coeffs in slot_row.items():
        book = ledger.books[hi]
        rows.append((coeffs, max(0, book.max_models - len(book.present))))
    for hi, coeffs in disk_row.items():
        rows.append((coeffs, max(0, ledger.books[hi].disk_free or 0)))
    rows.extend(colocation_rows(state, cols, on_host))
    return rows, shares


def baseline_rows(
    state: PlanState, cols: list[Column], first: int
) -> tuple[list[Row], list[tuple[int, int]]]:
    """Rows counting each baseline model's baseline replicas, and the variables they bound.

    A model with ``min_replicas`` gets one continuous ``b[m]`` (column ``first`` on) with
    ``b[m] <= sum_h x[m, h]`` and an upper bound of ``min(min_replicas, desired)``, so it
    counts the replicas that meet the baseline and no more. :func:`_lexicographic` maximises
    a class's ``b`` before the class's replicas, as Grid places a class's required
    baselines before the rest of its demand (specification, "Global placement loop")."""
    rows: list[Row] = []
    baselines: list[tuple[int, int]] = []
    for mi, js in by_model(cols).items():
        cap = min(state.profiles[mi].min_replicas, state.desired[mi])
        if cap <= 0:
            continue
        b = first + len(baselines)
        baselines.append((mi, cap))
        rows.append(([(b, 1), *((j, -1) for j in js)], 0))
    return rows, baselines


def pin_rows(state: PlanState, cols: list[Column]) -> tuple[list[Row], int]:
    """Pins as Grid honours them (:func:`grid_core.planner.phases.place_pins`), with one
    extra binary ``b`` per pinned model.

    Per pinned model: ``on`` are its columns on pin hosts, ``kept`` its live replicas off
    the pins (Grid keeps them: no churn for a pin that cannot land), ``new`` its new
    replicas off the pins. ``pin_new`` counts its new pin columns on hosts holding another
    replica Grid might drain (:func:`evictable`), ``on_new`` how many of those are chosen,
    and ``stand = pin_new - on_new``: a pin that needs a preemption counts as landed while
    the preemption is staged, so Grid places a stand-in replica elsewhere meanwhile. Which
    victim set Grid would choose is not modelled, so every such empty pin column allows one
    stand-in (a slight relaxation, for pinned models on occupied pin hosts only).
    New replicas off the pins make up only what the demand alone asks for beyond the pins
    and the live replicas off them, plus the stand-ins, plus one for each live replica off
    the pins that is not kept (Grid may relocate it: a new replica on another host):
    ``new <= max(0, want - on - K) + stand + (K - kept)`` with ``K`` the live replicas off
    the pins (a constant). With ``b = 1`` meaning "pins and live replicas cover the demand":
    ``new + kept + on_new + want*b <= want + pin_new + K``,
    ``new + kept + on + on_new - (on_cols + K)*b <= want + pin_new`` and
    ``want*b - on <= K``. The binaries are numbered after the placement columns.
    """
    from grid_core.planner.core import demand_count

    rows: list[Row] = []
    per_model: dict[int, tuple[list[int], list[int], list[int]]] = {}
    for j, (mi, hi, res) in enumerate(cols):
        if state.pin_hosts[mi]:
            on, kept, new = per_model.setdefault(mi, ([], [], []))
            (on if hi in state.pin_hosts[mi] else kept if res is not None else new).append(j)
    b = len(cols)
    for mi, (on, kept, new) in sorted(per_model.items()):
        want = demand_count(state.profiles[mi], state.demand[mi])
        on_new = [j for j in on if cols[j][2] is None and evictable(state, mi, cols[j][1])]
        room = want + len(on_new)
        rows.append(([(j, 1) for j in new + kept + on_new] + [(b, want)], room + len(kept)))
        twice = set(on_new)  # in on and in on_new: one coefficient of 2 (HiGHS refuses repeats)
        both = [(j, 2 if j in twice else 1) for j in new + kept + on]
        rows.append(([*both, (b, -(len(on) + len(kept)))], room))
        rows.append(([(j, -1) for j in on] + [(b, want)], len(kept)))
        b += 1
    return rows, b - len(cols)


def evictable(state: PlanState, mi: int, hi: int) -> bool:
    """Host ``hi`` holds a replica Grid might drain for ``mi``'s pin there: a superset of
    :func:`grid_core.planner.phases._victim_pool`'s candidates, read from the input alone.

    Another model's managed, memory-holding replica, not pinned to this host, that is not a
    serving incumbent (obsolete), or whose model is of lower priority than ``mi``, or has
    more serving replicas than it needs (surplus). Minimum residency is not checked. None
    when ``mi`` is larger than the host's desired ledger before anything is planned (its
    allocatable memory less unmanaged work): a victim set must release the footprint the
    replica lacks there (:class:`~grid_core.planner.preemption.VictimNeed`), and drained
    replicas give back only what keeping them took, so no drain can make room.
    """
    p = state.profiles[mi]
    host = state.hosts[hi]
    index = state.ledger.index
    if state.mem_rows[mi][hi] > state.ledger.books[hi].raw_free:
        return False
    for r in host.residencies:
        if not r.actuatable or r.state not in MEMORY_STATES or r.model_id == p.model_id:
            continue
        vmi = index.get(r.model_id)
        if vmi is None:
            return True
        victim = state.profiles[vmi]
        if host.host_id in victim.pins:
            continue
        live = dict(serving_incumbents(state, vmi))
        if live.get(hi) is not r or victim.priority < p.priority or len(live) > state.needed(vmi):
            return True
    return False


def colocation_rows(
    state: PlanState, cols: list[Column], on_host: dict[int, dict[int, int]]
) -> list[Row]:
    """Exclusions (x_a + x_b <= 1 minus what is live) and ceilings (big-M) per host."""
    ledger = state.ledger
    if not ledger.ceiling and not any(ledger.excludes.values()):
        return []
    rows: list[Row] = []
    index = ledger.index
    for hi, here in on_host.items():
        book = ledger.books[hi]
        fixed = {index[m] for m in book.live if m in index} - set(here)
        present_other = len(book.present - {state.profiles[mi].model_id for mi in here})
        for mi, j in here.items():
            mid = state.profiles[mi].model_id
            for other in ledger.excludes.get(mid, ()):
                oi = index.get(other)
                if oi is None:
                    continue
                if oi in fixed or (other in book.live and oi not in here):
                    rows.append(([(j, 1)], 0))
                elif oi in here and oi > mi:
                    rows.append(([(j, 1), (here[oi], 1)], 1))
            cap = ledger.ceiling.get(mid, 0)
            if cap:
                big = len(here) + present_other
                coeffs = [(k, 1) for k in here.values() if k != j] + [(j, big)]
                rows.append((coeffs, big + cap - 1 - present_other))
    return rows
