"""``grid allocator qualify RUNTIME MODEL``: the command over :mod:`grid_node.qualify`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import anyio
import typer

from grid_core.errors import NotFoundError
from grid_core.plugins import get_plugins
from grid_core.runtime import ArtifactSpec
from grid_node.qualify import check_artifact, locate, run_qualification


def qualify(
    runtime: Annotated[str, typer.Argument(help="Runtime: llama.cpp, vllm, ollama, comfyui …")],
    model: Annotated[
        str,
        typer.Argument(
            help="GGUF file, vLLM snapshot directory or name, Ollama tag, ComfyUI workflow id."
        ),
    ],
    artifact_sha256: Annotated[
        str | None,
        typer.Option("--artifact-sha256", help="Expected identity (SHA-256, registry digest)."),
    ] = None,
    artifact_source: Annotated[
        str | None,
        typer.Option(
            "--artifact-source", help="Exact source: hf://owner/repo@COMMIT or ollama://TAG."
        ),
    ] = None,
    artifact_size_mb: Annotated[
        int | None, typer.Option("--artifact-size-mb", help="Transfer ceiling in MB.")
    ] = None,
    models_dir: Annotated[
        Path | None,
        typer.Option("--models-dir", help="Where the model is found (default $GRID_HOME/models)."),
    ] = None,
    evidence: Annotated[
        Path | None,
        typer.Option("--evidence", help="Evidence file (default under $GRID_HOME/qualification)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the evidence document.")] = False,
) -> None:
    """Run RUNTIME's real lifecycle on this host once and write durable evidence.

    Steps: inventory, identity, warm, ownership, readiness, inference, activity, drain, stop.
    Exit 0 when every step passed, 1 otherwise; a missing engine is one line saying what is
    missing.
    """
    check_artifact(artifact_sha256, artifact_size_mb)
    adapters = get_plugins().runtime_adapters()
    adapter = adapters.get(runtime)
    if adapter is None:
        msg = f"runtime {runtime!r} has no adapter installed (installed: {sorted(adapters)})"
        raise NotFoundError(msg)
    model_id, dirs = locate(model, models_dir)
    spec = ArtifactSpec(
        model_id=model_id, sha256=artifact_sha256, source=artifact_source, size_mb=artifact_size_mb
    )
    doc = anyio.run(run_qualification, adapter, model, spec, dirs, evidence)
    if as_json:
        typer.echo(json.dumps(doc, indent=2))
    elif doc["missing"]:
        # The one line an operator needs: what is missing (the evidence still records it).
        typer.echo(f"grid: {runtime}: {doc['missing']} (evidence {doc['evidence_path']})", err=True)
    else:
        for s in doc["steps"]:
            typer.echo(f"{'ok  ' if s['ok'] else 'FAIL'} {s['name']:<10} {s['detail']}")
        typer.echo(f"evidence: {doc['evidence_path']}")
    if not doc["passed"]:
        raise typer.Exit(1)
