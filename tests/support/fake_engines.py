"""Start Grid's FAKE engines (``tests/fakes/``) for a test and stop them afterwards.

The fakes stand in for vLLM, Ollama and ComfyUI, which need GPUs this machine lacks. Each
helper starts a real process on a free loopback port and returns a handle a test stops in
``finally`` (by its own ``Popen`` handle — never by name).
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

FAKES = Path(__file__).resolve().parent.parent / "fakes"
START_TIMEOUT_S = 60.0
"""Upper bound for a fake to open its port on a loaded 2-core machine (never asserted)."""

sys.path.insert(0, str(FAKES))
from fakekit import read_events  # noqa: E402

__all__ = [
    "FAKES",
    "FakeService",
    "comfyui_launcher",
    "comfyui_service",
    "make_vllm_snapshot",
    "ollama_service",
    "png_size",
    "read_events",
    "vllm_launcher",
    "write_workflow_manifest",
]


@dataclass
class FakeService:
    """A running fake service: its URL, process and event log."""

    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    root: Path

    def events(self, kind: str | None = None) -> list[dict]:
        """Logged events (only ``kind`` when given)."""
        return [e for e in read_events(self.log) if kind is None or e["event"] == kind]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _wait_port(port_file: Path, proc: subprocess.Popen[bytes], log: Path) -> int:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if port_file.exists():
            return int(port_file.read_text())
        if proc.poll() is not None:
            raise RuntimeError(f"fake exited early: {log.read_text()[-500:]}")
        time.sleep(0.05)
    raise RuntimeError("fake never announced its port")


@contextlib.contextmanager
def ollama_service(
    root: Path, models: dict[str, dict], registry: dict[str, dict] | None = None
) -> Iterator[FakeService]:
    """The fake Ollama on a free loopback port with ``models`` already pulled.

    Args:
        root: a per-test directory.
        models: tag -> ``{"digest": hex, "size": bytes}`` present locally.
        registry: tag -> the same, pullable through ``/api/pull``.
    """
    store = root / "ollama-models"
    store.mkdir(parents=True, exist_ok=True)
    (store / "manifest.json").write_text(json.dumps(models))
    reg = root / "ollama-registry.json"
    reg.write_text(json.dumps(registry or {}))
    log, port_file, out = root / "ollama-events.jsonl", root / "ollama.port", root / "ollama.out"
    env = {**os.environ, "OLLAMA_HOST": "127.0.0.1:0", "OLLAMA_MODELS": str(store)}
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(FAKES / "fake_ollama.py"),
                "serve",
                "--registry",
                str(reg),
                "--log",
                str(log),
                "--port-file",
                str(port_file),
            ],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    svc = FakeService("", proc, log, root)
    try:
        svc.url = f"http://127.0.0.1:{_wait_port(port_file, proc, out)}"
        yield svc
    finally:
        svc.stop()


@contextlib.contextmanager
def comfyui_service(
    root: Path, checkpoints: tuple[str, ...] = ("fake-sd.safetensors",)
) -> Iterator[FakeService]:
    """The fake ComfyUI on a free loopback port with ``checkpoints`` installed."""
    base = root / "comfyui"
    ckpt = base / "models" / "checkpoints"
    ckpt.mkdir(parents=True, exist_ok=True)
    for name in checkpoints:
        (ckpt / name).write_bytes(b"fake weights " + name.encode())
    log, port_file, out = root / "comfyui-events.jsonl", root / "comfyui.port", root / "comfy.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(FAKES / "fake_comfyui.py"),
                "--listen",
                "127.0.0.1",
                "--port",
                "0",
                "--base-directory",
                str(base),
                "--log",
                str(log),
                "--port-file",
                str(port_file),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    svc = FakeService("", proc, log, root)
    try:
        svc.url = f"http://127.0.0.1:{_wait_port(port_file, proc, out)}"
        yield svc
    finally:
        svc.stop()


def vllm_launcher(directory: Path) -> Path:
    """An executable named ``vllm`` that runs the fake with this interpreter."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "vllm"
    path.write_text(
        f"#!{sys.executable}\nimport runpy, sys\n"
        f"sys.argv[0] = {str(path)!r}\n"
        f"runpy.run_path({str(FAKES / 'fake_vllm.py')!r}, run_name='__main__')\n"
    )
    path.chmod(0o755)
    return path


def comfyui_launcher(directory: Path, log: Path | None = None) -> Path:
    """An executable named ``comfyui`` that runs the FAKE ComfyUI with this interpreter.

    It takes ComfyUI's own ``main.py`` flags (``--listen``, ``--port``, ``--base-directory``),
    which is what ``grid test start --include-comfyui --comfyui PATH`` passes; ``log`` (JSON
    lines of loads, unloads and prompts) is added to its arguments when given.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "comfyui"
    extra = ["--log", str(log)] if log is not None else []
    path.write_text(
        f"#!{sys.executable}\nimport runpy, sys\n"
        f"sys.argv = [{str(path)!r}, *sys.argv[1:], *{extra!r}]\n"
        f"runpy.run_path({str(FAKES / 'fake_comfyui.py')!r}, run_name='__main__')\n"
    )
    path.chmod(0o755)
    return path


def make_vllm_snapshot(directory: Path, knobs: dict | None = None) -> Path:
    """A model directory the fake vLLM serves (``config.json``, a weights file, knobs)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"architectures": ["FakeForCausalLM"]}))
    (directory / "model.safetensors").write_bytes(b"fake weights of " + directory.name.encode())
    if knobs:
        (directory / "fake-engine.json").write_text(json.dumps(knobs))
    return directory


def write_workflow_manifest(
    path: Path, model_id: str, checkpoint: str = "fake-sd.safetensors"
) -> Path:
    """A ComfyUI workflow manifest: an API-format text-to-image graph and its inputs."""
    graph = {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": checkpoint}},
        "5": {
            "class_type": "EmptyLatentImage",
            "inputs": {"width": 512, "height": 512, "batch_size": 1},
        },
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["4", 1]}},
        "3": {
            "class_type": "KSampler",
            "inputs": {
                "seed": 0,
                "steps": 4,
                "cfg": 7.0,
                "sampler_name": "euler",
                "scheduler": "normal",
                "denoise": 1.0,
                "model": ["4", 0],
                "positive": ["6", 0],
                "negative": ["7", 0],
                "latent_image": ["5", 0],
            },
        },
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "grid", "images": ["8", 0]}},
    }
    doc = {
        "id": model_id,
        "kind": "image",
        "workflow": graph,
        "inputs": {
            "prompt": ["6", "text"],
            "negative_prompt": ["7", "text"],
            "seed": ["3", "seed"],
            "steps": ["3", "steps"],
            "width": ["5", "width"],
            "height": ["5", "height"],
        },
        "output": "9",
        "checkpoints": [checkpoint],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    return path


def wait_http(url: str, timeout_s: float = START_TIMEOUT_S) -> None:
    """Wait until ``url`` answers anything (a fake that binds after a slow start)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(url, timeout=2.0)
            return
        time.sleep(0.05)
    raise RuntimeError(f"{url} never answered")


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height of a PNG, after checking its signature, chunk CRCs and pixel data."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    pos, idat, size = 8, b"", (0, 0)
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) & 0xFFFFFFFF == crc
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height = size
    assert len(zlib.decompress(idat)) == height * (1 + 3 * width)  # 8-bit RGB rows
    return width, height
