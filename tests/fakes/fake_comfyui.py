#!/usr/bin/env python3
"""FAKE ComfyUI server for tests: ``fake_comfyui.py --listen HOST --port N`` (no GPU).

It mimics the ComfyUI server routes Grid relies on:

* ``GET /object_info`` — the node classes it can run (CheckpointLoaderSimple, CLIPTextEncode,
  EmptyLatentImage, KSampler, VAEDecode, SaveImage) with ``ckpt_name`` choices listed from
  ``BASE/models/checkpoints/*.safetensors``;
* ``POST /prompt`` — an API-format workflow graph; unknown node classes or a missing
  checkpoint are refused with 400 and ``node_errors``, else ``{"prompt_id", "number"}`` and
  the graph runs in the background (the checkpoint "loads" into accelerator memory on first
  use, then one short sleep per sampler step);
* ``GET /history/{prompt_id}`` — ``{}`` until done, then its outputs (image file names);
* ``GET /view?filename=&subfolder=&type=`` — the image: a real PNG of the latent's size;
* ``POST /free`` — ``unload_models`` drops loaded checkpoints from accelerator memory;
* ``GET /system_stats`` and ``GET /queue``.

Loads, unloads and prompts are appended to ``--log`` (JSON lines).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fakekit import EventLog, png, serve

LOAD_DELAY_S = 0.2
"""Seconds a checkpoint takes to "load": a cold workflow is visibly slower than a warm one."""
STEP_DELAY_S = 0.01
VRAM_TOTAL = 8 * 1024**3
NODE_CLASSES = (
    "CheckpointLoaderSimple",
    "CLIPTextEncode",
    "EmptyLatentImage",
    "KSampler",
    "VAEDecode",
    "SaveImage",
)


class FakeComfy:
    def __init__(self, base: Path, log: Path | None) -> None:
        self.base = base
        self.output = base / "output"
        self.output.mkdir(parents=True, exist_ok=True)
        self.log = EventLog(log)
        self.loaded: set[str] = set()
        self.history: dict[str, dict[str, Any]] = {}
        self.running: list[str] = []
        self.counter = 0

    def checkpoints(self) -> list[str]:
        d = self.base / "models" / "checkpoints"
        return sorted(p.name for p in d.glob("*.safetensors")) if d.is_dir() else []

    async def object_info(self, _: web.Request) -> web.Response:
        info: dict[str, Any] = {c: {"input": {"required": {}}} for c in NODE_CLASSES}
        info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"] = [self.checkpoints()]
        return web.json_response(info)

    def validate(self, graph: dict[str, Any]) -> dict[str, Any]:
        errors: dict[str, Any] = {}
        for node_id, node in graph.items():
            cls = node.get("class_type") if isinstance(node, dict) else None
            if cls not in NODE_CLASSES:
                errors[node_id] = {"errors": [{"message": f"unknown node class {cls!r}"}]}
            elif cls == "CheckpointLoaderSimple":
                ckpt = node.get("inputs", {}).get("ckpt_name")
                if ckpt not in self.checkpoints():
                    errors[node_id] = {
                        "errors": [{"message": f"Value not in list: ckpt_name: {ckpt!r}"}]
                    }
        return errors

    async def prompt(self, request: web.Request) -> web.Response:
        body = await request.json()
        graph = body.get("prompt")
        if not isinstance(graph, dict) or not graph:
            err = {"type": "invalid_prompt", "message": "no prompt graph"}
            return web.json_response({"error": err, "node_errors": {}}, status=400)
        errors = self.validate(graph)
        if errors:
            err = {"type": "prompt_outputs_failed_validation", "message": "validation failed"}
            return web.json_response({"error": err, "node_errors": errors}, status=400)
        prompt_id = str(uuid.uuid4())
        self.counter += 1
        self.running.append(prompt_id)
        self.log.write("prompt", prompt_id=prompt_id)
        asyncio.get_running_loop().create_task(self.execute(prompt_id, graph))
        return web.json_response(
            {"prompt_id": prompt_id, "number": self.counter, "node_errors": {}}
        )

    def _of(self, graph: dict[str, Any], cls: str) -> tuple[str, dict[str, Any]]:
        for node_id, node in graph.items():
            if node["class_type"] == cls:
                return node_id, node.get("inputs", {})
        return "", {}

    async def execute(self, prompt_id: str, graph: dict[str, Any]) -> None:
        try:
            _, ckpt = self._of(graph, "CheckpointLoaderSimple")
            name = ckpt.get("ckpt_name", "")
            if name and name not in self.loaded:
                await asyncio.sleep(LOAD_DELAY_S)
                self.loaded.add(name)
                self.log.write("load", checkpoint=name)
            _, latent = self._of(graph, "EmptyLatentImage")
            _, sampler = self._of(graph, "KSampler")
            steps = int(sampler.get("steps", 20))
            await asyncio.sleep(STEP_DELAY_S * steps)
            width, height = int(latent.get("width", 512)), int(latent.get("height", 512))
            save_id, save = self._of(graph, "SaveImage")
            prefix = str(save.get("filename_prefix", "ComfyUI"))
            filename = f"{prefix}_{self.counter:05d}_.png"
            data = png(width, height, int(sampler.get("seed", 0)))
            (self.output / filename).write_bytes(data)
            self.history[prompt_id] = {
                "prompt": [self.counter, prompt_id, graph, {}, [save_id]],
                "outputs": {
                    save_id: {"images": [{"filename": filename, "subfolder": "", "type": "output"}]}
                },
                "status": {"status_str": "success", "completed": True, "messages": []},
            }
            self.log.write("done", prompt_id=prompt_id, filename=filename)
        finally:
            self.running.remove(prompt_id)

    async def get_history(self, request: web.Request) -> web.Response:
        prompt_id = request.match_info["prompt_id"]
        entry = self.history.get(prompt_id)
        return web.json_response({prompt_id: entry} if entry else {})

    async def view(self, request: web.Request) -> web.StreamResponse:
        name = request.query.get("filename", "")
        if request.query.get("type", "output") != "output" or "/" in name or ".." in name:
            return web.Response(status=400)
        path = self.output / request.query.get("subfolder", "") / name
        if not path.is_file():
            return web.Response(status=404)
        return web.Response(body=path.read_bytes(), content_type="image/png")

    async def free(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("unload_models"):
            for name in sorted(self.loaded):
                self.log.write("unload", checkpoint=name)
            self.loaded.clear()
        return web.Response(status=200)

    async def system_stats(self, _: web.Request) -> web.Response:
        used = len(self.loaded) * 2 * 1024**3
        return web.json_response(
            {
                "system": {"os": "posix", "comfyui_version": "0.0.0-fake", "python_version": ""},
                "devices": [
                    {
                        "name": "fake-accelerator",
                        "type": "cuda",
                        "index": 0,
                        "vram_total": VRAM_TOTAL,
                        "vram_free": VRAM_TOTAL - used,
                    }
                ],
            }
        )

    async def queue(self, _: web.Request) -> web.Response:
        running = [[0, p, {}, {}, []] for p in self.running]
        return web.json_response({"queue_running": running, "queue_pending": []})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/object_info", self.object_info)
        app.router.add_post("/prompt", self.prompt)
        app.router.add_get("/history/{prompt_id}", self.get_history)
        app.router.add_get("/view", self.view)
        app.router.add_post("/free", self.free)
        app.router.add_get("/system_stats", self.system_stats)
        app.router.add_get("/queue", self.queue)
        return app


async def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="comfyui")
    p.add_argument("--listen", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8188)
    p.add_argument("--base-directory", type=Path, default=Path.cwd())
    p.add_argument("--log", type=Path)
    p.add_argument("--port-file", type=Path)
    args = p.parse_args(argv)
    fake = FakeComfy(args.base_directory, args.log)
    bound = await serve(fake.app(), args.listen, args.port, args.port_file)
    print(f"fake comfyui: listening on {args.listen}:{bound}", flush=True)
    await asyncio.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
