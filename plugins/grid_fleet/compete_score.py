"""``grid test compete``'s pure parts: the questions, the checker, the scores and the report.

Source: the specification's "Single-machine scenario lab and logical fleet test" (the real
competition) and "Proactive observation and portfolio planning" (labelled quality evidence
reaches full weight at eight fresh evaluations). Nothing here does I/O: the command
(:mod:`grid_fleet.compete`) measures, these functions judge and describe.

One evaluation is one answered question. Its score in [0, 1] is::

    CORRECTNESS_WEIGHT * correct + LATENCY_WEIGHT * min(1, fastest_p50_ms / latency_ms)

where ``correct`` is the exact-match checker's verdict (0 or 1) and ``fastest_p50_ms`` is the
lowest median latency among the candidates. One correct answer outweighs any speed (0.8 >
0.2); over the eight questions, two more correct answers outweigh any speed difference and one
more outweighs being up to twice as slow. Among equally correct candidates the faster one
scores higher: a candidate ten times slower than the fastest loses 0.18 per question, which
is 18 of the allocator's utility points once quality confidence is full. The tiny
random-weight models of the logical fleet answer nothing correctly, so there correctness ties
at zero and latency decides; with real models correctness dominates.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from grid_core.api import GridError, ValidationError, render_table
from grid_fleet.layout import FLEET_GRID_NAME
from grid_fleet.traffic import percentile

WORKLOAD = "coding"
"""The workload the competition measures (its questions are coding questions)."""
CORRECTNESS_WEIGHT = 0.8
"""Share of an evaluation's score that correctness earns: four times the latency share, so
correctness dominates (two more correct answers in eight outweigh any speed)."""
LATENCY_WEIGHT = 0.2
"""Share of an evaluation's score that speed earns (relative to the fastest candidate's
median): among equally correct candidates, a model several times faster leads by more than
the allocator's bounded cold-start penalty (at most 8 utility points) plus its optimism
bonus (at most 6)."""
MIN_CANDIDATES = 2
"""A competition needs a winner and a runner-up."""
MAX_CANDIDATES = 4
"""Candidates measured at most: the portfolio search itself considers at most four usable
candidates per workload (specification), so a fifth could never be chosen."""
SEED = 1234
"""Sampling seed of every question (with temperature 0 the answers are deterministic)."""
TEMPERATURE = 0.0
"""Greedy decoding: the same model and question always give the same answer."""
DEFAULT_STEP_TIMEOUT_S = 240.0
"""Budget of one convergence (a load, an offload, a switch) on a busy 2-core machine; tiny
models load and warm in seconds, the fleet's residency and cooldown guards take 15 s."""
DEFAULT_MAX_TOKENS = 32
"""Completion tokens per question: enough for any expected answer and a measurable latency."""
CONSTRAINT_TAG = "grid-compete-unplaceable"
"""The node tag the temporary constraint requires. No host carries it, so a profile that
requires it is fleet-ineligible; the command checks that no host has it before using it."""


class CompeteError(GridError):
    """The competition could not run or a check failed (the message names the step and fix)."""

    exit_code = 1


@dataclass(frozen=True)
class Question:
    """One deterministic coding question and its one accepted answer."""

    prompt: str
    expected: str


QUESTIONS: tuple[Question, ...] = (
    Question("In Python, what does len('hello') return? Reply with the value only.", "5"),
    Question("In Python, what is 10 % 4? Reply with the value only.", "2"),
    Question("In Python, what does 'abc'[::-1] return? Reply with the value only.", "cba"),
    Question("In Python, what does sum(range(4)) return? Reply with the value only.", "6"),
    Question("In Python, what does max(3, 9, 4) return? Reply with the value only.", "9"),
    Question("In Python, what does bool([]) return? Reply with the value only.", "False"),
    Question(
        "In SQL, which keyword removes duplicate rows from a SELECT? Reply with the keyword only.",
        "DISTINCT",
    ),
    Question(
        "In JavaScript code, what does [1, 2, 3].length evaluate to? Reply with the value only.",
        "3",
    ),
)
"""Eight questions: quality evidence reaches full confidence at eight fresh evaluations.
Each names a language the request classifier knows as coding, so the same prompts also serve
as the ordinary ``auto`` coding traffic."""

_TRIM = re.compile(r"^[\s`'\"]+|[\s`'\".]+$")


def is_correct(text: str, expected: str) -> bool:
    """The checker: the answer's first non-empty line, trimmed of whitespace, quotes,
    backticks and a trailing period, equals ``expected`` ignoring case."""
    for line in text.splitlines():
        cleaned = _TRIM.sub("", line)
        if cleaned:
            return cleaned.casefold() == expected.casefold()
    return False


def answer_score(correct: bool, latency_ms: float, fastest_p50_ms: float) -> float:
    """One evaluation's score in [0, 1] (see the module docstring)."""
    speed = 1.0 if latency_ms <= 0 else min(1.0, max(0.0, fastest_p50_ms) / latency_ms)
    return round(CORRECTNESS_WEIGHT * float(correct) + LATENCY_WEIGHT * speed, 4)


@dataclass
class Answer:
    """One question's outcome: latency in milliseconds (client-visible)."""

    question: int
    latency_ms: float
    correct: bool
    text: str
    score: float = 0.0


@dataclass
class Result:
    """One candidate's measurement.

    Attributes:
        model_id / artifact_sha256: the candidate and the configured revision it was run at.
        host_id: where the allocator loaded it for the measurement.
        answers: one per question.
        evaluations: evaluations the server accepted for it.
        quality / quality_confidence: the server's quality evidence after the submissions.
        utility: the allocator's utility of the candidate (points) once evidence was in.
    """

    model_id: str
    artifact_sha256: str | None
    host_id: str = ""
    answers: list[Answer] = field(default_factory=list)
    evaluations: int = 0
    quality: float | None = None
    quality_confidence: float | None = None
    utility: float | None = None

    @property
    def correct(self) -> int:
        return sum(1 for a in self.answers if a.correct)

    @property
    def p50_ms(self) -> float:
        return percentile([a.latency_ms for a in self.answers], 50) or 0.0

    @property
    def score(self) -> float:
        """Mean evaluation score (0 without answers)."""
        if not self.answers:
            return 0.0
        return round(sum(a.score for a in self.answers) / len(self.answers), 4)


def score_all(results: Sequence[Result]) -> None:
    """Give every answer its score, relative to the fastest candidate's median latency."""
    fastest = min((r.p50_ms for r in results if r.answers), default=0.0)
    for r in results:
        for a in r.answers:
            a.score = answer_score(a.correct, a.latency_ms, fastest)


def ranked(results: Iterable[Result]) -> list[Result]:
    """Best first: mean score, then correct answers, then lower median latency, then id."""
    return sorted(results, key=lambda r: (-r.score, -r.correct, r.p50_ms, r.model_id))


def candidates_of(profiles: Iterable[Mapping[str, Any]]) -> list[tuple[str, str | None]]:
    """``(model_id, artifact_sha256)`` of every coding candidate, sorted by id.

    A candidate is a profile with a positive ``coding`` workload score. The competition loads
    and offloads each one, so a candidate must be optional: no configured minimum replicas
    and no pins.

    Raises:
        ValidationError: fewer than :data:`MIN_CANDIDATES` or more than
            :data:`MAX_CANDIDATES` candidates, or a candidate with ``min_replicas`` or pins
            (each message names the fix).
    """
    found = []
    for p in profiles:
        scores = p.get("workload_scores") or {}
        if float(scores.get(WORKLOAD, 0.0) or 0.0) > 0.0:
            found.append(p)
    found.sort(key=lambda p: str(p["model_id"]))
    names = ", ".join(str(p["model_id"]) for p in found) or "none"
    if len(found) < MIN_CANDIDATES:
        msg = (
            f"grid test compete needs at least {MIN_CANDIDATES} {WORKLOAD} candidates, found "
            f"{len(found)} ({names}); give models a {WORKLOAD} score, e.g. 'grid allocator "
            f"model set MODEL --grid {FLEET_GRID_NAME} --workload-score {WORKLOAD}=0.8'"
        )
        raise ValidationError(msg)
    if len(found) > MAX_CANDIDATES:
        msg = (
            f"grid test compete measures at most {MAX_CANDIDATES} {WORKLOAD} candidates (the "
            f"portfolio search considers no more), found {len(found)} ({names}); remove the "
            f"{WORKLOAD} score of the others"
        )
        raise ValidationError(msg)
    for p in found:
        kept = []
        if int(p.get("min_replicas") or 0) > 0:
            kept.append((f"min_replicas {p['min_replicas']}", "--min-replicas 0"))
        if p.get("pins"):
            kept.append((f"pins {','.join(map(str, p['pins']))}", "--clear-pins"))
        if kept:
            msg = (
                f"candidate {p['model_id']} has {' and '.join(k for k, _ in kept)}, so it can "
                "never be offloaded; compete needs optional candidates: 'grid allocator model "
                f"set {p['model_id']} --grid {FLEET_GRID_NAME} {' '.join(f for _, f in kept)}' "
                f"(or drop it with --clear-workload-scores)"
            )
            raise ValidationError(msg)
    return [(str(p["model_id"]), p.get("artifact_sha256")) for p in found]


def with_min_replica(profile: Mapping[str, Any]) -> dict[str, Any]:
    """The measurement edit: the profile asking for one replica (the allocator loads it)."""
    return {
        **profile,
        "min_replicas": 1,
        "max_replicas": max(1, int(profile.get("max_replicas") or 1)),
    }


def with_constraint(profile: Mapping[str, Any]) -> dict[str, Any]:
    """The constraint edit: the profile also requiring :data:`CONSTRAINT_TAG`."""
    tags = [str(t) for t in profile.get("required_tags") or () if t != CONSTRAINT_TAG]
    return {**profile, "required_tags": [*tags, CONSTRAINT_TAG]}


DECISIVE_MARGIN = 0.14
"""Mean-score lead (score units: 1.0 is 100 utility points) beyond which the allocator's other
bounded terms cannot reorder two fully evaluated candidates: its optimism bonus (at most 6
points) plus its cold-start penalty (at most 8). A smaller lead is reported as not decisive:
the allocator may then still prefer the runner-up, and the command says so if it does."""


def margin(winner: Result, runner_up: Result) -> float:
    """The winner's mean-score lead over the runner-up."""
    return round(winner.score - runner_up.score, 4)


def margin_note(winner: Result, runner_up: Result) -> str | None:
    """A warning line when the lead is below :data:`DECISIVE_MARGIN`, else ``None``."""
    lead = margin(winner, runner_up)
    if lead >= DECISIVE_MARGIN:
        return None
    return (
        f"the measured lead ({lead:.3f}) is below {DECISIVE_MARGIN} (the allocator's optimism "
        "bonus plus cold-start penalty): the allocator may still prefer the runner-up; "
        "candidates that differ more (size, speed, correctness) make a clear decision"
    )


def why(winner: Result, runner_up: Result) -> str:
    """One sentence: why the winner won, in the measured numbers."""
    n = len(winner.answers)
    tie = winner.correct == runner_up.correct
    decided = "correctness tied, latency decided" if tie else "correctness decided"
    util = ""
    if winner.utility is not None and runner_up.utility is not None:
        util = f"; allocator utility {winner.utility:.1f} vs {runner_up.utility:.1f} points"
    return (
        f"{winner.model_id}: {winner.correct}/{n} correct vs {runner_up.correct}/"
        f"{len(runner_up.answers)}, p50 {winner.p50_ms:.0f} ms vs {runner_up.p50_ms:.0f} ms, "
        f"mean score {winner.score:.3f} vs {runner_up.score:.3f} over {winner.evaluations} vs "
        f"{runner_up.evaluations} evaluations ({decided}){util}"
    )


def result_doc(r: Result) -> dict[str, Any]:
    """A candidate's row of the JSON report."""
    return {
        "model_id": r.model_id,
        "artifact_sha256": r.artifact_sha256,
        "host_id": r.host_id,
        "correct": r.correct,
        "questions": len(r.answers),
        "p50_ms": round(r.p50_ms, 1),
        "latencies_ms": [round(a.latency_ms, 1) for a in r.answers],
        "score": r.score,
        "evaluations": r.evaluations,
        "quality": r.quality,
        "quality_confidence": r.quality_confidence,
        "utility": r.utility,
    }


def render_report(report: Mapping[str, Any]) -> str:
    """The human report: candidates, steps, the winner and why."""
    cands = render_table(
        ["candidate", "host", "correct", "p50 ms", "score", "evals", "quality (conf)", "utility"],
        [
            [
                c["model_id"],
                c["host_id"] or "-",
                f"{c['correct']}/{c['questions']}",
                f"{c['p50_ms']:.0f}",
                f"{c['score']:.3f}",
                c["evaluations"],
                "-"
                if c["quality"] is None
                else f"{c['quality']:.3f} ({c['quality_confidence'] or 0:.2f})",
                "-" if c["utility"] is None else f"{c['utility']:.1f}",
            ]
            for c in report["candidates"]
        ],
    )
    steps = render_table(
        ["step", "s", "result"],
        [[s["step"], f"{s['seconds']:.1f}", s["detail"]] for s in report["steps"]],
    )
    return "\n".join(
        [
            cands,
            "",
            steps,
            "",
            f"winner: {report['winner']} ({report['why']})",
            f"runner-up: {report['runner_up']}",
        ]
    )
