"""The bench's load generator processes: they measure, report failures, and never outlive
their coordinator (closed, failed, or killed)."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import msgspec
import psutil
import pytest

from grid_core.system import wait_until_sync
from grid_server.harness import ThreadServer, fake_engine_in_thread
from grid_server.loadgen import Block, Generators

pytestmark = pytest.mark.integration

GONE_WITHIN_S = 30.0
"""Liveness bound for a process to disappear on a loaded two-core machine (not a timing
assertion: the test only fails if the process never goes)."""
BODY = msgspec.json.encode(
    {"model": "m-gen", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
)


@pytest.fixture
def engine() -> Iterator[tuple[ThreadServer, str]]:
    server, key = fake_engine_in_thread("m-gen")
    try:
        yield server, key
    finally:
        server.stop()


def _gone(pids: list[tuple[int, float]]) -> bool:
    """Every (pid, create_time) has exited (a zombie awaiting its reaper counts as gone)."""
    for pid, created in pids:
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def _identities(pids: list[int]) -> list[tuple[int, float]]:
    return [(pid, psutil.Process(pid).create_time()) for pid in pids]


def test_generators_measure_every_request_and_stop_on_close(
    engine: tuple[ThreadServer, str],
) -> None:
    server, key = engine
    block = Block(
        url=server.url + "/v1/chat/completions",
        headers={"content-type": "application/json", "authorization": f"Bearer {key}"},
        body=BODY,
        requests=60,
        concurrency=3,
    )
    with Generators(2) as gens:
        ids = _identities(gens.pids)
        assert len(ids) == 2 and not _gone(ids)
        sample = gens.run(block)
    assert len(sample.latencies_ms) == 60 and all(x > 0 for x in sample.latencies_ms)
    # Straight to the engine: no Server-Timing from Grid on these answers.
    assert sample.upstream_ms == [None] * 60
    assert sample.wall_s > 0 and sample.cpu_s >= 0
    assert _gone(ids)


def test_a_failing_target_is_an_error_naming_it_and_leaves_no_generator() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: connecting is refused
    block = Block(
        url=f"http://127.0.0.1:{port}/v1/chat/completions",
        headers={"content-type": "application/json"},
        body=BODY,
        requests=5,
        concurrency=2,
    )
    gens = Generators(2)
    ids = _identities(gens.pids)
    try:
        with pytest.raises(RuntimeError, match=r"5 bench requests to .* failed \(first: Client"):
            gens.run(block)
    finally:
        gens.close()
    assert _gone(ids)


def test_generators_exit_when_their_coordinator_is_killed() -> None:
    script = textwrap.dedent(
        """
        import sys, time
        from grid_server.loadgen import Generators
        gens = Generators(2)
        print(" ".join(str(p) for p in gens.pids), flush=True)
        time.sleep(600)
        """
    )
    coordinator = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True
    )
    try:
        assert coordinator.stdout is not None
        pids = [int(p) for p in coordinator.stdout.readline().split()]
        ids = _identities(pids)
        assert len(ids) == 2 and not _gone(ids)
        coordinator.kill()  # SIGKILL: no cleanup code of the coordinator runs
        coordinator.wait()
        assert wait_until_sync(lambda: _gone(ids), timeout_s=GONE_WITHIN_S, interval_s=0.1)
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
            coordinator.wait()
        if coordinator.stdout is not None:
            coordinator.stdout.close()
