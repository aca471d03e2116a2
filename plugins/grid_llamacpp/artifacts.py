"""GGUF artifacts on a node: verify a local file or fetch an exact, bounded, hashed source.

Layout under the artifact directory::

    sha256/<digest>.gguf        published, verified files (immutable, content addressed)
    staging/<digest>.partial    an interrupted transfer, resumed with an HTTP Range request

A download streams into the staging file named after the expected digest, stops the moment
the stream passes the size ceiling, hashes the complete file and only then renames it into
``sha256/``. A wrong digest deletes the staging file and leaves every published file alone
(specification, "Managed host actuator").
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path

import httpx

from grid_core.api import (
    ArtifactSpec,
    LoadResult,
    NotFoundError,
    UnavailableError,
    ValidationError,
    replace_durably,
)

HF_ENDPOINT_ENV = "GRID_HF_ENDPOINT"
"""Base URL that ``hf://`` sources resolve against (a mirror, or a loopback server in tests)."""
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
HF_SOURCE = re.compile(
    r"^hf://([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)/((?:[A-Za-z0-9_.-]+/)*"
    r"[A-Za-z0-9_.-]+\.gguf)$"
)
"""Exact source form: owner, repository and a path ending in .gguf (no revision guessing)."""
CHUNK_BYTES = 1 << 20
"""Read/hash block: 1 MiB keeps memory flat for multi-GB files."""
MAX_TRANSFER_ATTEMPTS = 3
"""Transfer attempts per load, each resuming from the staged bytes; a flaky link gets a few
tries, a dead one fails the load quickly and the controller's backoff takes over."""
CONNECT_TIMEOUT_S = 10.0
"""Seconds to establish a connection to the artifact source."""
READ_TIMEOUT_S = 60.0
"""Seconds without a byte before a transfer attempt is abandoned."""
MB = 1024 * 1024


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in bounded chunks (``hashlib.file_digest``)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def source_url(source: str, endpoint: str | None = None) -> str:
    """The HTTP URL of an exact ``hf://owner/repo/path.gguf`` source.

    Raises:
        ValidationError: the source is not of that exact form.
    """
    m = HF_SOURCE.match(source)
    if m is None:
        msg = (
            f"artifact_source {source!r}: use the exact form hf://owner/repo/path.gguf "
            "(no credentials, no revision guessing)"
        )
        raise ValidationError(msg)
    base = (endpoint or os.environ.get(HF_ENDPOINT_ENV) or DEFAULT_HF_ENDPOINT).rstrip("/")
    owner, repo, path = m.groups()
    return f"{base}/{owner}/{repo}/resolve/main/{path}"


class ArtifactStore:
    """The node's artifact cache plus the operator's model directories.

    Args:
        root: artifact directory (created owner-only).
        model_dirs: directories searched for a GGUF named after the model id.
        progress: optional callback ``(bytes staged, total bytes or None)`` during a fetch
            (``grid pull`` draws its progress bar from it).
    """

    def __init__(
        self,
        root: Path,
        model_dirs: tuple[Path, ...] = (),
        progress: Callable[[int, int | None], None] | None = None,
    ) -> None:
        self.progress = progress
        """Called with (bytes staged, total bytes or None) as a transfer advances."""
        self.root = Path(root)
        self.model_dirs = tuple(Path(d) for d in model_dirs)
        self.published = self.root / "sha256"
        self.staging = self.root / "staging"

    def _ensure(self) -> None:
        for d in (self.root, self.published, self.staging):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)

    def cached_path(self, sha256: str) -> Path:
        """Where the published file with this digest lives."""
        return self.published / f"{sha256}.gguf"

    def find_local(self, model_id: str) -> Path | None:
        """A GGUF named after ``model_id`` in the model directories, if any."""
        names = [model_id] if model_id.endswith(".gguf") else [model_id, f"{model_id}.gguf"]
        for d in self.model_dirs:
            for name in names:
                p = d / name
                if p.is_file():
                    return p.resolve()
        return None

    def verify(self, path: Path, sha256: str | None, model_id: str) -> LoadResult:
        """Hash ``path`` when a digest is declared.

        Raises:
            ValidationError: the file's digest differs from the declared one.
        """
        if sha256 is not None:
            actual = sha256_file(path)
            if actual != sha256:
                msg = (
                    f"model {model_id}: {path} has SHA-256 {actual}, the profile declares "
                    f"{sha256}; replace the file or fix --artifact-sha256"
                )
                raise ValidationError(msg)
        return LoadResult(
            model_id=model_id,
            path=str(path),
            sha256=sha256,
            size_bytes=path.stat().st_size,
            fetched=False,
        )

    def resolve(self, spec: ArtifactSpec) -> LoadResult:
        """Verify a cached or local artifact, or fetch the exact declared source.

        Returns:
            The verified file; ``fetched`` is true only when a transfer happened.

        Raises:
            NotFoundError: no local file and no approved source.
            ValidationError: digest mismatch, over-ceiling stream or malformed source.
            UnavailableError: the source could not be reached after bounded attempts.
        """
        if spec.sha256 is not None:
            cached = self.cached_path(spec.sha256)
            if cached.is_file():
                return self.verify(cached, spec.sha256, spec.model_id)
        local = self.find_local(spec.model_id)
        if local is not None and (spec.sha256 is None or spec.source is None):
            return self.verify(local, spec.sha256, spec.model_id)
        if local is not None:
            try:
                return self.verify(local, spec.sha256, spec.model_id)
            except ValidationError:
                pass  # an approved exact source exists: fetch the declared bytes instead
        if spec.source is None or spec.sha256 is None or spec.size_mb is None:
            msg = (
                f"model {spec.model_id}: no local GGUF in {[str(d) for d in self.model_dirs]}"
                " and no approved source (artifact_source, artifact_sha256 and "
                "artifact_size_mb are all required to fetch)"
            )
            raise NotFoundError(msg)
        path = self.fetch(spec.source, spec.sha256, spec.size_mb * MB)
        return LoadResult(
            model_id=spec.model_id,
            path=str(path),
            sha256=spec.sha256,
            size_bytes=path.stat().st_size,
            fetched=True,
        )

    def fetch(self, source: str, sha256: str, max_bytes: int) -> Path:
        """Download ``source`` into the cache, resuming and bounded, then verify and publish.

        Args:
            source: exact ``hf://`` source.
            sha256: expected digest.
            max_bytes: ceiling; a longer stream is rejected.

        Returns:
            The published path.

        Raises:
            ValidationError: wrong digest or over the ceiling (staging file removed).
            UnavailableError: every bounded attempt failed to complete the transfer.
        """
        url = source_url(source)
        self._ensure()
        part = self.staging / f"{sha256}.partial"
        if part.exists() and part.stat().st_size > max_bytes:
            part.unlink()
        last_error = ""
        for _ in range(MAX_TRANSFER_ATTEMPTS):
            try:
                done = self._transfer(url, part, max_bytes)
            except (httpx.TransportError, httpx.HTTPStatusError) as exc:
                last_error = f"{type(exc).__name__}: {exc}"
                continue
            if done:
                break
        else:
            msg = (
                f"{source}: transfer incomplete after {MAX_TRANSFER_ATTEMPTS} attempts "
                f"({last_error or 'stream ended early'}); the partial file is kept for resume"
            )
            raise UnavailableError(msg)
        actual = sha256_file(part)
        if actual != sha256:
            part.unlink(missing_ok=True)
            msg = (
                f"{source}: downloaded SHA-256 {actual} differs from the declared {sha256}; "
                "nothing was published (check the source and --artifact-sha256)"
            )
            raise ValidationError(msg)
        final = self.cached_path(sha256)
        replace_durably(part, final)
        return final

    def _transfer(self, url: str, part: Path, max_bytes: int) -> bool:
        """One attempt; returns True when the server said the stream is complete."""
        have = part.stat().st_size if part.exists() else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        with httpx.stream(
            "GET", url, headers=headers, timeout=timeout, follow_redirects=True
        ) as resp:
            if resp.status_code == 416 and have:
                return True  # the staged bytes already cover the whole file
            resp.raise_for_status()
            if resp.status_code != 206:
                have = 0  # the server ignored the range: start over
            total = _declared_total(resp, have)
            if total is not None and total > max_bytes:
                part.unlink(missing_ok=True)
                msg = (
                    f"{url}: artifact is {total} bytes, above the {max_bytes}-byte ceiling; "
                    "raise --artifact-size-mb if the file is right"
                )
                raise ValidationError(msg)
            fd = os.open(part, os.O_WRONLY | os.O_CREAT, 0o600)
            with os.fdopen(fd, "r+b") as f:
                f.truncate(have)
                f.seek(have)
                written = have
                for block in resp.iter_bytes(CHUNK_BYTES):
                    written += len(block)
                    if written > max_bytes:
                        f.close()
                        part.unlink(missing_ok=True)
                        msg = (
                            f"{url}: stream passed the {max_bytes}-byte ceiling; rejected "
                            "and discarded"
                        )
                        raise ValidationError(msg)
                    f.write(block)
                    if self.progress is not None:
                        self.progress(written, total)
                f.flush()
                os.fsync(f.fileno())
            return total is None or written >= total


def _declared_total(resp: httpx.Response, offset: int) -> int | None:
    """Full artifact size from Content-Range or Content-Length, when the server says it."""
    rng = resp.headers.get("content-range", "")
    if "/" in rng and not rng.endswith("/*"):
        try:
            return int(rng.rsplit("/", 1)[1])
        except ValueError:
            return None
    length = resp.headers.get("content-length")
    if length is not None and length.isdigit():
        return offset + int(length) if resp.status_code == 206 else int(length)
    return None
