"""Readable renderings of ``grid allocator status`` and ``grid allocator explain`` (rich tables).

Only the human view lives here; ``--json`` prints the server's document unchanged. Output to
a pipe or file carries no colour codes (rich detects it), so the text stays greppable.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

PIPE_WIDTH = 160
"""Width when stdout is not a terminal: wide enough that host and model ids never wrap."""
MAX_ROWS = 50
"""Rows shown per table; ``--json`` has everything."""
HOST_STYLE = {
    "accepting": "green",
    "throttled": "yellow",
    "draining": "dark_orange",
    "paused": "dark_orange",
    "unhealthy": "red",
    "quarantined": "red",
}
RESIDENCY_STYLE = {
    "ready": "green",
    "loading": "yellow",
    "warming": "yellow",
    "cached": "blue",
    "draining": "dark_orange",
    "failed": "red",
}
VERDICT_STYLE = {
    "kept": "green",
    "placed": "green",
    "fits": "cyan",
    "rejected": "yellow",
    "incompatible": "dim",
    "ineligible": "red",
}


def console() -> Console:
    """A console for stdout: a terminal's own width, else :data:`PIPE_WIDTH` without colour."""
    if sys.stdout.isatty():
        return Console(width=shutil.get_terminal_size().columns)
    return Console(width=PIPE_WIDTH, color_system=None, force_terminal=False)


def _cell(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}"
    if isinstance(v, list | tuple):
        return ",".join(str(x) for x in v) or "-"
    return str(v)


def _table(title: str, columns: list[str]) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for c in columns:
        t.add_column(c, overflow="fold")
    return t


def _styled(value: str | None, styles: dict[str, str]) -> Text:
    return Text(value or "-", style=styles.get(value or "", ""))


def status_view(data: dict[str, Any]) -> RenderableType:
    """Summary, then hosts, models, actions, unmet constraints and node records."""
    server = data.get("server", {})
    ctl = data.get("controller", {}) if isinstance(data.get("controller"), dict) else {}
    parts: list[RenderableType] = [_summary(data, server, ctl)]
    if ctl.get("hosts"):
        parts.append(_hosts(ctl))
    if ctl.get("profiles"):
        parts.append(_models(ctl))
    actions = _actions(ctl)
    if actions is not None:
        parts.append(actions)
    parts.append(_unmet(ctl))
    parts.extend(_portfolio(ctl))
    parts.extend(_predictions(ctl))
    parts.append(_nodes(server))
    refusals = server.get("instance_refusals", [])
    if refusals:
        t = _table("Refused node agents", ["host", "instance", "holder", "verdict", "at"])
        for r in refusals:
            at = time.strftime("%H:%M:%S", time.localtime(float(r["at"])))
            t.add_row(r["host_id"], r["instance"], r["holder"], r["verdict"], at)
        parts.append(t)
    revoked = server.get("revoked_hosts", [])
    if revoked:
        t = _table("Revoked hosts", ["host", "state", "revoked at", "reason"])
        for h in revoked[:MAX_ROWS]:
            at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(h["revoked_at"])))
            # A server older than withdrawal-on-revoke reports only the id and the time.
            t.add_row(h["host_id"], _cell(h.get("state")), at, _cell(h.get("reason")))
        parts.append(t)
    breakers = server.get("open_breakers", [])
    if breakers:
        t = _table("Open breakers", ["engine", "model", "streak", "open for s"])
        for b in breakers:
            t.add_row(b["engine_id"], b["model_id"], str(b["streak"]), _cell(b["open_for_s"]))
        parts.append(t)
    return Group(*parts)


def _summary(data: dict[str, Any], server: dict[str, Any], ctl: dict[str, Any]) -> Text:
    out = Text()
    out.append(f"mode: {data.get('mode')}", style="bold")
    out.append(f"  authority: {ctl.get('authority', '-')}")
    out.append(f"  term: {ctl.get('controller_term', '-')}")
    parts = str(ctl.get("generation") or "").split(":")
    out.append(f"  plan: #{int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0}")
    out.append(f"\npasses: {server.get('ticks')}  last error: {_cell(server.get('last_error'))}")
    if ctl.get("last_tick_duration_ms") is not None:
        out.append(f"  last pass: {ctl['last_tick_duration_ms']:.1f} ms")
    build = server.get("planner_build")
    if isinstance(build, dict):  # a server older than the native build reports none
        shown = "native" if build.get("native") else str(build.get("reason", "interpreted"))
        out.append(f"\nplanner: {shown}", style="" if build.get("native") else "yellow")
    out.append(f"\nprofiles: {_cell(server.get('profiles'))}")
    if ctl.get("automatic_refusal"):
        out.append(f"\nautomatic refused: {ctl['automatic_refusal']}", style="red")
    if "error" in ctl:
        out.append(f"\ncontroller error: {ctl['error']}", style="red")
    warnings = list(server.get("warnings", []))
    warnings += [ctl["state_warning"]] if ctl.get("state_warning") else []
    warnings += list(ctl.get("warnings", []))
    for w in warnings:
        out.append(f"\nwarning: {w}", style="yellow")
    return out


def _hosts(ctl: dict[str, Any]) -> Table:
    t = _table(
        "Hosts",
        [
            "host",
            "state",
            "runtimes / backends",
            "heartbeat s",
            "used / allocatable MB",
            "free now MB",
            "residencies",
        ],
    )
    t.columns[2].no_wrap = True  # one line per host: residencies fold instead
    for h in ctl["hosts"][:MAX_ROWS]:
        res = Text()
        for r in h.get("residencies", []):
            if r["state"] == "cached" and "cached" in h:
                continue  # shown below with its provenance
            if res.plain:
                res.append(" ")
            res.append(f"{r['model_id']}:")
            res.append(r["state"], style=RESIDENCY_STYLE.get(r["state"], ""))
            if r.get("ownership", "managed") != "managed":
                # Grid never commands it: say so where the operator looks for it.
                res.append(f"({r['ownership']})", style="dim")
        _cached(h, res)
        t.add_row(
            h["host_id"],
            _styled(h.get("state"), HOST_STYLE),
            _offered(h),
            _cell(h.get("heartbeat_age_s")),
            f"{h.get('used_mb', 0)} / {h.get('allocatable_mb', 0)}",
            str(h.get("free_mb", "-")),
            res if res.plain else Text("-"),
        )
    return t


def _cached(h: dict[str, Any], res: Text) -> None:
    """Append ``b.gguf:cached(predictive)`` per weights on the host's disk that no residency
    row names: a predictive prefetch's unused download is marked, since only those may be
    expired or replaced by prediction."""
    shown = {r["model_id"] for r in h.get("residencies", []) if r["state"] != "cached"}
    for c in h.get("cached", []):
        if c["model_id"] in shown:
            continue
        if res.plain:
            res.append(" ")
        res.append(f"{c['model_id']}:")
        res.append("cached", style=RESIDENCY_STYLE.get("cached", ""))
        if c.get("predictive"):
            res.append("(predictive)", style="cyan")


def _offered(h: dict[str, Any]) -> str:
    """``llama.cpp,vllm / cpu,cuda (2 GPU, 24576 MB)``: what a host can run and on what."""
    text = f"{_cell(h.get('runtimes'))} / {_cell(h.get('backends'))}"
    if h.get("gpu_count"):
        text += f" ({h['gpu_count']} GPU, {h.get('gpu_memory_mb', 0)} MB)"
    return text


def _models(ctl: dict[str, Any]) -> Table:
    plan = ctl.get("plan") or {}
    desired = plan.get("desired", {})
    placed: dict[str, list[str]] = {}
    for a in plan.get("assignments", []):
        placed.setdefault(a["model_id"], []).append(a["host_id"])
    ready = (ctl.get("reconciliation") or {}).get("ready", {})
    forecasts = ctl.get("forecasts") or {}
    t = _table(
        "Models",
        ["model", "min-max", "desired", "ready", "placed on", "demand req/s", "why this count"],
    )
    for p in ctl["profiles"][:MAX_ROWS]:
        m = p["model_id"]
        f = forecasts.get(m) or {}
        t.add_row(
            m,
            f"{p.get('min_replicas', 0)}-{p.get('max_replicas', 1)}",
            str(desired.get(m, 0)),
            str(ready.get(m, 0)),
            ",".join(placed.get(m, [])) or "-",
            f"{f.get('request_rate_rps', 0.0) or 0.0:.3f}",
            ",".join(f.get("reasons", [])) or "-",
        )
    return t


def _actions(ctl: dict[str, Any]) -> Table | None:
    rec = ctl.get("reconciliation") or {}
    rows: list[tuple[str, ...]] = []
    for a in ctl.get("pending_commands", []):
        rows.append(("active", a["kind"], a["host_id"], a["model_id"], a["status"], a["reason"]))
    for p in rec.get("proposals", []) if rec.get("mode") == "recommend" else []:
        rows.append(("proposed", p["kind"], p["host_id"], p["model_id"], "-", p["reason"]))
    for d in rec.get("deferred", []):
        rows.append(("deferred", d["kind"], d["host_id"], d["model_id"], "-", d["reason"]))
    for a in ctl.get("history", []):
        msg = f"{a['reason']}: {a['message']}" if a.get("message") else a["reason"]
        rows.append(("done", a["kind"], a["host_id"], a["model_id"], a["status"], msg))
    if not rows:
        return None
    t = _table("Actions", ["", "kind", "host", "model", "status", "reason"])
    for r in rows[:MAX_ROWS]:
        style = "red" if r[4] in ("failed", "rejected") else ""
        t.add_row(*r, style=style)
    return t


def _unmet(ctl: dict[str, Any]) -> RenderableType:
    unmet = ctl.get("unmet", [])
    if not unmet:
        return Text("unmet: none (every desired replica is placed)")
    t = _table("Unmet", ["model", "reason", "binding", "missing", "host", "detail"])
    for u in unmet[:MAX_ROWS]:
        t.add_row(
            u["model_id"],
            u["code"],
            _cell(u.get("resource")),
            str(u.get("missing", 0)),
            _cell(u.get("host_id")),
            u["message"],
        )
    return t


def _predictions(ctl: dict[str, Any]) -> list[RenderableType]:
    """Inferred demand (learned edge and confidence) and the predictive cache's advisories."""
    out: list[RenderableType] = []
    rows = ctl.get("predictions") or []
    if rows:
        t = _table(
            "Predictions", ["model", "kind", "edge", "confidence", "support", "rps", "lead s"]
        )
        for r in rows[:MAX_ROWS]:
            t.add_row(
                r["model_id"],
                r["kind"],
                r["edge"],
                f"{r['confidence']:.2f}",
                str(r["support"]),
                f"{r['rate_rps']:.4f}",
                _cell(r.get("lead_s")),
            )
        out.append(t)
    pre = ctl.get("prefetch") or {}
    if pre.get("advisories") or pre.get("refused"):
        t = _table("Predictive cache", ["action", "host", "model", "MB", "reason", "edge"])
        for a in (pre.get("advisories") or [])[:MAX_ROWS]:
            t.add_row(
                a["kind"], a["host_id"], a["model_id"], str(a["size_mb"]), a["reason"], a["edge"]
            )
        for line in (pre.get("refused") or [])[:MAX_ROWS]:
            t.add_row("none", "-", line.split(":", 1)[0], "-", line.split(":", 1)[-1].strip(), "-")
        out.append(t)
    return out


def _portfolio(ctl: dict[str, Any]) -> list[RenderableType]:
    """Unbound workload demand: the joint choice, admission rows and candidate rows."""
    rep = ctl.get("portfolio") or {}
    rows = rep.get("admissions") or []
    if not rep or not (rows or rep.get("workloads") or rep.get("standby")):
        return []
    gate = rep.get("thresholds") or {}
    standby = ", ".join(f"{w}->{m}" for w, m in sorted((rep.get("standby") or {}).items()))
    head = Text(
        f"portfolio: {rep.get('plugin')}  models: {_cell(rep.get('models'))}  "
        f"exploring: {_cell(rep.get('exploring'))}  evaluated: {rep.get('evaluated', 0)}  "
        f"gate: {gate.get('observations')} requests or {gate.get('concurrency')} units "
        f"(media {gate.get('media_concurrency')})\n"
        f"standby on idle capacity: {standby or '-'} ({rep.get('standby_reason') or '-'})"
    )
    t = _table(
        "Workload admission",
        [
            "workload",
            "state",
            "model",
            "offered",
            "seen",
            "desired/planned/ready/missing",
            "hosts",
            "startup s",
            "reason",
        ],
    )
    for r in rows[:MAX_ROWS]:
        t.add_row(
            r["workload"],
            r["state"],
            _cell(r.get("model_id")),
            f"{r.get('offered_concurrency', 0.0):.2f}",
            str(r.get("observations", 0)),
            f"{r.get('desired', 0)}/{r.get('planned', 0)}/{r.get('ready', 0)}/"
            f"{r.get('missing', 0)}",
            str(r.get("eligible_hosts", 0)),
            _cell(r.get("startup_s")),
            r.get("reason", ""),
        )
    return [head, t, _candidates(rep.get("candidates") or [])]


def _candidates(rows: list[dict[str, Any]]) -> Table:
    """The portfolio's candidate rows (workload, model, utility and its evidence terms)."""
    c = _table(
        "Portfolio candidates",
        [
            "workload",
            "model",
            "utility",
            "suit.",
            "fit now",
            "resident",
            "paths",
            "best host",
            "outcome (conf)",
            "quality (conf)",
            "bonus",
            "penalty",
            "rejected",
        ],
    )
    for r in rows[:MAX_ROWS]:
        quality = (
            "-"
            if r.get("quality") is None
            else (f"{r['quality']:.2f} ({r.get('quality_confidence', 0.0):.2f})")
        )
        c.add_row(
            r["workload"],
            r["model_id"],
            _cell(r.get("utility")),
            f"{r.get('suitability', 0.0):.2f}",
            str(r.get("feasible_now", 0)),
            str(r.get("resident", 0)),
            str(len(r.get("preemption_paths") or [])),
            _cell(r.get("best_host")),
            f"{r.get('outcome', 1.0):.2f} ({r.get('outcome_confidence', 0.0):.2f})",
            quality,
            _cell(r.get("bonus")),
            _cell(r.get("transition_penalty")),
            _cell(r.get("rejection")),
        )
    return c


def _nodes(server: dict[str, Any]) -> Table:
    t = _table("Node records", ["node", "role", "host", "state", "models", "lease s"])
    for n in server.get("nodes", [])[:MAX_ROWS]:
        t.add_row(
            n["node_id"],
            n["role"],
            n["host_id"],
            _styled(n.get("state"), HOST_STYLE),
            _cell(n["models"]),
            _cell(n["lease_remaining_s"]),
        )
    return t


def explain_view(doc: dict[str, Any]) -> RenderableType:
    """The explanation: summary, demand, binding constraint, then one row per host."""
    head = Text(doc["summary"], style="bold")
    parts: list[RenderableType] = [head]
    if not doc.get("configured"):
        return Group(*parts)
    d = doc.get("demand") or {}
    facts = Text()
    facts.append(f"desired replicas: {doc['desired']}  placed: {doc['placed']}")
    if d:
        facts.append(
            f"\ndemand: {d.get('request_rate_rps', 0.0):.3f} req/s, offered concurrency "
            f"{d.get('offered_concurrency', 0.0):.2f}, queue {d.get('queue_depth') or 0.0:.2f}"
            f"; count set by: {', '.join(d.get('reasons', [])) or '-'}"
        )
    binding = doc.get("binding")
    facts.append("\nbinding constraint: ")
    facts.append(binding or "none", style="bold red" if binding else "green")
    parts.append(facts)
    t = _table("Hosts", ["host", "verdict", "reason", "free after plan MB", "why"])
    for v in doc.get("hosts", []):
        t.add_row(
            v["host_id"],
            _styled(v["verdict"], VERDICT_STYLE),
            v["reason"],
            _cell(v.get("free_mb")),
            v["detail"],
        )
    parts.append(t)
    for u in doc.get("unmet", []):
        parts.append(Text(f"unmet {u['code']}: {u['message']}", style="yellow"))
    return Group(*parts)
