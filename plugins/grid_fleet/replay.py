"""``grid test replay``: a real request trace replayed against the running fleet.

Source: the specification's "Single-machine scenario lab and logical fleet test". The Azure
LLM inference traces (2023, CC-BY 4.0, see ``tests/data/traces/README.md``) list one request
per row: arrival timestamp, ContextTokens and GeneratedTokens. Arrival times are kept and
compressed by ``--speedup``; ContextTokens becomes the prompt length and GeneratedTokens the
``max_tokens`` (both capped so tiny CPU models can answer); each trace maps to one model.
Requests are open-loop (an arrival never waits for an earlier answer) and are not retried:
a 503 is reported as a 503.
"""

from __future__ import annotations

import csv
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import httpx

from grid_core.api import AsyncGridClient, Calls, GridError, ValidationError, render_table
from grid_fleet import observe, traffic
from grid_fleet.layout import FleetRecord

MAX_TRACE_BYTES = 16 * 1024 * 1024
"""A trace larger than 16 MiB is refused (the shipped ones are well under 1 MiB)."""
MAX_IN_FLIGHT = 64
"""Requests the replay client has in flight at most (the fleet has 4 slots per engine);
a later arrival waits in the client, and that wait counts in its latency."""
SAMPLE_S = 2.0
"""Replica counts are sampled this often for the replicas-over-time report."""
DRAIN_S = 120.0
"""After the last arrival, answers still in flight get this long before they count as
errors."""
REPORT_ROWS = 20
"""Rows of the replicas-over-time table (the JSON report keeps every sample)."""
DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smh]?)$")


@dataclass(frozen=True)
class Arrival:
    """One replayed request: trace-time offset (s), model, prompt and output lengths."""

    offset_s: float
    model: str
    context_tokens: int
    generated_tokens: int
    trace: str


def parse_duration(text: str) -> float:
    """``600``, ``90s``, ``10m`` or ``1h`` → seconds.

    Raises:
        ValidationError: anything else, or zero.
    """
    m = DURATION.match(text.strip())
    if not m or float(m.group(1)) <= 0:
        msg = f"--duration {text!r}: use seconds or a number with s, m or h (e.g. 10m)"
        raise ValidationError(msg)
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def trace_kind(path: Path) -> str:
    """``code`` or ``conv`` from the file name (the two Azure traces), else the stem."""
    stem = path.stem.lower()
    return "code" if "code" in stem else "conv" if "conv" in stem else stem


def default_model(kind: str, rec: FleetRecord) -> str:
    """Conversation → the baseline model; code → the lowest-priority optional model."""
    base = next((m for m in rec.models if m.min_replicas >= 1), rec.models[0])
    optional = sorted((m for m in rec.models if m.min_replicas == 0), key=lambda m: m.priority)
    if kind == "code" and optional:
        return optional[0].model_id
    return base.model_id


def load_trace(
    path: Path, span_s: float, mapping: dict[str, str], rec: FleetRecord
) -> list[Arrival]:
    """Arrivals of the first ``span_s`` trace seconds of ``path``.

    Raises:
        ValidationError: unreadable, too large, missing columns, a bad row (named by line),
            or a model the fleet does not serve.
    """
    try:
        if path.stat().st_size > MAX_TRACE_BYTES:
            msg = f"--trace {path}: larger than {MAX_TRACE_BYTES >> 20} MiB"
            raise ValidationError(msg)
        text = path.read_text()
    except OSError as exc:
        msg = f"--trace {path}: {exc.strerror}"
        raise ValidationError(msg) from None
    kind = trace_kind(path)
    model = mapping.get(path.stem) or mapping.get(kind) or default_model(kind, rec)
    if model not in {m.model_id for m in rec.models}:
        msg = (
            f"--model-map: {model!r} is not served by this fleet "
            f"({', '.join(m.model_id for m in rec.models)})"
        )
        raise ValidationError(msg)
    rows = csv.DictReader(text.splitlines())
    need = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
    if not need <= set(rows.fieldnames or ()):
        msg = f"--trace {path}: needs the columns {', '.join(sorted(need))}"
        raise ValidationError(msg)
    out: list[Arrival] = []
    start: datetime | None = None
    for line, row in enumerate(rows, start=2):
        try:
            at = datetime.fromisoformat(row["TIMESTAMP"].strip()[:26])
            ctx, gen = int(row["ContextTokens"]), int(row["GeneratedTokens"])
        except (ValueError, TypeError):
            msg = f"--trace {path}: line {line} is not TIMESTAMP,ContextTokens,GeneratedTokens"
            raise ValidationError(msg) from None
        start = start or at
        offset = (at - start).total_seconds()
        if offset > span_s:
            break
        out.append(Arrival(offset, model, max(0, ctx), max(0, gen), kind))
    return out


@dataclass
class Replay:
    """One replay run."""

    fleet: FleetRecord
    arrivals: list[Arrival]
    speedup: float = 10.0
    max_prompt_tokens: int = 256
    max_tokens: int = 32
    echo: Callable[[str], None] = print
    outcomes: list[tuple[Arrival, traffic.Outcome]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)

    async def _sample(self, client: httpx.AsyncClient, obs: observe.Observer, t0: float) -> None:
        last = 0.0
        grid = AsyncGridClient(self.fleet.url, http=client)
        while True:
            try:
                for ev in obs.update(await grid.send(Calls.status(detail=True))):
                    self.echo("  " + ev.line(t0))
                if time.time() - last >= SAMPLE_S:
                    last = time.time()
                    self.samples.append(
                        {"t_s": round(last - t0, 1), "ready": observe.ready_counts(obs.last)}
                    )
            except GridError:
                pass  # a missed sample only thins the curve; the next poll retries
            await anyio.sleep(observe.POLL_S)

    async def _one(
        self,
        client: httpx.AsyncClient,
        limiter: anyio.CapacityLimiter,
        a: Arrival,
        salt: int,
        scheduled: float,
    ) -> None:
        async with limiter:
            out = await traffic.chat(
                client,
                self.fleet.url,
                a.model,
                prompt=traffic.prompt_of(
                    min(max(1, a.context_tokens), self.max_prompt_tokens), salt
                ),
                max_tokens=min(max(1, a.generated_tokens), self.max_tokens),
            )
        out.latency_s = time.monotonic() - scheduled  # from the arrival, client wait included
        self.outcomes.append((a, out))

    async def run(self) -> dict[str, Any]:
        """Replay every arrival on its compressed schedule; return the report."""
        arrivals = sorted(self.arrivals, key=lambda a: a.offset_s)
        limits = httpx.Limits(
            max_connections=MAX_IN_FLIGHT, max_keepalive_connections=MAX_IN_FLIGHT
        )
        obs = observe.Observer(self.fleet.url)
        t0 = time.time()
        span = arrivals[-1].offset_s / self.speedup if arrivals else 0.0
        self.echo(
            f"grid: replaying {len(arrivals)} requests over {span:.0f} s "
            f"({self.speedup:g}x) against {self.fleet.url}"
        )
        limiter = anyio.CapacityLimiter(MAX_IN_FLIGHT)
        async with (
            httpx.AsyncClient(
                trust_env=False, limits=limits, timeout=traffic.REQUEST_TIMEOUT_S
            ) as client,
            httpx.AsyncClient(trust_env=False, timeout=30.0) as status_client,
            anyio.create_task_group() as bg,
        ):
            bg.start_soon(self._sample, status_client, obs, t0)
            await anyio.sleep(observe.POLL_S)
            start = time.monotonic()
            with anyio.move_on_after(span + DRAIN_S):
                async with anyio.create_task_group() as tg:
                    for i, a in enumerate(arrivals):
                        at = start + a.offset_s / self.speedup
                        delay = at - time.monotonic()
                        if delay > 0:
                            await anyio.sleep(delay)
                        tg.start_soon(self._one, client, limiter, a, i, at)
            wall = time.monotonic() - start
            await anyio.sleep(observe.POLL_S * 2)
            bg.cancel_scope.cancel()
        done = {id(a) for a, _ in self.outcomes}
        for a in arrivals:  # cut off by the drain deadline
            if id(a) not in done:
                self.outcomes.append(
                    (
                        a,
                        traffic.Outcome(
                            model=a.model,
                            error=f"no answer within {DRAIN_S:.0f} s after the last arrival",
                        ),
                    )
                )
        return self._report(wall, obs)

    def _report(self, wall: float, obs: observe.Observer) -> dict[str, Any]:
        outs = [o for _, o in self.outcomes]
        summary = traffic.summarize(outs)
        per_model = {}
        for model in sorted({a.model for a, _ in self.outcomes}):
            per_model[model] = traffic.summarize([o for a, o in self.outcomes if a.model == model])
        transitions = [
            {
                "t_s": round(e.at - obs.events[0].at, 1) if obs.events else 0.0,
                "kind": e.kind,
                "host_id": e.host_id,
                "model_id": e.model_id,
                "before": e.before,
                "after": e.after,
                "detail": e.detail,
            }
            for e in obs.events
            if e.kind == "residency"
        ]
        served, requests = summary["served"], summary["requests"]
        return {
            **summary,
            "served_fraction": served / requests if requests else None,
            "wall_s": round(wall, 1),
            "speedup": self.speedup,
            "tokens_per_s": round(summary["completion_tokens"] / wall, 1) if wall > 0 else None,
            "caps": {"max_prompt_tokens": self.max_prompt_tokens, "max_tokens": self.max_tokens},
            "per_model": per_model,
            "transitions": transitions,
            "replicas_over_time": self.samples,
            "errors_sample": sorted({o.error for o in outs if o.error})[:5],
        }


def render_report(r: dict[str, Any]) -> str:
    """The replay report as tables."""

    def ms(v: object) -> str:
        return f"{v:.0f}" if isinstance(v, int | float) else "-"

    rows = [
        [
            "all",
            r["requests"],
            r["served"],
            r["unavailable_503"],
            r["other_errors"],
            ms(r["p50_ms"]),
            ms(r["p95_ms"]),
            ms(r["p99_ms"]),
        ]
    ]
    for model, s in r["per_model"].items():
        rows.append(
            [
                model,
                s["requests"],
                s["served"],
                s["unavailable_503"],
                s["other_errors"],
                ms(s["p50_ms"]),
                ms(s["p95_ms"]),
                ms(s["p99_ms"]),
            ]
        )
    lines = [
        "",
        render_table(
            ["model", "requests", "served", "503", "other errors", "p50 ms", "p95 ms", "p99 ms"],
            rows,
        ),
    ]
    frac = r["served_fraction"]
    lines.append(
        f"served {100 * frac:.1f}% in {r['wall_s']} s at {r['speedup']:g}x; "
        f"{r['tokens_per_s']} completion tokens/s"
        if frac is not None
        else "no requests"
    )
    lines.append(f"residency transitions: {len(r['transitions'])}")
    models = sorted({m for s in r["replicas_over_time"] for m in s["ready"]})
    step = max(1, -(-len(r["replicas_over_time"]) // REPORT_ROWS))
    lines.append("")
    lines.append(
        render_table(
            ["t s", *models],
            [
                [s["t_s"], *[s["ready"].get(m, 0) for m in models]]
                for s in r["replicas_over_time"][::step]
            ],
        )
    )
    for e in r["errors_sample"]:
        lines.append(f"error: {e}")
    return "\n".join(lines)
