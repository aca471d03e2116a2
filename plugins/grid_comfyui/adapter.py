"""The ComfyUI runtime adapter: workflow manifests on a loopback ComfyUI, one gateway each.

ComfyUI is a service Grid does not start. A Grid "model" on it is a workflow manifest
(:mod:`grid_comfyui.manifest`); its checkpoints must already be installed in ComfyUI —
Grid never downloads workflow assets (specification, "Current limits"):

* **load** — find ``<model id>.workflow.json`` in the model directories and verify its
  SHA-256 (the manifest is the artifact; a declared source is refused);
* **warm** — ComfyUI's ``/object_info`` must offer every node class and checkpoint the graph
  uses; one minimal generation then loads the checkpoint into accelerator memory; then the
  gateway (:mod:`grid_comfyui.gateway`) starts and serves ``/v1/media/image/generate``;
* **drain/unload** — the gateway's in-flight count; after it stops, ``POST /free`` unloads
  models from accelerator memory (files stay on disk). ComfyUI's ``/free`` releases every
  loaded model at once: another resident workflow on the same ComfyUI reloads its checkpoint
  on its next request.

ComfyUI must listen on loopback (it has no authentication); only the gateway, which checks
the engine key, is reachable from the network.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from pathlib import Path

import httpx

from grid_comfyui.comfy import PNG_SIGNATURE, run_workflow
from grid_comfyui.manifest import (
    MANIFEST_SUFFIX,
    MIN_SIDE_PX,
    Manifest,
    fill,
    missing_on_server,
    parse_manifest,
)
from grid_core.api import (
    AdoptOutcome,
    ArtifactSpec,
    ChildRecord,
    GatewayAdapter,
    LoadResult,
    NotFoundError,
    RuntimeHost,
    UnavailableError,
    ValidationError,
)

RUNTIME_NAME = "comfyui"
URL_ENV = "GRID_COMFYUI_URL"
"""Base URL of the loopback ComfyUI server (default ComfyUI's own 127.0.0.1:8188)."""
DEFAULT_URL = "http://127.0.0.1:8188"
READY_TIMEOUT_S = 120.0
"""Seconds for the gateway to answer once ComfyUI proved the workflow usable."""
WARMUP_TIMEOUT_S = 900.0
"""Seconds the warm-up generation may take: loading an SDXL checkpoint from a cold disk."""
MAX_CONCURRENCY = 1
"""ComfyUI executes one prompt at a time; more requests only queue inside it."""
LOOPBACK_EXAMPLE = "--listen 127.0.0.1"
"""Quoted when a non-loopback ComfyUI URL is refused."""


def find_manifest(model_id: str, model_dirs: tuple[Path, ...]) -> Path:
    """``<model_id>.workflow.json`` in the first model directory that has it.

    Raises:
        NotFoundError: in none of them (the message lists where it looked).
    """
    for d in model_dirs:
        path = d / f"{model_id}{MANIFEST_SUFFIX}"
        if path.is_file():
            return path
    dirs = ", ".join(str(d) for d in model_dirs) or "(none)"
    msg = f"{model_id}: no workflow manifest {model_id}{MANIFEST_SUFFIX} in {dirs}"
    raise NotFoundError(msg)


class ComfyUIAdapter(GatewayAdapter):
    """Runtime adapter for workflow manifests on a loopback ComfyUI.

    Args:
        url: ComfyUI's URL (else ``$GRID_COMFYUI_URL``, else 127.0.0.1:8188).
        ready_timeout_s: seconds the gateway may take to answer.
    """

    name = RUNTIME_NAME
    label = "ComfyUI gateway"
    gateway_module = "grid_comfyui.gateway"
    service = "ComfyUI"
    url_env = URL_ENV
    default_url = DEFAULT_URL
    loopback_example = LOOPBACK_EXAMPLE

    def __init__(self, url: str | None = None, *, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        super().__init__(url, ready_timeout_s=ready_timeout_s, max_concurrency=MAX_CONCURRENCY)
        self.live: set[str] = set()
        """Workflows with a ready (or adopted) gateway on this node: ComfyUI's ``/free``
        unloads every checkpoint at once, so it waits until the last of them stops."""

    async def warm(
        self,
        host: RuntimeHost,
        loaded: LoadResult,
        memory_mb: int,
        *,
        embeddings: bool = False,
        ready_timeout_s: float | None = None,
    ) -> ChildRecord:
        """Start the workflow's gateway (see :meth:`EngineChildAdapter.warm`) and count it
        among the live workflows."""
        child = await super().warm(
            host, loaded, memory_mb, embeddings=embeddings, ready_timeout_s=ready_timeout_s
        )
        self.live.add(child.model_id)
        return child

    async def adopt(self, host: RuntimeHost, child: ChildRecord) -> tuple[AdoptOutcome, str]:
        """Adopt after a node restart (see :meth:`EngineChildAdapter.adopt`); an adopted
        gateway counts among the live workflows."""
        outcome, why = await super().adopt(host, child)
        if outcome == "adopted":
            self.live.add(child.model_id)
        return outcome, why

    async def object_info(self) -> dict:
        """ComfyUI's node catalogue.

        Raises:
            NotFoundError: ComfyUI does not answer (one line saying what is missing).
        """
        try:
            async with self.service_client() as c:
                r = await c.get("/object_info")
                r.raise_for_status()
                return dict(r.json())
        except (httpx.HTTPError, ValueError) as exc:
            msg = (
                f"ComfyUI is not running at {self.url} ({type(exc).__name__}); start it with "
                f"--listen 127.0.0.1 or set {URL_ENV}"
            )
            raise NotFoundError(msg) from None

    async def inventory(self) -> str:
        """What this host offers for ComfyUI (raises NotFoundError when it is not running)."""
        info = await self.object_info()
        return f"comfyui {self.url}: {len(info)} node classes"

    # --- load -------------------------------------------------------------------------------
    async def load(self, host: RuntimeHost, artifact: ArtifactSpec) -> LoadResult:
        """Find and verify the workflow manifest (never fetched).

        Raises:
            ValidationError: a declared source, a malformed manifest, an id mismatch or the
                wrong digest.
            NotFoundError: no manifest file.
        """
        if artifact.source is not None:
            msg = (
                f"{artifact.model_id}: ComfyUI workflow assets are installed by hand, never "
                "fetched; drop --artifact-source and put the manifest in a model directory"
            )
            raise ValidationError(msg)
        path = find_manifest(artifact.model_id, host.model_dirs)
        raw = await asyncio.to_thread(path.read_bytes)
        manifest = parse_manifest(raw, str(path))
        if manifest.id != artifact.model_id:
            msg = f"workflow manifest {path}: its id is {manifest.id!r}, not {artifact.model_id!r}"
            raise ValidationError(msg)
        digest = hashlib.sha256(raw).hexdigest()
        if artifact.sha256 is not None and digest != artifact.sha256:
            msg = (
                f"{artifact.model_id}: manifest {path} has SHA-256 {digest}, the profile declares "
                f"{artifact.sha256}; fix --artifact-sha256 or restore the manifest"
            )
            raise ValidationError(msg)
        return LoadResult(
            model_id=artifact.model_id,
            path=str(path),
            sha256=artifact.sha256,
            size_bytes=len(raw),
        )

    # --- warm -------------------------------------------------------------------------------
    async def before_spawn(self, host: RuntimeHost, loaded: LoadResult, memory_mb: int) -> None:
        """Re-verify the manifest, prove ComfyUI can run it, and load its checkpoint.

        Raises:
            UnavailableError: ComfyUI lacks a node class or checkpoint (listed), or the
                warm-up generation failed.
        """
        again = await self.load(host, ArtifactSpec(model_id=loaded.model_id, sha256=loaded.sha256))
        manifest = parse_manifest(Path(again.path).read_bytes(), again.path)
        missing = missing_on_server(manifest, await self.object_info())
        if missing:
            msg = (
                f"ComfyUI at {self.url} cannot run {loaded.model_id}: missing {', '.join(missing)}"
            )
            raise UnavailableError(msg)
        await self._generate(manifest, warmup=True)

    async def _generate(self, manifest: Manifest, *, warmup: bool) -> bytes:
        request: dict[str, object] = {"prompt": "warm-up" if warmup else "a lighthouse at dawn"}
        for field, value in (("width", MIN_SIDE_PX), ("height", MIN_SIDE_PX), ("steps", 1)):
            if field in manifest.inputs:
                request[field] = value
        try:
            async with self.service_client(WARMUP_TIMEOUT_S) as c:
                return await run_workflow(
                    c, fill(manifest, request), manifest.output, WARMUP_TIMEOUT_S
                )
        except httpx.HTTPError as exc:
            msg = f"ComfyUI at {self.url} failed the warm-up of {manifest.id}: {exc}"
            raise UnavailableError(msg) from None

    def gateway_args(self, loaded: LoadResult) -> list[str]:
        """The verified workflow manifest the gateway fills per request."""
        return ["--manifest", loaded.path]

    async def after_stop(self, host: RuntimeHost, child: ChildRecord) -> None:
        """Unload models from accelerator memory (``POST /free``; files stay on disk) once
        the last live workflow stopped: ``/free`` cannot unload one checkpoint, and calling
        it while another workflow serves would make that workflow's next image reload its
        checkpoint.

        Raises:
            UnavailableError: ComfyUI did not accept the request (retried by a later unload).
        """
        self.live.discard(child.model_id)
        if self.live:
            return
        try:
            async with self.service_client() as c:
                r = await c.post("/free", json={"unload_models": True, "free_memory": True})
        except httpx.HTTPError as exc:
            msg = f"gateway stopped, but ComfyUI did not accept /free: {exc}"
            raise UnavailableError(msg) from None
        if r.status_code != 200:
            msg = f"gateway stopped, but ComfyUI answered /free with HTTP {r.status_code}"
            raise UnavailableError(msg)

    # --- qualification ------------------------------------------------------------------------
    async def infer(self, host: RuntimeHost, child: ChildRecord) -> str:
        """One real image through the gateway (qualification).

        Raises:
            ValidationError: no PNG came back.
        """
        async with httpx.AsyncClient(timeout=WARMUP_TIMEOUT_S, trust_env=False) as client:
            r = await client.post(
                f"{child.url}/v1/media/image/generate",
                headers={"Authorization": f"Bearer {host.api_key}"},
                json={
                    "model": child.alias,
                    "prompt": "a lighthouse at dawn",
                    "response_format": "b64_json",
                },
            )
        data = r.json().get("data", [{}])[0].get("b64_json", "") if r.status_code == 200 else ""
        image = base64.b64decode(data) if data else b""
        if not image.startswith(PNG_SIGNATURE):
            msg = f"image request on {child.alias}: HTTP {r.status_code}, no PNG"
            raise ValidationError(msg)
        return f"HTTP 200, PNG of {len(image)} bytes"
