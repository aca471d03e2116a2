"""``grid test demo``: a scripted, self-checking workday driven only by real requests.

Source: the specification's "Single-machine scenario lab and logical fleet test" (persistent
fixture demo). Nothing is injected: the allocator sees only the requests below, arriving
through ``/v1/chat/completions`` and answered by real llama-server children.

Phases (each has a deadline; a phase that does not converge fails the demo by name):

a. baseline — the fleet holds exactly one ready baseline replica and it answers;
b. cold model — the low-priority model is requested cold: an honest 503 + Retry-After, then
   the allocator loads and warms it and the client's retries get an answer;
c. scale-out — concurrent users with stable affinity keys drive the baseline to
   ``min(3, hosts)`` ready replicas on distinct hosts;
d. priority burst — with the fleet full and the earlier traffic still running, a burst for
   the high-priority model makes the allocator drain (then unload) a lower-priority
   residency and load the high-priority model in its place;
e. cooldown — all traffic stops; demand expires by itself; optional models drain and
   unload and the fleet returns to the baseline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from grid_core.api import AsyncGridClient, Calls, GridError, wait_until
from grid_fleet import observe, traffic
from grid_fleet.layout import FleetRecord, ModelSpec

PHASE_DEADLINE_S = {"a": 120.0, "b": 120.0, "c": 240.0, "d": 240.0, "e": 240.0}
"""Per-phase convergence budgets (seconds) on a busy 2-core machine. Typical phases take a
fraction: 1 s heartbeats, 30 s demand window, 15 s cooldown/residency (see layout)."""
SCALE_TARGET = 3
"""Replicas the baseline model scales out to (or the host count, when smaller)."""
BURST_USERS = 3
"""Concurrent users of the high-priority burst."""
TRICKLE_INTERVAL_S = 2.0
"""Seconds between low-priority requests during the burst: keeps that model genuinely
wanted, so the fleet is full of demanded work and the burst needs preemption."""
OBSERVE_S = observe.POLL_S
MIN_HOSTS = 2
"""One host holds exactly one replica: the cold-model phase needs a second host."""


class DemoFailure(GridError):
    """A demo phase did not converge or a check failed (message names the phase)."""

    exit_code = 1


@dataclass
class PhaseReport:
    """Measured facts of one phase."""

    name: str
    title: str
    seconds: float = 0.0
    outcomes: list[traffic.Outcome] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    closed: bool = False
    """Set when the phase's line is printed: its counts are final from then on."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "phase": self.name,
            "title": self.title,
            "seconds": round(self.seconds, 1),
            **traffic.summarize(self.outcomes),
            "notes": self.notes,
        }


@dataclass
class Demo:
    """One demo run against a running fleet.

    Args:
        fleet: the fleet record (URL, hosts, models with priorities).
        users: concurrent users in the scale-out phase.
        requests: requests each user sends at least (phase c) / burst size (phase d).
        max_tokens: completion tokens per request.
        echo: where progress lines go.
    """

    fleet: FleetRecord
    users: int = 6
    requests: int = 12
    max_tokens: int = 16
    echo: Callable[[str], None] = print
    obs: observe.Observer = field(init=False)
    t0: float = field(default_factory=time.time)
    phases: list[PhaseReport] = field(default_factory=list)
    late: int = 0
    """Background answers that arrived after the last phase closed (not in any phase)."""

    def __post_init__(self) -> None:
        self.obs = observe.Observer(self.fleet.url)
        by_priority = sorted(self.fleet.models, key=lambda m: m.priority)
        self.baseline = next(m for m in self.fleet.models if m.min_replicas >= 1)
        optional = [m for m in by_priority if m.min_replicas == 0]
        if len(optional) < 2:
            msg = "the demo needs one baseline model and two optional models of different priority"
            raise DemoFailure(msg)
        self.low: ModelSpec = optional[0]
        self.high: ModelSpec = optional[-1]
        self.target = min(SCALE_TARGET, len(self.fleet.hosts), self.baseline.max_replicas)
        if len(self.fleet.hosts) < MIN_HOSTS:
            msg = (
                f"the demo needs at least {MIN_HOSTS} logical hosts (one host cannot hold "
                "the baseline and another model at once); start with --machines 2 or more"
            )
            raise DemoFailure(msg)

    # --- observation ------------------------------------------------------------------------
    async def _watch(self, client: httpx.AsyncClient) -> None:
        grid = AsyncGridClient(self.fleet.url, http=client)
        while True:
            try:
                for ev in self.obs.update(await grid.send(Calls.status(detail=True))):
                    self.echo("  " + ev.line(self.t0))
            except GridError as exc:
                self.echo(f"  (status read failed: {type(exc).__name__})")
            await anyio.sleep(OBSERVE_S)

    def _ready(self, model: str) -> int:
        return observe.ready_counts(self.obs.last).get(model, 0)

    def _resident(self) -> dict[tuple[str, str], str]:
        return {
            k: v
            for k, v in observe.residencies(self.obs.last).items()
            if v not in ("cached", observe.GONE)
        }

    async def _until(
        self, phase: str, deadline: float, cond: Callable[[], bool], what: Callable[[], str]
    ) -> None:
        left = max(0.0, deadline - time.monotonic())
        if not await wait_until(cond, timeout_s=left, interval_s=OBSERVE_S):
            msg = (
                f"demo phase ({phase}) did not converge within "
                f"{PHASE_DEADLINE_S[phase]:.0f} s: {what()}"
            )
            raise DemoFailure(msg)

    def _check(self, phase: str, outcomes: list[traffic.Outcome]) -> None:
        bad = [o for o in outcomes if not o.ok]
        if bad:
            msg = (
                f"demo phase ({phase}): {len(bad)} of {len(outcomes)} requests failed; "
                f"first: {bad[0].model}: {bad[0].error}"
            )
            raise DemoFailure(msg)

    async def _ask(
        self, client: httpx.AsyncClient, model: str, key: str, deadline: float, salt: int = 0
    ) -> traffic.Outcome:
        return await traffic.chat(
            client,
            self.fleet.url,
            model,
            prompt=traffic.prompt_of(12, salt),
            max_tokens=self.max_tokens,
            affinity_key=key,
            retry_until=deadline,
        )

    def _begin(self, name: str, title: str) -> tuple[PhaseReport, float, float]:
        self.echo(f"\n== phase ({name}) {title}")
        rep = PhaseReport(name, title)
        self.phases.append(rep)
        return rep, time.monotonic(), time.monotonic() + PHASE_DEADLINE_S[name]

    def _record(self, outcome: traffic.Outcome) -> None:
        """File a background request under the phase in which it completed.

        The user loops outlive phase (c); counting each answer in the phase that was running
        when it arrived keeps every phase's numbers to its own requests, and a phase's line
        printed at its end equals its row in the final table (a closed phase takes nothing).
        """
        rep = self.phases[-1] if self.phases else None
        if rep is not None and not rep.closed:
            rep.outcomes.append(outcome)
        else:
            self.late += 1

    def _end(self, rep: PhaseReport, started: float) -> None:
        rep.closed = True
        rep.seconds = time.monotonic() - started
        s = traffic.summarize(rep.outcomes)
        p50 = f"{s['p50_ms']:.0f}" if s["p50_ms"] is not None else "-"
        mx = f"{s['max_ms']:.0f}" if s["max_ms"] is not None else "-"
        self.echo(
            f"   phase ({rep.name}) passed in {rep.seconds:.1f} s: {s['served']}/"
            f"{s['requests']} answered, latency p50 {p50} ms max {mx} ms "
            "(client-visible, retries included)"
        )
        for n in rep.notes:
            self.echo(f"   - {n}")

    # --- phases ---------------------------------------------------------------------------------
    async def phase_a(self, client: httpx.AsyncClient) -> None:
        rep, started, deadline = self._begin("a", f"baseline: one ready {self.baseline.model_id}")
        base = self.baseline.model_id

        def at_baseline() -> bool:
            res = self._resident()
            return self._ready(base) == 1 and all(m == base for (_h, m) in res)

        await self._until(
            "a", deadline, at_baseline, lambda: f"resident now: {sorted(self._resident().items())}"
        )
        for i in range(2):
            rep.outcomes.append(await self._ask(client, base, "user-1", deadline, i))
        self._check("a", rep.outcomes)
        rep.notes.append(
            f"first answer id {rep.outcomes[0].response_id}, "
            f"{rep.outcomes[0].completion_tokens} tokens"
        )
        self._end(rep, started)

    async def phase_b(self, client: httpx.AsyncClient) -> None:
        low = self.low.model_id
        rep, started, deadline = self._begin(
            "b", f"cold model {low}: 503 + Retry-After, then load, warm and answer"
        )
        out = await self._ask(client, low, "user-2", deadline)
        rep.outcomes.append(out)
        self._check("b", rep.outcomes)
        if out.first_status != 503 or not out.retry_after:
            msg = (
                f"demo phase (b): the first request for cold {low} got "
                f"{out.first_status} (Retry-After {out.retry_after!r}), expected 503 with "
                "Retry-After"
            )
            raise DemoFailure(msg)
        rep.notes.append(
            f"first attempt 503 with Retry-After {out.retry_after}; answered "
            f"after {out.attempts - 1} retries, {out.latency_s:.1f} s "
            "client-visible"
        )
        for i in range(2):
            rep.outcomes.append(await self._ask(client, low, "user-2", deadline, i + 1))
        self._check("b", rep.outcomes)
        self._end(rep, started)

    async def _user_loop(
        self,
        client: httpx.AsyncClient,
        model: str,
        key: str,
        stop: anyio.Event,
        deadline: float,
        pause_s: float = 0.0,
    ) -> None:
        i = 0
        while not stop.is_set() and time.monotonic() < deadline:
            self._record(await self._ask(client, model, key, deadline, i))
            i += 1
            if pause_s:
                with anyio.move_on_after(pause_s):
                    await stop.wait()

    async def phase_c(
        self,
        client: httpx.AsyncClient,
        tg: anyio.abc.TaskGroup,
        stop: anyio.Event,
    ) -> None:
        base = self.baseline.model_id
        rep, started, deadline = self._begin(
            "c",
            f"scale-out: {self.users} users with affinity keys drive {base} to "
            f"{self.target} replicas",
        )
        until = deadline + PHASE_DEADLINE_S["d"]
        for u in range(self.users):
            tg.start_soon(self._user_loop, client, base, f"user-{u + 1}", stop, until)
        if self.target < len(self.fleet.hosts):
            # Room for the low-priority model beside the scaled-out baseline: keep it wanted
            # (a slow trickle) so the fleet is full of demanded work when the burst comes.
            tg.start_soon(
                self._user_loop,
                client,
                self.low.model_id,
                "user-trickle",
                stop,
                until,
                TRICKLE_INTERVAL_S,
            )
            rep.notes.append(
                f"{self.low.model_id} kept wanted by one request every {TRICKLE_INTERVAL_S:.0f} s"
            )

        def spread() -> bool:
            hosts = {
                h
                for (h, m), s in observe.residencies(self.obs.last).items()
                if m == base and s == "ready"
            }
            return len(hosts) >= self.target and len(rep.outcomes) >= self.requests

        await self._until(
            "c",
            deadline,
            spread,
            lambda: (
                f"{base} has {self._ready(base)} ready replicas, wanted "
                f"{self.target}; {len(rep.outcomes)} requests answered"
            ),
        )
        self._check("c", rep.outcomes)
        hosts = sorted(
            h
            for (h, m), s in observe.residencies(self.obs.last).items()
            if m == base and s == "ready"
        )
        rep.notes.append(f"{base} ready on {', '.join(hosts)}")
        self._end(rep, started)

    async def phase_d(self, client: httpx.AsyncClient) -> None:
        high = self.high
        rep, started, deadline = self._begin(
            "d",
            f"priority burst: {high.model_id} (priority {high.priority}) while the "
            "earlier traffic continues",
        )
        hosts = {h.host_id for h in self.fleet.hosts}
        busy = {h for (h, _m) in self._resident()}
        rep.notes.append(
            f"fleet at burst start: {len(busy)}/{len(hosts)} hosts hold a replica "
            f"({', '.join(f'{h}:{m}' for (h, m) in sorted(self._resident()))})"
        )
        idle = sorted(hosts - busy)
        since = time.time()
        burst: list[traffic.Outcome] = []
        async with anyio.create_task_group() as inner:
            for u in range(BURST_USERS):
                inner.start_soon(
                    self._burst_user, client, high.model_id, f"burst-{u + 1}", deadline, burst
                )
        rep.outcomes.extend(burst)
        self._check_d(rep, note=False)
        if idle and len(hosts) > self.target + 1:
            # More hosts than the workday can fill (baseline replicas plus the low-priority
            # model): the burst fits without preemption, and the demo does not pretend
            # otherwise.
            rep.notes.append(
                f"fleet not full ({', '.join(idle)} idle): {high.model_id} was "
                "placed without preemption"
            )
            self._check_d(rep)
            self._end(rep, started)
            return
        await self._until(
            "d",
            deadline,
            lambda: self._preempted(since) is not None,
            lambda: f"no lower-priority residency was drained and unloaded for {high.model_id}",
        )
        host, victim = self._preempted(since) or ("?", "?")
        rep.notes.append(
            f"preempted {victim} on {host}: drained before unload, then "
            f"{high.model_id} loaded there"
        )
        self._check_d(rep)
        self._end(rep, started)

    def _check_d(self, rep: PhaseReport, note: bool = True) -> None:
        """Every phase (d) request must be answered, except that the preempted low-priority
        model may answer 503 while it has no replica: that is the honest outcome of the
        eviction, so it is counted and reported, not hidden and not a failure.

        Raises:
            DemoFailure: any other request failed.
        """
        low = self.low.model_id

        def evicted(o: traffic.Outcome) -> bool:
            return o.status == 503 and o.model == low

        self._check("d", [o for o in rep.outcomes if not evicted(o)])
        n = sum(1 for o in rep.outcomes if evicted(o))
        if n and note:
            rep.notes.append(
                f"{n} request(s) for {low} got 503 after its replica was evicted "
                "(counted in the 503 column)"
            )

    async def _burst_user(
        self,
        client: httpx.AsyncClient,
        model: str,
        key: str,
        deadline: float,
        sink: list[traffic.Outcome],
    ) -> None:
        for i in range(max(1, self.requests // BURST_USERS)):
            sink.append(await self._ask(client, model, key, deadline, i))

    def _preempted(self, since: float) -> tuple[str, str] | None:
        """(host, victim): an eviction of a lower-priority replica created after ``since``
        whose drain succeeded before its unload succeeded, on a host where the
        high-priority model is now ready. Read from the action records (a drain can finish
        between two status reads, so the residency state alone could miss it)."""
        prio = {m.model_id: m.priority for m in self.fleet.models}
        acts = list(self.obs.seen.values())
        ready = observe.residencies(self.obs.last)
        for unload in acts:
            if (
                unload.get("kind") != "unload"
                or unload.get("status") != "succeeded"
                or not unload.get("eviction")
                or float(unload.get("created_at") or 0) < since
                or prio.get(unload.get("model_id", ""), 0) >= self.high.priority
            ):
                continue
            host, victim = unload.get("host_id"), unload.get("model_id")
            drained = any(
                d.get("kind") == "drain"
                and d.get("status") == "succeeded"
                and d.get("host_id") == host
                and d.get("model_id") == victim
                and float(d.get("completed_at") or 0) <= float(unload.get("completed_at") or 0)
                and float(d.get("created_at") or 0) >= since
                for d in acts
            )
            if drained and ready.get((str(host), self.high.model_id)) == "ready":
                return str(host), str(victim)
        return None

    async def phase_e(self) -> None:
        base = self.baseline.model_id
        rep, started, deadline = self._begin(
            "e", "cooldown: traffic stopped, demand expires, fleet returns to baseline"
        )
        since = time.time()

        def at_baseline() -> bool:
            res = self._resident()
            return self._ready(base) == 1 and all(m == base for (_h, m) in res)

        await self._until(
            "e",
            deadline,
            at_baseline,
            lambda: f"still resident: {sorted(self._resident().items())}",
        )
        done = [
            a
            for a in self.obs.seen.values()
            if a.get("status") == "succeeded" and float(a.get("created_at") or 0) >= since
        ]
        drained = {(a.get("host_id"), a.get("model_id")) for a in done if a["kind"] == "drain"}
        unloaded = sorted(
            {(str(a.get("host_id")), str(a.get("model_id"))) for a in done if a["kind"] == "unload"}
        )
        rep.notes.append(
            "drained then unloaded: "
            + (", ".join(f"{m}@{h}" for h, m in unloaded if (h, m) in drained) or "none")
        )
        self._end(rep, started)

    # --- run ------------------------------------------------------------------------------------
    async def run(self) -> list[dict[str, Any]]:
        """Run every phase in order; raise :class:`DemoFailure` naming the failing phase."""
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=32)
        async with (
            httpx.AsyncClient(
                trust_env=False, limits=limits, timeout=traffic.REQUEST_TIMEOUT_S
            ) as client,
            httpx.AsyncClient(trust_env=False, timeout=30.0) as status_client,
            anyio.create_task_group() as watch,
        ):
            watch.start_soon(self._watch, status_client)
            await anyio.sleep(OBSERVE_S * 2)
            try:
                await self.phase_a(client)
                await self.phase_b(client)
                stop = anyio.Event()
                async with anyio.create_task_group() as users:
                    await self.phase_c(client, users, stop)
                    await self.phase_d(client)
                    stop.set()
                    # Requests still waiting (e.g. the trickle retrying a preempted
                    # model) are abandoned, not counted: phase (d) has closed.
                    users.cancel_scope.cancel()
                await self.phase_e()
            finally:
                watch.cancel_scope.cancel()
        return [p.as_dict() for p in self.phases]
