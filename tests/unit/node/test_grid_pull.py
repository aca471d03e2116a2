"""``grid pull``: an exact GGUF into the node cache from hf://, owner/repo:file or a local file."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from grid_llamacpp.artifacts import ArtifactStore
from grid_llamacpp.pull import normalise_source, pull

from grid_core.errors import ValidationError

DATA = b"GGUF" + os.urandom(3 * 1024 * 1024)
SHA = hashlib.sha256(DATA).hexdigest()


def test_pull_from_hf_lands_where_a_load_finds_it(artifact_server, tmp_path: Path) -> None:
    artifact_server.files["tiny.gguf"] = DATA
    path = pull("owner/repo:tiny.gguf", SHA, 10, tmp_path / "node")
    assert path == tmp_path / "node" / "artifacts" / "sha256" / f"{SHA}.gguf"
    assert path.read_bytes() == DATA
    # The node's load now verifies the cached bytes instead of transferring them.
    store = ArtifactStore(tmp_path / "node" / "artifacts")
    assert store.cached_path(SHA) == path
    sent = artifact_server.bytes_sent
    assert pull("hf://owner/repo/tiny.gguf", SHA, 10, tmp_path / "node") == path
    assert artifact_server.bytes_sent == sent  # a second pull moves nothing


def test_wrong_digest_publishes_nothing(artifact_server, tmp_path: Path) -> None:
    artifact_server.files["tiny.gguf"] = DATA
    with pytest.raises(ValidationError, match="nothing was published"):
        pull("hf://owner/repo/tiny.gguf", "0" * 64, 10, tmp_path / "node")
    assert not list((tmp_path / "node" / "artifacts" / "sha256").glob("*.gguf"))


def test_local_file_and_progress_on_the_command_line(tmp_path: Path) -> None:
    src = tmp_path / "mine.gguf"
    src.write_bytes(DATA)
    env = {**os.environ, "GRID_HOME": str(tmp_path / "home")}
    out = subprocess.run(
        [sys.executable, "-c", "from grid_core.cli import main; main()", "pull", str(src),
         "--sha256", SHA, "--state-dir", str(tmp_path / "node")],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr + out.stdout
    published = tmp_path / "node" / "artifacts" / "sha256" / f"{SHA}.gguf"
    assert published.read_bytes() == DATA
    assert oct(published.stat().st_mode & 0o777) == "0o600"
    assert "3.1 MB" in out.stdout or "3.1/3.1 MB" in out.stdout  # rich's transfer column
    bad = subprocess.run(
        [sys.executable, "-c", "from grid_core.cli import main; main()", "pull", str(src),
         "--sha256", "1" * 64, "--state-dir", str(tmp_path / "other")],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 or bad.returncode == 1
    assert "nothing was published" in bad.stderr


def test_source_forms() -> None:
    assert normalise_source("hf://a/b/c.gguf") == "hf://a/b/c.gguf"
    assert normalise_source("a/b:dir/c.gguf") == "hf://a/b/dir/c.gguf"
    assert normalise_source("./local.gguf") is None
