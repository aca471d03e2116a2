"""The node configuration document: defined once, written owner-only, read back strictly."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import pytest

from grid_core.errors import ValidationError
from grid_core.nodeconfig import CONFIG_FILE, NodeConfig, load_config


def test_document_round_trips_and_is_owner_only(tmp_path: Path) -> None:
    secret = "node-credential-secret"
    (tmp_path / "cred").write_text(secret)
    config = NodeConfig(
        token_file=tmp_path / "cred",
        state_dir=tmp_path / "node",
        grid_url="http://127.0.0.1:22100",
        host_id="host-doc",
        port_range=(22300, 22310),
        capacity_share=0.25,
        model_dirs=(tmp_path / "models",),
        tags=("gpu", "lab"),
        heartbeat_interval_s=2.0,
        throttle_fraction=0.5,
    )
    path = config.save()
    assert path == tmp_path / "node" / CONFIG_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_config(path) == config
    doc = json.loads(path.read_text())
    assert doc["schema_version"] == 1 and doc["port_range"] == [22300, 22310]
    assert secret not in path.read_text()  # the credential is referenced by file, never copied
    assert config.read_token() == secret


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("capacity_share", 0.0, "capacity_share (--capacity-share)"),
        ("heartbeat_interval_s", 0.0, "heartbeat_interval_s (--heartbeat-interval)"),
        ("port_range", [80, 90], "`$.port_range[0]`"),
        ("port_range", [22300, 22200], "port_range (--port-range)"),
        ("unknown_sensors", "guess", "unknown_sensors"),
        ("grid_url", "http://10.0.0.1:22100", "plain HTTP"),
        ("heartbeat_interval", 1.0, "unknown field `heartbeat_interval`"),
    ],
)
def test_a_bad_document_is_refused_naming_the_field(
    tmp_path: Path, field: str, value: object, named: str
) -> None:
    path = tmp_path / CONFIG_FILE
    path.write_text(json.dumps({"state_dir": str(tmp_path), field: value}))
    with pytest.raises(ValidationError, match=re.escape(named)):
        load_config(path)
