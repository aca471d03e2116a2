"""``grid up``, ``grid down``, ``grid models`` and ``grid chat``."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import typer

from grid_core.client import Calls, check_credential_transport, tls_verify
from grid_core.clioptions import (
    EtcdCaOption,
    EtcdCertOption,
    EtcdKeyOption,
    EtcdPasswordFileOption,
    EtcdUserOption,
    GridOption,
)
from grid_core.errors import GridError, ValidationError
from grid_core.system import (
    SAFE_PATH_FLAG,
    ProcessIdentity,
    SpawnedChild,
    exit_status,
    spawn_detached,
    stop_process_sync,
    wait_until_sync,
)
from grid_core.tls import describe_tls_failure
from grid_server.client import (
    CliError,
    client_key,
    exit_code_for,
    home_dir,
    local_server,
    resolve_target,
    send,
)
from grid_server.home import SERVER_FILE, grid_home
from grid_server.runner import MAX_REGISTRATION_GRACE_S
from grid_server.serve import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    ETCD_FLAGS,
    SERVER_MARKER,
    ServerTls,
    check_port,
    client_keys_required,
    exposure_warning,
    load_policy,
    tls_from_flags,
)

START_TIMEOUT_S = 30.0
"""How long ``grid up --detach`` waits for the server to announce its URL."""
START_POLL_S = 0.1
"""Seconds between checks for the server's announcement while ``grid up --detach`` waits."""
STOP_TIMEOUT_S = 15.0
"""Graceful shutdown budget before ``grid down`` escalates to SIGKILL."""
CHAT_TIMEOUT_S = 600.0
"""A chat reply from a cold CPU engine can take minutes."""
CHAT_WAIT_S = 180.0
"""Default ``grid chat --wait``: how long to keep retrying a model that is not ready yet (503
with Retry-After). Three minutes covers loading and warming a mid-sized GGUF on a laptop."""
CHAT_RETRY_MAX_S = 30.0
"""Longest single pause between chat retries, whatever Retry-After advises."""
CHAT_POLL_S = 1.0
"""Seconds between checks of ``GET /v1/models`` during a chat pause for a model that was not
ready (:data:`NOT_READY_CODE`): the command retries as soon as the model is listed ready
instead of sleeping out the whole Retry-After."""
NOT_READY_CODE = "model_not_ready"
"""The one 503 code a listing can end early. Any other 503 with Retry-After (every engine
busy, no engine accepted a connection) concerns a model that is listed already, so the command
waits out the advised pause."""
_TERMINAL_UNSAFE = {
    c: "\ufffd" for c in (*range(0x00, 0x20), *range(0x7F, 0xA0)) if chr(c) not in "\t\n"
}
"""C0 and C1 control characters (and DEL), except tab and newline, as shown by ``grid chat``:
a model's reply must not be able to move the cursor, retitle or clear the operator's terminal."""
GIVE_UP_CODES = frozenset({"model_unplaceable"})
"""503 error codes that waiting cannot cure (no host can run the model until an operator
changes its profile or the fleet): ``grid chat`` reports them at once instead of retrying."""


def _proven(rec: Mapping[str, Any]) -> ProcessIdentity | None:
    """The server process named by ``server.json`` (raw JSON) if proven, else None.

    Proof: the PID is alive, its birth time matches the recorded one, and its command line
    equals the recorded one (or, for records without it, runs the server module). A reused
    or unrelated PID is never signalled.
    """
    try:
        pid, birth = int(rec["pid"]), float(rec["create_time"])
    except (KeyError, TypeError, ValueError):
        return None
    recorded = rec.get("cmdline")
    if isinstance(recorded, list):
        ident = ProcessIdentity(pid, birth, cmdline=tuple(str(part) for part in recorded))
    else:
        ident = ProcessIdentity(pid, birth, args=(("-m", SERVER_MARKER),))
    return ident if ident.prove().status == "proven" else None


def up(
    host: str = typer.Option(DEFAULT_HOST, "--host", help="Address to bind (loopback default)."),
    port: int = typer.Option(DEFAULT_PORT, "--port", help="TCP port; 0 picks a free one."),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="Controller state dir."),  # noqa: B008
    detach: bool = typer.Option(False, "--detach", help="Run in the background."),
    tls_cert: Path | None = typer.Option(  # noqa: B008
        None, "--tls-cert", help="Serve HTTPS with this certificate chain (PEM; 'grid tls init')."
    ),
    tls_key: Path | None = typer.Option(  # noqa: B008
        None, "--tls-key", help="The certificate's private key (must be mode 0600)."
    ),
    tls_ca: Path | None = typer.Option(  # noqa: B008
        None, "--tls-ca", help="The CA that signed it (local clients and join tokens use it)."
    ),
    client_keys: str | None = typer.Option(
        None,
        "--client-keys",
        help="required|open: /v1 needs 'grid keys' API keys (default: required off loopback).",
    ),
    policy: Path | None = typer.Option(  # noqa: B008
        None, "--policy", help="JSON controller policy (planner, governor, forecast tunables)."
    ),
    tick_interval: float | None = typer.Option(
        None, "--tick-interval", min=0.1, help="Seconds between periodic controller passes."
    ),
    registration_grace: float | None = typer.Option(
        None,
        "--registration-grace",
        min=0.0,
        max=MAX_REGISTRATION_GRACE_S,
        help="Seconds after start while a model no registered host can run is still answered "
        "'not ready' (hosts register again after a restart); default one host lease, 60.",
    ),
    state_store: str | None = typer.Option(
        None,
        "--state-store",
        help="etcd://host:port[,host:port…][/prefix] (etcds:// for TLS): controller state and "
        "leader election in etcd, for two or three servers; default: the file store.",
    ),
    etcd_ca: EtcdCaOption = None,
    etcd_cert: EtcdCertOption = None,
    etcd_key: EtcdKeyOption = None,
    etcd_user: EtcdUserOption = None,
    etcd_password_file: EtcdPasswordFileOption = None,
) -> None:
    """Start the Grid server (foreground unless --detach); HTTPS with --tls-cert/--tls-key."""
    etcd_args = _etcd_args(etcd_ca, etcd_cert, etcd_key, etcd_user, etcd_password_file)
    try:
        check_port(port)
        tls = tls_from_flags(tls_cert, tls_key, tls_ca)
        client_keys_required(host, client_keys)
        if policy is not None:
            load_policy(policy)  # a bad file is the operator's flag: exit 2 in both modes
            policy = policy.expanduser().resolve()
        _check_state_store(state_store, etcd_args)
    except GridError as exc:
        raise CliError(str(exc), exc.exit_code) from None
    launch = _Launch(
        host,
        port,
        state_dir,
        tls,
        client_keys,
        policy,
        tick_interval,
        state_store,
        etcd_args,
        registration_grace,
    )
    warning = exposure_warning(host, tls is not None)
    if warning:
        typer.echo(warning, err=True)
    _refuse_second_server()
    if detach:
        _start_detached(launch.argv(), grid_home())
    else:
        launch.serve_here()


def _etcd_args(
    ca: Path | None, cert: Path | None, key: Path | None, user: str | None, password: Path | None
) -> dict[str, str]:
    """The ``--etcd-*`` flags given, by flag name (without ``--``): files as absolute paths,
    the user as given; never a secret itself."""
    files = {"etcd-ca": ca, "etcd-cert": cert, "etcd-key": key, "etcd-password-file": password}
    args = {k: str(v.expanduser().resolve()) for k, v in files.items() if v}
    if user is not None:
        args["etcd-user"] = user
    return args


def running_server() -> dict[str, Any] | None:
    """This Grid home's server record (``server.json``) when its process is proven to run."""
    rec = local_server()
    return rec if rec and _proven(rec) else None


def _refuse_second_server() -> None:
    """Refuse to start while this Grid home's recorded server is proven to run.

    Raises:
        CliError: a proven server runs (its URL and PID are named).
    """
    rec = running_server()
    if rec:
        msg = f"a Grid server is already running at {rec.get('url')} (pid {rec.get('pid')})"
        raise CliError(msg)


def _check_state_store(state_store: str | None, etcd_args: Mapping[str, str]) -> None:
    """Open and close ``--state-store`` once so a bad URL or etcd option fails before start.

    Raises:
        ValidationError: ``--etcd-*`` options without an etcd ``--state-store``.
        GridError: the store URL or its options are unusable.
    """
    if state_store is not None:
        from grid_server.store import open_state_store

        open_state_store(state_store, **{ETCD_FLAGS[k]: v for k, v in etcd_args.items()}).close()
    elif etcd_args:
        msg = "--etcd-* options need --state-store etcd://host:port"
        raise ValidationError(msg)


@dataclass(frozen=True)
class _Launch:
    """The checked options of one ``grid up``: run here, or as the argv of a detached server.

    ``etcd_args`` maps ``etcd-*`` flag names to paths or the user name, never a secret.
    """

    host: str
    port: int
    state_dir: Path | None
    tls: ServerTls | None
    client_keys: str | None
    policy: Path | None
    tick_interval: float | None
    state_store: str | None
    etcd_args: Mapping[str, str]
    registration_grace: float | None = None

    def argv(self) -> list[str]:
        """The detached server's command line (key paths only: the key stays in its file)."""
        args = [
            sys.executable,
            SAFE_PATH_FLAG,
            "-m",
            SERVER_MARKER,
            "--host",
            self.host,
            "--port",
            str(self.port),
        ]
        if self.state_dir is not None:
            args += ["--state-dir", str(self.state_dir)]
        if self.tls is not None:
            args += ["--tls-cert", str(self.tls.cert), "--tls-key", str(self.tls.key)]
            args += ["--tls-ca", str(self.tls.ca)] if self.tls.ca is not None else []
        if self.client_keys is not None:
            args += ["--client-keys", self.client_keys]
        if self.policy is not None:
            args += ["--policy", str(self.policy)]
        if self.tick_interval is not None:
            args += ["--tick-interval", str(self.tick_interval)]
        if self.registration_grace is not None:
            args += ["--registration-grace", str(self.registration_grace)]
        if self.state_store is not None:
            args += ["--state-store", self.state_store]
            for flag, value in self.etcd_args.items():
                args += [f"--{flag}", value]
        return args

    def serve_here(self) -> None:
        """Serve in this process until stopped.

        Raises:
            CliError: the address cannot be bound.
        """
        from grid_server.serve import serve

        try:
            serve(
                self.host,
                self.port,
                grid_home(),
                self.state_dir,
                None,
                self.tick_interval,
                self.policy,
                tls=self.tls,
                client_keys=self.client_keys,
                state_store=self.state_store,
                etcd_options={ETCD_FLAGS[k]: v for k, v in self.etcd_args.items()},
                registration_grace_s=self.registration_grace,
            )
        except OSError as exc:
            raise CliError(f"cannot listen on {self.host}:{self.port}: {exc.strerror}") from None


def _start_detached(args: list[str], home: Path) -> None:
    """Spawn the server in the background and wait until it announces its URL.

    Raises:
        CliError: the server exited first (with its last log line), or did not announce
            itself within ``START_TIMEOUT_S`` (it is then stopped by proven identity).
    """
    (home / SERVER_FILE).unlink(missing_ok=True)
    log_path = home / "server.log"
    run_start = log_path.stat().st_size if log_path.exists() else 0  # this run's lines only
    # The server keeps our environment (it is this user's own server process).
    pid = spawn_detached(args, log_path=log_path, env=dict(os.environ))

    def announced() -> dict[str, object] | None:
        rec = local_server()
        if rec and rec.get("pid") == pid:
            return rec
        code = exit_status(pid)
        if code is not None:
            reason = _last_log_line(log_path, run_start)
            msg = f"the server exited with code {code}"
            msg += f": {reason}" if reason else f"; see {log_path}"
            raise CliError(msg)
        return None

    rec = wait_until_sync(announced, timeout_s=START_TIMEOUT_S, interval_s=START_POLL_S)
    if rec is not None:
        typer.echo(f"grid: serving on {rec['url']} (pid {pid}); stop with 'grid down'")
        if rec.get("planner_build"):
            typer.echo(f"grid: planner build: {rec['planner_build']}")
        return
    stop_process_sync(SpawnedChild(pid), grace_s=STOP_TIMEOUT_S)
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


def down(before: Sequence[Callable[[str], list[str]]] = ()) -> None:
    """Stop the server ``grid up`` started (identity-proven PID only).

    ``before`` runs first with the server's URL: the node plugin stops a managed node on this
    machine that serves this server, so its engines unregister and exit cleanly while the
    server still answers (specification, "Remote Grid deployment").
    """
    path = home_dir() / SERVER_FILE
    rec = local_server()
    if rec is None:
        typer.echo("grid: no local server is running")
        return
    ident = _proven(rec)
    if ident is not None:
        for hook in before:
            try:
                for line in hook(str(rec.get("url") or "")):
                    typer.echo(line)
            except GridError as exc:
                raise CliError(f"the managed node was not stopped, nor the server: {exc}") from None
    if ident is None:
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
    try:
        stop_process_sync(ident, grace_s=STOP_TIMEOUT_S)
    except GridError as exc:
        raise CliError(str(exc)) from None
    path.unlink(missing_ok=True)
    typer.echo(f"grid: stopped the server at {rec.get('url')} (pid {rec.get('pid')})")


def models(
    grid: GridOption = None, as_json: bool = typer.Option(False, "--json", help="Raw JSON.")
) -> None:
    """List models with a ready route."""
    data = send(grid, Calls.models())
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    ids = [m.get("id") for m in data.get("data", [])]
    typer.echo("\n".join(ids) if ids else "(no ready models)")


def chat(
    text: str = typer.Argument(..., help="The user message."),
    model: str = typer.Option(..., "-m", "--model", help="Model id, or 'auto'."),
    grid: GridOption = None,
    max_tokens: int | None = typer.Option(
        None, "--max-tokens", min=1, help="Longest reply, in tokens (default: the engine's)."
    ),
    wait: float = typer.Option(
        CHAT_WAIT_S,
        "--wait",
        min=0.0,
        help="Seconds to keep retrying while the model starts (503 with Retry-After); 0 = once.",
    ),
) -> None:
    """Send one chat message and stream the reply.

    A model that is still starting answers 503 with Retry-After; the command waits (at most
    30 s per pause, and no longer than the model takes to be listed ready; a listed model
    whose engines are busy or unreachable waits out the pause) and tries again
    until --wait seconds have passed, saying on stderr what it waits for. A model that no host
    can run fails at once with the server's reason. Control characters in the reply, other
    than tab and newline, are shown as U+FFFD. Exit codes: 0 answered, 1 unavailable or no
    server, 2 refused (bad request, unknown model).
    """
    target = resolve_target(grid)
    body: dict[str, object] = {
        "model": model,
        "stream": True,
        "messages": [{"role": "user", "content": text}],
    }
    if max_tokens:
        body["max_tokens"] = max_tokens
    headers = {}
    key = client_key(target)
    if key:
        check_credential_transport(target.url, "client API key")
        headers["authorization"] = f"Bearer {key}"
    deadline = time.monotonic() + wait
    with httpx.Client(
        timeout=CHAT_TIMEOUT_S, trust_env=False, verify=tls_verify(target.ca_file)
    ) as client:
        while True:
            pause = _chat_once(client, target.url, body, headers)
            if pause is None:
                break
            left = deadline - time.monotonic()
            message, seconds, code = pause
            if left <= 0:
                suffix = f" (gave up after --wait {wait:g} s)" if wait > 0 else ""
                raise CliError(f"chat → 503: {message}{suffix}", exit_code_for(503))
            nap = min(seconds, CHAT_RETRY_MAX_S, left)
            typer.echo(f"grid: {message}; trying again in {nap:.0f} s", err=True)
            if code != NOT_READY_CODE:
                time.sleep(nap)
            elif _wait_until_listed(client, target.url, model, headers, nap):
                typer.echo(f"grid: {model} is ready; trying again now", err=True)


def _wait_until_listed(
    client: httpx.Client, base: str, model: str, headers: dict[str, str], seconds: float
) -> bool:
    """Sleep up to ``seconds``, polling ``GET /v1/models`` every ``CHAT_POLL_S``; True as soon
    as ``model`` (for ``auto``: any model) is listed ready. A failed poll only means the pause
    goes on: the retry that follows reports any real error."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(CHAT_POLL_S, left))
        try:
            resp = client.get(base + "/v1/models", headers=headers)
            ids = {m.get("id") for m in resp.json().get("data", [])} if resp.is_success else set()
        except (httpx.HTTPError, ValueError, AttributeError):
            continue
        if model in ids or (model == "auto" and ids):
            return True
    return False


def _chat_once(
    client: httpx.Client, base: str, body: dict[str, object], headers: dict[str, str]
) -> tuple[str, float, str | None] | None:
    """Stream one chat reply to stdout; ``(message, seconds, error code)`` when the server
    says retry.

    Raises:
        CliError: any other refusal (with its exit code), or no server answered.
    """
    try:
        with client.stream(
            "POST", base + "/v1/chat/completions", json=body, headers=headers
        ) as resp:
            if resp.status_code >= 400:
                resp.read()
                try:
                    error = resp.json()["error"]
                    message, code = str(error["message"]), error.get("code")
                except (ValueError, KeyError, TypeError, AttributeError):
                    message, code = resp.text[:200], None
                retry_after = resp.headers.get("retry-after", "")
                if resp.status_code == 503 and code in GIVE_UP_CODES:
                    raise CliError(f"chat → 503: {message}", exit_code_for(503))
                if resp.status_code == 503 and retry_after.isdigit():
                    return message, max(1.0, float(retry_after)), str(code) if code else None
                code = exit_code_for(resp.status_code)
                raise CliError(f"chat → {resp.status_code}: {message}", code)
            answered_by = _relay_stream(resp)
    except httpx.HTTPError as exc:
        tls = describe_tls_failure(exc, base)
        raise CliError(tls or f"no Grid server answered at {base} ({type(exc).__name__})") from None
    sys.stdout.write("\n")
    if body.get("model") == "auto" and answered_by:
        typer.echo(f"grid: auto was answered by {answered_by}", err=True)
    return None


def _relay_stream(resp: httpx.Response) -> str | None:
    """Write a streamed reply's text to stdout (control characters made harmless); the model
    the chunks name (the one that answered), or ``None`` when none did."""
    answered_by = None
    for line in resp.iter_lines():
        if not line.startswith("data:") or line.strip() == "data: [DONE]":
            continue
        try:
            chunk = json.loads(line[5:])
            model = chunk.get("model")
            if isinstance(model, str) and answered_by is None:
                answered_by = model.translate(_TERMINAL_UNSAFE)
            delta = chunk["choices"][0].get("delta", {}).get("content")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            continue
        if delta:
            sys.stdout.write(str(delta).translate(_TERMINAL_UNSAFE))
            sys.stdout.flush()
    return answered_by
