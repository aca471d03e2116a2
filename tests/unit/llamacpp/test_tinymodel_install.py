"""Tiny GGUF maker and llama-server discovery/installation (no build here)."""

from __future__ import annotations

import hashlib
import os
import stat

import gguf
import pytest
from grid_llamacpp import install
from grid_llamacpp.tinymodel import TinyModelSpec, make_model

from grid_core.errors import NotFoundError, ValidationError


def test_tiny_model_is_deterministic_llama_gguf_with_tokenizer(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    make_model(a, TinyModelSpec(seed=7))
    make_model(b, TinyModelSpec(seed=7))
    assert hashlib.sha256(a.read_bytes()).digest() == hashlib.sha256(b.read_bytes()).digest()
    reader = gguf.GGUFReader(str(a))
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "llama"
    assert "tokenizer.ggml.tokens" in reader.fields and "tokenizer.chat_template" in reader.fields
    assert any(t.name == "blk.1.ffn_down.weight" for t in reader.tensors)


def test_size_scales_from_hundreds_of_kb_to_tens_of_mb(tmp_path):
    small = make_model(tmp_path / "s.gguf", TinyModelSpec())
    large = make_model(tmp_path / "l.gguf", TinyModelSpec(embedding=512, layers=8))
    assert 100_000 < small < 1_000_000
    assert 10_000_000 < large < 100_000_000


@pytest.mark.parametrize("bad", [{"layers": 0}, {"embedding": 40}, {"context": 10}, {"name": ""}])
def test_bad_shapes_are_refused_without_writing(tmp_path, bad):
    out = tmp_path / "x.gguf"
    with pytest.raises(ValidationError):
        make_model(out, TinyModelSpec(**bad))
    assert not out.exists()


def fake_server(path, version_ok=True):
    path.write_text("#!/bin/sh\n" + ("echo 'version: 1 (test)'\n" if version_ok else "exit 3\n"))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_discovery_order_config_env_path_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv(install.LLAMA_SERVER_ENV, raising=False)
    with pytest.raises(NotFoundError, match=r"grid engine install llama\.cpp"):
        install.find_llama_server()
    cached = install.cached_binary()
    cached.parent.mkdir(parents=True)
    fake_server(cached)
    assert install.find_llama_server() == cached
    (tmp_path / "bin").mkdir()
    on_path = fake_server(tmp_path / "bin" / "llama-server")
    assert install.find_llama_server() == on_path
    env_bin = fake_server(tmp_path / "env-llama")
    monkeypatch.setenv(install.LLAMA_SERVER_ENV, str(env_bin))
    assert install.find_llama_server() == env_bin
    configured = fake_server(tmp_path / "configured")
    assert install.find_llama_server(str(configured)) == configured
    with pytest.raises(NotFoundError, match="not executable"):
        install.find_llama_server(str(tmp_path / "missing"))


def test_install_is_a_no_op_when_the_cached_binary_works(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cached = install.cached_binary()
    cached.parent.mkdir(parents=True)
    fake_server(cached)
    lines: list[str] = []
    path, built, _ = install.install(echo=lines.append)
    assert (path, built, lines) == (cached, False, [])


def test_unverified_source_archive_is_refused(tmp_path, monkeypatch):
    # The registry (here: a stand-in for pip) hands back bytes that are not the pinned archive.
    def fake_pip(*_a: object, **_k: object) -> None:
        (tmp_path / install.SDIST_NAME).write_bytes(b"not the pinned archive")

    monkeypatch.setattr(install, "_run", fake_pip)
    with pytest.raises(install.EngineInstallError, match="refusing to build"):
        install.download_source(tmp_path, lambda _l: None, tmp_path / "log")
    assert not (tmp_path / install.SDIST_NAME).exists()


def test_a_broken_binary_does_not_count_as_installed(tmp_path):
    assert not install.works(fake_server(tmp_path / "broken", version_ok=False))
    assert os.path.exists(tmp_path / "broken")


def test_make_model_cli_refuses_a_missing_directory_without_creating_it(tmp_path, capsys):
    from grid_core.cli import main

    missing = tmp_path / "no-such-dir"
    with pytest.raises(SystemExit) as exc:
        main(["test", "make-model", str(missing / "x.gguf")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(missing) in err[0] and "does not exist" in err[0]
    assert not missing.exists()


def _make_model_cli(*args: str) -> int:
    """``grid test make-model ARGS`` in process; its exit code."""
    from grid_core.cli import main

    try:
        main(["test", "make-model", *args])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def test_make_model_cli_keeps_an_existing_model_with_other_bytes(tmp_path, capsys):
    """A served model's file (its profile names the SHA-256) is never replaced unasked; the
    same bytes again are fine, and --force replaces."""
    out = tmp_path / "tiny-coder.gguf"
    assert _make_model_cli(str(out), "--seed", "1") == 0
    served = out.read_bytes()
    assert _make_model_cli(str(out), "--seed", "1") == 0  # identical bytes: no refusal
    assert out.read_bytes() == served
    capsys.readouterr()
    assert _make_model_cli(str(out), "--name", "slow-coder", "--layers", "3") == 2
    assert "already exists with other bytes" in capsys.readouterr().err
    assert out.read_bytes() == served
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-coder.gguf"]  # no leftover
    assert _make_model_cli(str(out), "--layers", "3", "--force") == 0
    assert out.read_bytes() != served
