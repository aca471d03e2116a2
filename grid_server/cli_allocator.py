"""``grid allocator model|mode|tick|status|token`` — operator commands over HTTP."""

from __future__ import annotations

import json
import math
import time
from http import HTTPStatus
from pathlib import Path
from typing import Any

import msgspec
import typer

from grid_core.bodies import MAX_JOIN_TOKEN_TTL_S, MAX_NODE_CREDENTIAL_TTL_S, JoinFile
from grid_core.client import Calls, RequestRefused, check_credential_transport
from grid_core.clioptions import (
    EtcdCaOption,
    EtcdCertOption,
    EtcdKeyOption,
    EtcdPasswordFileOption,
    EtcdUserOption,
    GridOption,
    OperatorTokenOption,
)
from grid_core.errors import EXIT_USAGE, GridError, ValidationError
from grid_core.grids import check_url
from grid_core.profile import ModelProfile, validate_declared_profile
from grid_core.store import StoreIdentity, may_share_state
from grid_core.table import render_table
from grid_server import profile_flags
from grid_server.cli_render import console, explain_view, status_view
from grid_server.client import CliError, resolve_target, send
from grid_server.home import write_secret_file


def model_set(
    model_id: str = typer.Argument(..., help="Model id (e.g. the GGUF file name)."),
    memory_mb: profile_flags.MemoryMbOption = None,
    runtime_memory_mb: profile_flags.RuntimeMemoryMbOption = None,
    artifact_sha256: profile_flags.ArtifactSha256Option = None,
    artifact_source: profile_flags.ArtifactSourceOption = None,
    artifact_size_mb: profile_flags.ArtifactSizeMbOption = None,
    runtime: profile_flags.RuntimeOption = None,
    backend: profile_flags.BackendOption = None,
    min_replicas: profile_flags.MinReplicasOption = None,
    max_replicas: profile_flags.MaxReplicasOption = None,
    priority: profile_flags.PriorityOption = None,
    data_tier: profile_flags.DataTierOption = None,
    required_tag: profile_flags.RequiredTagOption = None,
    forbidden_tag: profile_flags.ForbiddenTagOption = None,
    min_failure_domains: profile_flags.MinFailureDomainsOption = None,
    max_colocated_models: profile_flags.MaxColocatedModelsOption = None,
    colocation_exclude: profile_flags.ColocationExcludeOption = None,
    pin: profile_flags.PinOption = None,
    min_gpu_count: profile_flags.MinGpuCountOption = None,
    min_gpu_memory_mb: profile_flags.MinGpuMemoryMbOption = None,
    replica_concurrency: profile_flags.ReplicaConcurrencyOption = None,
    target_utilization: profile_flags.TargetUtilizationOption = None,
    expected_service_time_s: profile_flags.ExpectedServiceTimeSOption = None,
    latency_slo_ms: profile_flags.LatencySloMsOption = None,
    load_estimate_s: profile_flags.LoadEstimateSOption = None,
    warm_estimate_s: profile_flags.WarmEstimateSOption = None,
    admission_headroom_mb: profile_flags.AdmissionHeadroomMbOption = None,
    min_residency_s: profile_flags.MinResidencySOption = None,
    scale_down_cooldown_s: profile_flags.ScaleDownCooldownSOption = None,
    workload_score: profile_flags.WorkloadScoreOption = None,
    replace: profile_flags.ReplaceOption = False,
    clear_pins: profile_flags.ClearPinsOption = False,
    clear_required_tags: profile_flags.ClearRequiredTagsOption = False,
    clear_forbidden_tags: profile_flags.ClearForbiddenTagsOption = False,
    clear_backends: profile_flags.ClearBackendsOption = False,
    clear_colocation_excludes: profile_flags.ClearColocationExcludesOption = False,
    clear_runtime_memory_mb: profile_flags.ClearRuntimeMemoryMbOption = False,
    clear_workload_scores: profile_flags.ClearWorkloadScoresOption = False,
    clear_runtimes: profile_flags.ClearRuntimesOption = False,
    clear: profile_flags.ClearOption = None,
    grid: GridOption = None,
    token_file: OperatorTokenOption = None,
) -> None:
    """Create a model's placement profile, or change only the given fields of an existing one.

    An existing profile keeps every field not given on the command line; ``--replace``
    starts from the defaults instead; ``--clear-<field>`` empties one list field and
    ``--clear FIELD`` returns any field with a default to it (an unknown or required field,
    or one also given a value, is refused before anything is written). The write
    names the version it read, so an edit made meanwhile by someone else is never undone: the
    server refuses with 409 and this command prints both versions (re-run it to merge). The
    changed fields are printed as old → new.
    """
    # Every parameter by name, before any other local exists: the flags, as given.
    given = profile_flags.profile_edit(locals())
    _write_profile(grid, token_file, model_id, given, replace=replace)


def _write_profile(
    grid: str | None,
    token_file: Path | None,
    model_id: str,
    given: dict[str, Any],
    *,
    replace: bool,
) -> None:
    """Merge ``given`` (profile field → value) into the model's profile and write it back.

    The write names the version that was read (``if_version``); the changed fields are
    printed as old → new and the server's warnings on stderr.

    Raises:
        CliError: the profile changed meanwhile (409; both versions are printed, exit 2).
        CliError: a new profile without ``--memory-mb`` or an invalid merge (nothing is sent).
    """
    current, version = _current_profile(grid, model_id)
    profile = _merged_profile(model_id, current, given, replace)
    if profile == current:
        typer.echo(f"grid: profile for '{model_id}' unchanged")
        return
    call = Calls.put_model(model_id, msgspec.to_builtins(profile), if_version=version)
    try:
        answer = send(grid, call, token_file=token_file)
    except RequestRefused as exc:
        if exc.status == HTTPStatus.CONFLICT:
            raise CliError(_conflict_text(model_id, exc, profile), EXIT_USAGE) from None
        raise
    verb = "created" if current is None else "replaced" if replace else "updated"
    typer.echo(f"grid: profile for '{model_id}' {verb}")
    for line in profile_changes(current, profile):
        typer.echo(f"  {line}")
    for warning in answer.get("warnings") or ():
        # Accepted (hosts may join later), but it cannot be placed in full today.
        typer.echo(f"grid: warning: {warning}", err=True)


def _conflict_text(model_id: str, exc: RequestRefused, proposed: ModelProfile) -> str:
    """A 409 version conflict as lines: both versions, and what differs between them."""
    d = exc.details or {}
    lines = [f"profile for '{model_id}' changed while this command ran; nothing was written"]
    lines.append(
        f"  version you read: {d.get('expected_version') or 'none'}; "
        f"server has: {d.get('current_version') or 'none'}"
    )
    try:
        current = msgspec.convert(d.get("current"), ModelProfile | None)
    except msgspec.ValidationError:
        current = None
    if current is not None:
        lines.append("  server's profile → your profile:")
        lines.extend(f"    {c}" for c in profile_changes(current, proposed))
    lines.append("  re-run the command to apply your change on top of the server's version")
    return "\n".join(lines)


def _current_profile(grid: str | None, model_id: str) -> tuple[ModelProfile | None, str]:
    """The server's profile for ``model_id`` and its version (``None, ""`` when none: 404)."""
    try:
        data = send(grid, Calls.get_model(model_id))
    except RequestRefused as exc:
        if exc.status == HTTPStatus.NOT_FOUND:
            return None, ""
        raise
    try:
        profile = msgspec.convert(data["profile"], ModelProfile)
    except (msgspec.ValidationError, KeyError, TypeError) as exc:
        msg = f"the server's profile for '{model_id}' is unreadable ({exc}); use --replace"
        raise CliError(msg) from None
    version = data.get("version")
    # An older server sends no version: fall back to "any existing profile".
    return profile, version if isinstance(version, str) and version else "*"


def _merged_profile(
    model_id: str, current: ModelProfile | None, given: dict[str, Any], replace: bool
) -> ModelProfile:
    """``given`` applied over the current profile (or over the defaults), validated.

    Raises:
        CliError: a new or replaced profile without ``--memory-mb``, or an invalid result
            (exit 2; nothing is sent).
    """
    try:
        if current is None or replace:
            if "memory_mb" not in given:
                what = "replacing" if current is not None else "a new profile"
                msg = f"--memory-mb is required for {what} ('{model_id}')"
                raise CliError(msg, EXIT_USAGE)
            base = ModelProfile(model_id=model_id, memory_mb=given["memory_mb"])
        else:
            base = current
        return validate_declared_profile(msgspec.structs.replace(base, **given))
    except ValidationError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


def _show(value: object) -> str:
    plain = msgspec.to_builtins(value)
    if plain is None:
        return "-"
    if isinstance(plain, list | tuple):
        return ",".join(str(v) for v in plain) or "-"
    if isinstance(plain, dict):
        return ",".join(f"{k}={v}" for k, v in sorted(plain.items())) or "-"
    return str(plain)


def profile_changes(old: ModelProfile | None, new: ModelProfile) -> list[str]:
    """``field: old → new`` for every field that differs (against the defaults when new;
    ``memory_mb``, which has no default, then shows as ``- → new``)."""
    created = old is None
    if old is None:
        old = ModelProfile(model_id=new.model_id, memory_mb=0)
    lines = []
    for name in ModelProfile.__struct_fields__:
        before, after = getattr(old, name), getattr(new, name)
        if before != after or (created and name == "memory_mb"):
            shown = "-" if created and name == "memory_mb" else _show(before)
            lines.append(f"{name}: {shown} → {_show(after)}")
    return lines


def model_show(
    model_id: str = typer.Argument(..., help="Model id."),
    grid: GridOption = None,
    as_json: bool = typer.Option(
        False, "--json", help="The server's document as JSON, default values filled in."
    ),
) -> None:
    """Show a model's profile: every field (changed ones marked *) and its version.

    The version is the one ``model set`` writes over (an edit made meanwhile is refused).
    ``--json`` prints the server's document with the default of every profile field this
    CLI knows added where the server left it out (fields only a newer server knows stay as
    it sent them). Exit 2 when the model has no profile (404).
    """
    data = send(grid, Calls.get_model(model_id))
    try:
        profile = msgspec.convert(data["profile"], ModelProfile)
    except (msgspec.ValidationError, KeyError, TypeError) as exc:
        if as_json:  # show what the server said, as it said it
            typer.echo(json.dumps(data, indent=2, sort_keys=True))
            return
        msg = f"the server's profile for '{model_id}' is unreadable ({exc}); see --json"
        raise CliError(msg) from None
    if as_json:
        every = {f: msgspec.to_builtins(getattr(profile, f)) for f in profile.__struct_fields__}
        doc = {**data, "profile": {**every, **data["profile"]}}
        typer.echo(json.dumps(doc, indent=2, sort_keys=True))
        return
    default = ModelProfile(model_id=model_id, memory_mb=0)
    rows = [
        (
            name + (" *" if getattr(profile, name) != getattr(default, name) else ""),
            _show(getattr(profile, name)),
        )
        for name in ModelProfile.__struct_fields__
    ]
    typer.echo(f"model {model_id}  version {data.get('version') or '-'}")
    typer.echo(render_table(("field", "value"), rows))
    typer.echo("(* differs from the default)")


def model_remove(
    model_id: str = typer.Argument(..., help="Model id."),
    grid: GridOption = None,
    token_file: OperatorTokenOption = None,
) -> None:
    """Retire a model's profile (converges to zero replicas safely)."""
    send(grid, Calls.delete_model(model_id), token_file=token_file)
    typer.echo(f"grid: profile for '{model_id}' removed")


def mode(
    value: str = typer.Argument(..., metavar="observe|recommend|automatic"),
    grid: GridOption = None,
    token_file: OperatorTokenOption = None,
) -> None:
    """Select the allocator mode (recommend is the default; automatic acts)."""
    if value not in ("observe", "recommend", "automatic"):
        raise CliError(f"mode {value!r}: use observe, recommend or automatic", EXIT_USAGE)
    data = send(grid, Calls.set_mode(value), token_file=token_file)
    typer.echo(f"grid: allocator mode is {data.get('mode')}")
    if data.get("mode") != value:
        raise CliError(f"mode {value} was refused; see 'grid allocator status'")


def tick(
    grid: GridOption = None,
    token_file: OperatorTokenOption = None,
    as_json: bool = typer.Option(False, "--json", help="The pass's result as JSON."),
) -> None:
    """Run one reconciliation pass now."""
    data = send(grid, Calls.tick(), token_file=token_file)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        typer.echo("grid: tick done")


def status(
    grid: GridOption = None,
    as_json: bool = typer.Option(False, "--json", help="Full detail as JSON."),
) -> None:
    """Show the allocator's state: mode, hosts, models, actions, unmet constraints, warnings."""
    data = send(grid, Calls.status(detail=True))
    if as_json:
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    console().print(status_view(data))


def render_status(data: dict[str, Any]) -> str:
    """The readable status as plain text (what ``grid allocator status`` prints to a pipe)."""
    out = console()
    with out.capture() as captured:
        out.print(status_view(data))
    return captured.get()


def explain(
    model_id: str = typer.Argument(..., help="The model to explain."),
    grid: GridOption = None,
    as_json: bool = typer.Option(False, "--json", help="The explanation as JSON."),
) -> None:
    """Why MODEL is where it is (or is not): demand, desired count, a verdict per host and
    the constraint that binds.

    A model without a profile is operator input naming nothing: the explanation is still
    printed (``--json`` keeps ``configured: false``) and the command exits 2.
    """
    data = send(grid, Calls.explain(model_id))
    if as_json:
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        console().print(explain_view(data))
    if data.get("configured") is False:
        raise CliError(str(data.get("summary") or f"model '{model_id}' has no profile"), EXIT_USAGE)


def _check_ttl(flag: str, value: float, most: float) -> None:
    """Refuse a lifetime the server would refuse, in the flag's own unit.

    Args:
        flag: ``--ttl-days`` or ``--ttl-minutes``.
        value: the lifetime as given, in that flag's unit.
        most: the server's bound (``grid_core.bodies``) in the same unit.

    Raises:
        CliError: NaN, an infinity, zero or less, or above ``most`` (exit 2).
    """
    if not (math.isfinite(value) and 0 < value <= most):
        raise CliError(f"{flag} must be a number in (0, {most:g}]; got {value:g}", EXIT_USAGE)


def token_write(
    file: Path = typer.Argument(..., help="Where to write the credential (mode 0600)."),  # noqa: B008
    host_id: str | None = typer.Option(None, "--host-id", help="Stable host id to authorize."),
    ttl_days: float = typer.Option(30.0, "--ttl-days", help="Lifetime in days."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing FILE."),
    grid: GridOption = None,
    token_file: OperatorTokenOption = None,
) -> None:
    """Write an expiring node credential for one host id to FILE (owner-only)."""
    _check_ttl("--ttl-days", ttl_days, MAX_NODE_CREDENTIAL_TTL_S / 86400.0)
    if file.exists() and not force:
        # The file may be the only copy of a host's working credential.
        msg = f"{file} already exists; pass --force to replace it, or choose another path"
        raise CliError(msg, EXIT_USAGE)
    call = Calls.issue_node_credential(host_id or None, ttl_days * 86400.0)
    credential = send(grid, call, token_file=token_file)
    write_secret_file(file, msgspec.json.encode(credential).decode() + "\n")
    if not host_id:
        typer.echo(f"grid: generated host id {credential.host_id}")
    typer.echo(f"grid: wrote a node credential to {file} (mode 0600)")


def join_write(
    file: Path = typer.Argument(..., help="Where to write the join file (mode 0600)."),  # noqa: B008
    host_id: str | None = typer.Option(None, "--host-id", help="Stable host id to provision."),
    ttl_minutes: float = typer.Option(60.0, "--ttl-minutes", help="Lifetime in minutes."),
    url: str | None = typer.Option(
        None, "--url", help="The server URL as the new machine reaches it (default: --grid's)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing FILE."),
    grid: GridOption = None,
    token_file: OperatorTokenOption = None,
) -> None:
    """Write a one-time join token to FILE (owner-only): the server URL, the CA fingerprint
    and a secret that a new machine spends once with 'grid allocator node start --join FILE'.
    """
    _check_ttl("--ttl-minutes", ttl_minutes, MAX_JOIN_TOKEN_TTL_S / 60.0)
    if file.exists() and not force:
        msg = f"{file} already exists; pass --force to replace it, or choose another path"
        raise CliError(msg, EXIT_USAGE)
    target = resolve_target(grid)
    grid_url = check_url(url) if url else target.url
    check_credential_transport(grid_url, "join token")
    issued = send(
        grid, Calls.issue_join_token(host_id or None, ttl_minutes * 60.0), token_file=token_file
    )
    doc = JoinFile(
        grid_url=grid_url,
        ca_sha256=issued.ca_sha256,
        host_id=issued.host_id,
        join_token=issued.join_token,
        expires_at=issued.expires_at,
    )
    write_secret_file(file, msgspec.json.encode(doc).decode() + "\n")
    if not host_id:
        typer.echo(f"grid: generated host id {issued.host_id}")
    pin = f"CA sha256:{issued.ca_sha256}" if issued.ca_sha256 else "no CA pin (system trust)"
    typer.echo(
        f"grid: wrote a one-time join token for {grid_url} ({pin}) to {file} (mode 0600, "
        f"expires in {ttl_minutes:g} min); on the new machine: "
        f"grid allocator node start --join {file.name}"
    )
    if grid_url.startswith("http://"):
        typer.echo("grid: note: a plain-HTTP loopback URL only works on this machine", err=True)


def node_revoke(
    host_id: str = typer.Argument(..., help="The host id to revoke (see 'grid allocator status')."),
    grid: GridOption = None,
    token_file: OperatorTokenOption = None,
    as_json: bool = typer.Option(False, "--json", help="The server's answer as JSON."),
) -> None:
    """Revoke a host: its credentials are refused and its engines get no new request from now.

    The controller stops counting its replicas (it may place them elsewhere). Requests already
    running there may finish. The answer lists the engines withdrawn and any model left with
    no ready replica. Re-admit the host by provisioning it again (a new join token or node
    credential).
    """
    data = send(grid, Calls.revoke_host(host_id), token_file=token_file)
    if as_json:
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
        return
    for line in revoke_lines(data):
        typer.echo(line)


def revoke_lines(data: dict[str, Any]) -> list[str]:
    """What ``node revoke`` prints for the server's answer (see
    :func:`grid_server.api_allocator.revoke_host`): the revocation, the engines withdrawn
    (or the node record alone, or that the host was revoked already, or a warning that the
    server knows no host of that id, so that a mistyped id is not taken for a revocation of
    the host meant), requests still finishing there and the models left with no ready
    replica."""
    host = data.get("host_id")
    engines = data.get("engines") or []
    lines = [f"grid: revoked host {host}; its credentials are refused from now on"]
    if engines:
        lines.append(f"grid: withdrew {len(engines)} engine(s) of {host} from routing:")
        lines += [f"  {e['engine_id']}  {', '.join(e['models'])}" for e in engines]
    elif data.get("control_record"):
        lines.append(
            f"grid: withdrew {host}'s node record (its capacity leaves the controller's "
            "view); it had no engine routed here"
        )
    elif data.get("already_revoked_at") is not None:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(data["already_revoked_at"]))
        lines.append(
            f"grid: {host} was already revoked (at {at}) and had nothing routed here; "
            "a credential issued since then is refused now too"
        )
    else:
        lines.append(
            f"grid: warning: this server knows no host {host!r} (nothing was withdrawn); if "
            "the id is mistyped, the host you meant is still admitted: check the ids in "
            f"'grid allocator status'. {host!r} stays revoked should it ever connect"
        )
    inflight = int(data.get("inflight_requests") or 0)
    if inflight:
        lines.append(f"grid: {inflight} request(s) already running there may finish")
    for model in data.get("no_ready_replica") or []:
        lines.append(
            f"grid: warning: model '{model}' has no ready replica now; its requests are "
            "refused (503, or 404 without a profile) until one is ready elsewhere"
        )
    return lines


def state_copy(
    source: str = typer.Option(..., "--from", help="'file' or etcd://host:port[,…][/prefix]."),
    target: str = typer.Option(..., "--to", help="'file' or etcd://host:port[,…][/prefix]."),
    state_dir: Path | None = typer.Option(  # noqa: B008
        None, "--state-dir", help="The file store's directory (default $GRID_HOME/state)."
    ),
    force: bool = typer.Option(False, "--force", help="Replace state the target already has."),
    etcd_ca: EtcdCaOption = None,
    etcd_cert: EtcdCertOption = None,
    etcd_key: EtcdKeyOption = None,
    etcd_user: EtcdUserOption = None,
    etcd_password_file: EtcdPasswordFileOption = None,
) -> None:
    """Move controller state between the file store and etcd (stop every server on them first).

    The term continues above the source's, so nodes accept the next leader's commands.
    """
    import time

    from grid_server.cli_server import running_server
    from grid_server.home import grid_home
    from grid_server.store import copy_state, file_store, open_state_store

    def opened(flag: str, spec: str) -> Any:
        if spec == "file":
            return file_store(grid_home(), state_dir)
        if not spec.startswith(("etcd://", "etcds://")):
            msg = (
                f"{flag} {spec!r}: expected 'file' or etcd://host:port[,…][/prefix] "
                "(etcds:// for TLS)"
            )
            raise CliError(msg, EXIT_USAGE)
        try:
            return open_state_store(
                spec,
                ca_file=str(etcd_ca) if etcd_ca else None,
                cert_file=str(etcd_cert) if etcd_cert else None,
                key_file=str(etcd_key) if etcd_key else None,
                username=etcd_user,
                password_file=str(etcd_password_file) if etcd_password_file else None,
            )
        except ValidationError as exc:
            # The URL parser speaks of grid up's --state-store; here the URL came from flag.
            raise CliError(str(exc).replace("--state-store", flag, 1), EXIT_USAGE) from None

    if source == target:
        raise CliError("--from and --to name the same store", EXIT_USAGE)
    src, dst = opened("--from", source), opened("--to", target)
    server = running_server()
    if server is not None:
        # A server in observe or recommend mode holds no lease the copy would notice.
        _refuse_a_store_in_use(server, {"--from": src, "--to": dst})
    try:
        size, term = copy_state(src, dst, now=time.time(), force=force)
    except GridError as exc:
        raise CliError(str(exc), exc.exit_code) from None
    typer.echo(
        f"grid: copied {size} bytes of controller state to {target}; terms continue above {term}"
    )


def _refuse_a_store_in_use(server: dict[str, Any], stores: dict[str, Any]) -> None:
    """Refuse ``state copy`` when this Grid home's running server uses either store.

    Args:
        server: the running server's record (``server.json``); its ``state_store`` names the
            store it uses (absent from a record written by an earlier Grid).
        stores: the opened stores by flag (``--from``, ``--to``).

    Raises:
        CliError: the server uses one of the stores, or its record does not say which store
            it uses (exit 2; the message names the server, the flag and the store).
    """
    from grid_server.store import store_identity

    running = (
        f"a Grid server is running at {server.get('url')} (pid {server.get('pid')}) on this "
        "Grid home"
    )
    fix = "stop it with 'grid down' (and every other server on that store) before copying"
    try:
        used = msgspec.convert(server.get("state_store"), StoreIdentity | None)
    except msgspec.ValidationError:
        used = None
    if used is None:
        msg = f"{running} and its record does not say which state store it uses; {fix}"
        raise CliError(msg, EXIT_USAGE)
    for flag, store in stores.items():
        mine = store_identity(store)
        if may_share_state(used, mine):
            if mine == used:
                msg = f"{running} and uses the {flag} store, {mine.describe()}; {fix}"
            else:  # the same etcd prefix under other endpoints: maybe the same cluster
                msg = (
                    f"{running} and may use the {flag} store: {mine.describe()} has the key "
                    f"prefix of the server's store, {used.describe()}, and other endpoints can "
                    f"reach the same etcd cluster; {fix}, or copy under another prefix"
                )
            raise CliError(msg, EXIT_USAGE)


def register(cli: Any) -> None:
    """Mount the allocator commands on ``grid allocator``."""
    group = cli.group("allocator")
    model = cli.subgroup("allocator", "model", help="Model placement profiles.")
    model.command("set")(model_set)
    model.command("show")(model_show)
    model.command("remove")(model_remove)
    model.command("rm", hidden=True)(model_remove)
    group.command("mode")(mode)
    group.command("tick")(tick)
    group.command("status")(status)
    group.command("explain")(explain)
    token = cli.subgroup("allocator", "token", help="Node credentials.")
    token.command("write")(token_write)
    join = cli.subgroup("allocator", "join", help="One-time join tokens for new machines.")
    join.command("write")(join_write)
    node = cli.subgroup("allocator", "node", help="This machine's managed node agent.")
    node.command("revoke")(node_revoke)
    state = cli.subgroup("allocator", "state", help="The controller's durable state store.")
    state.command("copy")(state_copy)
