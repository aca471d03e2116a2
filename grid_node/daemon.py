"""The detached node-agent process: ``python -m grid_node.daemon --instance ID --config FILE``.

Started by :func:`grid_node.launch.start_node` (``grid allocator node start`` and the logical
fleet). Every option comes from the configuration document ``FILE``
(:class:`~grid_core.nodeconfig.NodeConfig`); ``--instance`` only names this process for identity
proofs. SIGTERM (sent by ``node stop`` after proving this process's identity) triggers the
graceful stop: fence routes, wait for running requests, stop identity-proven children,
deregister. A server that refuses this run for its host id (another agent holds it, or a
newer run superseded this one) stops it the same way and it exits non-zero with the reason.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from grid_core.errors import ConflictError, GridError
from grid_core.nodeconfig import NodeConfig, load_config
from grid_core.plugins import load_plugins
from grid_core.system.logs import configure_daemon_logging
from grid_node.agent import NodeAgent


def parse_args(argv: list[str]) -> tuple[Path, str]:
    """The two daemon arguments: the configuration document and the instance id."""
    p = argparse.ArgumentParser(prog="grid-node-daemon")
    p.add_argument("--instance", required=True)
    p.add_argument("--config", required=True, type=Path, help="node-config.json to run with")
    a = p.parse_args(argv)
    return a.config, a.instance


async def serve(config: NodeConfig, instance: str) -> None:
    """Run the agent until SIGTERM/SIGINT, then stop gracefully."""
    agent = NodeAgent(config, load_plugins(), instance=instance)
    await agent.open()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await agent.run(stop)
        if not agent.refused or agent.ever_registered:
            # A run refused at its first registration leaves the children it adopted from
            # its state directory alone: the controller knows them as the host's, and the
            # agent that owns that host id is another run.
            for line in await agent.shutdown():
                print(f"grid-node: {line}", flush=True)
        agent.mark_stopped()
    finally:
        await agent.close()
    if agent.refused:
        raise ConflictError(agent.refused)


def main(argv: list[str] | None = None) -> None:
    """Process entry point; a handled error prints one line and exits with its code."""
    path, instance = parse_args(sys.argv[1:] if argv is None else argv)
    configure_daemon_logging()
    try:
        asyncio.run(serve(load_config(path), instance))
    except GridError as exc:
        print(f"grid-node: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(exc.exit_code) from None


if __name__ == "__main__":
    main()
