"""Bounds of the reconciler and its mutation governor (every number named and explained)."""

from __future__ import annotations

import msgspec

MAX_GLOBAL_MUTATIONS = 8
"""Mutations in flight fleet-wide: enough to converge a 64-host fleet in a few heartbeats,
few enough that a bad plan cannot move most of the fleet at once."""
MAX_HOST_MUTATIONS = 1
"""Mutations in flight per host: a managed node runs one side effect at a time, so a second
one would only queue behind the first (a load and its dependent warm count as one)."""
ARTIFACT_FANOUT = 2
"""Loads of one exact artifact in flight at once (specification default): a third replica
waits instead of joining a download stampede."""
MUTATION_COOLDOWN_S = 30.0
"""After any finished mutation on a (host, model), wait this long before a different kind of
mutation there: one heartbeat interval plus margin, so the next decision sees the result."""
OBSERVATION_TIMEOUT_S = 120.0
"""A successful action's postcondition must appear in a heartbeat newer than its receipt;
until then (at most this long) the same action is not re-issued."""
BACKOFF_BASE_S = 15.0
"""First retry delay after a failure; doubles per consecutive failure."""
BACKOFF_MAX_S = 900.0
"""Retry delay ceiling (15 minutes): a broken artifact retries a few times an hour."""
HEARTBEAT_STALE_S = 90.0
"""A host whose last heartbeat is older than this gets no command (three missed 30 s beats,
the same bound the planner uses for new placement)."""
FUTURE_SKEW_S = 5.0
"""A heartbeat this far in the future is implausible and fails closed."""
ROUTE_LEASE_S = 60.0
"""Lease of a control or engine record (wire contract)."""
LEASE_MARGIN_S = 30.0
"""A replacement route must have strictly more than this left of its lease at the final
destructive check: covers the revision wait, delivery and the node's durable start."""
DRAIN_DEADLINE_S = 300.0
"""Longest a drained replica may keep requests in flight (or report unknown activity) before
the controller decides to force its unload: minutes of a long CPU generation, but bounded,
so a staged preemption or a retirement cannot wait forever behind one endless request. The
decision is explicit (reason ``drain_deadline``) and visible in status; before it the unload
is deferred with ``in_flight``/``activity_unknown`` and this deadline as ``until``."""
DRAIN_DEADLINE_REASON = "drain_deadline"
"""Reason of an unload the controller forces because the drain deadline passed."""
RESTART_GRACE_S = 60.0
"""After restoring state, destructive work waits one route lease so the fleet re-registers."""
HICCUP_FRACTION = 0.5
"""If more than this share of previously fresh hosts go stale in one tick, treat it as a
control-plane hiccup: plan, but start no mutations until membership is fresh again."""
PENALTY_CAP = 3
"""Failures of one model counted against one host for placement: bounded, so the failed host
remains a fallback when it is the only feasible target."""


class GovernorPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Tunable governor bounds; defaults are the module constants above."""

    max_global_mutations: int = MAX_GLOBAL_MUTATIONS
    max_host_mutations: int = MAX_HOST_MUTATIONS
    artifact_fanout: int = ARTIFACT_FANOUT
    mutation_cooldown_s: float = MUTATION_COOLDOWN_S
    observation_timeout_s: float = OBSERVATION_TIMEOUT_S
    backoff_base_s: float = BACKOFF_BASE_S
    backoff_max_s: float = BACKOFF_MAX_S
    heartbeat_stale_s: float = HEARTBEAT_STALE_S
    route_lease_s: float = ROUTE_LEASE_S
    lease_margin_s: float = LEASE_MARGIN_S
    restart_grace_s: float = RESTART_GRACE_S
    drain_deadline_s: float = DRAIN_DEADLINE_S
    hiccup_fraction: float = HICCUP_FRACTION

    def backoff_s(self, failures: int) -> float:
        """Delay before retry number ``failures`` (seconds, exponential, capped)."""
        if failures <= 0:
            return 0.0
        return min(self.backoff_max_s, self.backoff_base_s * 2.0 ** (failures - 1))
