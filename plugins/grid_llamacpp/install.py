"""Find ``llama-server``, or build it once from pinned llama.cpp source from the package registry.

The source is the llama.cpp tree vendored inside the ``llama-cpp-python`` source distribution
(MIT-licensed), fetched with pip (the registry's ordinary client) and checked against a pinned
SHA-256 before anything is extracted. Only the ``llama-server`` target is built. The binary is
kept in the user cache keyed by version, so the next install is a no-op.

Discovery order: explicit configuration, ``GRID_LLAMA_SERVER``, ``PATH``, the built cache.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from grid_core.api import GridError, NotFoundError, ValidationError, replace_durably
from grid_llamacpp.artifacts import sha256_file

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
"""The pinned source distribution (its vendored llama.cpp serves our tiny GGUFs and SmolLM2)."""
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
"""SHA-256 of llama_cpp_python-0.3.36.tar.gz; a different archive is refused."""
SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
LLAMA_SERVER_ENV = "GRID_LLAMA_SERVER"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",  # portable binary: the cache may be shared by machines of one family
    "-DBUILD_SHARED_LIBS=OFF",  # one self-contained file to cache and identity-check
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # configure must not touch the network
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
)
"""cmake flags: Release, portable, static, no network during configure, server target only."""
VERSION_CHECK_TIMEOUT_S = 30.0
"""Seconds ``llama-server --version`` may take (it only prints and exits)."""


class EngineInstallError(GridError):
    """The llama.cpp build could not be completed; the message names the failing step."""


def cache_root() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/grid/llama.cpp``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "grid" / "llama.cpp"


def cached_binary(version: str = LLAMA_CPP_PYTHON_VERSION) -> Path:
    """Where the built ``llama-server`` of ``version`` is kept."""
    return cache_root() / version / "llama-server"


def works(binary: Path) -> bool:
    """Whether ``binary`` runs and reports a version."""
    try:
        out = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=VERSION_CHECK_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "version" in (out.stdout + out.stderr)


def find_llama_server(configured: str | None = None) -> Path:
    """Locate ``llama-server``: configuration, ``GRID_LLAMA_SERVER``, ``PATH``, then the cache.

    Raises:
        NotFoundError: none found; the message says how to install it.
    """
    for candidate in (configured, os.environ.get(LLAMA_SERVER_ENV)):
        if candidate:
            p = Path(candidate).expanduser()
            if not (p.is_file() and os.access(p, os.X_OK)):
                msg = f"llama-server {p} (from configuration/{LLAMA_SERVER_ENV}) is not executable"
                raise NotFoundError(msg)
            return p.resolve()
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path).resolve()
    cached = cached_binary()
    if cached.is_file():
        return cached
    msg = (
        "llama-server not found (checked configuration, GRID_LLAMA_SERVER, PATH and "
        f"{cached}); run: grid engine install llama.cpp"
    )
    raise NotFoundError(msg)


def _run(argv: list[str], step: str, echo: Callable[[str], None], log: Path) -> None:
    """Run one build step, streaming progress lines and keeping a full log."""
    echo(f"[{step}] {' '.join(argv[:3])} …")
    with open(log, "a") as logf:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            logf.write(line)
            stripped = line.strip()
            if stripped.startswith("[") and "%]" in stripped[:8]:
                echo(f"  {stripped[:110]}")
        rc = proc.wait()
    if rc != 0:
        msg = f"llama.cpp build step '{step}' failed with exit code {rc}; see {log}"
        raise EngineInstallError(msg)


def download_source(workdir: Path, echo: Callable[[str], None], log: Path) -> Path:
    """Fetch and verify the pinned sdist with pip; returns the archive path.

    Raises:
        EngineInstallError: pip failed or the archive's SHA-256 is not the pinned one.
    """
    archive = workdir / SDIST_NAME
    if not (archive.is_file() and sha256_file(archive) == SDIST_SHA256):
        archive.unlink(missing_ok=True)
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
                "-d",
                str(workdir),
            ],
            "download",
            echo,
            log,
        )
    if not archive.is_file():
        msg = f"pip download did not produce {archive}; see {log}"
        raise EngineInstallError(msg)
    digest = sha256_file(archive)
    if digest != SDIST_SHA256:
        archive.unlink(missing_ok=True)
        msg = (
            f"{SDIST_NAME} has SHA-256 {digest}, expected {SDIST_SHA256}; refusing to build "
            "from an unverified archive"
        )
        raise EngineInstallError(msg)
    echo(f"[verify] {SDIST_NAME} sha256 {digest[:16]}… ok")
    return archive


def configure(workdir: Path, archive: Path, echo: Callable[[str], None], log: Path) -> Path:
    """Extract the vendored llama.cpp and run cmake configure; returns the build directory."""
    if shutil.which("cmake") is None:
        msg = "cmake is not installed; install cmake and a C++ compiler, then retry"
        raise EngineInstallError(msg)
    src_root = workdir / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
    if not src_root.is_dir():
        with tarfile.open(archive) as tar:
            tar.extractall(workdir, filter="data")
    source = src_root / "vendor" / "llama.cpp"
    if not (source / "CMakeLists.txt").is_file():
        msg = f"{archive} does not contain vendor/llama.cpp; the pinned archive is unusable"
        raise EngineInstallError(msg)
    build = workdir / "build"
    _run(["cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS], "configure", echo, log)
    return build


def install(
    *, force: bool = False, jobs: int | None = None, echo: Callable[[str], None] = print
) -> tuple[Path, bool, float]:
    """Build and cache ``llama-server`` unless a working cached binary exists.

    Args:
        force: rebuild even when the cached binary works.
        jobs: parallel compile jobs (default: CPU count).
        echo: where progress lines go.

    Returns:
        ``(binary, built, seconds)``: ``built`` is false for the no-op path.

    Raises:
        EngineInstallError: a step failed (download, verification, configure, build).
    """
    target = cached_binary()
    if not force and target.is_file() and works(target):
        return target, False, 0.0
    started = time.monotonic()
    workdir = cache_root() / f"build-{LLAMA_CPP_PYTHON_VERSION}"
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "build.log"
    echo(f"building llama-server {LLAMA_CPP_PYTHON_VERSION} in {workdir} (log: {log})")
    archive = download_source(workdir, echo, log)
    build = configure(workdir, archive, echo, log)
    _run(
        [
            "cmake",
            "--build",
            str(build),
            "--target",
            "llama-server",
            "-j",
            str(jobs or os.cpu_count() or 1),
        ],
        "build",
        echo,
        log,
    )
    built = build / "bin" / "llama-server"
    if not built.is_file():
        msg = f"the build finished but {built} is missing; see {log}"
        raise EngineInstallError(msg)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(".llama-server.partial")
    shutil.copy2(built, tmp)
    replace_durably(tmp, target)
    if not works(target):
        msg = f"{target} was built but does not run; see {log}"
        raise EngineInstallError(msg)
    # Keep the verified archive (a rebuild needs no download); drop the bulky trees.
    shutil.rmtree(build, ignore_errors=True)
    shutil.rmtree(workdir / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}", ignore_errors=True)
    return target, True, time.monotonic() - started


def check_runtime_name(name: str) -> None:
    """Only llama.cpp is installable by this plugin.

    Raises:
        ValidationError: another runtime was named.
    """
    if name not in ("llama.cpp", "llamacpp", "llama-cpp"):
        msg = f"engine {name!r}: this plugin installs only 'llama.cpp'"
        raise ValidationError(msg)
