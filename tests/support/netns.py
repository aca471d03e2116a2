"""Multi-host tests on one machine: network namespaces joined by a bridge (root only).

``netlab`` is a pytest fixture (import it into a conftest) returning a factory:
``netlab(("server", "node-a", "node-b"))`` builds a :class:`grid_core.system.netns.NetLab`
whose hosts have 198.18.x.y addresses and whose bridge gives the test process itself an
address on the lab link. Everything a lab made — every process still running in one of its
namespaces, the veths, the namespaces, the bridge — is removed when the test ends, passed or
failed. Where namespaces cannot be made (not root, no iproute2, a container without
CAP_SYS_ADMIN) the test is skipped with that reason; CI runs as root, so there it runs.

``secrets_exposed`` reads what a process shows the rest of the machine (its command line and
environment under ``/proc``) and reports any secret found there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import pytest

from grid_core.system.netns import NetLab, unavailable_reason

LabFactory = Callable[[Sequence[str]], NetLab]


@pytest.fixture
def netlab() -> Iterator[LabFactory]:
    """Factory of namespace labs, all closed at teardown (even when the test fails)."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces are unavailable here: {reason}")
    labs: list[NetLab] = []

    def make(names: Sequence[str]) -> NetLab:
        lab = NetLab(tuple(names))
        labs.append(lab)  # registered before building: a half-built lab is cleaned up too
        lab.build()
        return lab

    try:
        yield make
    finally:
        for lab in labs:
            lab.close()


def pem_secret_lines(path: Path) -> list[str]:
    """The base64 lines of a PEM private key (any one of them in the open is a leak)."""
    lines = path.read_text().splitlines()
    return [ln for ln in lines if ln and not ln.startswith("-----") and len(ln) >= 16]


def secrets_exposed(pids: Iterable[int], secrets: dict[str, str]) -> list[str]:
    """Where a secret appears in the argv or environment of ``pids``.

    Args:
        pids: processes to read (``/proc/<pid>/cmdline`` and ``environ``).
        secrets: name → secret value.

    Returns:
        One line per finding (``"pid 12 environ: engine key"``); empty when clean. A process
        that has exited meanwhile is skipped.
    """
    found: list[str] = []
    for pid in pids:
        for part in ("cmdline", "environ"):
            try:
                text = Path(f"/proc/{pid}/{part}").read_bytes().decode(errors="replace")
            except OSError:
                continue
            for name, value in secrets.items():
                if value and value in text:
                    found.append(f"pid {pid} {part}: {name}")
    return found


def secrets_in_texts(texts: dict[str, str], secrets: dict[str, str]) -> list[str]:
    """Where a secret appears in named texts (logs, status, ``/nodes``)."""
    return [
        f"{where}: {name}"
        for where, text in texts.items()
        for name, value in secrets.items()
        if value and value in text
    ]
