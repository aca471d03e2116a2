"""Request features are bounded and never carry prompt text or the raw affinity key."""

from __future__ import annotations

import msgspec

from grid_server import telemetry


def finish(shape: telemetry.Shape, **kw: object) -> bytes:
    f = telemetry.features(
        at=1.0,
        endpoint="chat",
        requested_model=str(kw.get("model", "m")),
        served_model="m",
        shape=shape,
        output_units=None,
        workload=None,
        service_time_s=0.1,
        queue_s=0.0,
        outcome="ok",
        affinity_hash=kw.get("affinity"),  # type: ignore[arg-type]
    )
    return msgspec.json.encode(f)


def test_chat_shape_sizes_without_keeping_text() -> None:
    body = {
        "model": "m",
        "max_tokens": 64,
        "stream": True,
        "messages": [
            {"role": "system", "content": "s" * 400},
            {"role": "user", "content": "secret-prompt " * 100},
        ],
    }
    shape = telemetry.shape_of("chat", body)
    assert shape.stream and shape.max_tokens == 64
    assert shape.input_units == (400 + 1400) // telemetry.CHARS_PER_TOKEN
    assert len(shape.text_prefix) == telemetry.TEXT_PREFIX_CHARS
    encoded = finish(shape)
    assert b"secret-prompt" not in encoded
    assert b'"output_units":64' in encoded


def test_image_parts_set_modality_and_embeddings_are_embeddings() -> None:
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this"},
                    {"type": "image_url", "image_url": {"url": "data:..."}},
                ],
            }
        ]
    }
    assert telemetry.shape_of("chat", body).modality == "image"
    emb = telemetry.shape_of("embeddings", {"input": ["abcd", "efgh"]})
    assert emb.modality == "embedding" and emb.input_units == 2


def test_huge_bodies_are_scanned_within_bounds() -> None:
    msgs = [{"role": "user", "content": "x" * 100_000} for _ in range(1000)]
    shape = telemetry.shape_of("chat", {"messages": msgs})
    assert shape.input_units <= telemetry.MAX_SCANNED_CHARS // telemetry.CHARS_PER_TOKEN


def test_affinity_is_double_hashed_and_names_are_bounded() -> None:
    shape = telemetry.shape_of("chat", {})
    encoded = finish(shape, affinity="a" * 64, model="n" * 5000)
    doc = msgspec.json.decode(encoded)
    assert doc["affinity_hash"] != "a" * 64 and len(doc["affinity_hash"]) == 32
    assert len(doc["requested_model"]) == telemetry.MAX_MODEL_NAME
