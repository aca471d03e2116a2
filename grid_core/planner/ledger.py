"""Per-plan capacity bookkeeping: two memory ledgers, model slots, colocation, disk.

Source: specification, "Global placement loop" and "Safety invariants" 1:

* incremental (make-before-break) ledger: everything live now (managed or not, obsolete or
  not) plus every new allocation, plus admission headroom, within the share of allocatable
  memory the host offers for new work (a throttled host offers only its fraction). The
  headroom grows with the size of the new replicas (:mod:`grid_core.headroom`): the book
  keeps the policy floor out of ``inc_free`` and each fit adds the largest share beyond it
  that a new replica on the host needs (:meth:`Ledger.admit_mb`);
* desired (raw) ledger: the complete desired footprint (unmanaged work first, kept incumbents,
  new allocations) within raw allocatable memory after reserve and thermal derating;
* model slots and colocation ceilings/exclusions count live and planned models;
* uncached artifacts reserve their size ceiling cumulatively against authenticated free disk.

Every mutation has an exact inverse so rounds can be retried and repair can backtrack.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grid_core.headroom import admission_headroom_mb
from grid_core.planner.eligibility import (
    MEMORY_STATES,
    host_ineligible_reason,
    placement_incompatibility,
    runtime_for,
)
from grid_core.planner.topology import LedgerTables, Opening
from grid_core.planner.types import PlannerPolicy
from grid_core.profile import ModelProfile, revision_matches
from grid_core.snapshot import HostSnapshot, ResidencySnapshot


@dataclass(slots=True)
class Placed:
    """One desired replica in the ledger (an incumbent kept or a new placement)."""

    mi: int
    hi: int
    incumbent: bool
    runtime: str
    memory_mb: int
    raw_mb: int
    """MB charged to the desired ledger (0 for unmanaged work, already in the base)."""
    inc_mb: int
    """MB charged to the incremental ledger (0 for incumbents: they are already live)."""
    disk_mb: int
    reason: str
    score: float | None = None


@dataclass(slots=True)
class HostBook:
    """Mutable capacity state of one host during one plan."""

    inc_free: int
    raw_free: int
    disk_free: int | None
    max_models: int
    live: frozenset[str]
    desired: set[str]
    present: set[str]
    eligible: bool
    blocked: bool = False
    """No preemption, relocation or repair may touch this host again in this plan: memory it
    releases belongs to a staged beneficiary and is proven free only by a later heartbeat."""
    staged: set[str] = field(default_factory=set)
    """Beneficiaries of preemptions staged here: each keeps its model slot, colocation rules
    and future footprint on this host, and is never assigned here before memory is free."""
    staged_mb: int = 0
    """Future footprint (MB) of :attr:`staged`, reserved against the desired ledger."""
    released_mb: int = 0
    """Live MB the staged victims will release once unloaded (still live until then)."""
    models: dict[int, Placed] = field(default_factory=dict)
    version: int = 0
    """Bumped on every change, so per-plan fit results can be reused while it is unchanged."""
    extra_mb: int = 0
    """Largest headroom beyond the floor that a new replica placed here needs (MB): every
    later fit on this host must leave it too."""


class Ledger:
    """Capacity state of every host plus the replicas placed so far.

    Args:
        profiles: configured models sorted by id (index = model index).
        hosts: snapshots sorted by id (index = host index).
        policy: planner policy.
        tables: compatibility and footprint memo tables shared by every plan of the same
            snapshot (:mod:`grid_core.planner.topology`); ``None`` builds private ones.
    """

    def __init__(
        self,
        profiles: list[ModelProfile],
        hosts: list[HostSnapshot],
        policy: PlannerPolicy,
        tables: LedgerTables | None = None,
    ) -> None:
        self.profiles = profiles
        self.hosts = hosts
        self.policy = policy
        self.index = {p.model_id: i for i, p in enumerate(profiles)}
        self.books: list[HostBook] = []
        self.ineligible: list[str | None] = []
        self.count = [0] * len(profiles)
        self.domains: list[dict[str, int]] = [{} for _ in profiles]
        self.ceiling = {
            p.model_id: p.max_colocated_models for p in profiles if p.max_colocated_models > 0
        }
        self.excludes: dict[str, set[str]] = {
            p.model_id: set(p.colocation_excludes) for p in profiles
        }
        for p in profiles:  # exclusions are reciprocal even when declared on one side
            for other in p.colocation_excludes:
                self.excludes.setdefault(other, set()).add(p.model_id)
        if tables is None:  # no shared snapshot context: this ledger's own tables
            tables = LedgerTables(pair=[{} for _ in profiles], extra=[{} for _ in profiles])
        self.tables = tables
        """The memo tables this ledger fills (a re-plan of the same inputs shares them)."""
        self._mem = tables.mem
        self._pair = tables.pair
        self._compat = tables.compat
        self._extra = tables.extra
        self._shares: dict[int, tuple[int, int, int, int]] = {}
        """Host → (book version, largest headroom share of its new replicas, how many hold
        it, the next largest) (:meth:`_share_without`)."""
        if tables.opening is None:  # the first ledger of this snapshot works them out
            tables.opening = [self._opening(host) for host in hosts]
        for reason, inc_free, raw_free, live, desired in tables.opening:
            host = hosts[len(self.books)]
            self.books.append(
                HostBook(
                    inc_free=inc_free,
                    raw_free=raw_free,
                    disk_free=host.artifact_disk_free_mb,
                    max_models=host.max_models,
                    live=live,
                    desired=set(desired),
                    present=set(live) | desired,
                    eligible=reason is None,
                )
            )
            self.ineligible.append(reason)
        self.domain_list = [h.failure_domain or f"host:{h.host_id}" for h in hosts]
        """Failure domain per host index; a host without one is its own domain."""

    def _opening(self, host: HostSnapshot) -> Opening:
        """``host``'s opening book values, before the plan keeps or places anything."""
        reason = host_ineligible_reason(host, self.policy)
        alloc = host.allocatable_mb
        frac = max(0.0, min(1.0, host.throttle_fraction))
        if host.state == "throttled":
            frac = min(frac, self.policy.throttled_fraction)
        live_used = host.external_used_mb
        unmanaged = host.external_used_mb
        live: set[str] = set()
        desired: set[str] = set()
        for r in host.residencies:
            if r.state not in MEMORY_STATES:
                continue
            live_used += r.memory_mb
            live.add(r.model_id)
            if not r.actuatable:  # unmanaged work stays whatever Grid plans
                unmanaged += r.memory_mb
                desired.add(r.model_id)
        inc_cap = int(alloc * frac) - self.policy.admission_headroom_mb
        return (reason, inc_cap - live_used, alloc - unmanaged, frozenset(live), frozenset(desired))

    # --- static facts (memoised per plan) ------------------------------------------------
    def compat(self, mi: int, hi: int) -> str | None:
        """Why a new replica of model ``mi`` can never go on host ``hi`` at this planning
        instant (:func:`~grid_core.eligibility.placement_incompatibility`: the static rules,
        and a throttled host its requests would outlast), or ``None`` (memoised)."""
        key = (mi, hi)
        if key not in self._compat:
            self._compat[key] = placement_incompatibility(
                self.profiles[mi], self.hosts[hi], self.policy.throttled_fraction
            )
        return self._compat[key]

    def memory(self, mi: int, hi: int) -> tuple[str, int]:
        """(runtime, MB) of a new replica of ``mi`` on ``hi`` (memoised)."""
        row = self._pair[mi]
        got = row.get(hi)
        if got is None:
            host = self.hosts[hi]
            key = (mi, host.runtimes)  # the answer depends on the host's runtimes only
            got = self._mem.get(key)
            if got is None:
                got = runtime_for(self.profiles[mi], host)
                self._mem[key] = got
            row[hi] = got
        return got

    def cached(self, mi: int, hi: int) -> bool:
        """Exact weights of ``mi`` are on ``hi``'s disk.

        When the profile declares a digest, only a file cached under that digest matches: an
        unknown (unreported) digest is not a match, so an old revision never looks cached.
        """
        p = self.profiles[mi]
        cached = self.hosts[hi].cached
        if p.model_id not in cached:
            return False
        return revision_matches(p, cached[p.model_id])

    def disk_cost(self, mi: int, hi: int) -> int:
        """MB of free disk a new replica reserves (0 when cached or no ceiling declared)."""
        size = self.profiles[mi].artifact_size_mb
        if not size or self.cached(mi, hi):
            return 0
        return size

    def headroom_extra(self, mi: int, hi: int) -> int:
        """MB of admission headroom a new replica of ``mi`` on ``hi`` needs beyond the policy
        floor that ``inc_free`` already keeps (0 for a model whose share is below the floor)."""
        row = self._extra[mi]
        got = row.get(hi)
        if got is None:
            floor = max(0, self.policy.admission_headroom_mb)
            own = admission_headroom_mb(
                self.memory(mi, hi)[1],
                floor_mb=floor,
                fraction=self.policy.admission_headroom_fraction,
                override_mb=self.profiles[mi].admission_headroom_mb,
            )
            got = row[hi] = own - floor
        return got

    def admit_mb(self, mi: int, hi: int) -> int:
        """Incremental MB a new replica of ``mi`` needs free on ``hi`` (compare with
        ``inc_free``): its footprint plus the largest headroom share beyond the floor that it
        or any new replica already placed there needs."""
        return self.memory(mi, hi)[1] + max(self.headroom_extra(mi, hi), self.books[hi].extra_mb)

    def _recount_extra(self, hi: int) -> None:
        book = self.books[hi]
        book.extra_mb = max(
            (self.headroom_extra(p.mi, hi) for p in book.models.values() if not p.incumbent),
            default=0,
        )

    # --- rules that change as the plan grows ---------------------------------------------
    def colocation_conflict(self, model_id: str, peers: set[str] | frozenset[str]) -> bool:
        """Whether ``model_id`` may not join ``peers`` (exclusions or a ceiling, reciprocal)."""
        others = peers - {model_id}
        excl = self.excludes.get(model_id)
        if excl and not excl.isdisjoint(others):
            return True
        size = len(others) + 1
        own = self.ceiling.get(model_id, 0)
        if own and size > own:
            return True
        if self.ceiling:
            for peer in others:
                c = self.ceiling.get(peer, 0)
                if c and size > c:
                    return True
        return False

    def fit_new(self, mi: int, hi: int) -> str | None:
        """Why a new replica of ``mi`` cannot go on ``hi`` now, or ``None`` when it fits.

        Reasons: ``ineligible``, ``blocked``, ``present``, ``memory``, ``slots``,
        ``colocation``, ``disk``. Static compatibility is checked by the caller.

        A host with a staged preemption still takes an unrelated model that fits beside the
        draining victims now (live ledger) and beside the beneficiary afterwards (its footprint,
        slot and colocation rules are reserved), so a staged preemption never blocks work that
        fits (issue 20; specification, "Global placement loop", staged preemption).
        """
        book = self.books[hi]
        if not book.eligible:
            return "ineligible"
        mid = self.profiles[mi].model_id
        if book.blocked and (not book.staged or mid in book.staged):
            return "blocked"
        if mid in book.present:
            return "present"
        got = self._pair[mi].get(hi)
        mem = (got if got is not None else self.memory(mi, hi))[1]
        extra = self._extra[mi].get(hi)
        if extra is None:
            extra = self.headroom_extra(mi, hi)
        held = book.extra_mb
        admit = mem + (held if held > extra else extra)  # as admit_mb, with fewer lookups
        if book.inc_free < admit or book.raw_free < mem:
            return "memory"
        if book.staged and book.inc_free + book.released_mb - book.staged_mb < admit:
            return "memory"  # would not fit beside the beneficiary once the victims are gone
        peers = book.present | book.staged if book.staged else book.present
        if book.max_models and len(peers) + 1 > book.max_models:
            return "slots"
        if (self.ceiling or self.excludes.get(mid)) and self.colocation_conflict(mid, peers):
            return "colocation"
        if book.disk_free is not None:  # no disk ceiling declared: disk never binds
            disk = self.disk_cost(mi, hi)
            if disk and book.disk_free < disk:
                return "disk"
        return None

    def fit_after_leaving(self, mi: int, hi: int, leaving: Placed) -> str | None:
        """Why a new replica of ``mi`` could not go on ``hi`` even once the new replica
        ``leaving`` has left it, or ``None`` when it would fit (same reasons as
        :meth:`fit_new`; the ledger is not changed)."""
        book = self.books[hi]
        if not book.eligible:
            return "ineligible"
        if book.blocked:
            return "blocked"
        mid = self.profiles[mi].model_id
        if mid in book.present:
            return "present"
        got = self._pair[mi].get(hi)
        mem = (got if got is not None else self.memory(mi, hi))[1]
        own = self._extra[mi].get(hi)  # headroom_extra's memo, read without its call
        if own is None:
            own = self.headroom_extra(mi, hi)
        inc_room = book.inc_free + leaving.inc_mb
        if inc_room < mem + own or book.raw_free + leaving.raw_mb < mem:
            return "memory"  # short even before the shares of the replicas staying there
        extra = book.extra_mb  # the largest share of the new replicas there (exact max)
        if extra > own:  # only a larger share than its own can still make it short
            if leaving.mi in book.models and self.headroom_extra(leaving.mi, hi) >= extra:
                extra = self._share_without(hi, leaving)
            if inc_room < mem + extra:
                return "memory"
        gone = self.profiles[leaving.mi].model_id
        # The peers once ``leaving`` has gone (the set is built only for colocation rules).
        if book.max_models and len(book.present) - (gone in book.present) + 1 > book.max_models:
            return "slots"
        if (self.ceiling or self.excludes.get(mid)) and self.colocation_conflict(
            mid, book.present - {gone}
        ):
            return "colocation"
        if book.disk_free is not None:  # no disk ceiling declared: disk never binds
            disk = self.disk_cost(mi, hi)
            if disk and book.disk_free + leaving.disk_mb < disk:
                return "disk"
        return None

    def _share_without(self, hi: int, leaving: Placed) -> int:
        """The largest headroom share beyond the floor among the new replicas on ``hi``
        other than ``leaving`` itself (MB; 0 without one), from the two largest shares
        there, remembered per host version. :meth:`fit_after_leaving` asks it only for a
        ``leaving`` whose own share is at least the host's :attr:`HostBook.extra_mb`, the
        largest share there, for every replica whose departure a repair considers."""
        book = self.books[hi]
        got = self._shares.get(hi)
        if got is None or got[0] != book.version:
            top = second = count = 0
            for p in book.models.values():
                if p.incumbent:
                    continue
                share = self.headroom_extra(p.mi, hi)
                if share > top:
                    top, second, count = share, top, 1
                elif share == top:
                    count += 1
                elif share > second:
                    second = share
            got = self._shares[hi] = (book.version, top, count, second)
        _, top, count, second = got
        if book.models.get(leaving.mi) is not leaving or leaving.incumbent:
            return top  # not one of the replicas counted: all of them stay
        # ``leaving`` holds the largest share: the caller asks only when its share is at
        # least ``extra_mb``, which place/remove keep equal to ``top`` (shares are >= 0)
        return top if count > 1 else second

    def fit_incumbent(self, mi: int, hi: int, res: ResidencySnapshot) -> str | None:
        """Why an existing residency cannot stay desired, or ``None`` when it may.

        Incumbents cost nothing incremental (they are live), but the complete desired
        footprint must fit raw allocatable memory, the desired model count must respect the
        host ceiling, and desired peers must respect colocation.
        """
        book = self.books[hi]
        mid = self.profiles[mi].model_id
        if not res.actuatable:
            peers = book.desired - {mid}
            raw_need = 0
        else:
            peers = book.desired
            raw_need = self._incumbent_mb(mi, hi, res)
        if book.raw_free < raw_need:
            return "memory"
        if book.max_models and len(peers | {mid}) > book.max_models:
            return "slots"
        if self.colocation_conflict(mid, peers):
            return "colocation"
        return None

    def _incumbent_mb(self, mi: int, hi: int, res: ResidencySnapshot) -> int:
        return max(res.memory_mb, self.memory(mi, hi)[1])

    # --- mutations (exact inverses) -------------------------------------------------------
    def keep(self, mi: int, hi: int, res: ResidencySnapshot, reason: str) -> Placed:
        """Record an incumbent as desired (call :meth:`fit_incumbent` first)."""
        book = self.books[hi]
        mid = self.profiles[mi].model_id
        raw = self._incumbent_mb(mi, hi, res) if res.actuatable else 0
        placed = Placed(
            mi=mi,
            hi=hi,
            incumbent=True,
            runtime=res.runtime or self.memory(mi, hi)[0],
            memory_mb=max(res.memory_mb, self.memory(mi, hi)[1])
            if res.actuatable
            else res.memory_mb,
            raw_mb=raw,
            inc_mb=0,
            disk_mb=0,
            reason=reason,
        )
        book.raw_free -= raw
        book.version += 1
        book.desired.add(mid)
        book.present.add(mid)
        self._attach(placed)
        return placed

    def place(self, mi: int, hi: int, reason: str, score: float | None = None) -> Placed:
        """Record a new replica (call :meth:`fit_new` first)."""
        book = self.books[hi]
        mid = self.profiles[mi].model_id
        runtime, mem = self.memory(mi, hi)
        disk = self.disk_cost(mi, hi)
        # Placed's fields in their declared order (positional: this runs for every trial move)
        placed = Placed(mi, hi, False, runtime, mem, mem, mem, disk, reason, score)
        book.inc_free -= mem
        book.raw_free -= mem
        extra = self.headroom_extra(mi, hi)
        if extra > book.extra_mb:
            book.extra_mb = extra
        book.version += 1
        if disk and book.disk_free is not None:
            book.disk_free -= disk
        book.desired.add(mid)
        book.present.add(mid)
        self._attach(placed)
        return placed

    def remove(self, mi: int, hi: int) -> Placed:
        """Undo :meth:`keep` or :meth:`place` for ``(mi, hi)``."""
        book = self.books[hi]
        placed = book.models.pop(mi)
        if not placed.incumbent and book.extra_mb and self.headroom_extra(mi, hi) >= book.extra_mb:
            self._recount_extra(hi)  # it held the largest share: another may hold it too
        book.version += 1
        mid = self.profiles[mi].model_id
        book.inc_free += placed.inc_mb
        book.raw_free += placed.raw_mb
        if placed.disk_mb and book.disk_free is not None:
            book.disk_free += placed.disk_mb
        res = self.hosts[hi].residency(mid)
        if res is None or res.actuatable or res.state not in MEMORY_STATES:
            book.desired.discard(mid)
        if mid not in book.live and mid not in book.desired:
            book.present.discard(mid)
        self.count[mi] -= 1
        dom = self.domain_list[hi]
        left = self.domains[mi][dom] - 1
        if left:
            self.domains[mi][dom] = left
        else:
            del self.domains[mi][dom]
        return placed

    def _attach(self, placed: Placed) -> None:
        self.books[placed.hi].models[placed.mi] = placed
        self.count[placed.mi] += 1
        dom = self.domain_list[placed.hi]
        self.domains[placed.mi][dom] = self.domains[placed.mi].get(dom, 0) + 1

    def domain_of(self, hi: int) -> str:
        """Failure domain of a host; a host without one is its own domain."""
        return self.domain_list[hi]

    def placements(self) -> list[Placed]:
        """Every desired replica, in (model id, host id) order."""
        out = [p for book in self.books for p in book.models.values()]
        out.sort(key=lambda p: (p.mi, p.hi))
        return out
