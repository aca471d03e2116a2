"""The vLLM runtime adapter: one Grid-owned ``vllm serve`` child per model.

Launch: ``vllm serve DIR --served-model-name ALIAS --host --port --max-num-seqs N --config
FILE``. The engine key goes into vLLM's own YAML argument file (``--config``, written 0600),
so it is never in argv or the child's environment; with a key vLLM refuses unauthenticated
``/v1`` requests, which keeps its OpenAI routes closed to the LAN. Readiness is ``/health``
200 plus the alias in the authenticated ``/v1/models``; activity is
``vllm:num_requests_running`` + ``vllm:num_requests_waiting`` from ``/metrics``.

Several vLLM children can share one GPU only if each preallocates no more than its share:
when the GPU's memory is known (NVML, ``nvidia-ml-py``) a child is started with
``--gpu-memory-utilization`` = its memory budget / the GPU's memory (specification, "Current
limits": runtime-specific memory accounting).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from pathlib import Path

import httpx

from grid_core.api import (
    ArtifactSpec,
    ChildRecord,
    EngineChildAdapter,
    LoadResult,
    NotFoundError,
    RuntimeHost,
    ValidationError,
    lists_model,
    write_atomic,
)
from grid_vllm.snapshots import SnapshotStore

RUNTIME_NAME = "vllm"
EXECUTABLE_ENV = "GRID_VLLM"
"""Path of the ``vllm`` executable (else ``vllm`` on PATH)."""
READY_TIMEOUT_S = 600.0
"""Seconds a child may take to become ready: vLLM loads weights, profiles memory and
captures CUDA graphs before it binds; ten minutes covers a 70B model on a cold disk."""
DEFAULT_MAX_NUM_SEQS = 16
"""Sequences one child batches at once (its max_concurrency as Grid admits work)."""
PROBE_TIMEOUT_S = 5.0
MIN_GPU_FRACTION = 0.05
"""Smallest --gpu-memory-utilization Grid passes: below it vLLM cannot hold a KV cache."""
MAX_GPU_FRACTION = 0.95
"""Largest: vLLM needs some memory outside its pool for activations and the CUDA context."""
METRIC = re.compile(
    r'^vllm:num_requests_(running|waiting)\{[^}]*model_name="([^"]*)"[^}]*\}\s+([0-9.eE+-]+)$'
)
INSTALL_HINT = (
    "vLLM is not installed on this host: pip install vllm (CUDA host), or set "
    f"{EXECUTABLE_ENV} to the vllm executable"
)


def gpu_total_mb() -> int | None:
    """Memory of GPU 0 in MB from NVML, ``None`` without a driver or binding."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            if pynvml.nvmlDeviceGetCount() < 1:
                return None
            info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
            return int(info.total) // (1024 * 1024)
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return None


class VllmAdapter(EngineChildAdapter):
    """Runtime adapter for ``vllm serve``.

    Args:
        executable: explicit ``vllm`` path (else ``$GRID_VLLM``, else PATH).
        max_num_seqs: sequences one child batches (its max_concurrency).
        ready_timeout_s: seconds a child may take to become ready.
    """

    name = RUNTIME_NAME
    label = "vLLM"

    def __init__(
        self,
        executable: str | None = None,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        *,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        super().__init__(ready_timeout_s=ready_timeout_s, max_concurrency=max_num_seqs)
        self._configured = executable
        self.max_num_seqs = max_num_seqs

    def executable(self) -> Path:
        """The ``vllm`` executable.

        Raises:
            NotFoundError: not configured and not on PATH (one line with the fix).
        """
        configured = self._configured or os.environ.get(EXECUTABLE_ENV)
        found = configured if configured and os.access(configured, os.X_OK) else None
        found = found or (None if configured else shutil.which("vllm"))
        if not found:
            where = f" ({configured} is not executable)" if configured else ""
            raise NotFoundError(INSTALL_HINT + where)
        return Path(found).absolute()

    def inventory(self) -> str:
        """What this host offers for vLLM (raises NotFoundError when it is missing)."""
        return f"vllm {self.executable()}"

    # --- load -------------------------------------------------------------------------------
    async def load(self, host: RuntimeHost, artifact: ArtifactSpec) -> LoadResult:
        """Verify a local snapshot directory or fetch the exact ``hf://owner/repo@commit``."""
        store = SnapshotStore(host.artifact_dir, host.model_dirs)
        return await asyncio.to_thread(store.resolve, artifact)

    # --- warm -------------------------------------------------------------------------------
    async def before_spawn(self, host: RuntimeHost, loaded: LoadResult, memory_mb: int) -> None:
        """Re-verify the snapshot identity right before launch (and that vLLM exists)."""
        self.executable()
        if loaded.sha256 is not None:
            store = SnapshotStore(host.artifact_dir, host.model_dirs)
            await asyncio.to_thread(store.verify, Path(loaded.path), loaded.sha256, loaded.model_id)

    def config_path(self, host: RuntimeHost, port: int) -> Path:
        """The child's 0600 vLLM argument file (holds the engine key)."""
        return host.state_dir / f"vllm-{port}.yaml"

    def command(
        self, host: RuntimeHost, loaded: LoadResult, alias: str, port: int, memory_mb: int
    ) -> list[str]:
        """``vllm serve`` with the key in a 0600 ``--config`` file (JSON is valid YAML)."""
        config = self.config_path(host, port)
        write_atomic(config, json.dumps({"api-key": host.api_key}))
        argv = [
            str(self.executable()),
            "serve",
            loaded.path,
            "--served-model-name",
            alias,
            "--host",
            host.bind_host,
            "--port",
            str(port),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--config",
            str(config),
        ]
        total = gpu_total_mb()
        if total and memory_mb:
            fraction = min(MAX_GPU_FRACTION, max(MIN_GPU_FRACTION, memory_mb / total))
            argv += ["--gpu-memory-utilization", f"{fraction:.3f}"]
        return argv

    def identity_args(self, child: ChildRecord) -> tuple[tuple[str, str], ...]:
        """``serve`` of this directory, under this alias, on this port."""
        return (
            ("serve", child.model_path),
            ("--served-model-name", child.alias),
            ("--port", str(child.port)),
        )

    async def ready(self, client: httpx.AsyncClient, host: RuntimeHost, child: ChildRecord) -> bool:
        """``/health`` 200 and the alias in the authenticated ``/v1/models``."""
        return await lists_model(client, child.url, host.api_key, child.alias)

    async def activity(self, host: RuntimeHost, child: ChildRecord) -> int | None:
        """Running plus waiting sequences of this alias from ``/metrics``."""
        try:
            async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, trust_env=False) as client:
                r = await client.get(f"{child.url}/metrics")
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        seen = False
        total = 0.0
        for line in r.text.splitlines():
            m = METRIC.match(line.strip())
            if m and m.group(2) == child.alias:
                seen = True
                total += float(m.group(3))
        return int(total) if seen else None

    async def after_stop(self, host: RuntimeHost, child: ChildRecord) -> None:
        """Remove the child's key-bearing argument file."""
        self.config_path(host, child.port).unlink(missing_ok=True)

    # --- qualification ------------------------------------------------------------------------
    async def infer(self, host: RuntimeHost, child: ChildRecord) -> str:
        """One real chat completion through the child (qualification).

        Raises:
            ValidationError: the engine did not answer with generated tokens.
        """
        async with httpx.AsyncClient(timeout=120.0, trust_env=False) as client:
            r = await client.post(
                f"{child.url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {host.api_key}"},
                json={
                    "model": child.alias,
                    "max_tokens": 8,
                    "messages": [{"role": "user", "content": "Reply with OK"}],
                },
            )
        tokens = (
            r.json().get("usage", {}).get("completion_tokens", 0) if r.status_code == 200 else 0
        )
        if not tokens:
            msg = f"chat completion on {child.alias}: HTTP {r.status_code}, no tokens"
            raise ValidationError(msg)
        return f"HTTP 200, {tokens} tokens"
