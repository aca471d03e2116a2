"""``grid pull``: put one exact GGUF into this node's artifact cache, with progress.

Sources: ``hf://owner/repo/path.gguf``, the short form ``owner/repo:path.gguf``, or a local
file. The bytes land in the same content-addressed cache a node's load uses
(``<state dir>/artifacts/sha256/<digest>.gguf``), so a profile declaring that
``--artifact-sha256`` is then served without a network transfer (specification, "CLI
workflow": pre-pulling avoids cold network transfers). Nothing is published unless its
SHA-256 equals the declared one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from grid_core.api import ValidationError, grid_home, replace_durably
from grid_llamacpp.artifacts import MB, ArtifactStore, sha256_file

SHORT_FORM = re.compile(r"^([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+):((?:[A-Za-z0-9_.-]+/)*[^/]+\.gguf)$")
"""``owner/repo:path.gguf`` — the spelling of ``grid pull <repo>:<model.gguf>``."""
DEFAULT_CEILING_MB = 200 * 1024
"""Transfer ceiling when none is given: larger than any single GGUF published today (a
405B Q8 file is ~400 GB split into shards of at most ~50 GB), so it only stops runaways."""


def normalise_source(source: str) -> str | None:
    """``hf://`` form of ``source``, or ``None`` when it names a local file."""
    if source.startswith("hf://"):
        return source
    m = SHORT_FORM.match(source)
    if m is not None and not Path(source).exists():
        return f"hf://{m.group(1)}/{m.group(2)}/{m.group(3)}"
    return None


def _bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )


def pull(source: str, sha256: str, size_mb: int | None, state_dir: Path | None) -> Path:
    """Fetch or copy ``source`` into the cache and return the published path.

    Raises:
        ValidationError: a malformed digest or source, a wrong digest, or over the ceiling.
        UnavailableError: the transfer could not complete.
    """
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        msg = f"--sha256 {sha256!r}: use the file's 64 lowercase hex SHA-256"
        raise ValidationError(msg)
    root = (state_dir or grid_home() / "node") / "artifacts"
    hf = normalise_source(source)
    with _bar() as bar:
        task = bar.add_task(Path(source).name, total=None)

        def advance(done: int, total: int | None) -> None:
            bar.update(task, completed=done, total=total)

        store = ArtifactStore(root, progress=advance)
        cached = store.cached_path(sha256)
        if cached.is_file() and sha256_file(cached) == sha256:
            return cached
        if hf is not None:
            return store.fetch(hf, sha256, (size_mb or DEFAULT_CEILING_MB) * MB)
        path = Path(source).expanduser()
        if not path.is_file():
            msg = f"{source}: not a local file, hf://owner/repo/path.gguf or owner/repo:file.gguf"
            raise ValidationError(msg)
        size = path.stat().st_size
        if size_mb is not None and size > size_mb * MB:
            msg = f"{source}: {size // MB} MB is above --size-mb {size_mb}"
            raise ValidationError(msg)
        store.staging.mkdir(parents=True, exist_ok=True, mode=0o700)
        store.published.mkdir(parents=True, exist_ok=True, mode=0o700)
        part = store.staging / f"{sha256}.partial"
        bar.update(task, total=size)
        with open(path, "rb") as src, open(part, "wb") as dst:
            os.fchmod(dst.fileno(), 0o600)
            done = 0
            while block := src.read(MB):
                dst.write(block)
                done += len(block)
                advance(done, size)
            dst.flush()
            os.fsync(dst.fileno())
    actual = sha256_file(part)
    if actual != sha256:
        part.unlink(missing_ok=True)
        msg = f"{source}: SHA-256 is {actual}, not the declared {sha256}; nothing was published"
        raise ValidationError(msg)
    replace_durably(part, cached)
    return cached


__all__ = ["normalise_source", "pull"]
