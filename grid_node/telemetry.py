"""Host telemetry with psutil: one :class:`~grid_core.protection.Sample` plus resources.

Every sensor a platform lacks is reported as ``None`` (unknown), never as zero, so the
protection policy decides what unknown means.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from grid_core.protection import Sample
from grid_core.runtime import GpuDevice as GpuDeviceReport
from grid_core.wire import GpuDevice, Resources

MB = 1024 * 1024


def _temperature() -> float | None:
    """Hottest reported temperature (Celsius), ``None`` when the platform has no sensors."""
    read = getattr(psutil, "sensors_temperatures", None)
    if read is None:
        return None
    try:
        groups = read()
    except (OSError, RuntimeError):
        return None
    temps = [t.current for entries in groups.values() for t in entries if t.current]
    return max(temps) if temps else None


def _network_up() -> bool | None:
    """Whether any non-loopback interface is up; ``None`` when unreadable."""
    try:
        stats = psutil.net_if_stats()
    except OSError:
        return None
    others = {name: s for name, s in stats.items() if not name.startswith("lo")}
    if not others:
        return None
    return any(s.isup for s in others.values())


IDLE_PROBE_TIMEOUT_S = 2.0
"""Seconds the platform idle-time probe may take; it answers in milliseconds normally."""


GRAPHICAL_SESSION_TYPES = ("x11", "wayland", "mir")
"""logind session types whose idle hint a desktop environment maintains; a tty or ssh session's
IdleHint never changes, so it says nothing about whether the owner is at the machine."""


def probe_env() -> dict[str, str]:
    """The environment of a sensor probe (``ioreg``, ``loginctl``): ``PATH`` and a C locale.

    A probe needs nothing of the agent's environment, so it gets none of it: no node
    credential, no ``GRID_HOME`` (a probe must never look like a process of the fleet it
    runs under), and a fixed locale so the output parses the same everywhere.
    """
    return {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C"}


def _probe(argv: list[str]) -> str | None:
    """A sensor probe's standard output (bare environment, :data:`IDLE_PROBE_TIMEOUT_S`), or
    ``None`` when it cannot run or times out."""
    try:
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=IDLE_PROBE_TIMEOUT_S,
            check=False,
            env=probe_env(),
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None


def _macos_idle_s() -> float | None:
    """Seconds since the last HID input on macOS (``ioreg``), ``None`` when unreadable."""
    out = _probe(["ioreg", "-c", "IOHIDSystem"])
    if out is None:
        return None
    for line in out.splitlines():
        if '"HIDIdleTime"' in line:
            try:
                return int(line.rsplit("=", 1)[1].strip()) / 1e9  # nanoseconds
            except ValueError:
                return None
    return None


def logind_idle_s(show_session_output: str, now_s: float) -> float | None:
    """Seconds the owner has been idle from ``loginctl show-session`` output, ``None`` if unknown.

    Only active graphical user sessions count (see :data:`GRAPHICAL_SESSION_TYPES`). One
    session with ``IdleHint=no`` means the owner is at the machine (0 s); when every such
    session is idle, the shortest idle time since its ``IdleSinceHint`` (microseconds of
    wall-clock time) is the answer.

    Args:
        show_session_output: ``-p Type -p Class -p Active -p IdleHint -p IdleSinceHint``
            properties of one or more sessions (blank-line separated).
        now_s: the current wall-clock time in seconds.
    """
    idle: list[float] = []
    for block in show_session_output.strip().split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if props.get("Type") not in GRAPHICAL_SESSION_TYPES or props.get("Class") != "user":
            continue
        if props.get("Active") != "yes":
            continue
        if props.get("IdleHint") == "no":
            return 0.0
        try:
            since_us = int(props.get("IdleSinceHint", "0"))
        except ValueError:
            continue
        if since_us > 0:
            idle.append(max(0.0, now_s - since_us / 1e6))
    return min(idle) if idle else None


def _linux_idle_s() -> float | None:
    """Owner idle time from logind (``loginctl``), ``None`` without a graphical session."""
    listing = _probe(["loginctl", "list-sessions", "--no-legend"])
    sessions = [line.split()[0] for line in (listing or "").splitlines() if line.strip()]
    if not sessions:
        return None
    props = ("Type", "Class", "Active", "IdleHint", "IdleSinceHint")
    out = _probe(["loginctl", "show-session", *sessions, *(a for p in props for a in ("-p", p))])
    if out is None:
        return None
    return logind_idle_s(out, time.time())


def _user_idle_s() -> float | None:
    """Seconds since the owner's last input where a source exists: macOS HID idle time, or
    logind's idle hint of an active graphical session on Linux. Anything else is ``None``
    (unknown), never a guess from terminals."""
    if sys.platform == "darwin":
        return _macos_idle_s()
    if sys.platform.startswith("linux"):
        return _linux_idle_s()
    return None


class CpuMeter:
    """System CPU utilisation minus what Grid's own children use.

    Protection should react to the owner's work, not to the inference Grid itself runs, or a
    busy engine would throttle its own host. psutil measures CPU between two calls, so the
    meter keeps one ``psutil.Process`` per child between samples.
    """

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}
        psutil.cpu_percent(interval=None)  # prime the system-wide counter

    def percent(self, managed_pids: list[int]) -> float:
        """Percent of all CPUs busy with work other than ``managed_pids`` since last call."""
        total = psutil.cpu_percent(interval=None)
        ours = 0.0
        for pid in managed_pids:
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    self._procs[pid] = proc = psutil.Process(pid)
                    proc.cpu_percent(interval=None)  # first call only primes the counter
                    continue
                ours += proc.cpu_percent(interval=None)
            except psutil.Error:
                self._procs.pop(pid, None)
        for pid in set(self._procs) - set(managed_pids):
            del self._procs[pid]
        return max(0.0, total - ours / (psutil.cpu_count() or 1))


def sample(
    at: float | None = None,
    gpus: Sequence[GpuDeviceReport] | None = None,
    cpu: CpuMeter | None = None,
    managed_pids: list[int] | None = None,
) -> Sample:
    """Read every sensor once.

    Args:
        at: the sample time (monotonic seconds); defaults to now.
        gpus: devices from the ``grid_gpu_devices`` hook, for GPU memory pressure.
        cpu: a meter that subtracts Grid's own children (system-wide CPU without one).
        managed_pids: Grid's children, for ``cpu``.
    """
    battery = None
    with contextlib.suppress(OSError, RuntimeError, AttributeError):
        battery = psutil.sensors_battery()
    try:
        load = os.getloadavg()[0] / (psutil.cpu_count() or 1)
    except OSError:
        load = None
    gpu_pct = None
    known = [
        (g.memory_used_mb, g.memory_total_mb)
        for g in gpus or ()
        if g.memory_used_mb is not None and g.memory_total_mb
    ]
    if known:
        gpu_pct = max(100.0 * used / total for used, total in known)
    return Sample(
        at=time.monotonic() if at is None else at,
        cpu_pct=cpu.percent(managed_pids or []) if cpu else psutil.cpu_percent(interval=None),
        memory_pct=psutil.virtual_memory().percent,
        gpu_memory_pct=gpu_pct,
        load_per_cpu=load,
        battery_pct=battery.percent if battery is not None else None,
        charging=battery.power_plugged if battery is not None else None,
        temperature_c=_temperature(),
        network_up=_network_up(),
        user_idle_s=_user_idle_s(),
    )


def backends_of(devices: Sequence[GpuDeviceReport]) -> list[str]:
    """Compute backends really present: ``cpu`` always, ``metal`` on Apple silicon, and each
    backend a GPU plugin's devices declare (their optional ``backend`` attribute, e.g.
    ``cuda`` from NVML)."""
    found = {"cpu"}
    if sys.platform == "darwin" and platform.machine() == "arm64":
        found.add("metal")
    for d in devices:
        backend = getattr(d, "backend", None)
        if isinstance(backend, str) and backend:
            found.add(backend)
    return sorted(found)


def resources(
    *,
    capacity_share: float,
    managed_pids: list[int],
    artifact_dir: Path,
    runtimes: list[str],
    throttle_fraction: float,
    failure_domain: str | None = None,
    tags: tuple[str, ...] = (),
    gpus: Sequence[GpuDeviceReport] | None = None,
) -> Resources:
    """Capacity and current external use, scaled to this agent's share of the machine.

    Memory held by Grid's own children is subtracted exactly once from the used total, so
    ``external_used_mb`` is what the owner's other programs use now.
    """
    vm = psutil.virtual_memory()
    ours = 0
    for pid in managed_pids:
        with contextlib.suppress(psutil.Error):
            ours += psutil.Process(pid).memory_info().rss
    used_by_others = max(0, vm.total - vm.available - ours)
    disk_free = disk_total = None
    with contextlib.suppress(OSError):
        artifact_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        du = psutil.disk_usage(str(artifact_dir))
        disk_free, disk_total = du.free // MB, du.total // MB
    devices = [
        GpuDevice(
            index=g.index,
            name=g.name,
            memory_total_mb=g.memory_total_mb,
            memory_used_mb=g.memory_used_mb,
        )
        for g in gpus or ()
    ]
    return Resources(
        # round, not int: a logical host's share is kept to 6 decimals, so share × RAM can land
        # a hair under the MB its fleet gave it (3,071.998 for 3,072 MB of a 24,105 MB machine).
        capacity_mb=round(vm.total / MB * capacity_share),
        runtimes=runtimes,
        backends=backends_of(devices=gpus or ()),
        failure_domain=failure_domain,
        tags=list(tags),
        gpus=devices,
        artifact_disk_free_mb=int(disk_free * capacity_share) if disk_free is not None else None,
        artifact_disk_total_mb=int(disk_total * capacity_share) if disk_total is not None else None,
        external_used_mb=int(used_by_others / MB * capacity_share),
        throttle_fraction=throttle_fraction,
    )
