"""An embedding profile's engines start with the embeddings endpoint enabled (issue 16, item 8)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from grid_llamacpp.adapter import LlamaCppAdapter
from grid_vllm.adapter import VllmAdapter
from simfleet import SimFleet

from grid_core.errors import ValidationError
from grid_core.profile import ModelProfile
from grid_core.runtime import LoadResult


def _warms(fleet: SimFleet) -> list[tuple[str, bool]]:
    out = []
    for _ in range(6):
        fleet.now += 5.0
        for h in sorted(fleet.nodes):
            out += [(c.model_id, c.embeddings) for c in fleet.heartbeat(h) if c.kind == "warm"]
            fleet.complete(h)
    return out


def test_only_a_dedicated_embedding_profile_is_warmed_with_embeddings() -> None:
    fleet = SimFleet.uniform(2, 8000)
    for h in fleet.nodes:
        fleet.heartbeat(h)
    fleet.ctl.set_mode("automatic", fleet.now)
    embed = {"embedding": 1.0, "research": 0.2}
    for mid, scores in (("embed", embed), ("chat", {"general": 1.0, "embedding": 0.3})):
        fleet.put_profile(
            ModelProfile(model_id=mid, memory_mb=2000, min_replicas=1, workload_scores=scores)
        )
    warms = dict(_warms(fleet))
    assert warms == {"embed": True, "chat": False}


def test_embedding_profile_rule() -> None:
    def p(scores: dict[str, float]) -> ModelProfile:
        return ModelProfile(model_id="m", memory_mb=1, workload_scores=scores)

    assert p({"embedding": 1.0}).serves_embeddings
    assert p({"embedding": 0.9, "research": 0.1}).serves_embeddings
    assert not p({}).serves_embeddings
    assert not p({"general": 1.0, "embedding": 0.5}).serves_embeddings
    assert not p({"general": 1.0, "embedding": 1.0}).serves_embeddings  # a tie: chat stays on


class _Host:
    """The paths a runtime adapter reads from its node (no port, no publication needed)."""

    bind_host = "127.0.0.1"

    def __init__(self, root: Path) -> None:
        self.state_dir = root
        self.artifact_dir = root / "artifacts"
        self.model_dirs = (root,)
        self.api_key = "k"
        self.api_key_file = root / "k"


def test_llama_server_gets_the_embeddings_flag_only_when_asked(tmp_path: Path) -> None:
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o700)
    a = LlamaCppAdapter(str(exe))
    host = _Host(tmp_path)
    loaded = LoadResult(model_id="m.gguf", path="/m.gguf", sha256=None, size_bytes=1)
    plain = a.child_command(host, loaded, "m.gguf", 22001, 100)
    assert plain[0] == str(exe.resolve())
    assert "--embeddings" not in plain
    embed = a.child_command(host, loaded, "m.gguf", 22001, 100, embeddings=True)
    assert embed[-1] == "--embeddings"
    assert embed[:-1] == plain


def test_a_runtime_without_embeddings_refuses_an_embedding_warm(tmp_path: Path) -> None:
    host = _Host(tmp_path)
    loaded = LoadResult(model_id="m", path="/m", sha256=None, size_bytes=1)
    with pytest.raises(ValidationError, match="serves no embeddings endpoint"):
        asyncio.run(VllmAdapter().warm(host, loaded, 100, embeddings=True))
