"""``grid test compete``: the allocator picks the measured winner of the coding portfolio.

Source: the specification's "Single-machine scenario lab and logical fleet test" (the real
competition) and "Proactive observation and portfolio planning" (labelled quality, evaluation
traffic, candidate feasibility). It runs against a running logical fleet (``grid test
start``) and talks only to the fleet's public routes:

1. measure — for each coding candidate in turn, a temporary profile edit asks for one
   replica, so the allocator loads it through its ordinary lifecycle (plan, load, warm);
   the eight questions of :mod:`grid_fleet.compete_score` go through the Grid router as
   operator-marked evaluation traffic (never demand); then a temporary impossible node tag
   makes the allocator drain and unload it, and the original profile is put back exactly;
2. evidence — every answer becomes one authenticated ``POST /allocator/evaluations`` with
   the configured artifact digest;
3. serve — with every candidate offloaded (one the allocator still holds, say for coding
   traffic an earlier run sent within the hour, is offloaded by the same temporary tag and
   put back), ordinary ``auto`` coding requests go through the normal request path until the
   model the allocator loaded answers; it must be the measured winner, on the host the plan
   chose for it;
4. constrain — the winner's profile requires a tag no host has: status must name the
   rejection, the winner must go and the runner-up must load and answer;
5. restore — the original profile comes back exactly and the winner serves again.

Every profile edit is journalled in ``fleet/compete-edits.json`` before it is sent and undone
on any failure (an interrupted run's journal is undone by the next run), so the operator's
profiles are never left half-edited. The command leaves the winner ready.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import msgspec

from grid_core.api import (
    Calls,
    EvaluationBody,
    GridClient,
    GridError,
    RequestRefused,
    write_atomic,
)
from grid_core.wire import OPERATOR_HEADER
from grid_fleet import compete_score as cs
from grid_fleet import observe
from grid_fleet.daemons import operator_token
from grid_fleet.layout import COMPETE_JOURNAL, FleetRecord
from grid_fleet.traffic import check_answer

T = TypeVar("T")
Echo = Callable[[str], None]

POLL_S = 1.0
"""Status reads while waiting: residency states last seconds at 1 s heartbeats."""
PROGRESS_S = 10.0
"""A progress line at least this often during a long wait."""
TRAFFIC_INTERVAL_S = 1.0
"""Gap between two ordinary ``auto`` requests while waiting for a model to serve them."""
REQUEST_TIMEOUT_S = 120.0
"""One inference request (a cold CPU engine under load answers well inside this)."""
SERVING = frozenset({"loading", "warming", "ready", "draining"})
"""Residency states that hold (or are about to hold) a model's memory: not offloaded."""
EVALUATION_HEADER = "X-Grid-Evaluation"
"""Marks inference as an evaluation; valid only with the operator capability."""


# --- reading the allocator's status ---------------------------------------------------------
def _ctl(status: dict[str, Any]) -> dict[str, Any]:
    return status.get("controller") or {}


def states(status: dict[str, Any], model_id: str) -> dict[str, str]:
    """``host → residency state`` of ``model_id`` (cached weights excluded)."""
    return {
        str(h.get("host_id")): str(r.get("state"))
        for h in _ctl(status).get("hosts") or ()
        for r in h.get("residencies") or ()
        if r.get("model_id") == model_id and r.get("state") != "cached"
    }


def ready_hosts(status: dict[str, Any], model_id: str) -> list[str]:
    """Hosts where ``model_id`` is ready, sorted."""
    return sorted(h for h, s in states(status, model_id).items() if s == "ready")


def planned_hosts(status: dict[str, Any], model_id: str) -> list[str]:
    """Hosts the authoritative plan assigns ``model_id`` to, sorted."""
    plan = _ctl(status).get("plan") or {}
    return sorted(
        str(a.get("host_id"))
        for a in plan.get("assignments") or ()
        if a.get("model_id") == model_id
    )


def candidate_row(status: dict[str, Any], model_id: str) -> dict[str, Any] | None:
    """The portfolio's candidate row of ``model_id`` for the coding workload, if shown."""
    for row in (_ctl(status).get("portfolio") or {}).get("candidates") or ():
        if row.get("workload") == cs.WORKLOAD and row.get("model_id") == model_id:
            return dict(row)
    return None


def admission_row(status: dict[str, Any]) -> dict[str, Any] | None:
    """The coding workload's admission row, if the workload is active."""
    for row in (_ctl(status).get("portfolio") or {}).get("admissions") or ():
        if row.get("workload") == cs.WORKLOAD:
            return dict(row)
    return None


def start_failure(status: dict[str, Any], model_id: str, since: float) -> str | None:
    """A load or warm of ``model_id`` that failed after ``since`` (Unix seconds), if any."""
    for key in ("history", "pending_commands"):
        for a in _ctl(status).get(key) or ():
            if (
                isinstance(a, dict)
                and a.get("model_id") == model_id
                and a.get("kind") in ("load", "warm")
                and a.get("status") in ("failed", "rejected")
                and float(a.get("created_at") or 0.0) >= since
            ):
                return f"{a['kind']} on {a.get('host_id')} failed: {a.get('message') or '?'}"
    return None


def not_real(doc: dict[str, Any]) -> str | None:
    """Why an answer is not a real completion (no id, no choice, no generated token), or
    ``None``. Empty text is allowed: a random-weight model may end its turn at once, which
    is still an answer the engine generated."""
    rid, _text, _pt, ct, _problem = check_answer(doc)
    choices = doc.get("choices")
    if not rid:
        return "no response id"
    if not isinstance(choices, list) or not choices:
        return "no choices"
    if ct <= 0:
        return "no usage.completion_tokens"
    return None


def _where(status: dict[str, Any], models: list[str]) -> str:
    """``model@host:state`` for the given models (progress and error text)."""
    parts = [f"{m}@{h}:{s}" for m in models for h, s in sorted(states(status, m).items())]
    return ", ".join(parts) or "none resident"


def choice(status: dict[str, Any]) -> str:
    """How the allocator chose the coding model: the portfolio's mapping of the admitted
    workload, or its standby leader on idle capacity before admission (docs/portfolio.md)."""
    portfolio = _ctl(status).get("portfolio") or {}
    mapping = (portfolio.get("mapping") or {}).get(cs.WORKLOAD)
    standby = (portfolio.get("standby") or {}).get(cs.WORKLOAD)
    if mapping or not standby:
        return f"mapped {cs.WORKLOAD} to {mapping}"
    return f"stands {standby} by for {cs.WORKLOAD} (idle capacity, before admission)"


def chosen_model(status: dict[str, Any]) -> str | None:
    """The model the allocator chose for the coding workload: the portfolio's mapping once the
    workload is admitted, else its standby leader; ``None`` while it has chosen neither."""
    portfolio = _ctl(status).get("portfolio") or {}
    mapped = (portfolio.get("mapping") or {}).get(cs.WORKLOAD)
    return mapped or (portfolio.get("standby") or {}).get(cs.WORKLOAD)


def another_choice(
    status: dict[str, Any], served: str | None, model_id: str, candidates: list[str]
) -> str | None:
    """Why an ``auto`` answer from another candidate than ``model_id`` shows the allocator
    chose that candidate (the message of the failure), or ``None`` when it does not.

    It shows that only when the allocator's choice (:func:`chosen_model`) is another
    candidate. Before it has chosen, or while its choice is not ready yet, the router answers
    an ``auto`` request with the ready model of the best configured score: such an answer
    says nothing about the allocator (seen on a 3-host fleet: both candidates became ready in
    the same second, the workload not yet admitted, and the configured favourite answered
    first).
    """
    chosen = chosen_model(status)
    if served == model_id or served not in candidates or chosen in (None, model_id):
        return None
    utility = {m: (candidate_row(status, m) or {}).get("utility") for m in candidates}
    return (
        f"the allocator served {cs.WORKLOAD} with {served}, not the measured winner "
        f"{model_id} ({choice(status)}; utilities {utility}); see the candidate rows in "
        "'grid allocator status'"
    )


def served_hosts(status: dict[str, Any], model_id: str, planned: list[str]) -> list[str] | None:
    """Where ``model_id``, which has just answered, is ready; ``None`` while status does not
    show it ready yet.

    The router sends traffic to an engine as soon as its warm command succeeds, up to one
    heartbeat before the host's residency report says ``ready``, so an answer can come from a
    replica that this status read still shows as cached or warming.

    Raises:
        CompeteError: it is ready on a host the plan did not choose (``planned``).
    """
    hosts = ready_hosts(status, model_id)
    if not hosts:
        return None
    if set(hosts) - set(planned):
        msg = (
            f"{model_id} answered from {hosts}, but the plan placed it on {planned}: the "
            "answer did not come from the planner-preferred host"
        )
        raise cs.CompeteError(msg)
    return hosts


# --- profile edits that are always undone --------------------------------------------------
class Edit(msgspec.Struct, kw_only=True):
    """One model's applied edit (journalled): the original profile and the version written."""

    original: dict[str, Any]
    original_version: str
    written_version: str


class ProfileEdits:
    """Temporary profile edits, journalled before they are sent and undone exactly.

    Every edit is computed from the profile as it was before the first edit, and written
    with ``If-Match`` on the version read (or last written), so an operator's change made
    meanwhile is never overwritten: the write is refused with 409 instead.
    """

    def __init__(self, client: GridClient, journal: Path, echo: Echo) -> None:
        self.client = client
        self.journal = journal
        self.echo = echo
        self.edits: dict[str, Edit] = {}

    def _save(self) -> None:
        if self.edits:
            write_atomic(self.journal, msgspec.json.encode(self.edits))
        else:
            self.journal.unlink(missing_ok=True)

    def recover(self) -> None:
        """Undo the edits an interrupted run left in the journal (each only if unchanged)."""
        if not self.journal.exists():
            return
        try:
            left = msgspec.json.decode(self.journal.read_bytes(), type=dict[str, Edit])
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            msg = (
                f"{self.journal} is unreadable ({exc}); check the profiles it names, then delete it"
            )
            raise cs.CompeteError(msg) from None
        self.edits = left
        self.echo(
            "grid: undoing the profile edits an interrupted run left on " + ", ".join(sorted(left))
        )
        problems = self.restore_all()
        if problems:
            raise cs.CompeteError("; ".join(problems))

    def apply(self, model_id: str, change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """Write ``change(original profile)`` for ``model_id``."""
        edit = self.edits.get(model_id)
        if edit is None:
            doc = self.client.send(Calls.get_model(model_id))
            edit = Edit(
                original=dict(doc["profile"]),
                original_version=str(doc["version"]),
                written_version=str(doc["version"]),
            )
            self.edits[model_id] = edit
            self._save()  # journalled before anything is changed
        answer = self.client.send(
            Calls.put_model(model_id, change(dict(edit.original)), if_version=edit.written_version)
        )
        edit.written_version = str(answer["version"])
        self._save()

    def restore(self, model_id: str) -> None:
        """Put ``model_id``'s original profile back and prove it is byte-for-byte the same.

        Raises:
            CompeteError: the server stored another version than the original.
            RequestRefused: 409 when someone changed the profile meanwhile (left as is).
        """
        edit = self.edits.get(model_id)
        if edit is None:
            return
        answer = self.client.send(
            Calls.put_model(model_id, edit.original, if_version=edit.written_version)
        )
        del self.edits[model_id]
        self._save()
        if answer.get("version") != edit.original_version:
            msg = (
                f"restoring {model_id}'s profile stored version {answer.get('version')}, not the "
                f"original {edit.original_version}; compare it with 'grid allocator model show'"
            )
            raise cs.CompeteError(msg)

    def restore_all(self) -> list[str]:
        """Restore every edited profile; the problems, one line each (empty when all went)."""
        problems = []
        for model_id in sorted(self.edits):
            try:
                self.restore(model_id)
            except RequestRefused as exc:
                self.edits.pop(model_id, None)
                self._save()
                problems.append(
                    f"{model_id}'s profile was changed by someone else during the run, so the "
                    f"original was not put back ({exc.message}); check it with 'grid allocator "
                    "model show'"
                )
            except GridError as exc:
                problems.append(f"restoring {model_id}'s profile failed: {exc}")
        return problems


# --- the run -----------------------------------------------------------------------------------
@dataclass
class Compete:
    """One competition against a running fleet.

    Args:
        fleet: the fleet record (URL).
        root: the fleet directory (operator token, edit journal).
        max_tokens: completion tokens per request.
        step_timeout_s: budget of each convergence wait (seconds).
        echo: where progress lines go.
    """

    fleet: FleetRecord
    root: Path
    max_tokens: int = cs.DEFAULT_MAX_TOKENS
    step_timeout_s: float = cs.DEFAULT_STEP_TIMEOUT_S
    echo: Echo = print
    steps: list[dict[str, Any]] = field(default_factory=list)
    results: list[cs.Result] = field(default_factory=list)
    served_by: dict[str, int] = field(default_factory=dict)
    """Ordinary ``auto`` answers by the model that served them (all steps)."""
    _asked: int = 0
    obs: observe.Observer = field(init=False)
    """Residency transitions seen by every status read (progress lines and the report)."""
    t0: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.obs = observe.Observer(self.fleet.url)

    def _read(self) -> dict[str, Any]:
        """One detailed status read; its new residency transitions are printed."""
        status = self.client.status(detail=True)
        for ev in self.obs.update(status):
            if ev.kind == "residency" and ev.note != observe.FIRST_READ:
                self.echo("  " + ev.line(self.t0))
        return status

    def run(self) -> dict[str, Any]:
        """Run every step; restore every profile edit whatever happens.

        Raises:
            CompeteError: a step failed (the message names it and what was seen).
            ValidationError: the fleet's candidates do not allow a competition.
        """
        token = operator_token(self.root)
        t0 = time.monotonic()
        with (
            GridClient(self.fleet.url, operator_token=token) as self.client,
            httpx.Client(trust_env=False, timeout=REQUEST_TIMEOUT_S) as self.http,
        ):
            self.token = token
            self.edits = ProfileEdits(self.client, self.root / COMPETE_JOURNAL, self.echo)
            self.edits.recover()
            try:
                report = self._run()
            except BaseException:
                edited = sorted(self.edits.edits)
                problems = self.edits.restore_all()
                for p in problems:
                    self.echo(f"grid: {p}")
                if edited and not problems:
                    self.echo(
                        f"grid: stopped; the temporary edits of {', '.join(edited)} are undone"
                    )
                raise
            problems = self.edits.restore_all()
            if problems:
                raise cs.CompeteError("; ".join(problems))
        report["seconds"] = round(time.monotonic() - t0, 1)
        return report

    def _run(self) -> dict[str, Any]:
        status = self._read()
        candidates = cs.candidates_of(_ctl(status).get("profiles") or ())
        self._check_tag_unused(status)
        names = [m for m, _ in candidates]
        self.echo(f"grid: {len(names)} {cs.WORKLOAD} candidates: {', '.join(names)}")
        for model_id, sha in candidates:
            self.results.append(self._measure(model_id, sha))
        with self._step("evidence") as note:
            cs.score_all(self.results)
            note(self._submit())
        best = cs.ranked(self.results)
        winner, runner_up = best[0], best[1]
        why = cs.why(winner, runner_up)
        self.echo(f"grid: measured winner {why}")
        note_line = cs.margin_note(winner, runner_up)
        if note_line is not None:
            self.echo(f"grid: warning: {note_line}")
        with self._step("serve") as note:
            note(self._serve(winner.model_id, names))
        with self._step("constrain") as note:
            note(self._constrain(winner.model_id, runner_up.model_id))
        with self._step("restore") as note:
            note(self._restore(winner.model_id, runner_up.model_id))
        return {
            "workload": cs.WORKLOAD,
            "winner": winner.model_id,
            "runner_up": runner_up.model_id,
            "why": cs.why(winner, runner_up),
            "score_margin": cs.margin(winner, runner_up),
            "decisive": note_line is None,
            "candidates": [cs.result_doc(r) for r in best],
            "steps": self.steps,
            "auto_served_by": dict(sorted(self.served_by.items())),
            "scoring": {
                "correctness_weight": cs.CORRECTNESS_WEIGHT,
                "latency_weight": cs.LATENCY_WEIGHT,
                "checker": "exact match of the first answer line (trimmed, case-insensitive)",
                "seed": cs.SEED,
                "temperature": cs.TEMPERATURE,
                "max_tokens": self.max_tokens,
            },
        }

    @contextmanager
    def _step(self, name: str) -> Iterator[Callable[[str], None]]:
        """Time one step; the body reports its one-line result through the callable."""
        self.echo(f"\n== {name}")
        t0 = time.monotonic()
        first = len(self.obs.events)
        row: dict[str, Any] = {"step": name, "seconds": 0.0, "detail": ""}

        def note(detail: str) -> None:
            row["detail"] = detail

        yield note
        row["seconds"] = round(time.monotonic() - t0, 1)
        row["transitions"] = [
            ev.line(self.t0).strip()
            for ev in self.obs.events[first:]
            if ev.kind == "residency" and ev.note != observe.FIRST_READ
        ]
        self.steps.append(row)
        self.echo(f"   {name} done in {row['seconds']:.1f} s: {row['detail']}")

    def _check_tag_unused(self, status: dict[str, Any]) -> None:
        """Refuse when a host carries the constraint tag (the constraint would not bind)."""
        for h in _ctl(status).get("hosts") or ():
            if cs.CONSTRAINT_TAG in (h.get("tags") or ()):
                msg = (
                    f"host {h.get('host_id')} carries the tag {cs.CONSTRAINT_TAG}, so requiring "
                    "it cannot make a model unplaceable; remove that tag from the host"
                )
                raise cs.CompeteError(msg)

    # --- waiting -------------------------------------------------------------------------------
    def _wait(
        self,
        what: str,
        check: Callable[[dict[str, Any]], T | None],
        describe: Callable[[dict[str, Any]], str],
        *,
        during: Callable[[], None] | None = None,
    ) -> T:
        """Poll status until ``check`` answers; a progress line every :data:`PROGRESS_S`.

        ``during`` runs between reads (ordinary traffic while waiting for a model to serve).

        Raises:
            CompeteError: the step budget ran out (names ``what`` and the last state seen).
        """
        t0 = time.monotonic()
        deadline = t0 + self.step_timeout_s
        shown = t0
        status: dict[str, Any] = {}
        while True:
            status = self._read()
            value = check(status)
            if value is not None:
                return value
            now = time.monotonic()
            if now >= deadline:
                msg = (
                    f"{what}: not reached within {self.step_timeout_s:.0f} s (now: "
                    f"{describe(status)}); see 'grid allocator status' and the host logs, or "
                    "raise --step-timeout-s on a busy machine"
                )
                raise cs.CompeteError(msg)
            if now - shown >= PROGRESS_S:
                shown = now
                self.echo(
                    f"   ... waiting for {what} ({now - t0:.0f} s so far); now: {describe(status)}"
                )
            if during is not None:
                during()
            time.sleep(POLL_S)

    def _wait_ready(self, model_id: str, since: float) -> str:
        """Wait until ``model_id`` is ready; return its host (the first ready one)."""

        def check(status: dict[str, Any]) -> str | None:
            failed = start_failure(status, model_id, since)
            if failed is not None:
                raise cs.CompeteError(f"the allocator could not start {model_id}: {failed}")
            hosts = ready_hosts(status, model_id)
            return hosts[0] if hosts else None

        return self._wait(f"{model_id} ready", check, lambda s: _where(s, [model_id]))

    def _wait_gone(self, models: list[str]) -> None:
        """Wait until none of ``models`` holds a host (drained and unloaded)."""
        self._wait(
            f"{', '.join(models)} offloaded",
            lambda s: (
                True if not any(SERVING & set(states(s, m).values()) for m in models) else None
            ),
            lambda s: _where(s, models),
        )

    def _shown_ready(self, model_id: str) -> list[str]:
        """Hosts where status shows ``model_id`` ready, once it does (it has just answered;
        see :func:`served_hosts`)."""
        return self._wait(
            f"status shows {model_id} ready",
            lambda s: ready_hosts(s, model_id) or None,
            lambda s: _where(s, [model_id]),
        )

    def _offload_held(self, models: list[str]) -> None:
        """Offload every one of ``models``: each gets the temporary impossible tag until none
        is resident, then its original profile back.

        The allocator may hold a candidate (a workload admitted by earlier ``auto`` traffic
        stays admitted while any of its requests is remembered, up to an hour; or standby on
        idle capacity), and it may place one again a moment after a status read showed none:
        so every candidate is constrained, whatever one read showed. Constraining only the
        resident one would let the allocator move the workload to another candidate.
        """
        status = self._read()
        held = [m for m in models if SERVING & set(states(status, m).values())]
        why = f"{', '.join(held)} still resident" if held else "none resident now"
        self.echo(
            f"   {why}; every candidate gets the temporary tag so the allocator cannot hold "
            f"one for the {cs.WORKLOAD} workload or standby meanwhile"
        )
        for m in models:
            self.edits.apply(m, cs.with_constraint)
        self._wait_gone(models)
        for m in models:
            self.edits.restore(m)

    # --- inference ------------------------------------------------------------------------------
    def _chat(
        self, model: str, prompt: str, headers: dict[str, str]
    ) -> tuple[dict[str, Any], float]:
        """One chat request through the Grid router, following 503 + Retry-After.

        Returns:
            The answer document and the latency (ms) of the attempt that was answered.

        Raises:
            CompeteError: another status, a malformed answer, or no engine within the step
                budget.
        """
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": self.max_tokens,
            "temperature": cs.TEMPERATURE,
            "seed": cs.SEED,
        }
        deadline = time.monotonic() + self.step_timeout_s
        while True:
            t0 = time.perf_counter()
            try:
                resp = self.http.post(
                    self.fleet.url + "/v1/chat/completions", json=body, headers=headers
                )
            except httpx.HTTPError as exc:
                msg = f"a request for {model} failed: {type(exc).__name__}: {exc}"
                raise cs.CompeteError(msg) from None
            latency_ms = (time.perf_counter() - t0) * 1000.0
            if resp.status_code == 503 and time.monotonic() < deadline:
                time.sleep(min(2.0, max(0.2, float(resp.headers.get("retry-after") or 1))))
                continue
            if resp.status_code != 200:
                msg = f"a request for {model} got HTTP {resp.status_code}: {resp.text[:200]}"
                raise cs.CompeteError(msg)
            doc = resp.json()
            return (doc if isinstance(doc, dict) else {}), latency_ms

    def _ask_eval(self, model_id: str, index: int, q: cs.Question) -> cs.Answer:
        """One evaluation question for ``model_id`` (operator-marked: never demand)."""
        headers = {EVALUATION_HEADER: "1", OPERATOR_HEADER: self.token}
        doc, latency_ms = self._chat(model_id, q.prompt, headers)
        problem = not_real(doc)
        if problem:
            msg = f"{model_id} gave no real answer to question {index + 1}: {problem}"
            raise cs.CompeteError(msg)
        _rid, text, _pt, _ct, _problem = check_answer(doc)
        return cs.Answer(index, latency_ms, cs.is_correct(text, q.expected), text[:200])

    def _ask_auto(self) -> str:
        """One ordinary ``auto`` coding request (no credential, no mark); the model that
        answered it, counted in :attr:`served_by`.

        Raises:
            CompeteError: the answer is not a real completion (no id, text or usage).
        """
        q = cs.QUESTIONS[self._asked % len(cs.QUESTIONS)]
        self._asked += 1
        doc, _ms = self._chat("auto", q.prompt, {})
        problem = not_real(doc)
        served = str(doc.get("model") or "?")
        if problem:
            raise cs.CompeteError(f"an auto coding request answered by {served}: {problem}")
        self.served_by[served] = self.served_by.get(served, 0) + 1
        return served

    # --- steps ----------------------------------------------------------------------------------
    def _measure(self, model_id: str, sha: str | None) -> cs.Result:
        """Load ``model_id`` through the allocator, ask the questions, offload it."""
        result = cs.Result(model_id, sha)
        with self._step(f"measure {model_id}") as note:
            since = time.time()
            self.edits.apply(model_id, cs.with_min_replica)
            self.echo(f"   asked the allocator for one {model_id} replica (temporary edit)")
            result.host_id = self._wait_ready(model_id, since)
            self.echo(f"   ready on {result.host_id}: {len(cs.QUESTIONS)} evaluation questions")
            for i, q in enumerate(cs.QUESTIONS):
                result.answers.append(self._ask_eval(model_id, i, q))
            self._offload(model_id)
            note(
                f"on {result.host_id}: {result.correct}/{len(result.answers)} correct, "
                f"p50 {result.p50_ms:.0f} ms; offloaded, profile restored"
            )
        return result

    def _offload(self, model_id: str) -> None:
        """Make the allocator drain and unload ``model_id`` (temporary impossible tag), then
        put its original profile back."""
        self.edits.apply(model_id, cs.with_constraint)
        self._wait_gone([model_id])
        self.edits.restore(model_id)

    def _submit(self) -> str:
        """One evaluation per answer (score, latency, configured digest); the result line."""
        for r in self.results:
            for a in r.answers:
                body = EvaluationBody(
                    model_id=r.model_id,
                    workload=cs.WORKLOAD,
                    score=a.score,
                    artifact_sha256=r.artifact_sha256,
                    latency_ms=round(a.latency_ms, 3),
                )
                answer = self.client.send(Calls.record_evaluation(body))
                r.evaluations += 1
                evidence = answer.get("evidence") or {}
                r.quality = evidence.get("score")
                r.quality_confidence = evidence.get("confidence")
        sent_at = time.time()
        # Utilities from a controller pass that has seen the evidence (passes every 2 s).
        status = self._wait(
            "a controller pass after the evidence",
            lambda s: s if float(_ctl(s).get("last_tick_at") or 0.0) > sent_at else None,
            lambda s: f"last pass at {_ctl(s).get('last_tick_at')}",
        )
        for r in self.results:
            row = candidate_row(status, r.model_id)
            r.utility = None if row is None else row.get("utility")
        return ", ".join(f"{r.model_id} {r.evaluations} x mean {r.score:.3f}" for r in self.results)

    def _serve(self, winner: str, candidates: list[str]) -> str:
        """Every candidate offloaded, ordinary ``auto`` traffic until the allocator's model
        answers; it must be the winner, on a host its plan chose."""
        self._offload_held(candidates)
        planned: list[str] = []

        def planned_now(status: dict[str, Any]) -> None:
            if not planned:
                planned.extend(planned_hosts(status, winner))

        sent = self._auto_until_model(winner, candidates, planned_now)
        last: list[dict[str, Any]] = [{}]

        def shown(s: dict[str, Any]) -> list[str] | None:
            last[0] = s
            return served_hosts(s, winner, planned or planned_hosts(s, winner))

        hosts = self._wait(f"status shows {winner} ready", shown, lambda s: _where(s, [winner]))
        status = last[0]
        row = admission_row(status) or {}
        for r in self.results:
            cand = candidate_row(status, r.model_id)
            if cand is not None:
                r.utility = cand.get("utility")
        return (
            f"{sent} auto requests; the allocator {choice(status)} and loaded it on "
            f"{', '.join(hosts)} (the plan's host); admission {row.get('state', '?')}"
        )

    def _auto_until_model(
        self,
        model_id: str,
        candidates: list[str],
        seen: Callable[[dict[str, Any]], None] = lambda _s: None,
    ) -> int:
        """Ordinary ``auto`` traffic until ``model_id`` answers; fail at once when another
        candidate answers because the allocator chose it (:func:`another_choice`)."""
        sent = 0

        def check(status: dict[str, Any]) -> bool | None:
            nonlocal sent
            seen(status)
            served = self._ask_auto()
            sent += 1
            if served == model_id:
                return True
            wrong = another_choice(status, served, model_id, candidates)
            if wrong is not None:
                raise cs.CompeteError(wrong)
            return None

        self._wait(
            f"an auto {cs.WORKLOAD} answer from {model_id}",
            check,
            lambda s: f"{sent} requests, answered by {self.served_by}; " + _where(s, candidates),
            during=lambda: time.sleep(max(0.0, TRAFFIC_INTERVAL_S - POLL_S)),
        )
        return sent

    def _constrain(self, winner: str, runner_up: str) -> str:
        """The winner requires a tag no host has: status must say so, the winner must go and
        the runner-up must load and answer ordinary ``auto`` traffic."""
        self.edits.apply(winner, cs.with_constraint)
        self.echo(f"   {winner} now requires node tag {cs.CONSTRAINT_TAG} (temporary edit)")

        def explained(status: dict[str, Any]) -> str | None:
            row = candidate_row(status, winner)
            return str(row["rejection"]) if row and row.get("rejection") else None

        rejection = self._wait(
            f"status explains why {winner} is rejected",
            explained,
            lambda s: f"candidate row {candidate_row(s, winner)}",
        )
        self.echo(f"   status: {winner} rejected: {rejection}")
        self._wait_gone([winner])
        sent = self._auto_until_model(runner_up, [winner, runner_up])
        hosts = self._shown_ready(runner_up)
        return (
            f"{winner} rejected ({rejection}) and offloaded; {runner_up} loaded on "
            f"{', '.join(hosts)} and answered after {sent} auto requests"
        )

    def _restore(self, winner: str, runner_up: str) -> str:
        """The winner's original profile back (same version): the winner returns and serves."""
        self.edits.restore(winner)
        self.echo(f"   {winner}'s original profile is back (same version)")
        self._wait(
            f"{winner} back and {runner_up} offloaded",
            lambda s: True if ready_hosts(s, winner) and not ready_hosts(s, runner_up) else None,
            lambda s: _where(s, [winner, runner_up]),
        )
        sent = self._auto_until_model(winner, [winner, runner_up])
        hosts = self._shown_ready(winner)
        return (
            f"constraint removed, profile identical; {winner} ready again on "
            f"{', '.join(hosts)} and answered after {sent} auto requests"
        )
