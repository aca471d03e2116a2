"""``grid allocator token write --ttl-days`` and ``join write --ttl-minutes`` check their
lifetime before asking the server: a NaN, an infinity or one past the server's bound used to
come back as the server's wire-level refusal of ``$.ttl_s`` (seconds, a field the operator
never typed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from grid_core.cli import main


@pytest.mark.parametrize(
    ("command", "flag", "value", "bound"),
    [
        ("token", "--ttl-days", "nan", "366"),
        ("token", "--ttl-days", "inf", "366"),
        ("token", "--ttl-days", "367", "366"),
        ("token", "--ttl-days", "0", "366"),
        ("join", "--ttl-minutes", "nan", "10080"),
        ("join", "--ttl-minutes", "10081", "10080"),
        ("join", "--ttl-minutes", "-1", "10080"),
    ],
)
def test_a_lifetime_out_of_range_names_the_flag_and_its_bound(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    flag: str,
    value: str,
    bound: str,
) -> None:
    monkeypatch.setenv("GRID_HOME", str(tmp_path / "home"))
    out = tmp_path / "credential"
    # No server runs: the flag must be refused before any request is made.
    args = ["allocator", command, "write", str(out), "--grid", "http://127.0.0.1:1", flag, value]
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert err.startswith(f"grid: error: {flag} must be a number in (0, {bound}]")
    assert not out.exists()
