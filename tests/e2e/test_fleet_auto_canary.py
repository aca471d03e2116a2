"""``auto`` coding traffic earns a coding canary on spare capacity, and never evicts (issue 13).

One three-host logical fleet with real llama-server engines, started through the shipped CLI.
Every model fills a host (one model per host). The operator gives the models workload scores:
``tiny-coder`` is the coding model (and, to give auto demand every reason to take a host,
outranks the directly used model and may grow to three replicas), ``tiny-general`` the
general one, ``tiny-writer`` none. ``tiny-general`` is the baseline on one host; a client
keeps ``tiny-writer`` in direct use on another with named requests; the third host is spare.
The coder gets its coding score only once the writer is in use: with one idle host, that host
is the fleet's node-failure reserve, so the coder cannot stand by there before any coding
request (the portfolio's standby), and only the admission gate can bring it.

1. Three ``auto`` requests about code are classified as coding. The first two are answered
   by whatever is ready (the router's fallback) while the coding workload waits below the
   admission gate; the third admits it, and the allocator loads ``tiny-coder`` on the spare
   host. An observer polls the admission rows all along (the operator's status API), records
   every step it sees with its time, and the next ``auto`` request is answered by the coder.
2. A burst of concurrent ``auto`` coding requests then asks for more coder replicas than the
   spare host holds. The only other hosts hold the baseline and the directly used model:
   the burst must leave both in place. ``tiny-writer`` stays ready on its host throughout
   (never drained, unloaded, reloaded or named as an eviction) and its named requests keep
   getting answers.

The observed steps are printed (evidence for the issue); assertions are on what happened and
in which order, never on wall-clock times (specification, "Proactive observation and
portfolio planning": workload demand fills spare capacity but never evicts, the admission
gate, and the per-workload admission rows).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fleet_cli import CONVERGE_S as WAIT_S
from fleet_cli import ChatFleet, chat_fleet, grid, wait_for
from ports import port

pytestmark = pytest.mark.e2e

ENGINE_PORT_BASE = port(24100)
"""Engine ports for this module's fleet: clear of the other e2e fleets' ranges."""
MACHINES = 3
"""Hosts: the baseline's, the directly used model's, and one spare."""
HOST_GIB = 3
"""Each logical host's memory (GiB): any two of the fleet's models exceed one host."""
GENERAL, CODER, WRITER = "tiny-general.gguf", "tiny-coder.gguf", "tiny-writer.gguf"
"""The fleet's baseline, its coding model, and the model a client uses by name."""
PROFILES: dict[str, dict[str, object]] = {
    CODER: {"workload_scores": {"coding": 1.0}, "priority": 100, "max_replicas": MACHINES},
    GENERAL: {"workload_scores": {"general": 1.0}},
    WRITER: {"priority": 20},
}
"""The operator's changes to the fleet's default profiles: workload scores, and a coder that
outranks the directly used writer and may want every host (so only the rule that workload
demand never evicts keeps the writer in place)."""
CODING_PROMPTS = (
    "Why does this python function raise a KeyError?",
    "Refactor this class so the unit test passes.",
    "Write a regex for a git merge commit message.",
)
"""Three distinct requests the built-in classifier reads as coding (the gate's observations)."""
BURST_PROMPT = "Debug the stack trace of this python module: {i}"
"""The burst's coding request (``{i}``: the client's number)."""
STEP_ORDER = ("awaiting-plan", "planned", "starting", "ready")
"""The admission states a newly seen workload passes through, in the order a user sees them."""
REQUIRED_STEPS = frozenset({"awaiting-plan", "planned", "ready"})
"""Steps the observer must see. ``starting`` lasts only while a node reports the tiny coder
loading or warming (well under a heartbeat on an idle machine), so it is recorded when seen
but not required."""
POLL_S = 0.1
"""Observer's status poll interval (s): ``planned`` lasts from the admitting pass until the
node reports the coder loaded and warmed (0.4 s on an idle machine); a status read costs a
few milliseconds."""
NAMED_GAP_S = 0.2
"""Pause between the directly used model's named requests (s): it is busy all test long."""
BURST_CLIENTS = 16
"""Concurrent ``auto`` clients in the burst: more than one coder replica's four slots."""
BURST_S = 12.0
"""How long each burst client keeps sending (s)."""
BURST_MAX_TOKENS = 48
"""Tokens per burst reply (``ignore_eos``): each request occupies an engine slot a while."""
MIN_NAMED_ANSWERS = 10
"""Named answers the directly used model must give while observed (it was really in use)."""
SAME_LOAD_S = 1.0
"""Spread of a replica's reported ``loaded_at`` (s) that is still one load: the node derives
it from a monotonic clock each heartbeat (microsecond jitter), while a reload comes after a
drain, an unload, a load and a warm, each at least a heartbeat apart."""
FLEET_GRID = "test-fleet"
"""The name ``grid test start`` registers the fleet under (``--grid test-fleet``)."""
WIDE = {"COLUMNS": "250"}
"""A wide terminal for the text status, so an admission row fits one line."""


@dataclass(frozen=True)
class Step:
    """One admission state of the coding workload as the observer first saw it.

    Attributes:
        at: monotonic seconds; state, model_id, reason: the row's fields.
    """

    at: float
    state: str
    model_id: str | None
    observations: int
    desired: int
    ready: int
    reason: str


@dataclass
class Observer:
    """Polls the operator's status every :data:`POLL_S` on a thread: the coding admission
    steps, the writer's residency on every host, and any plan eviction or action naming it."""

    fleet: Fleet
    steps: list[Step] = field(default_factory=list)
    writer: set[tuple[str, str, float | None]] = field(default_factory=set)
    """(host, state, loaded_at) of every writer residency seen; ("-", "absent", None) for a
    poll that found none."""
    evictions: list[dict[str, Any]] = field(default_factory=list)
    polls: int = 0
    max_desired: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def row(self) -> Step | None:
        return self.steps[-1] if self.steps else None

    def poll(self) -> None:
        ctl = self.fleet.controller()
        if not ctl:
            return
        self.polls += 1
        homes = [
            (h["host_id"], r["state"], r.get("loaded_at"))
            for h in ctl.get("hosts") or []
            for r in h.get("residencies") or []
            if r["model_id"] == WRITER
        ]
        self.writer.update(homes or [("-", "absent", None)])
        plan = ctl.get("plan") or {}
        self.evictions += [e for e in plan.get("evictions") or [] if e.get("model_id") == WRITER]
        rows = (ctl.get("portfolio") or {}).get("admissions") or []
        got = next((r for r in rows if r["workload"] == "coding"), None)
        if got is None:
            return
        self.max_desired = max(self.max_desired, got.get("desired", 0))
        step = Step(
            at=time.monotonic(),
            state=got["state"],
            model_id=got.get("model_id"),
            observations=got.get("observations", 0),
            desired=got.get("desired", 0),
            ready=got.get("ready", 0),
            reason=got["reason"],
        )
        last = self.row()
        if last is None or (last.state, last.observations) != (step.state, step.observations):
            self.steps.append(step)

    def run(self) -> None:
        while not self.stop.is_set():
            self.poll()
            self.stop.wait(POLL_S)


@dataclass
class NamedUse:
    """A client using :data:`WRITER` by name on a thread: one request every
    :data:`NAMED_GAP_S`; ``codes`` holds every answer's status."""

    fleet: Fleet
    codes: list[int] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            self.codes.append(self.fleet.chat(WRITER, "Write a short poem about rain.")[0])
            self.stop.wait(NAMED_GAP_S)


class Fleet(ChatFleet):
    """The fleet as an operator (status, profiles) and a client (chat) see it."""

    def __init__(self, home: Path, url: str, token: str) -> None:
        super().__init__(home, url, token, max_connections=4 * BURST_CLIENTS)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    home = tmp_path_factory.mktemp("auto-canary-home")
    with chat_fleet(
        Fleet, home, machines=MACHINES, engine_port_base=ENGINE_PORT_BASE, gib=HOST_GIB
    ) as f:
        yield f


def _thread(target: Callable[[], None]) -> threading.Thread:
    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t


def _ordered(steps: list[Step]) -> list[str]:
    """The distinct states in the order seen (repeats of one state collapsed)."""
    out: list[str] = []
    for s in steps:
        if not out or out[-1] != s.state:
            out.append(s.state)
    return out


def _settled(fleet: Fleet) -> tuple[str, str]:
    """(the writer's host, the spare host) once the fleet holds the writer on one host and
    leaves exactly one host empty. A changed profile can move or add a replica for a while
    on a slow machine; the failure message shows what the hosts held instead."""

    def hosts() -> tuple[str, str] | None:
        placed = fleet.placement()
        writers = [h for h, ms in placed.items() if WRITER in ms]
        empty = [h for h, ms in placed.items() if not ms]
        return (writers[0], empty[0]) if len(writers) == 1 and len(empty) == 1 else None

    try:
        return wait_for(hosts, "the writer on one host and one host spare", WAIT_S)
    except AssertionError as exc:
        ctl = fleet.controller()
        held = {
            h["host_id"]: [(r["model_id"], r["state"]) for r in h.get("residencies") or []]
            for h in ctl.get("hosts") or []
        }
        desired = (ctl.get("plan") or {}).get("desired")
        why = fleet.http.get(f"{fleet.url}/allocator/explain/{CODER}", headers=fleet.ops).text
        msg = (
            f"{exc}; hosts hold {held}; the plan wants {desired}; why {CODER}: {why}; "
            f"portfolio: {ctl.get('portfolio')}; demand: {ctl.get('demand')}"
        )
        raise AssertionError(msg) from exc


def _canary(fleet: Fleet, seen: Observer, since: float) -> tuple[str, str, float]:
    """Step 1: the coding requests and the canary's steps (actions created at or after
    ``since``, Unix s, are the test's); returns (the spare host the coder
    was loaded on, the writer's host, monotonic time of the first coding request)."""
    writer_host, spare = _settled(fleet)
    asked = time.monotonic()
    for i, text in enumerate(CODING_PROMPTS):
        # Below the gate, the coder is nowhere: the router's fallback answers.
        assert not [h for h, ms in fleet.placement().items() if CODER in ms]
        assert fleet.answered("auto", text) != CODER
        if i + 1 < len(CODING_PROMPTS):
            wait_for(
                lambda n=i + 1: (r := seen.row()) is not None and r.observations == n,
                f"the coding row counting {i + 1} observation(s)",
                WAIT_S,
            )
    wait_for(lambda: (r := seen.row()) is not None and r.state == "ready", "coding ready", WAIT_S)
    assert fleet.answered("auto", "Fix the bug in this python function.") == CODER
    after = fleet.placement()
    assert [h for h, ms in after.items() if CODER in ms] == [spare], after
    assert WRITER in after[writer_host] and writer_host != spare
    # The canary's own actions: a load and a warm on the spare host, evicting nothing.
    canary = sorted(
        (a["kind"], a["host_id"], a["status"], a["eviction"], a["beneficiary"])
        for a in fleet.actions(since)
        if a["model_id"] == CODER
    )
    assert canary == [(k, spare, "succeeded", False, None) for k in ("load", "warm")], canary
    return spare, writer_host, asked


def _print_steps(title: str, steps: list[Step], since: float) -> None:
    print(f"\n{title}")
    for s in steps:
        print(
            f"  +{s.at - since:6.2f} s  {s.state:<14} model={s.model_id or '-':<18} "
            f"seen={s.observations} desired/ready={s.desired}/{s.ready}  {s.reason}"
        )


def _check_cli(fleet: Fleet) -> None:
    """``grid allocator status`` (JSON and text) shows the coding row with the coder."""
    out = grid(fleet.home, "allocator", "status", "--json", "--grid", FLEET_GRID)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = json.loads(out.stdout)["controller"]["portfolio"]["admissions"]
    [row] = [r for r in rows if r["workload"] == "coding"]
    assert row["model_id"] == CODER and row["state"] in ("ready", "undersupplied"), row
    text = grid(fleet.home, "allocator", "status", "--grid", FLEET_GRID, extra_env=WIDE)
    assert text.returncode == 0, text.stdout + text.stderr
    assert "Workload admission" in text.stdout, text.stdout
    line = next(ln for ln in text.stdout.splitlines() if "coding" in ln and CODER in ln)
    print("operator's text status (first line of the row): " + " ".join(line.split()))
    print(f"operator's JSON status: {row['state']} {row['model_id']}: {row['reason']}")


def test_auto_coding_traffic_earns_a_canary_on_spare_capacity_and_never_evicts(
    fleet: Fleet,
) -> None:
    since = time.time()
    for model in (GENERAL, WRITER):
        fleet.put_profile(model, PROFILES[model])
    wait_for(lambda: GENERAL in set().union(*fleet.placement().values()), "baseline", WAIT_S)
    # A client starts using the writer by name (its first request cold-starts it) and keeps
    # using it for the rest of the test.
    assert fleet.answered(WRITER, "Write a short poem about rain.") == WRITER
    wait_for(lambda: fleet.ready_on(WRITER), "the writer reported ready", WAIT_S)
    # Only now does the coder score for coding. Scored earlier, while two hosts were still
    # idle, it could stand by on one of them before any coding request (the portfolio's
    # standby keeps one idle host as the node-failure reserve and may use the rest); with one
    # idle host left that host is the reserve, so only the admission gate can place it.
    fleet.put_profile(CODER, PROFILES[CODER])
    assert fleet.profile(CODER)["workload_scores"]["coding"] > 0
    named, seen = NamedUse(fleet), Observer(fleet)
    workers = [_thread(named.run), _thread(seen.run)]
    try:
        spare, writer_host, asked = _canary(fleet, seen, since)
        canary_steps = list(seen.steps)
        answers = fleet.burst("auto", BURST_PROMPT, BURST_CLIENTS, BURST_S, BURST_MAX_TOKENS)
        wait_for(lambda: len(named.codes) >= MIN_NAMED_ANSWERS, "named answers", WAIT_S)
    finally:
        named.stop.set()
        seen.stop.set()
        for w in workers:
            w.join(WAIT_S)
    _print_steps(f"coding admission steps (coder loaded on {spare}):", canary_steps, asked)
    _print_steps("during the auto burst:", seen.steps[len(canary_steps) :], asked)

    # The order a user sees: each step later in STEP_ORDER than the one before it, the
    # required ones all seen, and every chosen model the coder.
    order = _ordered(canary_steps)
    assert set(order) <= set(STEP_ORDER), order
    assert order == sorted(order, key=STEP_ORDER.index), order
    assert set(order) >= REQUIRED_STEPS, order
    assert {s.model_id for s in canary_steps if s.state != "awaiting-plan"} == {CODER}
    assert [s.observations for s in canary_steps if s.state == "awaiting-plan"] == [1, 2]

    # The burst asked for more coder capacity than the spare host gives (the row says why the
    # missing replicas wait), yet the writer was never drained, unloaded, reloaded or made an
    # eviction victim, and kept answering.
    assert seen.max_desired > 1, seen.steps
    short = [s for s in seen.steps[len(canary_steps) :] if s.state == "undersupplied"]
    assert short and all("; " in s.reason for s in short), seen.steps  # the count and why
    assert answers[(200, CODER)] > 0 and {c for c, _ in answers} <= {200, 503}, answers
    assert {(h, s) for h, s, _ in seen.writer} == {(writer_host, "ready")}, seen.writer
    born = [t or 0.0 for _, _, t in seen.writer]
    assert max(born) - min(born) < SAME_LOAD_S, seen.writer  # one load, never a reload
    assert not seen.evictions, seen.evictions
    moves = [
        (a["kind"], a["model_id"], a["host_id"])
        for a in fleet.actions(since)
        if a["kind"] in ("drain", "unload") or a.get("eviction")
    ]
    assert not moves, moves
    assert set(named.codes) == {200}, Counter(named.codes)
    _check_cli(fleet)
    print(
        f"auto burst: {sum(answers.values())} requests from {BURST_CLIENTS} clients, answers "
        f"{dict(answers)}; the coding row wanted up to {seen.max_desired} coder replicas; "
        f"{len(named.codes)} named {WRITER} requests all answered 200; "
        f"{seen.polls} status polls saw {WRITER} only ready on {writer_host}"
    )
