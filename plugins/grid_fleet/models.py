"""The logical fleet's models: the generated tiny demo GGUFs or the operator's own files.

The demo models are written through ``grid test make-model`` (the llama.cpp plugin's public
command), as an operator would, never by importing another plugin's internals.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from grid_core.api import GridError, ValidationError
from grid_fleet import layout
from grid_fleet.layout import FleetSettings, ModelSpec

GGUF_MAGIC = b"GGUF"
"""First four bytes of every GGUF file (the format's magic number)."""
MAKE_MODEL_TIMEOUT_S = 120.0
"""A tiny demo GGUF is written in about a second; two minutes covers a loaded CI machine."""

Echo = Callable[[str], None]


def grid_exe() -> list[str]:
    """How to run the ``grid`` CLI of this very installation."""
    return [sys.executable, "-c", "from grid_core.cli import main; main()"]


def check_gguf(path: Path) -> None:
    """Refuse an operator ``--model`` that is not a readable GGUF file, before starting anything.

    Raises:
        ValidationError: the file is missing, unreadable or lacks the GGUF magic bytes.
    """
    try:
        with path.open("rb") as f:
            head = f.read(len(GGUF_MAGIC))
    except IsADirectoryError:
        msg = f"--model {path}: is a directory, not a GGUF file"
        raise ValidationError(msg) from None
    except FileNotFoundError:
        msg = f"--model {path}: no such file"
        raise ValidationError(msg) from None
    except OSError as exc:
        msg = f"--model {path}: cannot read it ({exc.strerror or exc})"
        raise ValidationError(msg) from None
    if head != GGUF_MAGIC:
        msg = f"--model {path}: not a GGUF file (it does not start with the GGUF magic bytes)"
        raise ValidationError(msg)


def prepare_models(root: Path, settings: FleetSettings, echo: Echo) -> tuple[ModelSpec, ...]:
    """Generate the three default tiny models (or describe the operator's GGUFs).

    Raises:
        ValidationError: an operator ``--model`` path is missing or not a ``.gguf``.
    """
    small = min(settings.capacities_mb)
    models_dir = root / "models"
    models_dir.mkdir(parents=True, exist_ok=True)
    out: list[ModelSpec] = []
    if settings.models:
        for i, raw in enumerate(settings.models):
            path = Path(raw)
            check_gguf(path)
            link = models_dir / path.name
            if link.is_symlink() and link.resolve() != path.resolve():
                link.unlink()  # an earlier fleet's file of the same name
            if not link.exists():
                link.symlink_to(path)
            out.append(
                ModelSpec(
                    model_id=path.name,
                    path=str(path),
                    sha256=layout.sha256_of(path),
                    memory_mb=int(small * layout.OPERATOR_MODEL_SHARE),
                    priority=50 - 10 * i,
                    min_replicas=1 if i == 0 else 0,
                    max_replicas=min(3, settings.machines) if i == 0 else 1,
                )
            )
        return tuple(out)
    for i, m in enumerate(layout.DEFAULT_MODELS):
        path = models_dir / f"{m['name']}.gguf"
        if not path.exists():
            size = make_tiny_model(path, m["name"], m["layers"], m["embedding"], seed=i)
            echo(f"  made {path.name} ({size / 1e6:.1f} MB file)")
        out.append(
            ModelSpec(
                model_id=path.name,
                path=str(path),
                sha256=layout.sha256_of(path),
                memory_mb=int(small * m["share"]),
                priority=m["priority"],
                min_replicas=m["min_replicas"],
                max_replicas=min(m["max_replicas"], settings.machines),
            )
        )
    return tuple(out)


def make_tiny_model(path: Path, name: str, layers: int, embedding: int, *, seed: int) -> int:
    """Write one demo GGUF through ``grid test make-model`` (the llama.cpp plugin's command).

    The fleet drives the llama.cpp plugin through its public command, as an operator would,
    rather than importing another plugin's internals.

    Returns:
        The file size in bytes.

    Raises:
        GridError: the command failed (its last output line is the message).
    """
    argv = [
        *grid_exe(),
        "test",
        "make-model",
        str(path),
        "--name",
        name,
        "--layers",
        str(layers),
        "--embedding",
        str(embedding),
        "--context",
        str(layout.MODEL_CONTEXT),
        "--seed",
        str(seed),
    ]
    done = subprocess.run(
        argv, capture_output=True, text=True, check=False, timeout=MAKE_MODEL_TIMEOUT_S
    )
    if done.returncode != 0 or not path.is_file():
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        msg = f"making the demo model {path.name} failed: {lines[-1]}"
        raise GridError(msg)
    return path.stat().st_size
