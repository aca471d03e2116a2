"""The how-to's example plugin (examples/grid-echo-runtime) installs and runs its lifecycle.

The example is installed from its own ``pyproject.toml`` as a distribution with a ``grid``
entry point, loaded beside every built-in plugin, and its ``echo`` adapter drives a real engine
child process through load, warm, probe, a real chat completion, drain, adoption by a fresh
adapter (a node restart) and unload. Nothing is left running.
"""

from __future__ import annotations

import ast
import secrets
from pathlib import Path

import anyio
import httpx
import msgspec
import psutil
import pytest

from grid_core.api import (
    ArtifactSpec,
    ChildRecord,
    LocalRuntimeHost,
    NotFoundError,
    RuntimeAdapter,
    is_gone,
    stop_process_sync,
)
from grid_core.testing import builtin_entry_points, install_project, plugins_with

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "grid-echo-runtime"


def test_the_example_imports_only_the_public_api() -> None:
    allowed = ("grid_core.api", "grid_core.wire", "grid_echo")
    for path in (EXAMPLE / "grid_echo").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("grid"):
                assert node.module.startswith(allowed), f"{path.name} imports {node.module}"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("grid_") or alias.name.startswith(allowed)


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    target = tmp_path / "site"
    target.mkdir()
    install_project(EXAMPLE, target)
    monkeypatch.syspath_prepend(str(target))
    return target


def _host(root: Path, published: list[ChildRecord]) -> LocalRuntimeHost:
    models = root / "models"
    state = root / "state"
    models.mkdir()
    state.mkdir()
    key = secrets.token_hex(16)
    key_file = state / "engine.keys"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    return LocalRuntimeHost(
        bind_host="127.0.0.1",
        state_dir=state,
        artifact_dir=state / "artifacts",
        model_dirs=(models,),
        api_key=key,
        api_key_file=key_file,
        port_range=(23400, 23499),
        publish_fn=lambda c: published.append(msgspec.structs.replace(c)),  # a durable copy
        used_ports=lambda: {c.port for c in published},
    )


def test_the_example_plugin_is_found_and_drives_a_real_engine(
    installed: Path, tmp_path: Path
) -> None:
    plugins = plugins_with(
        builtins=tuple(ep.name for ep in builtin_entry_points()), distributions=(installed,)
    )
    info = next(i for i in plugins.infos if i.name == "grid_echo")
    assert (info.distribution, info.version) == ("grid-echo-runtime", "0.1.0")
    adapters = plugins.runtime_adapters()
    assert set(adapters) >= {"echo", "llama.cpp"}
    echo = adapters["echo"]
    assert isinstance(echo, RuntimeAdapter)
    status = next(s for s in plugins.hook_status() if s.hook == "grid_runtime_adapters")
    assert status.objects["echo"] == "grid_echo"

    published: list[ChildRecord] = []
    host = _host(tmp_path, published)
    (host.model_dirs[0] / "tiny.bin").write_bytes(b"weights")
    child: ChildRecord | None = None

    async def lifecycle() -> None:
        nonlocal child
        with pytest.raises(NotFoundError, match=r"missing\.bin is in no model directory"):
            await echo.load(host, ArtifactSpec(model_id="missing.bin"))
        loaded = await echo.load(host, ArtifactSpec(model_id="tiny.bin"))
        child = await echo.warm(host, loaded, memory_mb=64)
        assert [c.state for c in published] == ["starting", "ready"]  # durable before ready
        probe = await echo.probe(host, child)
        assert probe.alive and probe.ready and probe.active_requests == 0
        async with httpx.AsyncClient(timeout=10.0) as client:
            r = await client.post(
                f"{child.url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {host.api_key}"},
                json={"model": child.alias, "messages": [{"role": "user", "content": "hi grid"}]},
            )
            anonymous = await client.get(f"{child.url}/v1/models")
        assert r.status_code == 200
        assert r.json()["choices"][0]["message"]["content"] == "hi grid"
        assert anonymous.status_code == 401
        assert await echo.drain(host, child, 5.0) == 0
        # A node restart: a fresh adapter proves the recorded child and adopts it.
        fresh = plugins_with(distributions=(installed,)).runtime_adapters()["echo"]
        assert await fresh.adopt(host, child) == ("adopted", "")
        await fresh.unload(host, child, idle_wait_s=5.0)
        assert is_gone(child.pid)
        assert (await echo.adopt(host, child))[0] == "dead"

    try:
        anyio.run(lifecycle)
    finally:
        if child is not None and not is_gone(child.pid):
            from grid_echo.adapter import identity  # the example's own proof

            stop_process_sync(identity(child), grace_s=5.0)
    assert child is not None
    assert not psutil.pid_exists(child.pid) or psutil.Process(child.pid).status() == "zombie"
