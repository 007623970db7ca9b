"""`promptcache simulate`: run the upstream simulator as its own server, on uvloop.

Contract: `add_arguments(parser)` adds `--host` (127.0.0.1), `--port` (8090; 0 = any free port),
`--clock real|manual`, `--models PATH` (default `rules/simulator.yaml`) and `--platform NAME` (the
platform `/v1/messages` behaves as: `direct`, `strict-compatible`, `vertex`, `bedrock`, `foundry`;
Vertex and Bedrock paths always answer as their platform); `run(args)` loads the
table (errors -> exit 2), starts the server, prints `promptcache simulator listening on URL` (the
real bound port) and serves until SIGINT/SIGTERM; returns the exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import uvloop

from proxy.sim.app import start_sim
from proxy.sim.clock import Clock
from proxy.sim.config import ConfigError, SimConfig
from proxy.sim.platforms import PLATFORMS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8090, help="port to bind, 0 for any (default 8090)")
    parser.add_argument(
        "--clock",
        choices=("real", "manual"),
        default="real",
        help="real wall time, or manual time moved by POST /_sim/clock (default real)",
    )
    parser.add_argument(
        "--models", metavar="PATH", default=None, help="per-model table (default rules/simulator.yaml)"
    )
    parser.add_argument(
        "--platform",
        choices=tuple(PLATFORMS),
        default="direct",
        help="the platform whose rules /v1/messages applies (default direct)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        config = SimConfig.load(args.models)
    except ConfigError as exc:
        print(f"promptcache simulate: {exc}", file=sys.stderr)
        return 2
    clock = Clock.manual_at() if args.clock == "manual" else Clock.real()
    return uvloop.run(_serve(args.host, args.port, config, clock, args.platform))


async def _serve(host: str, port: int, config: SimConfig, clock: Clock, platform: str = "direct") -> int:
    try:
        runner, url = await start_sim(host, port, config, clock, platform)
    except OSError as exc:
        print(f"promptcache simulate: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    kind = "manual" if clock.is_manual else "real"
    print(f"promptcache simulator listening on {url} (clock: {kind})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="promptcache simulate", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
