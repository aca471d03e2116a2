"""Which Grid a command talks to: ``--grid <name|url|local>`` and the named-grid config file.

Source: the specification's "Remote Grid deployment" (every command accepts ``--grid`` with a
name, an id or a local URL). An operator who runs several grids keeps them by name in
``$GRID_HOME/grids.json`` (0600), each with its URL, the CA certificate its server is verified
with, the operator token file and a client key file; ``grid grids use NAME`` makes one the
default. The file holds paths only, never a secret.

Resolution of ``--grid`` (:func:`resolve_target`):

* ``https://…`` / ``http://…``: that URL; the CA and token file of a configured grid with the
  same URL, or of the local server when it is that URL;
* ``local``: the server ``grid up`` started on this machine (``server.json``);
* a name: that configured grid;
* omitted: the default grid if one was chosen with ``grid grids use``, else ``local``.

Layering: an edge module of ``grid_core`` (it reads files); decision modules never import it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from grid_core.errors import StateError, ValidationError
from grid_core.system import grid_home, write_atomic

GRID_OPTION_HELP = (
    "Grid URL, a configured grid name ('grid grids list') or 'local'; default: the grid "
    "chosen with 'grid grids use', else local."
)
"""The help of every command's ``--grid`` option: what :func:`resolve_target` accepts."""

GRIDS_FILE = "grids.json"
"""The named-grid config file inside ``$GRID_HOME``."""
LOCAL_SERVER_FILE = "server.json"
"""What ``grid up`` announces in ``$GRID_HOME`` (the server package writes it)."""
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 22100
"""The server's port when nothing says otherwise: clear of the engines' own defaults
(llama.cpp 8080, vLLM 8000, ComfyUI 8188, Ollama 11434) and below the ephemeral range."""
DEFAULT_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"
"""Where the local server listens when nothing says otherwise (``grid up``'s defaults); the
one definition the CLI, the node agent and the server share."""
GRID_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$"
"""Grid names: short identifiers that cannot be mistaken for a URL or ``local``."""
RESERVED_NAMES = frozenset({"local"})


class GridEntry(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One named grid.

    Attributes:
        url: the server's base URL (``https://`` off loopback).
        ca_file: CA certificate the server is verified with (``None``: system store).
        token_file: file holding the operator capability for this grid.
        client_key_file: file holding a client API key for ``/v1`` on this grid.
        node_token_file: a node credential file (``grid allocator node start`` on a worker).
        start_hint: the command that brings this grid's server back, quoted when it does not
            answer (e.g. ``grid test restart`` for the logical test fleet).
    """

    url: str
    ca_file: str | None = None
    token_file: str | None = None
    client_key_file: str | None = None
    node_token_file: str | None = None
    start_hint: str | None = None


class GridsConfig(msgspec.Struct, kw_only=True):
    """The whole config file: the grids by name and the default."""

    default: str | None = None
    grids: dict[str, GridEntry] = msgspec.field(default_factory=dict)


@dataclass(frozen=True)
class GridTarget:
    """A resolved ``--grid``: where to connect and with which files.

    Attributes:
        url: base URL without a trailing slash.
        name: the configured name, ``local``, or ``None`` for a bare URL.
        ca_file: CA certificate to verify an ``https://`` server with.
        token_file: operator capability file for this grid, if configured.
        client_key_file: client API key file for ``/v1``, if configured.
        node_token_file: node credential file, if configured.
        start_hint: how to bring this grid's server back when it does not answer.
    """

    url: str
    name: str | None = None
    ca_file: Path | None = None
    token_file: Path | None = None
    client_key_file: Path | None = None
    node_token_file: Path | None = None
    start_hint: str = "grid up"


def config_path(home: Path | None = None) -> Path:
    """``$GRID_HOME/grids.json``."""
    return (home or grid_home()) / GRIDS_FILE


def load_config(home: Path | None = None) -> GridsConfig:
    """The named-grid config (empty when the file does not exist).

    Raises:
        StateError: the file exists but is unreadable or malformed (names the file).
    """
    path = config_path(home)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return GridsConfig()
    except OSError as exc:
        raise StateError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        return msgspec.json.decode(raw, type=GridsConfig)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        msg = f"{path}: not a grids config ({exc}); fix it or remove it and add the grids again"
        raise StateError(msg) from None


def save_config(config: GridsConfig, home: Path | None = None) -> Path:
    """Write the config atomically, owner-only; returns its path.

    Raises:
        StateError: the file could not be written.
    """
    path = config_path(home)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(path, msgspec.json.format(msgspec.json.encode(config)))
    return path


def check_name(name: str) -> str:
    """Refuse a grid name that is malformed, ``local``, or looks like a URL.

    Raises:
        ValidationError: names the rule.
    """
    if name in RESERVED_NAMES or not re.match(GRID_NAME_PATTERN, name):
        msg = (
            f"grid name {name!r}: use a letter then letters, digits, . _ - (at most 64); "
            "'local' is reserved"
        )
        raise ValidationError(msg)
    return name


def check_url(url: str) -> str:
    """A grid URL: ``http(s)://host[:port]`` without a path; returned without a trailing slash.

    Raises:
        ValidationError: not an http(s) URL with a host.
    """
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        msg = f"grid URL {url!r}: give https://host:port (or http://127.0.0.1:port on loopback)"
        raise ValidationError(msg)
    return url.rstrip("/")


def local_server(home: Path | None = None) -> dict[str, Any] | None:
    """The running local server's announcement (``server.json``), if any."""
    try:
        doc = json.loads(((home or grid_home()) / LOCAL_SERVER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _path(value: str | None) -> Path | None:
    return Path(value).expanduser() if value else None


def _from_entry(name: str, entry: GridEntry) -> GridTarget:
    return GridTarget(
        url=entry.url.rstrip("/"),
        name=name,
        ca_file=_path(entry.ca_file),
        token_file=_path(entry.token_file),
        client_key_file=_path(entry.client_key_file),
        node_token_file=_path(entry.node_token_file),
        start_hint=entry.start_hint or "grid up",
    )


def register(name: str, entry: GridEntry, home: Path | None = None) -> Path:
    """Add or replace the named grid ``name`` (the default grid is left as it is).

    Used by tools that start a grid of their own, such as the logical test fleet, so that a
    bare ``--grid URL`` finds its token file and its restart command.

    Raises:
        ValidationError: a malformed name or URL.
        StateError: the config file is malformed or could not be written.
    """
    check_name(name)
    check_url(entry.url)
    config = load_config(home)
    config.grids[name] = entry
    return save_config(config, home)


def unregister(name: str, url: str, home: Path | None = None) -> bool:
    """Remove the named grid ``name`` if it still points at ``url`` (an operator who re-used
    the name for another grid keeps theirs); returns whether it was removed.

    Raises:
        StateError: the config file is malformed or could not be written.
    """
    config = load_config(home)
    entry = config.grids.get(name)
    if entry is None or entry.url.rstrip("/") != url.rstrip("/"):
        return False
    del config.grids[name]
    if config.default == name:
        config.default = None
    save_config(config, home)
    return True


def _local(home: Path | None) -> GridTarget:
    rec = local_server(home)
    url = str(rec["url"]) if rec and rec.get("url") else DEFAULT_URL
    ca = rec.get("ca_file") if rec else None
    return GridTarget(url=url.rstrip("/"), name="local", ca_file=_path(ca))


def resolve_target(grid: str | None, home: Path | None = None) -> GridTarget:
    """Resolve ``--grid`` (see the module docstring for the order).

    Raises:
        ValidationError: an unknown grid name (the message lists the configured ones) or a
            malformed URL.
        StateError: the config file is malformed.
    """
    if grid and grid.startswith(("http://", "https://")):
        url = check_url(grid)
        config = load_config(home)
        for name, entry in sorted(config.grids.items()):
            if entry.url.rstrip("/") == url:
                return _from_entry(name, entry)
        local = _local(home)
        if local.url == url:
            return local
        return GridTarget(url=url)
    if grid in (None, ""):
        config = load_config(home)
        if config.default and config.default in config.grids:
            return _from_entry(config.default, config.grids[config.default])
        return _local(home)
    if grid == "local":
        return _local(home)
    config = load_config(home)
    named = config.grids.get(grid)
    if named is None:
        known = ", ".join(sorted(config.grids)) or "none yet"
        msg = (
            f"--grid {grid!r}: no such grid (configured: {known}); give a URL, 'local', or add "
            "it with 'grid grids add NAME URL'"
        )
        raise ValidationError(msg)
    return _from_entry(grid, named)
