"""Request normalisation for Ollama: routed traffic must never make Ollama reload a model.

Ollama keeps a model in memory for the ``keep_alive`` a request names and reloads it whenever
a request's runner options (context size, batch, GPU layers …) differ from the loaded ones.
A client sending ``keep_alive: 0`` or its own ``num_ctx`` would therefore unload or reload a
Grid-placed model on every request — reload thrash that the allocator never decided. Grid
owns residency, so before a request reaches Ollama the gateway removes those fields and pins
the values the residency was warmed with (specification, "Current limits"; issue: Ollama
reload thrash). Pure functions: no I/O.
"""

from __future__ import annotations

from typing import Any

RELOAD_OPTIONS = (
    "num_ctx",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "use_mmap",
    "use_mlock",
    "num_thread",
    "low_vram",
    "numa",
)
"""Runner options that make Ollama reload a model when they differ from the loaded ones."""
PINNED_KEEP_ALIVE = -1
"""Keep the model loaded until Grid unloads it (a negative keep_alive never expires)."""


def normalize(
    body: dict[str, Any], *, model: str, num_ctx: int
) -> tuple[dict[str, Any], list[str]]:
    """The request as Ollama should see it, and the caller fields that were overridden.

    Args:
        body: the caller's decoded JSON request (not modified).
        model: the Ollama tag the residency serves.
        num_ctx: the context size (tokens) the residency was loaded with.

    Returns:
        ``(body, overridden)``: a new body with ``model`` set, ``keep_alive`` pinned, reload
        options removed and ``options.num_ctx`` pinned; ``overridden`` names each caller field
        that was dropped or replaced (for the gateway's log).
    """
    out = dict(body)
    overridden: list[str] = []
    if "keep_alive" in out and out["keep_alive"] != PINNED_KEEP_ALIVE:
        overridden.append("keep_alive")
    out["keep_alive"] = PINNED_KEEP_ALIVE
    if "num_ctx" in out:
        overridden.append("num_ctx")
        del out["num_ctx"]
    options = out.get("options")
    opts: dict[str, Any] = dict(options) if isinstance(options, dict) else {}
    for key in RELOAD_OPTIONS:
        if key in opts and not (key == "num_ctx" and opts[key] == num_ctx):
            overridden.append(f"options.{key}")
            del opts[key]
    opts["num_ctx"] = num_ctx
    out["options"] = opts
    out["model"] = model
    return out, overridden
