"""The logical fleet's ComfyUI media node (``grid test start --include-comfyui``).

Source: the specification's "Single-machine scenario lab and logical fleet test": with
``--include-comfyui`` one of the N logical machines is a ComfyUI media node and the others
are llama.cpp text nodes. The fixture owns the ComfyUI process (it starts it before the media
node's agent and stops it after), and the partition of this machine's memory stays a
partition: the media node gets one share like a text node.

Unlike the specification's first version, where the fixture's ComfyUI was inventory only,
here the media node's agent runs the ComfyUI runtime plugin: each workflow of the media
bundle is a profile (``runtimes: [comfyui]``, zero minimum replicas), so the first image
request finds it cold (503 + ``Retry-After``), its demand makes the controller warm the
workflow's gateway on the media node, and later requests get the PNG — the same lifecycle
as a text model.

What runs as ComfyUI is the operator's choice: ``--comfyui PATH`` or ``$GRID_COMFYUI``, an
executable that takes ComfyUI's own ``main.py`` flags (``--listen``, ``--port``,
``--base-directory``). On a machine without a GPU the test suite passes its FAKE ComfyUI
server (``tests/fakes/fake_comfyui.py``) this way.

The media bundle (``--media-bundle DIR``) is a directory of workflow manifests
(``<model id>.workflow.json``) and the checkpoint files they name (beside them or under
``checkpoints/``). The fixture links the checkpoints into its ComfyUI's own base directory
(``fleet/comfyui/models/checkpoints``) and the manifests into the media node's model
directory (``fleet/media``): Grid still never downloads workflow assets.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import msgspec

from grid_core.api import (
    ConflictError,
    GridError,
    ProcessIdentity,
    SpawnedChild,
    UnavailableError,
    ValidationError,
    birth_of,
    exit_status,
    spawn_detached,
    stop_process_sync,
    wait_until_sync,
)
from grid_fleet import layout
from grid_fleet.layout import FleetRecord, ModelSpec, ProcessRecord, sha256_of

Echo = Callable[[str], None]

RUNTIME = "comfyui"
"""The runtime plugin the media node offers (and the only one)."""
TEXT_RUNTIME = "llama.cpp"
"""The runtime the text nodes offer: their engines are Grid-owned llama-server children."""
EXECUTABLE_ENV = "GRID_COMFYUI"
"""Names the ComfyUI launcher when ``--comfyui`` is not given."""
URL_ENV = "GRID_COMFYUI_URL"
"""How the ComfyUI runtime plugin finds its server (set for the media node's agent only)."""
MANIFEST_SUFFIX = ".workflow.json"
"""A workflow manifest's file name ends so (the ComfyUI plugin's convention)."""
CHECKPOINT_DIR = "checkpoints"
START_S = 180.0
"""ComfyUI imports PyTorch and scans its custom nodes before it listens: minutes on a cold
disk are normal; the fake answers within a second or two."""
STOP_S = 20.0
"""Graceful ComfyUI shutdown budget before SIGKILL."""
POLL_S = 0.5
LOG_TAIL_LINES = 5
WORKFLOW_MEMORY_SHARE = 0.5
"""A workflow's budget as a share of the media node's memory: one workflow always fits with
room for the planner's admission headroom (ComfyUI keeps one checkpoint loaded at a time)."""
WORKFLOW_PRIORITY = 50
"""The same priority as the text baseline: image work is neither batch nor critical."""


class BundleManifest(msgspec.Struct):
    """The two fields of a workflow manifest the fleet reads (the ComfyUI plugin checks the
    whole manifest when it loads the workflow)."""

    id: str
    checkpoints: list[str] = msgspec.field(default_factory=list)


def comfyui_executable(given: Path | None) -> str:
    """The ComfyUI launcher: ``--comfyui PATH``, else ``$GRID_COMFYUI``.

    Raises:
        ValidationError: neither is given, or the file is not executable (one line with the fix).
    """
    raw = str(given) if given is not None else os.environ.get(EXECUTABLE_ENV, "")
    if not raw:
        msg = (
            f"--include-comfyui needs ComfyUI: pass --comfyui PATH or set {EXECUTABLE_ENV} to an "
            "executable that takes ComfyUI's main.py flags (--listen, --port, --base-directory)"
        )
        raise ValidationError(msg)
    path = Path(raw).expanduser()
    found = shutil.which(str(path))
    if found is None:
        msg = f"--comfyui {raw}: no such executable file"
        raise ValidationError(msg)
    return str(Path(found).resolve())


def bundle_manifests(bundle: Path) -> list[tuple[str, Path, list[str]]]:
    """The workflows of a media bundle: ``(model id, manifest, checkpoint names)`` each.

    Only the fields the fixture needs are read here; the ComfyUI plugin checks the whole
    manifest when it loads the workflow.

    Raises:
        ValidationError: not a directory, no manifest, an unreadable manifest, an id that
            does not match its file name, or a checkpoint the bundle does not hold.
    """
    if not bundle.is_dir():
        msg = f"--media-bundle {bundle}: not a directory of workflow manifests"
        raise ValidationError(msg)
    out = []
    for path in sorted(bundle.glob(f"*{MANIFEST_SUFFIX}")):
        try:
            entry = msgspec.json.decode(path.read_bytes(), type=BundleManifest)
        except OSError as exc:
            msg = f"--media-bundle: {path}: cannot read ({exc.strerror})"
            raise ValidationError(msg) from None
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            msg = (
                f"--media-bundle: {path} is not a workflow manifest: {exc} "
                '(a manifest needs at least "id", the model id, and lists its "checkpoints")'
            )
            raise ValidationError(msg) from None
        model_id, ckpts = entry.id, entry.checkpoints
        if path.name != f"{model_id}{MANIFEST_SUFFIX}":
            want = f"{model_id}{MANIFEST_SUFFIX}"
            msg = f"--media-bundle: {path.name} declares id {model_id!r}; name it {want}"
            raise ValidationError(msg)
        for c in ckpts:
            if checkpoint_file(bundle, c) is None:
                msg = (
                    f"--media-bundle: workflow {model_id} needs checkpoint {c}, which is neither "
                    f"in {bundle} nor in {bundle / CHECKPOINT_DIR}"
                )
                raise ValidationError(msg)
        out.append((model_id, path, ckpts))
    if not out:
        msg = f"--media-bundle {bundle}: no *{MANIFEST_SUFFIX} workflow manifest in it"
        raise ValidationError(msg)
    return out


def checkpoint_file(bundle: Path, name: str) -> Path | None:
    """Where the bundle holds checkpoint ``name`` (beside the manifests or in checkpoints/)."""
    if Path(name).name != name:
        return None  # a path, not a file name: never leave the bundle
    for candidate in (bundle / name, bundle / CHECKPOINT_DIR / name):
        if candidate.is_file():
            return candidate
    return None


def base_dir(root: Path) -> Path:
    """The fixture's ComfyUI base directory (models, input, output, user)."""
    return root / "comfyui"


def model_dir(root: Path) -> Path:
    """The media node's model directory: the bundle's manifests, linked."""
    return root / "media"


def prepare_bundle(root: Path, bundle: Path, media_capacity_mb: int) -> tuple[ModelSpec, ...]:
    """Link the bundle into the fixture and describe each workflow's profile.

    Returns:
        One :class:`ModelSpec` per workflow: the manifest's SHA-256 as its identity, the
        ``comfyui`` runtime, half the media node's memory, zero to one replica.

    Raises:
        ValidationError: see :func:`bundle_manifests`.
    """
    workflows = bundle_manifests(bundle)
    ckpt_dir = base_dir(root) / "models" / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    mdir = model_dir(root)
    mdir.mkdir(parents=True, exist_ok=True)
    out = []
    for model_id, manifest, ckpts in workflows:
        _link(mdir / manifest.name, manifest)
        for c in ckpts:
            found = checkpoint_file(bundle, c)
            assert found is not None  # bundle_manifests checked it
            _link(ckpt_dir / c, found)
        out.append(
            ModelSpec(
                model_id=model_id,
                path=str(manifest.resolve()),
                sha256=sha256_of(manifest),
                memory_mb=int(media_capacity_mb * WORKFLOW_MEMORY_SHARE),
                priority=WORKFLOW_PRIORITY,
                min_replicas=0,
                max_replicas=1,
                runtime=RUNTIME,
            )
        )
    return tuple(out)


def _link(link: Path, target: Path) -> None:
    if link.is_symlink() or link.exists():
        link.unlink()  # an earlier fleet's bundle
    link.symlink_to(target.resolve())


def start_comfyui(
    root: Path, executable: str, port: int, *, fresh_log: bool = True
) -> ProcessRecord:
    """Start ComfyUI on ``127.0.0.1:port`` with the fixture's base directory.

    The process is returned as soon as it runs (the caller records it at once, so a failed
    start is cleaned up like any fleet process); :func:`wait_comfyui` waits for it to answer.

    Raises:
        UnavailableError: the launcher could not be started.
    """
    base = base_dir(root)
    base.mkdir(parents=True, exist_ok=True)
    argv = [executable, "--listen", "127.0.0.1", "--port", str(port), "--base-directory", str(base)]
    log = root / "comfyui.log"
    try:
        pid = spawn_detached(argv, log_path=log, truncate_log=fresh_log)
    except OSError as exc:
        msg = f"could not start ComfyUI ({executable}): {exc.strerror or exc}"
        raise UnavailableError(msg) from None
    birth = birth_of(pid)
    if birth is None:
        stop_process_sync(SpawnedChild(pid), grace_s=STOP_S)
        msg = f"ComfyUI ({executable}) exited at once; see {log}"
        raise UnavailableError(msg)
    return ProcessRecord(pid=pid, birth=birth, marker=("--base-directory", str(base)))


def wait_comfyui(root: Path, rec: ProcessRecord, url: str) -> None:
    """Wait until ComfyUI answers ``/system_stats`` at ``url``.

    Raises:
        UnavailableError: it exited (its log's tail is quoted) or did not answer in time.
    """
    log = root / "comfyui.log"

    def answers() -> bool:
        code = exit_status(rec.pid)
        if code is not None or rec.identity().prove().status == "dead":
            tail = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            msg = f"ComfyUI exited ({code}); {log} ends with:\n" + ("\n".join(tail) or "(empty)")
            raise UnavailableError(msg)
        try:
            return httpx.get(f"{url}/system_stats", timeout=2.0, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    if not wait_until_sync(answers, timeout_s=START_S, interval_s=POLL_S):
        msg = f"ComfyUI did not answer at {url} within {START_S:.0f} s; see {log}"
        raise UnavailableError(msg)


def stop_comfyui(rec: ProcessRecord | None, echo: Echo) -> None:
    """Stop the fixture's ComfyUI by its proven identity (after the media node unloaded)."""
    if rec is None:
        return
    ident: ProcessIdentity = rec.identity()
    proof = ident.prove()
    if proof.status == "dead":
        return
    if proof.status != "proven":
        echo(f"  not signalling ComfyUI pid {rec.pid}: {proof.reason} (inspect it by hand)")
        return
    try:
        stop_process_sync(ident, grace_s=STOP_S)
    except GridError as exc:
        echo(f"  ComfyUI pid {rec.pid}: {exc}")
        return
    echo(f"  ComfyUI pid {rec.pid} stopped")


def start_media(
    root: Path, rec: FleetRecord, put_profile: Callable[[ModelSpec], None], echo: Echo
) -> None:
    """Profile the bundle's workflows and start the media node's ComfyUI.

    The process is written to ``fleet.json`` as soon as it runs, so a failed start stops it
    like every other fleet process.

    Raises:
        ValidationError: the media bundle is unusable.
        UnavailableError: ComfyUI did not start or answer.
    """
    settings = rec.settings
    assert settings.media_bundle is not None and settings.comfyui is not None
    host = rec.hosts[-1]
    assert host.comfyui_url is not None
    rec.media = prepare_bundle(root, Path(settings.media_bundle), host.capacity_mb)
    for m in rec.media:
        put_profile(m)
        echo(
            f"  workflow {m.model_id}: {m.memory_mb} MB on media node {host.host_id}, "
            "cold until asked"
        )
    rec.comfyui = start_comfyui(root, settings.comfyui, _port(host.comfyui_url))
    layout.save_record(root, rec)
    wait_comfyui(root, rec.comfyui, host.comfyui_url)
    echo(f"  ComfyUI pid {rec.comfyui.pid} on {host.comfyui_url} (media node {host.host_id})")


def restart_comfyui(root: Path, rec: FleetRecord, echo: Echo) -> None:
    """Bring back the media node's ComfyUI when it is not running (no media node: no-op).

    Raises:
        ConflictError: the recorded pid is alive but not provably the fixture's ComfyUI.
        UnavailableError: it did not come back.
    """
    host = rec.hosts[-1] if rec.hosts else None
    if rec.settings.comfyui is None or host is None or host.comfyui_url is None:
        return
    proof = rec.comfyui.identity().prove().status if rec.comfyui else "dead"
    if proof == "proven":
        return
    if proof == "unproven" and rec.comfyui is not None:
        msg = (
            f"ComfyUI pid {rec.comfyui.pid} in {layout.record_path(root)} is alive but not "
            "provably the fleet's; inspect it by hand"
        )
        raise ConflictError(msg)
    rec.comfyui = start_comfyui(
        root, rec.settings.comfyui, _port(host.comfyui_url), fresh_log=False
    )
    layout.save_record(root, rec)
    wait_comfyui(root, rec.comfyui, host.comfyui_url)
    echo(f"  ComfyUI pid {rec.comfyui.pid} restarted on {host.comfyui_url}")


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None  # built by layout.host_specs with an explicit port
    return port
