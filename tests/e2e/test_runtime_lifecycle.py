"""One lifecycle suite, every runtime: llama.cpp (real llama-server) and vLLM, Ollama and
ComfyUI (their FAKE engines, ``tests/fakes/``), driven by the node actuator.

Per runtime: load → warm → a real request through the Grid router → drain with a request in
flight (the unload waits for it) → unload; ``kill -9`` of the child is detected; after a node
restart the exact live child is adopted and can still drain and unload. The key is never in
a child's argv or environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import msgspec
import psutil
import pytest
from engine_pace import InFlight, drain_while_busy
from fake_engines import (
    FakeService,
    comfyui_service,
    make_vllm_snapshot,
    ollama_service,
    png_size,
    vllm_launcher,
    write_workflow_manifest,
)
from grid_comfyui.adapter import ComfyUIAdapter
from grid_llamacpp.adapter import LlamaCppAdapter
from grid_llamacpp.tinymodel import TinyModelSpec, make_model
from grid_ollama.adapter import OllamaAdapter
from grid_vllm.adapter import VllmAdapter
from ports import port_range

from grid_core.nodeconfig import NodeConfig
from grid_core.protection import ProtectionDecision
from grid_core.runtime import ChildRecord, RuntimeAdapter
from grid_core.system import ProcessIdentity, is_gone, stop_process, wait_until
from grid_core.wire import Command
from grid_node.actuator import Actuator
from grid_node.state import StateFile
from grid_server.harness import Testbed, start_server

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

WAIT_S = 90.0
"""Upper bound for an engine to reach a state on a busy 2-core machine (never asserted)."""
COMMAND_DEADLINE_S = 120.0
"""Deadline of one actuator command: an unload waits for the in-flight request to finish."""
PORTS = port_range(22700, 22799)
"""Managed ports of this suite's children (apart from the other e2e suites)."""
ACCEPTING = ProtectionDecision(
    state="accepting", reason="", sensor_state="accepting", sensor_reason="", raw_state="accepting"
)

Body = dict[str, object]


@dataclass
class Kit:
    """What differs per runtime: the adapter, the model, and what a request looks like."""

    runtime: str
    model_id: str
    adapter: RuntimeAdapter
    model_dirs: tuple[Path, ...]
    path: str
    body: Callable[[str, bool], Body]
    """(model, long) → request body; ``long`` keeps the engine busy for a few seconds."""
    check: Callable[[httpx.Response], None]
    services: list[object] = field(default_factory=list)


def chat_body(model: str, long: bool) -> Body:
    return {
        "model": model,
        "max_tokens": 60 if long else 6,
        "messages": [{"role": "user", "content": "Reply with OK"}],
    }


def check_chat(r: httpx.Response) -> None:
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] > 0


def check_png(r: httpx.Response) -> None:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("image/png")
    assert png_size(r.content) == (64, 96)


@contextlib.contextmanager
def kit_for(runtime: str, root: Path) -> Iterator[Kit]:
    models = root / "models"
    models.mkdir(parents=True, exist_ok=True)
    if runtime == "llama.cpp":
        make_model(
            models / "mid.gguf",
            TinyModelSpec(name="mid", embedding=256, layers=4, context=4096, seed=2),
        )

        def llama_body(model: str, long: bool) -> Body:
            # ignore_eos: a tiny model may end a reply early; the long reply's length is set
            # per attempt by engine_pace (this is its first step).
            if not long:
                return {**chat_body(model, long), "max_tokens": 6}
            return {**chat_body(model, long), "max_tokens": 300, "ignore_eos": True}

        yield Kit(
            runtime,
            "mid.gguf",
            LlamaCppAdapter(parallel=2),
            (models,),
            "/v1/chat/completions",
            llama_body,
            check_chat,
        )
    elif runtime == "vllm":
        make_vllm_snapshot(models / "fake-qwen", {"token_delay_s": 0.05, "start_delay_s": 0.5})
        exe = vllm_launcher(root / "bin")
        yield Kit(
            runtime,
            "fake-qwen",
            VllmAdapter(str(exe), max_num_seqs=4, ready_timeout_s=WAIT_S),
            (models,),
            "/v1/chat/completions",
            chat_body,
            check_chat,
        )
    elif runtime == "ollama":
        digest = "a" * 64
        with ollama_service(root, {"fake-llama:1b": {"digest": digest, "size": 1000}}) as svc:

            def ollama_body(model: str, long: bool) -> Body:
                return {**chat_body(model, long), "max_tokens": 300 if long else 6}

            yield Kit(
                runtime,
                "fake-llama:1b",
                OllamaAdapter(svc.url, ready_timeout_s=WAIT_S),
                (models,),
                "/v1/chat/completions",
                ollama_body,
                check_chat,
                [svc],
            )
    elif runtime == "comfyui":
        write_workflow_manifest(models / "image-sdxl.workflow.json", "image-sdxl")
        with comfyui_service(root) as svc:

            def image_body(model: str, long: bool) -> Body:
                return {
                    "model": model,
                    "prompt": "a lighthouse",
                    "steps": 150 if long else 4,
                    "width": 64,
                    "height": 96,
                    "seed": 7,
                }

            yield Kit(
                runtime,
                "image-sdxl",
                ComfyUIAdapter(svc.url, ready_timeout_s=WAIT_S),
                (models,),
                "/v1/media/image/generate",
                image_body,
                check_png,
                [svc],
            )
    else:  # pragma: no cover - a runtime named in PARAMS without a kit is a test bug
        raise AssertionError(runtime)


RUNTIMES = ["llama.cpp", "vllm", "ollama", "comfyui"]


@dataclass
class Rig:
    kit: Kit
    config: NodeConfig
    act: Actuator
    grid: Testbed
    seq: int = 0

    def command(self, kind: str, **kw: object) -> Command:
        self.seq += 1
        return Command(
            action_id=f"{kind}-{self.seq}",
            kind=kind,  # type: ignore[arg-type]  # a test literal
            node_id=self.act.state.host_id,
            model_id=self.kit.model_id,
            plan_generation=f"epoch:{self.seq:020d}:digest",
            controller_term=1,
            controller_id="ctl-A",
            executable=True,
            memory_mb=64,
            runtime=self.kit.runtime,
            **kw,
        )

    async def run(self, kind: str, **kw: object):
        return await self.act.execute(
            self.command(kind, **kw),
            deadline_mono=time.monotonic() + COMMAND_DEADLINE_S,
            decision=ACCEPTING,
        )

    def restart(self) -> Actuator:
        store = StateFile(self.config.state_dir)
        state = store.load()
        assert state is not None
        self.act = Actuator(
            config=self.config,
            store=store,
            state=state,
            adapters={self.kit.runtime: self.kit.adapter},
        )
        return self.act

    def child(self) -> ChildRecord:
        return self.act.state.children[self.kit.model_id]


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    home = tmp_path_factory.mktemp("grid-home")
    server = start_server(home)
    bed = Testbed(server.url, home)
    try:
        yield bed
    finally:
        bed.close()
        server.stop()


@pytest.fixture(params=RUNTIMES)
async def rig(request: pytest.FixtureRequest, tmp_path: Path, grid: Testbed) -> AsyncIterator[Rig]:
    with kit_for(request.param, tmp_path) as kit:
        config = NodeConfig(
            state_dir=tmp_path / "node", model_dirs=kit.model_dirs, port_range=PORTS
        )
        store = StateFile(config.state_dir)
        state = store.load_or_create(f"host-{kit.runtime.replace('.', '')}-{os.getpid()}")
        act = Actuator(config=config, store=store, state=state, adapters={kit.runtime: kit.adapter})
        rig = Rig(kit, config, act, grid)
        try:
            yield rig
        finally:
            for child in list(rig.act.state.children.values()):
                ident = ProcessIdentity(child.pid, child.birth, args=(("--port", str(child.port)),))
                if ident.prove().status == "proven":
                    await stop_process(ident, grace_s=5.0)


def route_through_grid(rig: Rig) -> str:
    """Register the node's ready child with the real server as the agent does."""
    host_id = rig.act.state.host_id
    token = rig.grid.node_token(host_id)
    rows = [msgspec.to_builtins(r) for r in rig.act.residencies() if r.state == "ready"]
    rig.grid.register_host(token, host_id, residencies=rows)
    child = rig.child()
    rig.grid.register_engine(
        token, host_id, rig.kit.model_id, child.url, rig.act.state.engine_api_key
    )
    rig.grid.wait_ready(rig.kit.model_id, timeout_s=WAIT_S)
    return token


async def _drain_while_busy(
    rig: Rig, client: httpx.AsyncClient, finished: dict[str, float]
) -> InFlight:
    """A long request through the router that the fence-only drain finds running
    (``finished["request"]``: monotonic time its answer arrived). The FAKE engines take a
    fixed time per step; a real llama-server gets longer requests until one outlasts the
    drain's first look (:func:`engine_pace.drain_while_busy`)."""
    kit = rig.kit

    async def long_request(tokens: int) -> httpx.Response:
        body = kit.body(kit.model_id, True)
        if kit.runtime == "llama.cpp":
            body = {**body, "max_tokens": tokens}
        r = await client.post(kit.path, json=body)
        finished["request"] = time.monotonic()
        return r

    async def running() -> int | None:
        return await kit.adapter.drain(rig.act.host, rig.child(), 0.0)

    async def restart() -> None:
        assert (await rig.run("unload")).status == "succeeded"
        assert (await rig.run("warm")).status == "succeeded"
        route_through_grid(rig)

    return await drain_while_busy(
        long_request, running, lambda: rig.act.drain(kit.model_id, wait_s=0.0), restart
    )


async def test_lifecycle_through_the_router_with_drain_in_flight(rig: Rig) -> None:
    kit = rig.kit
    load = await rig.run("load")
    assert load.status == "succeeded", load.message
    warm = await rig.run("warm", dependencies=[load.action_id])
    assert warm.status == "succeeded", warm.message
    child = rig.child()
    assert child.state == "ready"
    secret = rig.act.state.engine_api_key
    proc = psutil.Process(child.pid)
    assert all(secret not in a for a in proc.cmdline())
    assert all(secret not in v for v in proc.environ().values())

    async with httpx.AsyncClient(timeout=WAIT_S) as direct:
        unauth = await direct.post(f"{child.url}{kit.path}", json=kit.body(kit.model_id, False))
        assert unauth.status_code == 401  # the engine's own routes need the key

    route_through_grid(rig)
    async with httpx.AsyncClient(base_url=rig.grid.url, timeout=COMMAND_DEADLINE_S) as client:
        kit.check(await client.post(kit.path, json=kit.body(kit.model_id, False)))

        finished: dict[str, float] = {}
        busy = await _drain_while_busy(rig, client, finished)
        assert "still running" in busy.drained
        child = rig.child()
        assert child.state == "draining"
        print(f"drain saw the request running on attempt {busy.attempts} ({busy.tokens} tokens)")

        async def unload() -> object:
            ack = await rig.run("unload")
            finished["unload"] = time.monotonic()
            return ack

        unload_task = asyncio.create_task(unload())
        resp = await busy.request
        ack = await unload_task
    kit.check(resp)
    if kit.runtime == "llama.cpp":
        assert resp.json()["usage"]["completion_tokens"] == busy.tokens  # not cut short
    assert ack.status == "succeeded", ack.message  # type: ignore[attr-defined]
    assert finished["request"] <= finished["unload"]  # the unload waited for the request
    assert kit.model_id not in rig.act.state.children
    assert is_gone(child.pid)
    [row] = [r for r in rig.act.residencies() if r.model_id == kit.model_id]
    assert row.state == "cached" and row.runtime == kit.runtime


async def test_kill_9_is_detected(rig: Rig) -> None:
    assert (await rig.run("warm")).status == "succeeded"
    child = rig.child()
    os.kill(child.pid, signal.SIGKILL)
    await wait_until(rig.act.refresh, timeout_s=WAIT_S, interval_s=0.05)
    [row] = [r for r in rig.act.residencies() if r.model_id == rig.kit.model_id]
    assert row.state == "failed"
    assert "process lost" in rig.child().failure
    assert (await rig.run("unload")).status == "succeeded"
    assert (await rig.run("warm")).status == "succeeded"


async def test_restart_adopts_the_live_child(rig: Rig) -> None:
    assert (await rig.run("warm")).status == "succeeded"
    before = rig.child()
    act = rig.restart()
    await act.recover()
    adopted = rig.child()
    assert adopted.state == "ready" and adopted.pid == before.pid
    assert any(f"adopted {rig.kit.model_id}" in e for e in act.events)
    async with httpx.AsyncClient(timeout=WAIT_S) as client:
        r = await client.post(
            f"{adopted.url}{rig.kit.path}",
            headers={"Authorization": f"Bearer {act.state.engine_api_key}"},
            json=rig.kit.body(rig.kit.model_id, False),
        )
    rig.kit.check(r)
    assert (await rig.run("drain")).status == "succeeded"
    ack = await rig.run("unload")
    assert ack.status == "succeeded", ack.message
    assert is_gone(before.pid)


@pytest.mark.parametrize("rig", ["ollama"], indirect=True)
async def test_ollama_requests_cannot_make_it_reload(rig: Rig) -> None:
    """40 routed requests with keep_alive 0 and differing num_ctx: no load, unload or reload."""
    [svc] = rig.kit.services
    assert isinstance(svc, FakeService)
    assert (await rig.run("warm")).status == "succeeded"
    assert [e["event"] for e in svc.events() if e["event"] != "request"] == ["load"]
    route_through_grid(rig)
    async with httpx.AsyncClient(base_url=rig.grid.url, timeout=WAIT_S) as client:
        for i in range(40):
            body = {
                **chat_body(rig.kit.model_id, False),
                "keep_alive": 0,
                "options": {"num_ctx": 512 * (1 + i % 4)},
                **({"num_ctx": 8192} if i % 2 else {}),
            }
            check_chat(await client.post("/v1/chat/completions", json=body))
    requests = svc.events("request")
    assert len([e for e in requests if e["route"] == "/v1/chat/completions"]) == 40
    assert all(e["keep_alive"] == -1 for e in requests)  # what Ollama actually received
    lifecycle = [e["event"] for e in svc.events() if e["event"] in ("load", "unload", "reload")]
    assert lifecycle == ["load"]  # the warm's own load, nothing since
    # Grid sent no load or unload command after the warm's one pin.
    assert len([e for e in requests if e["route"] == "/api/generate"]) == 1
    # Control: the same request sent to Ollama directly does reload it (the fake is strict).
    async with httpx.AsyncClient(base_url=svc.url, timeout=WAIT_S) as direct:
        body = {**chat_body(rig.kit.model_id, False), "options": {"num_ctx": 1024}}
        check_chat(await direct.post("/v1/chat/completions", json=body))
    assert "reload" in [e["event"] for e in svc.events()]


@pytest.mark.parametrize("rig", ["ollama"], indirect=True)
async def test_ollama_never_pulls_over_an_existing_tag(rig: Rig) -> None:
    [svc] = rig.kit.services
    assert isinstance(svc, FakeService)
    ack = await rig.run("load", artifact_sha256="b" * 64, artifact_source="ollama://fake-llama:1b")
    assert ack.status == "failed" and "never replaces an existing tag" in ack.message
    assert svc.events("pull") == []


@pytest.mark.parametrize("rig", ["comfyui"], indirect=True)
async def test_image_route_is_503_while_cold_then_a_png(rig: Rig) -> None:
    """A profiled workflow with no ready gateway: 503 + Retry-After; once warm: a PNG."""
    [svc] = rig.kit.services
    assert isinstance(svc, FakeService)
    ops = rig.grid.operator()
    profile = {"model_id": rig.kit.model_id, "memory_mb": 4096, "runtimes": ["comfyui"]}
    put = rig.grid.http.put(
        f"{rig.grid.url}/allocator/models/{rig.kit.model_id}", headers=ops, json=profile
    )
    assert put.status_code == 200, put.text
    body = rig.kit.body(rig.kit.model_id, False)
    async with httpx.AsyncClient(base_url=rig.grid.url, timeout=WAIT_S) as client:
        cold = await client.post("/v1/media/image/generate", json=body)
        assert cold.status_code == 503, cold.text
        assert int(cold.headers["retry-after"]) >= 1
        assert (await rig.run("warm")).status == "succeeded"
        assert svc.events("load")  # the warm-up put the checkpoint in accelerator memory
        route_through_grid(rig)
        check_png(await client.post("/v1/media/image/generate", json=body))
    assert (await rig.run("unload")).status == "succeeded"
    assert svc.events("unload")  # POST /free released it
