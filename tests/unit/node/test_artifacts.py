"""Artifact fetch against a real loopback HTTP server: resume, ceiling, digest, fetched flag."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest
from grid_llamacpp.adapter import LlamaCppAdapter
from grid_llamacpp.artifacts import ArtifactStore

from grid_core.errors import NotFoundError, ValidationError
from grid_core.nodeconfig import NodeConfig
from grid_core.protection import ProtectionDecision
from grid_core.runtime import ArtifactSpec, LoadResult
from grid_core.wire import Command
from grid_node.actuator import Actuator
from grid_node.state import StateFile

MB = 1024 * 1024
PAYLOAD = os.urandom(3 * MB + 12345)
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()
SOURCE = "hf://owner/repo/models/m.gguf"


def spec(**kw) -> ArtifactSpec:
    return ArtifactSpec(
        **{"model_id": "m.gguf", "sha256": DIGEST, "source": SOURCE, "size_mb": 4, **kw}
    )


def test_fetch_publishes_verified_file_and_second_load_is_a_cache_hit(tmp_path, artifact_server):
    artifact_server.files["models/m.gguf"] = PAYLOAD
    store = ArtifactStore(tmp_path / "art")
    first = store.resolve(spec())
    assert first.fetched and Path(first.path).read_bytes() == PAYLOAD
    assert Path(first.path).name == f"{DIGEST}.gguf"
    sent = artifact_server.bytes_sent
    second = store.resolve(spec())
    assert not second.fetched and second.path == first.path
    assert artifact_server.bytes_sent == sent  # no transfer for a cache hit


def test_cut_transfer_resumes_with_a_range_request(tmp_path, artifact_server):
    artifact_server.files["models/m.gguf"] = PAYLOAD
    artifact_server.cut_after["models/m.gguf"] = MB + 7
    store = ArtifactStore(tmp_path / "art")
    result = store.resolve(spec())
    assert Path(result.path).read_bytes() == PAYLOAD
    ranges = [r for _, r in artifact_server.requests]
    assert ranges[0] is None and ranges[1] is not None and ranges[1].startswith("bytes=")
    resumed_from = int(ranges[1][6:].split("-")[0])
    assert resumed_from > 0
    # Resumed: only what was staged is skipped; the whole file was not sent twice.
    assert artifact_server.bytes_sent == (MB + 7) + (len(PAYLOAD) - resumed_from)
    assert artifact_server.bytes_sent < len(PAYLOAD) + MB
    assert not any((tmp_path / "art" / "staging").iterdir())


def test_over_ceiling_stream_is_rejected(tmp_path, artifact_server):
    artifact_server.files["models/m.gguf"] = PAYLOAD
    store = ArtifactStore(tmp_path / "art")
    with pytest.raises(ValidationError, match="ceiling"):
        store.resolve(spec(size_mb=2))
    # Without a declared length the stream itself is cut at the ceiling.
    artifact_server.hide_length.add("models/m.gguf")
    with pytest.raises(ValidationError, match="ceiling"):
        store.resolve(spec(size_mb=2))
    assert len(artifact_server.requests) == 2  # a rejected stream is not retried
    assert not store.cached_path(DIGEST).exists()
    assert not any((tmp_path / "art" / "staging").iterdir())


def test_wrong_digest_never_replaces_the_prior_cache(tmp_path, artifact_server):
    old = os.urandom(100_000)
    old_digest = hashlib.sha256(old).hexdigest()
    artifact_server.files["models/m.gguf"] = old
    store = ArtifactStore(tmp_path / "art")
    prior = store.resolve(spec(sha256=old_digest, size_mb=1))
    before = Path(prior.path).stat()
    artifact_server.files["models/m.gguf"] = PAYLOAD  # the source now serves other bytes
    wanted = hashlib.sha256(b"what the operator declared").hexdigest()
    with pytest.raises(ValidationError, match="differs from the declared"):
        store.resolve(spec(sha256=wanted))
    assert Path(prior.path).read_bytes() == old
    assert Path(prior.path).stat().st_mtime_ns == before.st_mtime_ns
    assert not store.cached_path(wanted).exists()
    assert sorted(p.name for p in (tmp_path / "art" / "sha256").iterdir()) == [f"{old_digest}.gguf"]


def test_local_gguf_is_verified_not_fetched(tmp_path, artifact_server):
    models = tmp_path / "models"
    models.mkdir()
    (models / "m.gguf").write_bytes(PAYLOAD)
    store = ArtifactStore(tmp_path / "art", (models,))
    result = store.resolve(spec(source=None, size_mb=None))
    assert not result.fetched and result.path == str(models / "m.gguf")
    with pytest.raises(ValidationError, match="SHA-256"):
        store.resolve(spec(source=None, size_mb=None, sha256="0" * 64))
    with pytest.raises(NotFoundError, match="no approved source"):
        store.resolve(ArtifactSpec(model_id="other.gguf"))
    assert artifact_server.requests == []


def test_malformed_source_is_refused(tmp_path):
    with pytest.raises(ValidationError, match=r"hf://owner/repo/path\.gguf"):
        ArtifactStore(tmp_path).resolve(spec(source="https://example.com/m.gguf"))


ACCEPTING = ProtectionDecision(
    state="accepting", reason="", sensor_state="accepting", sensor_reason="", raw_state="accepting"
)


@pytest.mark.anyio
async def test_acknowledgement_artifact_fetched_only_when_transferred(tmp_path, artifact_server):
    artifact_server.files["models/m.gguf"] = PAYLOAD
    config = NodeConfig(state_dir=tmp_path / "node", model_dirs=(tmp_path / "none",))
    store = StateFile(config.state_dir)
    state = store.load_or_create("host-a")
    act = Actuator(
        config=config, store=store, state=state, adapters={"llama.cpp": LlamaCppAdapter()}
    )

    def load(action: str, gen: int) -> Command:
        return Command(
            action_id=action,
            kind="load",
            node_id="host-a",
            model_id="m.gguf",
            plan_generation=f"e:{gen:020d}:d",
            controller_term=1,
            controller_id="c1",
            executable=True,
            artifact_sha256=DIGEST,
            artifact_source=SOURCE,
            artifact_size_mb=4,
        )

    deadline = time.monotonic() + 60
    first = await act.execute(load("a1", 1), deadline_mono=deadline, decision=ACCEPTING)
    assert first.status == "succeeded" and first.artifact_fetched is True
    assert first.duration_seconds is not None and first.duration_seconds > 0
    second = await act.execute(load("a2", 2), deadline_mono=deadline, decision=ACCEPTING)
    assert second.status == "succeeded" and second.artifact_fetched is False
    # Redelivery of an executed action returns its receipt without running it again.
    sent = artifact_server.bytes_sent
    again = await act.execute(load("a1", 1), deadline_mono=deadline, decision=ACCEPTING)
    assert again == first and artifact_server.bytes_sent == sent


@pytest.mark.anyio
async def test_a_predictive_prefetch_keeps_its_provenance_until_used_or_evicted(
    tmp_path, artifact_server
):
    """A cache-only predictive load fetches and verifies (no engine starts); the node reports
    the artifact as predictive with its age until an eviction removes it. An ordinary load
    of the same weights is never predictive."""
    artifact_server.files["models/m.gguf"] = PAYLOAD
    config = NodeConfig(state_dir=tmp_path / "node", model_dirs=(tmp_path / "none",))
    store = StateFile(config.state_dir)
    state = store.load_or_create("host-a")
    act = Actuator(
        config=config, store=store, state=state, adapters={"llama.cpp": LlamaCppAdapter()}
    )

    def cmd(action: str, gen: int, kind: str, reason: str) -> Command:
        return Command(
            action_id=action,
            kind=kind,
            node_id="host-a",
            model_id="m.gguf",
            plan_generation=f"e:{gen:020d}:d",
            controller_term=1,
            controller_id="c1",
            executable=True,
            reason=reason,
            artifact_sha256=DIGEST,
            artifact_source=SOURCE,
            artifact_size_mb=4,
        )

    deadline = time.monotonic() + 60
    ack = await act.execute(
        cmd("p1", 1, "load", "predictive_prefetch"), deadline_mono=deadline, decision=ACCEPTING
    )
    assert ack.status == "succeeded" and ack.artifact_fetched
    assert act.state.children == {}  # cache only: nothing warmed
    [art] = act.cached_artifacts()
    assert art.predictive and art.artifact_sha256 == DIGEST and art.cached_age_s is not None
    # Provenance survives a restart of the node agent (durable state).
    again = StateFile(config.state_dir).load_or_create("host-a")
    assert again.predictive["m.gguf"].sha256 == DIGEST
    ack = await act.execute(
        cmd("e1", 2, "evict", "predictive_ttl"), deadline_mono=deadline, decision=ACCEPTING
    )
    assert ack.status == "succeeded" and act.cached_artifacts() == []
    ack = await act.execute(
        cmd("l2", 3, "load", "place"), deadline_mono=deadline, decision=ACCEPTING
    )
    assert ack.artifact_fetched
    [art] = act.cached_artifacts()
    assert not art.predictive and art.cached_age_s is None


@pytest.mark.anyio
async def test_evict_deletes_grids_own_download_file_or_directory_and_nothing_else(tmp_path):
    """A vLLM snapshot is a directory under the artifact directory: evicting it frees the disk
    (it used to stay behind). An operator's model directory, a symlink out of the artifact
    directory and a path another cached model still uses are never deleted."""
    config = NodeConfig(state_dir=tmp_path / "node", model_dirs=(tmp_path / "operator",))
    store = StateFile(config.state_dir)
    state = store.load_or_create("host-a")
    act = Actuator(
        config=config, store=store, state=state, adapters={"llama.cpp": LlamaCppAdapter()}
    )
    snapshot = config.artifact_dir / "snapshots" / ("c" * 64)
    (snapshot / "weights").mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot / "weights" / "model.safetensors").write_bytes(b"w" * 1024)
    operator = tmp_path / "operator" / "m-own"
    operator.mkdir(parents=True)
    (operator / "config.json").write_text("{}")
    escape = config.artifact_dir / "snapshots" / "escape"
    escape.symlink_to(operator, target_is_directory=True)
    shared = config.artifact_dir / "sha256" / ("d" * 64)
    shared.parent.mkdir(parents=True)
    shared.write_bytes(b"g")
    rows = {
        "m-snap": snapshot,
        "m-own": operator,
        "m-link": escape,
        "m-a": shared,
        "m-b": shared,
    }
    for model_id, path in rows.items():
        state.artifacts[model_id] = LoadResult(
            model_id=model_id, path=str(path), sha256=None, size_bytes=1
        )

    async def evict(model_id: str) -> str:
        cmd = Command(
            action_id=f"evict-{model_id}",
            kind="evict",
            node_id="host-a",
            model_id=model_id,
            plan_generation="e:00000000000000000001:d",
            controller_term=1,
            controller_id="c1",
            executable=True,
        )
        ack = await act.execute(cmd, deadline_mono=time.monotonic() + 60, decision=ACCEPTING)
        assert ack.status == "succeeded", ack
        return ack.message

    assert await evict("m-snap") == f"evicted {snapshot}"
    assert not snapshot.exists()
    assert "operator's own file" in await evict("m-own") and (operator / "config.json").exists()
    assert "operator's own file" in await evict("m-link") and (operator / "config.json").exists()
    assert "another cached model" in await evict("m-a") and shared.exists()
    assert await evict("m-b") == f"evicted {shared}" and not shared.exists()
    assert act.cached_artifacts() == []


@pytest.mark.anyio
async def test_the_node_refuses_a_predictive_transfer_that_would_leave_less_than_the_floor(
    tmp_path, artifact_server, monkeypatch
):
    """The node re-checks the predictive floor against its own fresh disk reading: with free
    disk just short of floor plus artifact, a cache-only predictive load fails before a byte
    is transferred, while a demanded load of the same weights on the same disk proceeds."""
    import psutil

    from grid_core.demand.prefetch import PREDICTIVE_FLOOR_MB
    from grid_node import actuator as actuator_module

    artifact_server.files["models/m.gguf"] = PAYLOAD
    real = psutil.disk_usage(str(tmp_path))
    short = (PREDICTIVE_FLOOR_MB + 4 - 1) * MB  # one MB short of floor + the 4 MB ceiling

    def disk_usage(path: str):  # type: ignore[no-untyped-def]  # psutil's shape
        return real._replace(free=short)

    monkeypatch.setattr(actuator_module.psutil, "disk_usage", disk_usage)
    config = NodeConfig(state_dir=tmp_path / "node", model_dirs=(tmp_path / "none",))
    store = StateFile(config.state_dir)
    act = Actuator(
        config=config,
        store=store,
        state=store.load_or_create("host-a"),
        adapters={"llama.cpp": LlamaCppAdapter()},
    )

    def load(action: str, gen: int, reason: str) -> Command:
        return Command(
            action_id=action,
            kind="load",
            node_id="host-a",
            model_id="m.gguf",
            plan_generation=f"e:{gen:020d}:d",
            controller_term=1,
            controller_id="c1",
            executable=True,
            reason=reason,
            artifact_sha256=DIGEST,
            artifact_source=SOURCE,
            artifact_size_mb=4,
        )

    deadline = time.monotonic() + 60
    ack = await act.execute(
        load("p1", 1, "predictive_prefetch"), deadline_mono=deadline, decision=ACCEPTING
    )
    assert ack.status == "failed" and "predictive prefetch refused" in ack.message
    assert artifact_server.bytes_sent == 0 and act.cached_artifacts() == []
    ack = await act.execute(load("l1", 2, "place"), deadline_mono=deadline, decision=ACCEPTING)
    assert ack.status == "succeeded" and ack.artifact_fetched
