"""vLLM model snapshots on a node: a local directory or an exact, bounded ``hf://`` snapshot.

A vLLM model is a directory (``config.json``, tokenizer, safetensors shards), not one file.
Its immutable identity is the **snapshot digest**: SHA-256 over the sorted lines
``<relative path>\\0<file SHA-256>\\n`` of every regular file. The autonomous fetch form is
``hf://owner/repo@<40-hex commit>`` — a commit, never a branch, so the source cannot move
(specification, "Managed host actuator" and "Current limits"). A fetch first reads the
revision's file list with sizes and refuses it above the declared ceiling, streams every file
into a staging directory named after the expected digest (stopping at the ceiling), hashes the
complete tree and only then renames it into ``snapshots/<digest>``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

import httpx

from grid_core.api import (
    ArtifactSpec,
    LoadResult,
    NotFoundError,
    UnavailableError,
    ValidationError,
    fsync_dir,
)

HF_ENDPOINT_ENV = "GRID_HF_ENDPOINT"
"""Base URL ``hf://`` sources resolve against (a mirror, or a loopback server in tests)."""
DEFAULT_HF_ENDPOINT = "https://huggingface.co"
HF_SNAPSHOT = re.compile(r"^hf://([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)@([0-9a-f]{40})$")
"""Exact snapshot form: owner, repository and a full commit hash."""
CONFIG_FILE = "config.json"
"""Every vLLM (Hugging Face) model directory has one; its absence means "not a model"."""
CHUNK_BYTES = 1 << 20
"""Read/hash block: 1 MiB keeps memory flat for multi-GB shards."""
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
"""Seconds without a byte before a transfer is abandoned."""
MB = 1024 * 1024


def parse_snapshot_source(source: str) -> tuple[str, str, str]:
    """``hf://owner/repo@commit`` → ``(owner, repo, commit)``.

    Raises:
        ValidationError: any other form (a branch, a tag or a missing revision).
    """
    m = HF_SNAPSHOT.match(source)
    if m is None:
        msg = (
            f"artifact_source {source!r}: vLLM needs an immutable snapshot "
            "hf://owner/repo@<40-hex commit> (no branch or tag names)"
        )
        raise ValidationError(msg)
    return m.group(1), m.group(2), m.group(3)


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def snapshot_digest(root: Path) -> tuple[str, int]:
    """The snapshot identity of a directory and its total size in bytes."""
    lines = []
    total = 0
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = path.relative_to(root).as_posix()
        lines.append(f"{rel}\0{_file_sha256(path)}\n")
        total += path.stat().st_size
    return hashlib.sha256("".join(lines).encode()).hexdigest(), total


class SnapshotStore:
    """The node's vLLM snapshots plus the operator's model directories.

    Args:
        root: artifact directory (``snapshots/`` and ``staging/`` live under it).
        model_dirs: where operator-installed model directories are found by model id.
    """

    def __init__(self, root: Path, model_dirs: tuple[Path, ...]) -> None:
        self.root = root
        self.model_dirs = model_dirs

    def _local(self, model_id: str, sha256: str | None) -> Path | None:
        if sha256 is not None:
            published = self.root / "snapshots" / sha256
            if (published / CONFIG_FILE).is_file():
                return published
        for d in self.model_dirs:
            candidate = (d / model_id).resolve()
            if candidate.is_relative_to(d.resolve()) and (candidate / CONFIG_FILE).is_file():
                return candidate
        return None

    def verify(self, path: Path, sha256: str | None, model_id: str) -> LoadResult:
        """Hash a snapshot directory and compare with the declared identity.

        Raises:
            ValidationError: the directory's snapshot digest differs from ``sha256``.
        """
        digest, size = snapshot_digest(path)
        if sha256 is not None and digest != sha256:
            msg = (
                f"{model_id}: snapshot {path} has identity {digest}, the profile declares "
                f"{sha256}; fix --artifact-sha256 or replace the directory"
            )
            raise ValidationError(msg)
        return LoadResult(model_id=model_id, path=str(path), sha256=sha256, size_bytes=size)

    def resolve(self, artifact: ArtifactSpec) -> LoadResult:
        """Verify a local snapshot, or fetch the exact declared one.

        Raises:
            NotFoundError: no local directory and no fetch source.
            ValidationError: wrong identity, or a malformed or incomplete source.
            UnavailableError: the transfer failed or passed the size ceiling.
        """
        local = self._local(artifact.model_id, artifact.sha256)
        if local is not None:
            return self.verify(local, artifact.sha256, artifact.model_id)
        if artifact.source is None:
            dirs = ", ".join(str(d) for d in self.model_dirs) or "(none)"
            msg = (
                f"{artifact.model_id}: no model directory with {CONFIG_FILE} in {dirs} and no "
                "artifact_source; install it there or set hf://owner/repo@<commit>"
            )
            raise NotFoundError(msg)
        if artifact.sha256 is None or artifact.size_mb is None:
            msg = (
                f"{artifact.model_id}: a fetched snapshot needs artifact_sha256 (its identity) "
                "and artifact_size_mb (its ceiling) besides artifact_source"
            )
            raise ValidationError(msg)
        return self.fetch(artifact, artifact.sha256, artifact.size_mb)

    def fetch(self, artifact: ArtifactSpec, sha256: str, size_mb: int) -> LoadResult:
        """Download the snapshot, verify its identity and publish it atomically."""
        assert artifact.source is not None
        owner, repo, rev = parse_snapshot_source(artifact.source)
        base = (os.environ.get(HF_ENDPOINT_ENV) or DEFAULT_HF_ENDPOINT).rstrip("/")
        ceiling = size_mb * MB
        staging = self.root / "staging" / f"snapshot-{sha256}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True, mode=0o700)
        timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        try:
            with httpx.Client(timeout=timeout, follow_redirects=True) as client:
                files = self._listing(client, base, owner, repo, rev, ceiling, artifact.source)
                written = 0
                for rel in files:
                    written = self._download(
                        client,
                        f"{base}/{owner}/{repo}/resolve/{rev}/{rel}",
                        staging / rel,
                        written,
                        ceiling,
                        artifact.source,
                    )
        except httpx.HTTPError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            msg = f"{artifact.source}: transfer failed ({type(exc).__name__}: {exc}); retry later"
            raise UnavailableError(msg) from None
        except (UnavailableError, ValidationError):
            shutil.rmtree(staging, ignore_errors=True)
            raise
        digest, size = snapshot_digest(staging)
        if digest != sha256:
            shutil.rmtree(staging, ignore_errors=True)
            msg = (
                f"{artifact.source}: the downloaded snapshot has identity {digest}, not the "
                f"declared {sha256}; nothing was published"
            )
            raise ValidationError(msg)
        final = self.root / "snapshots" / sha256
        final.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if final.exists():
            shutil.rmtree(staging, ignore_errors=True)
        else:
            os.rename(staging, final)
            fsync_dir(final.parent)
        return LoadResult(
            model_id=artifact.model_id,
            path=str(final),
            sha256=sha256,
            size_bytes=size,
            fetched=True,
        )

    @staticmethod
    def _listing(
        client: httpx.Client,
        base: str,
        owner: str,
        repo: str,
        rev: str,
        ceiling: int,
        source: str,
    ) -> list[str]:
        r = client.get(f"{base}/api/models/{owner}/{repo}/revision/{rev}", params={"blobs": True})
        if r.status_code == 404:
            msg = f"{source}: no such repository or revision at {base}"
            raise ValidationError(msg)
        r.raise_for_status()
        siblings = r.json().get("siblings", [])
        files: list[str] = []
        total = 0
        for s in siblings:
            rel = str(s.get("rfilename", ""))
            if not rel or rel.startswith("/") or ".." in Path(rel).parts:
                msg = f"{source}: the listing names an unsafe path {rel!r}; refusing it"
                raise ValidationError(msg)
            size = s.get("size")
            if not isinstance(size, int):
                msg = f"{source}: the listing gives no size for {rel}; cannot bound the transfer"
                raise ValidationError(msg)
            total += size
            files.append(rel)
        if total > ceiling:
            msg = (
                f"{source}: the snapshot is {total // MB} MB, above the declared ceiling of "
                f"{ceiling // MB} MB; raise --artifact-size-mb if that is intended"
            )
            raise ValidationError(msg)
        return files

    @staticmethod
    def _download(
        client: httpx.Client, url: str, dest: Path, written: int, ceiling: int, source: str
    ) -> int:
        dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with client.stream("GET", url) as r, open(dest, "wb") as out:
            r.raise_for_status()
            for block in r.iter_bytes(CHUNK_BYTES):
                written += len(block)
                if written > ceiling:
                    msg = (
                        f"{source}: the transfer passed the {ceiling // MB} MB ceiling; stopped "
                        "and discarded"
                    )
                    raise UnavailableError(msg)
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
        return written
