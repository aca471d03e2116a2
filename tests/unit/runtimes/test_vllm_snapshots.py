"""vLLM snapshots: exact hf://owner/repo@<commit> sources, size ceilings, snapshot identity.

A loopback stand-in for the Hugging Face hub serves the two routes a fetch uses: the
revision's file listing with sizes and each file's ``resolve`` URL.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from grid_vllm.snapshots import SnapshotStore, parse_snapshot_source, snapshot_digest
from loopback_http import serving

from grid_core.errors import UnavailableError, ValidationError
from grid_core.profile import ModelProfile, validate_profile
from grid_core.runtime import ArtifactSpec

REV = "0123456789abcdef0123456789abcdef01234567"
FILES = {"config.json": b'{"architectures": ["Fake"]}', "model.safetensors": b"w" * 300_000}


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch):
    state = {"files": dict(FILES), "lie_about_size": False, "requests": []}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            state["requests"].append(self.path)
            if self.path.startswith(f"/api/models/acme/tiny/revision/{REV}"):
                siblings = [
                    {"rfilename": k, "size": 10 if state["lie_about_size"] else len(v)}
                    for k, v in state["files"].items()
                ]
                body = json.dumps({"sha": REV, "siblings": siblings}).encode()
            elif self.path.startswith(f"/acme/tiny/resolve/{REV}/"):
                body = state["files"].get(self.path.rsplit("/", 1)[1], b"")
            else:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with serving(Handler) as url:
        monkeypatch.setenv("GRID_HF_ENDPOINT", url)
        yield state


def expected_digest(tmp_path: Path) -> str:
    ref = tmp_path / "reference"
    ref.mkdir()
    for name, data in FILES.items():
        (ref / name).write_bytes(data)
    return snapshot_digest(ref)[0]


def spec(sha: str, size_mb: int = 1) -> ArtifactSpec:
    return ArtifactSpec(
        model_id="tiny", sha256=sha, source=f"hf://acme/tiny@{REV}", size_mb=size_mb
    )


def test_fetch_verifies_and_publishes_then_reuses(hub, tmp_path: Path) -> None:
    digest = expected_digest(tmp_path)
    store = SnapshotStore(tmp_path / "artifacts", ())
    got = store.resolve(spec(digest))
    assert got.fetched and got.sha256 == digest
    assert Path(got.path) == tmp_path / "artifacts" / "snapshots" / digest
    assert (Path(got.path) / "model.safetensors").read_bytes() == FILES["model.safetensors"]
    again = store.resolve(spec(digest))
    assert not again.fetched and again.path == got.path  # the cache answers, nothing moves


def test_listing_above_the_ceiling_is_refused_before_any_transfer(hub, tmp_path: Path) -> None:
    hub["files"]["big.safetensors"] = b"x" * (2 * 1024 * 1024)
    with pytest.raises(ValidationError, match="above the declared ceiling"):
        SnapshotStore(tmp_path / "artifacts", ()).resolve(spec("a" * 64, size_mb=1))
    assert not any("/resolve/" in r for r in hub["requests"])


def test_a_stream_past_the_ceiling_stops(hub, tmp_path: Path) -> None:
    hub["files"]["big.safetensors"] = b"x" * (2 * 1024 * 1024)
    hub["lie_about_size"] = True  # the listing understates; the stream still stops
    with pytest.raises(UnavailableError, match="ceiling"):
        SnapshotStore(tmp_path / "artifacts", ()).resolve(spec("a" * 64, size_mb=1))
    assert not (tmp_path / "artifacts" / "snapshots").exists()


def test_wrong_identity_publishes_nothing(hub, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="nothing was published"):
        SnapshotStore(tmp_path / "artifacts", ()).resolve(spec("b" * 64))
    assert not (tmp_path / "artifacts" / "snapshots").exists()
    assert list((tmp_path / "artifacts" / "staging").iterdir()) == []


@pytest.mark.parametrize(
    "source", ["hf://acme/tiny@main", "hf://acme/tiny", "hf://acme/tiny@v1.0", "http://x/y"]
)
def test_only_a_full_commit_is_a_snapshot_source(source: str) -> None:
    with pytest.raises(ValidationError, match="40-hex commit"):
        parse_snapshot_source(source)


def test_profiles_accept_each_runtime_s_exact_source_form() -> None:
    def profile(source: str, runtimes: tuple[str, ...], model: str = "tiny") -> ModelProfile:
        return ModelProfile(
            model_id=model, memory_mb=1024, runtimes=runtimes, artifact_source=source,
            artifact_sha256="a" * 64, artifact_size_mb=10,
        )  # fmt: skip

    validate_profile(profile(f"hf://acme/tiny@{REV}", ("vllm",)))
    validate_profile(profile("ollama://qwen2.5:0.5b", ("ollama",), "qwen2.5:0.5b"))
    validate_profile(profile("hf://acme/tiny/tiny.gguf", ("llama.cpp",)))
    for bad, runtimes in (
        (f"hf://acme/tiny@{REV}", ("llama.cpp",)),  # a snapshot is not a GGUF
        ("hf://acme/tiny@main", ("vllm",)),  # a branch can move
        ("ollama://other:1b", ("ollama",)),  # the source must be this model's tag
    ):
        with pytest.raises(ValidationError, match="artifact_source"):
            validate_profile(profile(bad, runtimes))
