"""Exact placement optimum: the same planning input as a mixed-integer program (HiGHS).

An optimality certificate for the greedy planner: :func:`exact_optimum` builds, from one
:class:`PlanInputs`, the largest number of replicas any single plan could place under exactly
the hard rules :func:`grid_core.planner.plan` obeys, and solves it with HiGHS (the optional
``highspy`` dependency, extra ``exact``). ``grid bench plan --exact`` and the scenario lab
compare the planner's coverage with it.

The program (one binary per model and candidate host; the candidate lists, memory footprints
and starting ledgers are Grid's own, from :class:`grid_core.planner.core.PlanState`)::

    maximise    sum x[m, h]
    subject to  sum_h x[m, h]                    <= desired[m]           every model
                sum_m inc[m, h] * x[m, h] + e[h] <= incremental free[h]  every host
                extra[m', h] * x[m', h]          <= e[h]                 every new m' whose
                                                   admission headroom exceeds the floor
                sum_m raw[m, h] * x[m, h]        <= desired free[h]      every host
                sum_m new_slot[m, h] * x[m, h]   <= free slots[h]        hosts with a ceiling
                sum_m disk[m, h] * x[m, h]       <= free disk[h]         hosts reporting disk
                colocation exclusions and ceilings                       where profiles set them

``e[h]`` is one continuous variable per host where some new replica's headroom share exceeds
the floor: at least the largest such share among the replicas chosen there, so the memory row
is exactly the ledger's rule (footprints plus the largest share) in about two coefficients per
replica plus one per host. (One row per such replica, each repeating the whole host row,
says the same with a number of coefficients that grows with the square of the replicas per
host: 5.4 million for 55,000 columns on a 512-host fleet, where HiGHS's presolve, which its
time limit does not interrupt, ran for a minute against a limit of one second.)

Pins are modelled as Grid honours them: a pinned model's replicas off its pins only make up
demand beyond the pins that landed (:func:`grid_core.planner.exactrows.pin_rows`; that module
builds every row of the program), and whenever the first solve leaves demand or a pin
unplaced, :func:`_lexicographic` re-solves in Grid's order: pins first, then
per priority class its baselines (``min_replicas``, counted by one bounded continuous
variable per baseline model) and then the rest of its demand.

A kept incumbent costs nothing incremental and no new slot (it is live already) but its size in
the desired ledger; a new replica costs its footprint in both and a slot. What the program
deliberately leaves out, so its optimum is an upper bound on the planner's coverage:

* failure-domain spread (the planner treats it as a goal and reports a shortfall, never as a
  reason to leave a replica out when another domain has no room);
* staged preemption and relocation (they free memory only after a later heartbeat proves it,
  so no single plan can use it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from grid_core.errors import ValidationError
from grid_core.planner import exactrows
from grid_core.planner.core import PlanState
from grid_core.planner.exactrows import Column, Row
from grid_core.planner.types import PlanInputs

DEFAULT_TIME_LIMIT_S = 120.0
"""Solver budget per solve: the 1024-host bench fleet solves within it; a pathological input
returns the best solution and bound found instead of running for hours."""
CEILING_STATUS = "Optimal (the plan reaches the no-solve ceiling)"
"""Status text of a result HiGHS stopped at its time limit whose plan already places as many
replicas as :meth:`_Program.ceiling` allows: proven by counting, not by the solver, so the
text must not read "Time limit reached" beside ``optimal`` true."""
RETRY_PRESOLVE = "off"
"""HiGHS ``presolve`` setting of the one retry a solve gets when HiGHS ends it with status
"Solve error" (its own final feasibility check rejected the point it produced).

Source: seed 4 of the random-fleet property (the fleet it shrinks to is
tests/data/fleets/4x6-presolve-solve-error.json). On the ladder's last level HiGHS 1.16's MIP
presolve reduces the 50-row program to nothing and postsolves a point that breaks a memory row
by 2,356 MB, so the solve ends without a plan. Rows in GB, integer headroom variables and a
tighter feasibility tolerance leave it failing (as on the unshrunk fleet; scaling every row to
a largest coefficient of 1 rescues the shrunk fleet only); the same program without presolve
is proven optimal (4 priority-0 replicas) in milliseconds. Presolve stays on (HiGHS's
default) for every first attempt: the failure is rare (one program in the ~2,100 fleets seed 4
draws)."""
DEFAULT_PRESOLVE = "choose"
"""HiGHS's own default ``presolve`` value, restored after a :data:`RETRY_PRESOLVE` retry."""
RELATIVE_GAP = 1e-6
"""Stop only when the solution is proven within one part in a million of the bound (the
objective is an integer count, so this is exact for every fleet below a million replicas)."""


@dataclass(frozen=True, slots=True)
class ExactResult:
    """The solved program.

    Attributes:
        desired: replicas wanted in total (the planner's desired counts, summed).
        optimum: replicas placed by the best solution that, like Grid, reserves pins first
            and gives every priority class its baselines (``min_replicas``) and then the
            most replicas it can have before any lower class (lexicographic).
            When ``optimal`` is false this is the best plan found within the time limit
            (the unordered one if the ordered solves found none), not a proven optimum.
        unordered: replicas the best solution places when priority is ignored (the pure
            packing maximum; equals ``optimum`` whenever everything desired fits). It is
            proven when it equals ``bound``; else it is the most any plan found places
            (never below ``optimum``).
        bound: proven upper bound on any plan's replicas (the no-solve ceiling of
            :meth:`_Program.ceiling` when HiGHS proved no bound of its own); never below
            ``unordered``.
        optimal: ``optimum`` is proven: HiGHS proved every solve it rests on optimal within
            :data:`RELATIVE_GAP` (the first solve when everything fits, else every level of
            the ordered ladder), or the plan places as many replicas as the ceiling that
            needs no solve.
        status: HiGHS model status text of the solves ``optimum`` rests on: of the first
            one not proved optimal, else of the last one.
        seconds: solver run time as HiGHS accounts it, summed over its solves.
        per_model: model id → replicas in the best solution.
        assignments: (model id, host id) of every replica in the best solution.
        variables / constraints: size of the program.
    """

    desired: int
    optimum: int
    unordered: int
    bound: int
    optimal: bool
    status: str
    seconds: float
    per_model: dict[str, int]
    assignments: tuple[tuple[str, str], ...]
    variables: int
    constraints: int

    @property
    def coverage(self) -> float:
        """Fraction of desired replicas the optimum places (1.0 when nothing is desired)."""
        return self.optimum / self.desired if self.desired else 1.0


def _highs() -> Any:
    try:
        import highspy
    except ImportError:
        msg = (
            "the exact optimum needs HiGHS: install the optional extra with "
            "pip install 'grid[exact]' (or pip install highspy)"
        )
        raise ValidationError(msg) from None
    return highspy


def _quiet_solver(highspy: Any) -> Any:
    """A HiGHS instance whose copyright banner (written to fd 1 on creation) is discarded,
    so ``--json`` output stays one JSON document."""
    import os
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as sink:
            os.dup2(sink.fileno(), 1)
            h = highspy.Highs()
            h.setOptionValue("output_flag", False)
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    return h


def prime_quietly() -> None:
    """Load HiGHS once with its copyright banner discarded (it prints on first use only).

    Command-line edges call this before printing, so ``--json`` stays one JSON document.

    Raises:
        ValidationError: ``highspy`` is not installed (names the extra).
    """
    _quiet_solver(_highs())


def exact_optimum(
    inputs: PlanInputs,
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    start: Iterable[tuple[str, str]] = (),
) -> ExactResult:
    """Solve ``inputs`` exactly: the most replicas any one plan could place.

    Args:
        inputs: the planning input (the same value :func:`grid_core.planner.plan` takes).
        time_limit_s: solver wall-clock budget in seconds (> 0).
        start: a known plan's ``(model id, host id)`` pairs (Grid's, say), offered to every
            solve as its first incumbent: an unproven result is then never a worse plan.

    Returns:
        An :class:`ExactResult` (optimum, proven bound, per-model counts).

    Raises:
        ValidationError: ``highspy`` is not installed (names the extra), or the time limit is
            not positive.
    """
    prog = _Program.build(inputs, time_limit_s)
    state, cols, h = prog.state, prog.cols, prog.h
    desired = sum(state.desired)
    if not prog.n:
        return ExactResult(desired, 0, 0, 0, True, "empty", 0.0, {}, (), 0, 0)
    prog.use_start(start)
    prog.run()
    status = h.modelStatusToString(h.getModelStatus())
    unordered, bound = _objective(h, prog.inf, prog.ceiling())
    optimal = status == "Optimal" or unordered >= bound  # a plan at the ceiling is proven
    if optimal and status != "Optimal":
        status = CEILING_STATUS
    sol = _solution(h, prog.total)
    pins = [j for j, (mi, hi, _) in enumerate(cols) if hi in state.pin_hosts[mi]]
    if unordered < desired or (pins and sum(sol[j] > 0.5 for j in pins) < len(pins)):
        # The ladder alone proves the ordered optimum: each level is proven given the floors
        # above it. The first solve's proof (or not) is the unordered maximum's, which
        # shows as ``unordered == bound``.
        optimal, ordered, status = _lexicographic(prog, pins)
        if ordered is not None:  # else keep the first solve's plan: feasible, not ordered
            sol = ordered
            # the ordered plan is a plan too: an unproven first solve may have found fewer
            unordered = max(unordered, sum(v > 0.5 for v in sol[: prog.n]))
            bound = max(bound, unordered)
    seconds = h.getRunTime()  # HiGHS's own accounting: the planner core reads no clock
    per_model: dict[str, int] = {}
    chosen: list[tuple[str, str]] = []
    for (mi, hi, _kind), v in zip(cols, sol[: prog.n], strict=True):
        if v > 0.5:
            mid = state.profiles[mi].model_id
            per_model[mid] = per_model.get(mid, 0) + 1
            chosen.append((mid, state.hosts[hi].host_id))
    return ExactResult(
        desired=desired,
        optimum=sum(per_model.values()),
        unordered=unordered,
        bound=bound,
        optimal=optimal,
        status=status,
        seconds=seconds,
        per_model=dict(sorted(per_model.items())),
        assignments=tuple(sorted(chosen)),
        variables=prog.n,
        constraints=prog.rows,
    )


def loss_by_class(
    inputs: PlanInputs,
    assignments: Iterable[tuple[str, str]],
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
) -> dict[int, int]:
    """Replicas a plan's host choices cost, per priority class (where a packing gap comes from).

    The program is solved for the most replicas (priority ignored) first with nothing fixed,
    then again after fixing, class by class from the highest priority down, every replica of
    that class exactly where ``assignments`` put it (and nowhere else). What a class's
    fixing takes away from the count is the loss its host choices cause, the classes below
    it re-packed optimally around them. The losses add up to the unordered optimum minus
    the plan's replicas (when the plan is feasible in the program, as Grid's always is).

    Args:
        inputs: the planning input the plan was made from.
        assignments: the plan's ``(model id, host id)`` replicas.
        time_limit_s: solver budget in seconds per solve (> 0).

    Returns:
        Priority → replicas lost (0 when that class's choices cost nothing), highest first.

    Raises:
        ValidationError: ``highspy`` is not installed, or the time limit is not positive.
    """
    prog = _Program.build(inputs, time_limit_s)
    if not prog.n:
        return {}
    import numpy as np

    state, h = prog.state, prog.h
    chosen = set(assignments)
    prios = [state.profiles[mi].priority for mi, _, _ in prog.cols]
    prog.run()
    best = _found(h)
    out: dict[int, int] = {}
    for prio in sorted(set(prios), reverse=True):
        members = [j for j, q in enumerate(prios) if q == prio]
        fixed = [
            1.0
            if (state.profiles[prog.cols[j][0]].model_id, state.hosts[prog.cols[j][1]].host_id)
            in chosen
            else 0.0
            for j in members
        ]
        h.changeColsBounds(
            len(members), np.array(members, dtype=np.int32), np.array(fixed), np.array(fixed)
        )
        prog.run()
        now = _found(h)
        out[prio] = max(0, best - now)
        best = now
    return out


@dataclass(slots=True)
class _Program:
    """The built (not yet solved) program: HiGHS instance, columns and sizes."""

    state: PlanState
    cols: list[Column]
    h: Any
    n: int
    total: int
    rows: int
    inf: float
    time_limit_s: float
    pin_rows: list[Row]
    pin_binaries: int
    """Pinned models' binaries (:func:`grid_core.planner.exactrows.pin_rows`), numbered after
    the ``n`` placements."""
    shares: list[list[tuple[int, int]]]
    """Per headroom variable ``e[h]`` (numbered after the pin binaries):
    (column, MB of headroom share beyond the floor) of each new replica on that host that
    has one (:func:`grid_core.planner.exactrows.capacity_rows`)."""
    baselines: list[tuple[int, int]]
    """Per baseline variable ``b[m]`` (numbered after the headroom variables, up to
    ``total``): (model index, baseline replicas it may count: the fewer of ``min_replicas``
    and the model's desired count); see :func:`grid_core.planner.exactrows.baseline_rows`."""
    start: Any = None
    """A known plan as a HiGHS solution (:meth:`use_start`), offered before every solve."""

    @property
    def first_share(self) -> int:
        """Column of the first headroom variable ``e[h]`` (after placements and pin binaries)."""
        return self.n + self.pin_binaries

    @property
    def first_baseline(self) -> int:
        """Column of the first baseline variable ``b[m]`` (after the headroom variables)."""
        return self.first_share + len(self.shares)

    @classmethod
    def build(cls, inputs: PlanInputs, time_limit_s: float) -> _Program:
        if not time_limit_s > 0:
            msg = f"exact: time limit must be positive seconds, got {time_limit_s}"
            raise ValidationError(msg)
        highspy = _highs()
        from grid_core.planner import canonical_inputs

        state = PlanState(canonical_inputs(inputs), [], None)
        cols = exactrows.columns(state)
        n = len(cols)
        pin_rows, pin_binaries = exactrows.pin_rows(state, cols)
        rows, shares = exactrows.capacity_rows(state, cols, n + pin_binaries)
        rows.extend(pin_rows)
        base_rows, baselines = exactrows.baseline_rows(state, cols, n + pin_binaries + len(shares))
        rows.extend(base_rows)
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("mip_rel_gap", RELATIVE_GAP)
        h.setOptionValue("threads", 1)
        total = n + pin_binaries + len(shares) + len(baselines)
        prog = cls(
            state,
            cols,
            h,
            n,
            total,
            len(rows),
            highspy.kHighsInf,
            time_limit_s,
            pin_rows,
            pin_binaries,
            shares,
            baselines,
        )
        if n:
            prog._add(highspy, rows)
        return prog

    def use_start(self, assignments: Iterable[tuple[str, str]]) -> None:
        """Offer a known plan (``(model id, host id)`` pairs, e.g. Grid's) to every solve as
        its first incumbent, so a solve stopped by its time limit never reports less than
        that plan. HiGHS ignores it where it breaks a row (a class floor it does not meet);
        a pair that is no column of the program leaves the start unused."""
        state = self.state
        index = {
            (state.profiles[mi].model_id, state.hosts[hi].host_id): j
            for j, (mi, hi, _) in enumerate(self.cols)
        }
        x = [0.0] * self.total
        for pair in assignments:
            j = index.get(pair)
            if j is None:
                return
            x[j] = 1.0
        for g in range(self.pin_binaries):  # each pinned model's b: the value its rows allow
            b = self.n + g
            x[b] = 1.0
            rows = self.pin_rows[3 * g : 3 * g + 3]
            if any(sum(a * x[j] for j, a in coeffs) > ub for coeffs, ub in rows):
                x[b] = 0.0
        for g, members in enumerate(self.shares):  # e[h]: the largest share chosen there
            x[self.first_share + g] = float(max((mb for j, mb in members if x[j] > 0.5), default=0))
        placed = {
            mi: sum(x[j] > 0.5 for j in js) for mi, js in exactrows.by_model(self.cols).items()
        }
        for g, (mi, cap) in enumerate(self.baselines):  # b[m]: the baseline replicas placed
            x[self.first_baseline + g] = float(min(cap, placed.get(mi, 0)))
        highspy = _highs()
        start = highspy.HighsSolution()
        start.col_value = x
        start.value_valid = True
        self.start = start

    def run(self) -> None:
        """Solve once within :attr:`time_limit_s` of its own: HiGHS checks its time limit
        against the instance's cumulative run time, so each solve's deadline is moved past
        the time the earlier solves already used.

        A solve HiGHS ends with "Solve error" is run once more, from a cleared solver state
        and without presolve (:data:`RETRY_PRESOLVE`), with a time limit of its own; the
        model status then read is the retry's. If the retry errs too, the status stays
        "Solve error" and callers report the solve as not proven."""
        self._run_once()
        h = self.h
        if h.getModelStatus() != _highs().HighsModelStatus.kSolveError:
            return
        h.clearSolver()
        h.setOptionValue("presolve", RETRY_PRESOLVE)
        try:
            self._run_once()
        finally:
            h.setOptionValue("presolve", DEFAULT_PRESOLVE)

    def _run_once(self) -> None:
        if self.start is not None:
            self.h.setSolution(self.start)
        self.h.setOptionValue("time_limit", self.h.getRunTime() + float(self.time_limit_s))
        self.h.run()

    def ceiling(self) -> int:
        """Replicas no plan can exceed without solving anything: per model, the fewer of
        its desired count and its candidate columns, summed."""
        return sum(
            min(len(js), self.state.desired[mi]) for mi, js in exactrows.by_model(self.cols).items()
        )

    def objective(self, members: list[int] | None = None) -> Any:
        """Cost vector: -1 on ``members`` (every placement column when ``None``)."""
        import numpy as np

        cost = np.zeros(self.total)
        if members is None:
            cost[: self.n] = -1.0
        else:
            cost[members] = -1.0
        return cost

    def _add(self, highspy: Any, rows: list[Row]) -> None:
        import numpy as np

        h, total = self.h, self.total
        binaries, heads = self.first_share, self.first_baseline
        upper = np.ones(total)  # headroom variable: its largest share; baseline: its cap
        upper[binaries:heads] = [max(mb for _, mb in members) for members in self.shares]
        upper[heads:] = [cap for _, cap in self.baselines]
        h.addCols(
            total,
            self.objective(),
            np.zeros(total),
            upper,
            0,
            np.array([], dtype=np.int32),
            np.array([], dtype=np.int32),
            np.array([], dtype=np.float64),
        )
        h.changeColsIntegrality(
            binaries,
            np.arange(binaries, dtype=np.int32),
            np.full(binaries, highspy.HighsVarType.kInteger, dtype=np.uint8),
        )
        starts: list[int] = []
        index: list[int] = []
        value: list[float] = []
        bounds: list[float] = []
        for coeffs, ub in rows:
            starts.append(len(index))
            for j, a in coeffs:
                index.append(j)
                value.append(float(a))
            bounds.append(float(ub))
        if rows:
            # HiGHS refuses the whole batch (kError, nothing added) if a row repeats a column:
            # the program would then be solved without any constraint at all.
            added = h.addRows(
                len(rows),
                np.full(len(rows), -self.inf),
                np.array(bounds),
                len(index),
                np.array(starts, dtype=np.int32),
                np.array(index, dtype=np.int32),
                np.array(value),
            )
            if added == highspy.HighsStatus.kError:
                msg = f"exact: HiGHS refused the program's {len(rows)} constraints"
                raise RuntimeError(msg)


def _lexicographic(prog: _Program, pins: list[int]) -> tuple[bool, list[float] | None, str]:
    """Re-solve in the order Grid must respect: pins first (reserved before anything else,
    higher priority first), then per priority class, highest first, the most baseline
    replicas (``min_replicas``, :func:`grid_core.planner.exactrows.baseline_rows`) and then
    the most replicas of the class, each level's optimum then fixed as a floor for the next.

    The last level's solution meets every floor, so it is the ordered optimum itself; no
    further solve is needed. A level that ends without any solution (its time limit spent
    before HiGHS found one) stops the ladder, and the previous level's solution is kept:
    it still meets every floor fixed so far, but the classes below were not maximised.

    Returns:
        (every solve proved optimal, the last solution found or ``None`` when even the
        first level found none, the HiGHS status text of the first solve not proved
        optimal, or of the last solve when all were).
    """
    import numpy as np

    h, total, inf = prog.h, prog.total, prog.inf
    profiles = prog.state.profiles
    prios = [profiles[mi].priority for mi, _, _ in prog.cols]
    order = sorted(set(prios), reverse=True)
    first = prog.first_baseline
    levels = [[j for j in pins if prios[j] == prio] for prio in order]
    levels = [lv for lv in levels if lv]
    for prio in order:
        base = [
            first + g for g, (mi, _) in enumerate(prog.baselines) if profiles[mi].priority == prio
        ]
        levels += [base] if base else []
        levels.append([j for j, q in enumerate(prios) if q == prio])
    everything = np.arange(total, dtype=np.int32)
    optimal = True
    solution: list[float] | None = None
    status = "Not Set"
    for members in levels:
        h.changeColsCost(total, everything, prog.objective(members))
        level = _solve_level(prog, members)
        if optimal:  # after the first unproven level its status is the one that matters
            status = level[0]
            optimal = status == "Optimal"
        if level[1] is None:
            return False, solution, status
        solution, best = level[1], level[2]
        h.addRow(
            float(best), inf, len(members), np.array(members, dtype=np.int32), np.ones(len(members))
        )
    return optimal, solution, status


def _solve_level(prog: _Program, members: list[int]) -> tuple[str, list[float] | None, int]:
    """Solve one ladder level: (HiGHS status text, the solution or ``None`` when none was
    found, how many of ``members`` the solution places).

    The count is read from the solution itself, not from HiGHS's objective value: offered a
    start, HiGHS has answered with the start's own values beside the objective of a better
    plan (64x32 seed 94 at priority 1: 52 placed, 54 reported), and a floor of 54 then made
    the next level infeasible. When that happens the level is solved again without the
    start; if the two still disagree, the status says so and the level is not proven."""
    h = prog.h
    for _attempt in range(2):
        prog.run()
        status = h.modelStatusToString(h.getModelStatus())
        if not h.getInfo().primal_solution_status:
            return status, None, 0
        solution = _solution(h, prog.total)
        placed, reported = round(sum(solution[j] for j in members)), _found(h)
        if placed >= reported or prog.start is None:
            break
        prog.start = None  # the start's values came back: solve again without it
        h.clearSolver()  # and without the incumbent HiGHS kept from that solve
    if placed < reported:
        status = f"{status}, but its solution places {placed} of the {reported} it reports"
    return status, solution, placed


def _objective(h: Any, inf: float, ceiling: int) -> tuple[int, int]:
    """(best placed count found, proven upper bound) of the last solve.

    ``ceiling`` is the bound that needs no solve (:meth:`_Program.ceiling`); it is the
    answer when HiGHS stopped before proving any bound of its own (its dual bound is then
    infinite), and it caps a proven bound too.
    """
    info = h.getInfo()
    found = _found(h)
    dual = info.mip_dual_bound
    bound = min(ceiling, int(-dual + 1e-6)) if abs(dual) < inf else ceiling
    return found, max(found, bound)


def _found(h: Any) -> int:
    """Replicas (of the objective's columns) in the last solve's best solution; 0 if none."""
    info = h.getInfo()
    return round(-info.objective_function_value) if info.primal_solution_status else 0


def _solution(h: Any, n: int) -> list[float]:
    info = h.getInfo()
    return list(h.getSolution().col_value) if info.primal_solution_status else [0.0] * n
