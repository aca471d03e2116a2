"""``grid up``, ``grid down``, ``grid models`` and ``grid chat``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import typer

from grid_core.errors import EXIT_USAGE, ValidationError
from grid_server.client import (
    CliError,
    exit_code_for,
    home_dir,
    local_server,
    request,
    resolve_grid,
)
from grid_server.home import SERVER_FILE, grid_home
from grid_server.serve import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    SERVER_MARKER,
    check_port,
    exposure_warning,
)

START_TIMEOUT_S = 30.0
"""How long ``grid up --detach`` waits for the server to announce its URL."""
STOP_TIMEOUT_S = 15.0
"""Graceful shutdown budget before ``grid down`` escalates to SIGKILL."""
CHAT_TIMEOUT_S = 600.0
"""A chat reply from a cold CPU engine can take minutes."""

GridOpt = typer.Option(None, "--grid", help="Server URL, or 'local' (default).")


def _proven(rec: dict[str, object]) -> psutil.Process | None:
    """The server process named by ``server.json`` if its identity is proven, else None.

    Proof: the PID is alive, its birth time equals the recorded one, and its command line
    equals the recorded one (or, for records without it, carries the server module marker).
    A reused or unrelated PID is never signalled.
    """
    try:
        proc = psutil.Process(int(rec["pid"]))  # type: ignore[call-overload]
        if abs(proc.create_time() - float(rec["create_time"])) > 0.01:  # type: ignore[arg-type]
            return None
        cmdline = proc.cmdline()
        recorded = rec.get("cmdline")
        if isinstance(recorded, list):
            return proc if cmdline == recorded else None
        return proc if any(SERVER_MARKER in part for part in cmdline) else None
    except (psutil.Error, KeyError, TypeError, ValueError):
        return None


def _gone(proc: psutil.Process, timeout_s: float) -> bool:
    """Wait until ``proc`` has exited (a zombie awaiting its parent counts as exited)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def up(
    host: str = typer.Option(DEFAULT_HOST, "--host", help="Address to bind (loopback default)."),
    port: int = typer.Option(DEFAULT_PORT, "--port", help="TCP port; 0 picks a free one."),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="Controller state dir."),  # noqa: B008
    detach: bool = typer.Option(False, "--detach", help="Run in the background."),
) -> None:
    """Start the Grid server (foreground unless --detach)."""
    try:
        check_port(port)
    except ValidationError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    warning = exposure_warning(host)
    if warning:
        typer.echo(warning, err=True)
    home = grid_home()
    rec = local_server()
    if rec and _proven(rec):
        msg = f"a Grid server is already running at {rec.get('url')} (pid {rec.get('pid')})"
        raise CliError(msg)
    args = [sys.executable, "-m", SERVER_MARKER, "--host", host, "--port", str(port)]
    if state_dir is not None:
        args += ["--state-dir", str(state_dir)]
    if not detach:
        from grid_server.serve import serve

        try:
            serve(host, port, home, state_dir, None)
        except OSError as exc:
            raise CliError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        return
    (home / SERVER_FILE).unlink(missing_ok=True)
    log_path = home / "server.log"
    log = log_path.open("ab")
    run_start = log.tell()  # only this run's lines explain this run's failure
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
        close_fds=True,
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        rec = local_server()
        if rec and rec.get("pid") == proc.pid:
            typer.echo(f"grid: serving on {rec['url']} (pid {proc.pid}); stop with 'grid down'")
            return
        if proc.poll() is not None:
            reason = _last_log_line(log_path, run_start)
            msg = f"the server exited with code {proc.returncode}"
            msg += f": {reason}" if reason else f"; see {log_path}"
            raise CliError(msg)
        time.sleep(0.1)
    proc.terminate()
    proc.wait(STOP_TIMEOUT_S)
    raise CliError(f"the server did not start within {START_TIMEOUT_S:.0f} s; see server.log")


def _last_log_line(path: Path, offset: int) -> str | None:
    """The last non-empty line the server wrote after ``offset`` (its own prefix removed)."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1].removeprefix("grid: error: ") if lines else None


def down() -> None:
    """Stop the server ``grid up`` started (identity-proven PID only)."""
    path = home_dir() / SERVER_FILE
    rec = local_server()
    if rec is None:
        typer.echo("grid: no local server is running")
        return
    proc = _proven(rec)
    if proc is None:
        try:
            psutil.Process(int(rec.get("pid", -1)))
        except (psutil.Error, ValueError, TypeError):
            path.unlink(missing_ok=True)
            typer.echo("grid: the recorded server is gone; removed its stale record")
            return
        msg = (
            f"pid {rec.get('pid')} in {path} is not provably the Grid server; "
            "not signalling it — inspect it manually"
        )
        raise CliError(msg)
    proc.send_signal(signal.SIGTERM)
    if not _gone(proc, STOP_TIMEOUT_S):
        proc.kill()
        if not _gone(proc, STOP_TIMEOUT_S):
            msg = f"pid {proc.pid} did not exit after SIGKILL; inspect it manually"
            raise CliError(msg)
    path.unlink(missing_ok=True)
    typer.echo(f"grid: stopped the server at {rec.get('url')} (pid {rec.get('pid')})")


def models(
    grid: str | None = GridOpt, as_json: bool = typer.Option(False, "--json", help="Raw JSON.")
) -> None:
    """List models with a ready route."""
    data = request("GET", grid, "/v1/models")
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    ids = [m.get("id") for m in data.get("data", [])]
    typer.echo("\n".join(ids) if ids else "(no ready models)")


def chat(
    text: str = typer.Argument(..., help="The user message."),
    model: str = typer.Option(..., "-m", "--model", help="Model id, or 'auto'."),
    grid: str | None = GridOpt,
    max_tokens: int | None = typer.Option(None, "--max-tokens", min=1),
) -> None:
    """Send one chat message and stream the reply."""
    base = resolve_grid(grid)
    body: dict[str, object] = {
        "model": model,
        "stream": True,
        "messages": [{"role": "user", "content": text}],
    }
    if max_tokens:
        body["max_tokens"] = max_tokens
    try:
        with (
            httpx.Client(timeout=CHAT_TIMEOUT_S, trust_env=False) as client,
            client.stream("POST", base + "/v1/chat/completions", json=body) as resp,
        ):
            if resp.status_code >= 400:
                resp.read()
                try:
                    message = resp.json()["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    message = resp.text[:200]
                code = exit_code_for(resp.status_code)
                raise CliError(f"chat → {resp.status_code}: {message}", code)
            for line in resp.iter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                try:
                    chunk = json.loads(line[5:])
                    delta = chunk["choices"][0].get("delta", {}).get("content")
                except (ValueError, KeyError, IndexError, TypeError, AttributeError):
                    continue
                if delta:
                    sys.stdout.write(delta)
                    sys.stdout.flush()
    except httpx.HTTPError as exc:
        raise CliError(f"no Grid server answered at {base} ({type(exc).__name__})") from None
    sys.stdout.write("\n")
