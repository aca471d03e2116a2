"""The local wire contract: example documents round-trip; bad input names its field path."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from grid_core import wire
from grid_core.wire import Heartbeat, HeartbeatResponse, NodeRegistration, WireError

DATA = Path(__file__).parents[2] / "data" / "wire"


def _load(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("registration.json", NodeRegistration),
        ("heartbeat.json", Heartbeat),
        ("heartbeat_response.json", HeartbeatResponse),
    ],
)
def test_example_documents_round_trip(name: str, kind: type[msgspec.Struct]) -> None:
    raw = (DATA / name).read_bytes()
    decoded = wire.decode(raw, kind)
    assert decoded.rejected_rows == ()
    again = wire.decode(wire.encode(decoded.document), kind)
    assert again.document == decoded.document
    # every key of the example survives the round trip with its value
    original = json.loads(raw)
    encoded = json.loads(wire.encode(decoded.document))

    def contained(a: Any, b: Any) -> bool:
        if isinstance(a, dict):
            return all(k in b and contained(v, b[k]) for k, v in a.items() if v not in ([], {}))
        if isinstance(a, list):
            return len(a) == len(b) and all(contained(x, y) for x, y in zip(a, b, strict=True))
        return a == b

    assert contained(original, encoded)


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    doc = _load("heartbeat.json")
    doc["future_field"] = {"anything": 1}
    doc["allocator"]["another_new_field"] = True
    assert wire.decode(json.dumps(doc), Heartbeat).document.node_id == "ctl.host-studio-7f3a"


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    cur: Any = out
    parts = path.split(".")
    for part in parts[:-1]:
        cur = cur[int(part)] if part.isdigit() else cur[part]
    last = parts[-1]
    if value is _DELETE:
        del cur[last]
    elif last.isdigit():
        cur[int(last)] = value
    else:
        cur[last] = value
    return out


_DELETE = object()

REG = "registration.json"
HB = "heartbeat.json"
RESP = "heartbeat_response.json"

BAD: list[tuple[str, str, Any, str]] = [
    (REG, "host_id", _DELETE, "host_id"),
    (REG, "host_id", "", "$.host_id"),
    (REG, "host_id", "h" * 500, "$.host_id"),
    (REG, "host_id", 42, "$.host_id"),
    (REG, "role", "superuser", "$.role"),
    (REG, "resources.capacity_mb", -1, "$.resources.capacity_mb"),
    (REG, "resources.capacity_mb", "lots", "$.resources.capacity_mb"),
    (REG, "resources.capacity_mb", 1.5, "$.resources.capacity_mb"),
    (REG, "resources.reserved_mb", 2**40, "$.resources.reserved_mb"),
    (REG, "resources.runtimes", "llama.cpp", "$.resources.runtimes"),
    (REG, "resources.tags", ["t"] * 1000, "$.resources.tags"),
    (REG, "resources.memory_bandwidth_gbps", -3.0, "$.resources.memory_bandwidth_gbps"),
    (REG, "resources.throttle_fraction", 1.5, "$.resources.throttle_fraction"),
    (REG, "allocator.state", "sleeping", "$.allocator.state"),
    (REG, "allocator.schema_version", 2, "$.allocator.schema_version"),
    (REG, "allocator.actuator_capabilities", ["teleport"], "$.allocator.actuator_capabilities"),
    (REG, "models", "coder-7b", "$.models"),
    (HB, "node_id", _DELETE, "node_id"),
    (HB, "request_commands", "yes", "$.request_commands"),
    (HB, "load.active_tasks", -2, "$.load.active_tasks"),
    (HB, "acknowledgements.0.status", "done", "$.acknowledgements[0].status"),
    (HB, "acknowledgements.0.duration_seconds", -1.0, "$.acknowledgements[0].duration_seconds"),
    (HB, "acknowledgements.0.duration_seconds", 1e300, "$.acknowledgements[0].duration_seconds"),
    (HB, "acknowledgements.0.action_id", "", "$.acknowledgements[0].action_id"),
    (HB, "acknowledgements.0.artifact_fetched", "true", "$.acknowledgements[0].artifact_fetched"),
    (HB, "acknowledgements.0.message", "x" * 5000, "$.acknowledgements[0].message"),
    (RESP, "ttl_seconds", -60, "$.ttl_seconds"),
    (RESP, "allocator.mode", "yolo", "$.allocator.mode"),
    (RESP, "allocator.commands.0.kind", "reboot", "$.allocator.commands[0].kind"),
    (RESP, "allocator.commands.0.controller_term", -1, "$.allocator.commands[0].controller_term"),
    (RESP, "allocator.commands.0.plan_generation", _DELETE, "plan_generation"),
    (RESP, "allocator.commands.0.not_before", 1e20, "$.allocator.commands[0].not_before"),
    (RESP, "allocator.commands.0.dependencies", [1, 2], "$.allocator.commands[0].dependencies"),
    (
        RESP,
        "allocator.commands.0.artifact_sha256",
        "ABC",
        "$.allocator.commands[0].artifact_sha256",
    ),
    (RESP, "model_last_used_at.coder-7b", -5, "$.model_last_used_at"),
]


@pytest.mark.parametrize(
    ("fixture", "path", "value", "expected_path"),
    BAD,
    ids=[f"{f.split('.')[0]}:{p}" for f, p, _v, _e in BAD],
)
def test_bad_input_is_rejected_with_field_path(
    fixture: str, path: str, value: Any, expected_path: str
) -> None:
    kind = {REG: NodeRegistration, HB: Heartbeat, RESP: HeartbeatResponse}[fixture]
    doc = _set(_load(fixture), path, value)
    with pytest.raises(WireError) as info:
        wire.decode(json.dumps(doc), kind)
    assert expected_path in str(info.value)


def test_non_finite_and_non_json_bodies_are_rejected() -> None:
    for body in (
        b'{"host_id": "h", "resources": {"capacity_mb": 1e999}}',
        b"{not json",
        b'{"host_id": "h", "resources": {"capacity_mb": NaN}}',
        b"[]",
    ):
        with pytest.raises(WireError):
            wire.decode(body, NodeRegistration)


def test_malformed_residency_row_is_dropped_and_reported() -> None:
    doc = _load(REG)
    good = doc["allocator"]["residencies"][0]
    doc["allocator"]["residencies"] = [
        good,
        {**good, "model_id": "other", "state": "levitating"},
        {**good, "model_id": "third", "memory_mb": -4},
        "not even an object",
    ]
    decoded = wire.decode(json.dumps(doc), NodeRegistration)
    assert [r.model_id for r in decoded.document.allocator.residencies] == ["coder-7b"]
    assert len(decoded.rejected_rows) == 3
    assert "$.allocator.residencies[1]" in decoded.rejected_rows[0]
    assert "state" in decoded.rejected_rows[0]
    assert "memory_mb" in decoded.rejected_rows[1]


def test_bad_input_count_meets_the_bar() -> None:
    assert len(BAD) >= 20


def test_derived_record_ids_are_stable_and_host_scoped() -> None:
    assert wire.control_record_id("h1") == "ctl.h1"
    assert wire.engine_record_id("h1", "m") == wire.engine_record_id("h1", "m")
    assert wire.engine_record_id("h1", "m") != wire.engine_record_id("h2", "m")
    assert wire.engine_record_id("h1", "m").startswith("eng.h1.")
