"""An embedding profile's engines start with the embeddings endpoint enabled (issue 16, item 8)."""

from __future__ import annotations

from pathlib import Path

from grid_llamacpp.adapter import LlamaCppAdapter
from simfleet import SimFleet

from grid_core.profile import ModelProfile


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


def test_llama_server_gets_the_embeddings_flag_only_when_asked(tmp_path: Path) -> None:
    a = LlamaCppAdapter()
    args = (tmp_path / "llama-server", "/m.gguf", "m.gguf", "127.0.0.1", 22001, tmp_path / "k")
    assert "--embeddings" not in a.argv(*args)
    assert a.argv(*args, embeddings=True)[-1] == "--embeddings"
