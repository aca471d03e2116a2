"""``grid test start|status|watch|restart|stop|demo|replay|compete`` — the logical fleet's
commands."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer

from grid_core.api import (
    GridClient,
    GridError,
    ModelProfile,
    UnavailableError,
    ValidationError,
    render_table,
)
from grid_fleet import daemons, layout, lifecycle, media, models, observe
from grid_fleet.compete_score import DEFAULT_MAX_TOKENS, DEFAULT_STEP_TIMEOUT_S

Json = Annotated[bool, typer.Option("--json", help="One JSON document.")]
COMPETE_SETUP_HINT = (
    "start one and give two to four optional models a coding score first "
    "(docs/quickstart.md, section 7: 'grid test start --machines 3 --text-capacities-gib 3,3,3', "
    "then 'grid allocator model set MODEL --workload-score coding=S')"
)
"""How to get a fleet ``grid test compete`` can run on, for its "no fleet" refusal."""
DEMO_COLUMNS = (
    "phase",
    "s",
    "requests",
    "answered",
    "503",
    "first-attempt 503s",
    "p50 ms",
    "p95 ms",
    "tokens",
)


def _running_record(
    how: str = "start one with 'grid test start --machines 4'",
) -> layout.FleetRecord:
    """The running fleet's record.

    Raises:
        UnavailableError: no fleet runs on this GRID_HOME; the message ends with ``how``.
    """
    rec = layout.load_record(layout.fleet_dir())
    if rec is None or daemons.server_proof(rec.server) != "proven":
        msg = f"no logical fleet is running here; {how}"
        raise UnavailableError(msg)
    return rec


# ``grid test start``'s options: ``None`` where the operator left one out (see
# :func:`grid_fleet.layout.fill_left_out`).
MachinesOption = Annotated[
    int | None,
    typer.Option(
        "--machines",
        help=f"Logical hosts ({layout.MIN_MACHINES}-{layout.MAX_MACHINES}; default: one "
        f"per --text-capacities-gib value, else the fleet recorded here, else "
        f"{layout.DEFAULT_MACHINES}).",
    ),
]
CapacitiesOption = Annotated[
    str | None,
    typer.Option(
        "--text-capacities-gib",
        help="Per-host memory in GiB, e.g. 6,4,4,2 (default: an equal split of usable memory).",
    ),
]
ModelOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--model",
        help="A GGUF to serve instead of the generated tiny models (repeatable; "
        "the first is the baseline).",
    ),
]
PortOption = Annotated[
    int | None,
    typer.Option("--port", help=f"Fleet API port (default {layout.DEFAULT_PORT})."),
]
EnginePortBaseOption = Annotated[
    int | None,
    typer.Option(
        "--engine-port-base",
        help=f"First engine port (default {layout.DEFAULT_ENGINE_PORT_BASE}); each host "
        f"gets {layout.ENGINE_PORTS_PER_HOST}.",
    ),
]
IncludeComfyuiOption = Annotated[
    bool | None,
    typer.Option(
        "--include-comfyui/--no-include-comfyui",
        help="Make the last machine a ComfyUI media node serving --media-bundle's "
        "workflows (default: as the fleet recorded here, else no).",
    ),
]
MediaBundleOption = Annotated[
    Path | None,
    typer.Option(
        "--media-bundle",
        help="Directory of workflow manifests (*.workflow.json) and their checkpoints.",
    ),
]
ComfyuiOption = Annotated[
    Path | None,
    typer.Option(
        "--comfyui",
        help=f"ComfyUI launcher taking main.py's flags (default: ${media.EXECUTABLE_ENV}).",
    ),
]


def start(
    machines: MachinesOption = None,
    text_capacities_gib: CapacitiesOption = None,
    model: ModelOption = None,
    port: PortOption = None,
    engine_port_base: EnginePortBaseOption = None,
    include_comfyui: IncludeComfyuiOption = None,
    media_bundle: MediaBundleOption = None,
    comfyui: ComfyuiOption = None,
) -> None:
    """Start one Grid server plus N logical hosts with real llama-server children (and, with
    --include-comfyui, a ComfyUI media node as the last of the N).

    A flag left out keeps the running fleet's value, so the bare command confirms the fleet
    that runs here (and starts any host agent that stopped); a flag given differently is
    refused, naming it, before anything is checked or started."""
    for path in model or ():
        models.check_gguf(path.expanduser())
    root = layout.fleet_dir()
    existing = layout.load_record(root)
    typed = layout.StartFlags(
        machines=machines,
        capacities_gib=text_capacities_gib,
        models=tuple(str(p.expanduser().resolve()) for p in model) if model else None,
        port=port,
        engine_port_base=engine_port_base,
        include_comfyui=include_comfyui,
        media_bundle=media_bundle,
        comfyui=comfyui,
    )
    asked = layout.fill_left_out(typed, existing.settings if existing is not None else None)
    _refuse_other_settings(
        existing, asked, text_capacities_gib, machines_given=machines is not None
    )
    launcher, bundle = _media_options(
        asked.include_comfyui,
        Path(asked.media_bundle) if asked.media_bundle is not None else None,
        Path(asked.comfyui) if asked.comfyui is not None else None,
    )
    caps = layout.start_capacities(
        asked.machines,
        text_capacities_gib,
        existing.settings if existing is not None else None,
        media=asked.include_comfyui,
    )
    settings = msgspec.structs.replace(
        asked, capacities_mb=caps, media_bundle=bundle, comfyui=launcher
    )
    rec = lifecycle.start(settings, typer.echo, root, capacities_given=bool(text_capacities_gib))
    typer.echo(_started_text(rec, root))


def _refuse_other_settings(
    existing: layout.FleetRecord | None,
    settings: layout.FleetSettings,
    capacities_gib: str | None,
    *,
    machines_given: bool,
) -> None:
    """Refuse at once a start whose flags differ from the running fleet's in machines,
    ports, models, the media node or the text nodes' ``--text-capacities-gib`` values: the
    conflict is the answer, not a memory or media-bundle check of a fleet that cannot start
    beside it anyway. The start itself compares every setting again (memory split and media
    paths included) under the fleet lock.

    Args:
        existing: the recorded fleet, ``None`` when none is recorded.
        settings: what this start asks for (:func:`grid_fleet.layout.fill_left_out`).
        capacities_gib: ``--text-capacities-gib`` as typed, ``None`` when left out. Only its
            values are compared (the media node's share depends on free memory), and only
            for the running fleet's shape (another machine count is named by itself).

    Raises:
        SettingsConflictError: a fleet runs here with other settings (exit 2).
        ValidationError: ``capacities_gib`` is not one number per text node.
    """
    if existing is None or daemons.server_proof(existing.server) != "proven":
        return
    run = existing.settings
    caps = run.capacities_mb
    if (
        capacities_gib
        and settings.machines == run.machines
        and settings.include_comfyui == run.include_comfyui
    ):
        text = run.machines - 1 if run.include_comfyui else run.machines
        asked = layout.text_capacities(capacities_gib, text, media=run.include_comfyui)
        caps = asked + run.capacities_mb[text:]
    probe = msgspec.structs.replace(
        settings,
        capacities_mb=caps,
        media_bundle=run.media_bundle,
        comfyui=run.comfyui,
    )
    if probe != run:
        raise lifecycle.settings_conflict(run, probe, machines_given=machines_given)


def _started_text(rec: layout.FleetRecord, root: Path) -> str:
    """What ``grid test start`` prints once the fleet runs: its API, token file and models,
    then the commands to try next."""
    names = ", ".join(m.model_id for m in (*rec.models, *rec.media))
    return f"""
grid: the fleet API is {rec.url}
grid: operator token (owner-only): {daemons.token_path(root)}
grid: models: {names}
next:
  grid test status                 # hosts, shares, residencies
  grid test watch                  # residency transitions as they happen (Ctrl-C stops watching)
  grid chat --grid {rec.url} -m {rec.models[0].model_id} 'Reply with OK'
  grid test demo                   # the self-checking workday{_media_hint(rec)}
  grid test replay --trace T.csv   # replay a real request trace (Azure LLM CSV) and report
  grid test compete                # measure coding candidates (set up: docs/quickstart.md §7)
  grid test restart                # bring back a killed server or host agent, as configured
  grid test stop                   # drain and stop everything the fleet started"""


def _media_hint(rec: layout.FleetRecord) -> str:
    """The image request line of start's "next:" list (empty without a media node)."""
    if not rec.media:
        return ""
    body = json.dumps({"model": rec.media[0].model_id, "prompt": "a lighthouse"})
    return (
        f"\n  curl -o out.png {rec.url}/v1/media/image/generate -H 'Content-Type: "
        f"application/json' -d '{body}'   # 503 + Retry-After while the workflow is cold"
    )


def _media_options(
    include: bool, bundle: Path | None, launcher: Path | None
) -> tuple[str | None, str | None]:
    """The resolved ComfyUI launcher and media bundle (``None, None`` without a media node).

    Raises:
        ValidationError: a media option without --include-comfyui, no bundle, no launcher,
            or an unusable bundle (checked before anything starts).
    """
    if not include:
        if bundle is not None or launcher is not None:
            msg = "--media-bundle and --comfyui need --include-comfyui"
            raise ValidationError(msg)
        return None, None
    if bundle is None:
        msg = (
            "--include-comfyui needs --media-bundle DIR: workflow manifests "
            f"(*{media.MANIFEST_SUFFIX}) and the checkpoints they name"
        )
        raise ValidationError(msg)
    resolved = bundle.expanduser().resolve()
    media.bundle_manifests(resolved)
    return media.comfyui_executable(launcher), str(resolved)


def status(as_json: Json = False) -> None:
    """Show the fleet: settings, hosts with shares and residencies, models, mode."""
    doc = lifecycle.status_document()
    if as_json:
        typer.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    if not doc.get("settings"):
        typer.echo("grid: no logical fleet here; start one with 'grid test start --machines 4'")
        return
    typer.echo(render_status(doc))


PROFILE_DEFAULTS: dict[str, Any] = {
    f.name: f.default
    for f in msgspec.structs.fields(ModelProfile)
    if f.default is not msgspec.NODEFAULT
}
"""Default field values of a model profile: the server's documents omit them."""


def _with_defaults(profile: dict[str, Any]) -> dict[str, Any]:
    """A profile document with every omitted default field filled in."""
    return {**PROFILE_DEFAULTS, **profile}


def _settings_line(settings: dict[str, Any]) -> list[str]:
    """The start settings as one line, in the units of ``grid test start``'s flags, such
    that typed back it asks for this fleet: one exact ``--text-capacities-gib`` value per
    text node (the media node's share is not a flag). Empty for a document without
    settings."""
    if not settings:
        return []
    media = bool(settings.get("include_comfyui"))
    caps = tuple(settings.get("capacities_mb") or ())
    gib = layout.exact_gib_text(caps[:-1] if media and caps else caps)
    extra = " --include-comfyui" if media else ""
    models = settings.get("models") or ()
    return [
        f"settings: --machines {settings.get('machines')} --text-capacities-gib {gib} "
        f"--port {settings.get('port')} --engine-port-base {settings.get('engine_port_base')}"
        + extra
        + (f" and {len(models)} --model file(s)" if models else "")
    ]


def render_status(doc: dict[str, Any]) -> str:
    """The readable fleet status."""
    alloc = doc.get("allocator") or {}
    ctl = alloc.get("controller") or {}
    lines = [
        f"fleet: {'running' if doc['running'] else 'STOPPED'} at {doc['url']} "
        f"(server pid {doc['server_pid']}, mode {alloc.get('mode', '-')})",
        f"operator token: {doc['token_file']}",
        *_settings_line(doc.get("settings") or {}),
        "",
        _host_table(doc, ctl),
    ]
    # The server's live profiles, not fleet.json's launch-time ones: an operator may have
    # changed a priority or replica range with 'grid allocator model set' since the start.
    live = ctl.get("profiles")
    source = "live, from the allocator" if isinstance(live, list) else "as launched"
    lines += ["", f"profiles ({source}):", _profile_table(doc, alloc)]
    if doc.get("allocator_error"):
        lines.append(f"allocator status unavailable: {doc['allocator_error']}")
    if doc.get("compete_edits"):
        lines.append(
            "warning: 'grid test compete' temporary profile edits are applied to "
            f"{', '.join(doc['compete_edits'])} (a run is going on, or one was killed; the next "
            "'grid test compete' undoes them first)"
        )
    return "\n".join(lines)


def _host_table(doc: dict[str, Any], ctl: dict[str, Any]) -> str:
    """One row per logical host: its launch settings (fleet.json) beside what the allocator
    sees of it now (state, free MB, residencies other than cached)."""
    by_host = {h["host_id"]: h for h in ctl.get("hosts") or ()}
    rows = []
    for h in doc["hosts"]:
        view = by_host.get(h["host_id"], {})
        res = ", ".join(
            f"{r['model_id']}:{r['state']}"
            for r in view.get("residencies") or ()
            if r.get("state") != "cached"
        )
        rows.append(
            [
                h["host_id"],
                h["failure_domain"],
                h["capacity_mb"],
                ",".join(h.get("runtimes") or ()) or "any",
                f"{h['port_low']}-{h['port_high']}",
                "yes" if h["agent_running"] else "NO",
                view.get("state", "-"),
                view.get("free_mb", "-"),
                res or "-",
            ]
        )
    header = ["host", "domain", "MB", "runtimes", "ports", "agent", "state", "free MB"]
    return render_table([*header, "residencies"], rows)


def _profile_table(doc: dict[str, Any], alloc: dict[str, Any]) -> str:
    """One row per model profile (the server's live ones when it answered, else the launch
    settings): priority, MB, replica range, ready replicas and the forecast's desired."""
    ctl = alloc.get("controller") or {}
    ready = observe.ready_counts(alloc) if alloc else {}
    raw = ctl.get("forecasts") or {}
    forecasts = raw if isinstance(raw, dict) else {}
    live = ctl.get("profiles")
    profiles = live if isinstance(live, list) else doc["models"]
    rows = []
    for m in map(_with_defaults, profiles):
        fc = forecasts.get(m["model_id"], {})
        rows.append(
            [
                m["model_id"],
                m["priority"],
                m["memory_mb"],
                f"{m['min_replicas']}..{m['max_replicas']}",
                ready.get(m["model_id"], 0),
                fc.get("desired_replicas", "-"),
            ]
        )
    return render_table(["model", "priority", "MB", "replicas", "ready", "desired"], rows)


def watch() -> None:
    """Follow residency transitions and command outcomes (Ctrl-C stops watching only)."""
    rec = _running_record()
    obs = observe.Observer(rec.url)
    t0 = time.time()
    typer.echo(f"grid: watching {rec.url} (Ctrl-C stops watching; the fleet keeps running)")
    try:
        with GridClient(rec.url) as client:
            while True:
                try:
                    for ev in obs.poll(client):
                        typer.echo(ev.line(t0))
                except GridError as exc:
                    typer.echo(f"(status read failed: {type(exc).__name__}; retrying)")
                time.sleep(observe.POLL_S)
    except KeyboardInterrupt:
        typer.echo("\ngrid: stopped watching; the fleet is still running")


def restart() -> None:
    """Bring back whatever fleet daemon is down (server, host agents) with its full configuration.

    The one restart command for the logical fleet: after the server or a node agent was
    killed, it starts the server on the same URL with the fleet's policy, tick interval and
    durable state (profiles, mode), and each stopped host agent with its own settings and
    credential (it adopts its live engines). Running daemons are left alone.
    """
    root = layout.fleet_dir()
    typer.echo(f"grid: restarting what is down in {root}")
    rec = lifecycle.restart(typer.echo, root)
    typer.echo(f"grid: the fleet runs at {rec.url}")


def stop() -> None:
    """Drain and stop every host agent and engine the fleet started, then its server."""
    root = layout.fleet_dir()
    if layout.load_record(root) is None:
        typer.echo("grid: no fleet here; nothing to stop")
        return
    left = lifecycle.stop(typer.echo, root)
    if left:
        msg = f"processes still running after stop: {left}; run 'grid test stop' again"
        raise UnavailableError(msg)
    stray = daemons.stray_processes(root)
    if stray:
        msg = f"processes referring to {root} still run: {stray}; inspect them by hand"
        raise UnavailableError(msg)
    typer.echo("grid: fleet stopped; no process it started is left (checked by PID)")


def demo(
    users: Annotated[
        int, typer.Option("--users", min=1, max=64, help="Concurrent users in the scale-out phase.")
    ] = 6,
    requests: Annotated[
        int, typer.Option("--requests", min=1, max=1000, help="Requests per phase at least.")
    ] = 12,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", min=1, max=512, help="Completion tokens per request.")
    ] = 16,
    as_json: Json = False,
) -> None:
    """Run the self-checking workday against the running fleet (real requests only)."""
    import anyio

    from grid_fleet.demo import Demo

    rec = _running_record()
    t0 = time.monotonic()
    # With --json, progress and transitions go to stderr so stdout is one JSON document.
    d = Demo(
        rec,
        users=users,
        requests=requests,
        max_tokens=max_tokens,
        echo=(lambda s: typer.echo(s, err=True)) if as_json else typer.echo,
    )
    report = anyio.run(d.run)
    total = time.monotonic() - t0
    if as_json:
        typer.echo(json.dumps({"phases": report, "seconds": round(total, 1)}, indent=2))
        return
    typer.echo("\n" + render_demo_table(report))
    typer.echo(f"grid: demo passed: every phase converged ({total:.0f} s)")


def render_demo_table(report: list[dict[str, Any]]) -> str:
    """One row per phase, from the same counts as the phase's own ``answered`` line."""
    return render_table(
        list(DEMO_COLUMNS),
        [
            [
                p["phase"],
                p["seconds"],
                p["requests"],
                p["served"],
                p["unavailable_503"],
                p["first_attempt_503s"],
                _ms(p["p50_ms"]),
                _ms(p["p95_ms"]),
                p["completion_tokens"],
            ]
            for p in report
        ],
    )


def _ms(v: object) -> str:
    return f"{v:.0f}" if isinstance(v, int | float) else "-"


def replay(
    trace: Annotated[list[Path], typer.Option("--trace", help="Azure LLM trace CSV (repeatable).")],
    speedup: Annotated[float, typer.Option("--speedup", help="Time compression.")] = 10.0,
    model_map: Annotated[
        list[str] | None,
        typer.Option(
            "--model-map", help="TRACE=MODEL; TRACE is 'conv', 'code' or the file's stem."
        ),
    ] = None,
    duration: Annotated[
        str, typer.Option("--duration", help="Trace time to replay from its start: 600, 10m, 1h.")
    ] = "10m",
    max_prompt_tokens: Annotated[int, typer.Option("--max-prompt-tokens", min=1)] = 256,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", min=1, help="Cap on GeneratedTokens.")
    ] = 32,
    as_json: Json = False,
) -> None:
    """Replay a real request trace against the running fleet and report what it served."""
    import anyio

    from grid_fleet.replay import Replay, load_trace, parse_duration, render_report

    rec = _running_record()
    span = parse_duration(duration)
    if speedup <= 0:
        raise ValidationError("--speedup must be positive")
    mapping = {}
    for item in model_map or ():
        key, sep, model_id = item.partition("=")
        if not sep or not key or not model_id:
            raise ValidationError(f"--model-map {item!r}: use TRACE=MODEL")
        mapping[key] = model_id
    arrivals = []
    for path in trace:
        arrivals += load_trace(path, span, mapping, rec)
    r = Replay(
        rec,
        arrivals,
        speedup=speedup,
        max_prompt_tokens=max_prompt_tokens,
        max_tokens=max_tokens,
        echo=(lambda s: None) if as_json else typer.echo,
    )
    report = anyio.run(r.run)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        typer.echo(render_report(report))


def compete(
    max_tokens: Annotated[
        int,
        typer.Option("--max-tokens", min=1, max=256, help="Completion tokens per request."),
    ] = DEFAULT_MAX_TOKENS,
    step_timeout_s: Annotated[
        float,
        typer.Option(
            "--step-timeout-s",
            min=10.0,
            max=3600.0,
            help="Budget of each wait (a load, an offload, a switch), seconds.",
        ),
    ] = DEFAULT_STEP_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Measure every coding candidate, let the allocator pick the winner, constrain it, restore.

    Needs a running fleet (grid test start) whose profiles give two to four optional models a
    coding workload score. Every temporary profile edit is undone, also on failure; the
    winner is left ready.
    """
    from grid_fleet.compete import Compete
    from grid_fleet.compete_score import render_report

    rec = _running_record(COMPETE_SETUP_HINT)
    # With --json, progress goes to stderr so stdout is one JSON document.
    run = Compete(
        rec,
        layout.fleet_dir(),
        max_tokens=max_tokens,
        step_timeout_s=step_timeout_s,
        echo=(lambda s: typer.echo(s, err=True)) if as_json else typer.echo,
    )
    report = run.run()
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    typer.echo("\n" + render_report(report))
    typer.echo(f"grid: compete passed ({report['seconds']:.0f} s); {report['winner']} is ready")
