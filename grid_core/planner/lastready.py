"""A model's last ready replica is not taken for another model's scale-out on one tick's noise.

Source: specification, "Global placement loop" (direct request/queue/SLO/error evidence may
trigger a destructive preemption; minimum residency and cooldowns exist to suppress churn)
and "Safety invariants" 8 (bound change). A queue of one request on an already served model
is direct evidence, and it asks for one replica beyond the ready set. When the only capacity
for that replica is a lower-priority model's last ready replica, acting on the first sighting
trades a whole workload's service (the victim has nothing left until it is restored) for
extra capacity of a model that is still served, and the queue is often gone a minute later.

So a preemption that would take another model's last ready replica for a *scale-out* waits
until the beneficiary's shortfall has persisted for :data:`SHORTFALL_PERSIST_S`
(:attr:`~grid_core.demand.types.ModelDemand.short_since`, kept by the demand tracker). It is
hysteresis only: once the need persists the same preemption proceeds. It never delays

* a baseline (the beneficiary is below ``min_replicas``),
* a pin on its own host,
* a model that has no ready replica (its first replica is not scale-out), or
* a victim with another ready replica the plan keeps.

The refusal is reported as the beneficiary's ``shortfall_settling`` unmet code, naming the
victim, so status shows why the replica waits.
"""

from __future__ import annotations

import msgspec

from grid_core.demand.types import ModelDemand
from grid_core.planner.core import PlanState
from grid_core.snapshot import ResidencySnapshot

SHORTFALL_PERSIST_S = 10.0
"""Seconds a served model's shortfall must persist before it may take another model's last
ready replica: one default demand bucket (``ForecastPolicy.bucket_s``), so a need seen in a
single bucket is noise the way one bucket of silence is not yet a trend
(:data:`~grid_core.demand.desired.LIVE_EVIDENCE_BUCKETS`). A controller ticking once a minute
therefore needs the shortfall on two consecutive ticks."""


def established(demand: ModelDemand, now: float) -> ModelDemand:
    """``demand`` with a live shortfall dated as already persisted (``now`` minus
    :data:`SHORTFALL_PERSIST_S`), for inputs that are one instant without history, such as a
    fleet file for ``grid bench plan``: the planner then makes the decision it makes once the
    evidence has lasted, not the first-sighting one. Demand without a live shortfall, or with
    its own date, is returned unchanged."""
    if demand.short_since is not None or not demand.live_shortfall():
        return demand
    return msgspec.structs.replace(demand, short_since=now - SHORTFALL_PERSIST_S)


def settling_scale_out(state: PlanState, mi: int, hi: int) -> bool:
    """Whether ``mi``'s need on ``hi`` is a scale-out whose shortfall has not yet persisted.

    Args:
        state: the plan being built.
        mi: the beneficiary's model index.
        hi: the host whose victims are being considered.

    True only for a model that is served (at least one ready replica by its demand), is not
    below its baseline, has no pin on ``hi``, and whose shortfall began less than
    :data:`SHORTFALL_PERSIST_S` before the plan (or is not recorded at all).
    """
    d = state.demand[mi]
    if d is None or d.ready_replicas < 1 or hi in state.pin_hosts[mi]:
        return False
    have = state.ledger.count[mi] + state.staged.get(mi, 0)
    if have < state.profiles[mi].min_replicas:
        return False
    return d.short_since is None or state.now - d.short_since < SHORTFALL_PERSIST_S


def kept_ready(state: PlanState, vmi: int) -> int:
    """Ready incumbents of model ``vmi`` that the plan keeps."""
    mid = state.profiles[vmi].model_id
    n = 0
    for hj, book in enumerate(state.ledger.books):
        placed = book.models.get(vmi)
        res = state.res_maps[hj].get(mid)
        if placed is not None and placed.incumbent and res is not None and res.state == "ready":
            n += 1
    return n


def last_ready(state: PlanState, vmi: int, r: ResidencySnapshot) -> bool:
    """Whether ``r`` (a kept replica of model ``vmi``) is the model's last ready replica that
    the plan keeps."""
    return r.state == "ready" and kept_ready(state, vmi) <= 1


def settling_message(state: PlanState, mi: int) -> str:
    """The refusal, for the beneficiary's unmet entry: which last replicas wait, and since
    when the shortfall is seen (seconds before the plan)."""
    victims = ", ".join(f"'{v}'" for v in sorted(state.settling.get(mi, ())))
    d = state.demand[mi]
    since = d.short_since if d is not None else None
    seen = "first seen now" if since is None else f"seen for {max(0.0, state.now - since):g} s"
    return (
        f"taking the last ready replica of {victims} waits until this shortfall persists "
        f"{SHORTFALL_PERSIST_S:g} s ({seen})"
    )
