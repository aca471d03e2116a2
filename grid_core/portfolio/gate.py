"""The admission gate: which workloads' unbound demand may enter portfolio planning.

Specification, "Proactive observation and portfolio planning": a workload is admitted after
three observations in the demand window, or earlier once its offered concurrency (arrival
rate × measured service time + queued work) reaches 1.5 units, so a queued minute-long video
job starts its model at once while one short text request stays below the gate. Image and
video work between 1.0 and 1.5 units may earn one canary only after a fleet-level
spare-capacity proof; such weak evidence is capped at one replica until a validated response
(or direct demand, or the ordinary threshold) lifts the cap.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from grid_core.demand.series import Forecast
from grid_core.demand.tracker import ADMISSION_MEMORY_S
from grid_core.portfolio.feasibility import SERVING, Fit
from grid_core.portfolio.types import AdmissionThresholds, WorkloadDemand
from grid_core.profile import ModelProfile

MEDIA = {"image": "image", "video": "video"}
"""Workloads whose requests are media jobs (long device time, few arrivals)."""
HELD_FROM = frozenset({"observations", "concurrency", "held"})
"""Admissions that keep a workload admitted (``held``) while its requests stay within the
admission memory: ordinary evidence, and the hold itself until the memory empties."""
SPARE_UNSEEN_WORKLOADS = 1
"""Model slots kept free for a workload nobody has asked for yet (specification)."""


def workload_demand(
    workload: str,
    fc: Forecast,
    observations: int,
    profiles: tuple[ModelProfile, ...],
    gate: AdmissionThresholds,
) -> WorkloadDemand:
    """The forecast of one workload, before the spare-capacity proof.

    The service time is the measured one (whatever served it), else the fastest candidate's
    expected service time, so an unserved workload is not treated as free. The rate is the
    forecast's, but never below the remembered arrivals spread over the admission memory: a
    sparse workload's ten-second-bucket forecast decays to nothing between requests, which
    would make its pressure (and every comparison built on it) noise.
    """
    expected = [
        p.expected_service_time_s for p in profiles if p.workload_scores.get(workload, 0.0) > 0
    ]
    service = fc.service_time_s or (min(expected) if expected else 0.0)
    rate = max(fc.rate_rps, observations / ADMISSION_MEMORY_S)
    offered = rate * service + fc.queued
    admission = "below_gate"
    if observations >= gate.observations:
        admission = "observations"
    elif offered >= gate.concurrency:
        admission = "concurrency"
    elif workload in MEDIA and offered >= gate.media_concurrency:
        admission = "weak_media"  # still needs the spare-capacity proof
    return WorkloadDemand(
        workload=workload,
        request_rate_rps=rate,
        service_time_s=fc.service_time_s,
        queue_depth=fc.queued,
        offered_concurrency=offered,
        observations=observations,
        failure_rate=fc.error_rate,
        p95_ms=fc.p95_ms,
        modality=MEDIA.get(workload, "text"),
        admitted=admission in ("observations", "concurrency"),
        admission=admission,
        canary_cap=admission == "weak_media",
    )


def spare_capacity_proof(fit: Fit, workload: str) -> str | None:
    """Why the fleet cannot safely explore a weak media workload, or ``None`` when it can.

    The proof (specification): unknown model-slot limits give no hypothetical headroom; one
    slot stays free for an unseen workload and a node failure's worth of slots for its
    residents; a second compatible host must exist; and free memory must exceed one copy of
    every enabled catalog model not resident yet.
    """
    candidates = [p for p in fit.profiles if p.workload_scores.get(workload, 0.0) > 0]
    if not candidates or max(fit.row(p.model_id).compatible for p in candidates) < 2:
        return "no second compatible host"
    spare_slots = 0
    largest = 0
    free_mb = 0
    resident: set[str] = set()
    for hi, host in enumerate(fit.hosts):
        book = fit.ledger.books[hi]
        if not book.eligible:
            continue
        present = len(book.present)
        largest = max(largest, present)
        if book.max_models:
            spare_slots += max(0, book.max_models - present)
        free_mb += max(0, book.inc_free)
        resident |= {r.model_id for r in host.residencies if r.state in SERVING}
    if spare_slots < 1 + SPARE_UNSEEN_WORKLOADS + largest:
        return f"{spare_slots} spare model slots (needs a canary, an unseen workload and a node)"
    catalog_mb = sum(p.memory_mb for p in fit.profiles if p.model_id not in resident)
    if free_mb <= catalog_mb:
        return f"{free_mb} MB free is not beyond one copy of the catalog ({catalog_mb} MB)"
    return None


def admit(
    demand: Mapping[str, WorkloadDemand],
    fit: Fit,
    previous: Mapping[str, WorkloadDemand] | None = None,
) -> dict[str, WorkloadDemand]:
    """Apply the spare-capacity proof to weak media evidence and the admission hysteresis;
    returns the final forecasts.

    Hysteresis: a workload admitted last tick by ordinary evidence (observations or
    concurrency) stays admitted, as ``held`` and capped at one replica, while any of its
    requests remain within the admission memory. A single minute-long video job crosses the
    concurrency gate on arrival, but its rate forecast decays within minutes; without the
    hold the admission would flip off one tick later, the host drained for it would be
    refilled by its previous resident, and the job's retry would find nothing (churn with no
    service). The hold never creates eviction authority of its own (``held`` is not mature
    evidence for the 1.5x rule).
    """
    out: dict[str, WorkloadDemand] = {}
    before = previous or {}
    for w, d in demand.items():
        if d.admission == "weak_media" and spare_capacity_proof(fit, w) is None:
            d = msgspec.structs.replace(d, admitted=True)
        last = before.get(w)
        if (
            not d.admitted
            and d.observations > 0
            and last is not None
            and last.admission in HELD_FROM
        ):
            d = msgspec.structs.replace(d, admitted=True, admission="held", canary_cap=True)
        out[w] = d
    return out
