"""The detached node-agent process: ``python -m grid_node.daemon --instance ID [flags]``.

Started by ``grid allocator node start``. SIGTERM (sent by ``node stop`` after proving this
process's identity) triggers the graceful stop: fence routes, wait for running requests,
stop identity-proven children, deregister.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from grid_core.errors import GridError
from grid_core.plugins import load_plugins
from grid_node.agent import NodeAgent
from grid_node.config import NodeConfig, parse_port_range


def parse_args(argv: list[str]) -> tuple[NodeConfig, str]:
    """Daemon flags (the same meaning as ``node start``'s)."""
    p = argparse.ArgumentParser(prog="grid-node-daemon")
    p.add_argument("--instance", required=True)
    p.add_argument("--state-dir", required=True)
    p.add_argument("--grid", required=True)
    p.add_argument("--token-file")
    p.add_argument("--host-id")
    p.add_argument("--dedicated", action="store_true")
    p.add_argument("--port-range", default="22200-22299")
    p.add_argument("--capacity-share", type=float, default=1.0)
    p.add_argument("--models-dir", action="append", default=[])
    p.add_argument("--llama-server")
    p.add_argument("--failure-domain")
    p.add_argument("--tag", action="append", default=[])
    p.add_argument("--heartbeat-interval", type=float, default=5.0)
    p.add_argument("--unknown-sensors", choices=("ignore", "throttle"), default="ignore")
    p.add_argument("--throttle-fraction", type=float, default=None)
    a = p.parse_args(argv)
    config = NodeConfig(
        state_dir=Path(a.state_dir),
        grid_url=a.grid,
        token_file=Path(a.token_file) if a.token_file else None,
        host_id=a.host_id,
        dedicated=a.dedicated,
        port_range=parse_port_range(a.port_range),
        capacity_share=a.capacity_share,
        model_dirs=tuple(Path(d) for d in a.models_dir),
        llama_server=a.llama_server,
        failure_domain=a.failure_domain,
        tags=tuple(a.tag),
        heartbeat_interval_s=a.heartbeat_interval,
        throttle_fraction=a.throttle_fraction,
        unknown_sensors=a.unknown_sensors,
    )
    return config, a.instance


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
        for line in await agent.shutdown():
            print(f"grid-node: {line}", flush=True)
        agent.mark_stopped()
    finally:
        await agent.close()


def main(argv: list[str] | None = None) -> None:
    """Process entry point; a handled error prints one line and exits 1."""
    config, instance = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        asyncio.run(serve(config, instance))
    except GridError as exc:
        print(f"grid-node: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(exc.exit_code) from None


if __name__ == "__main__":
    main()
