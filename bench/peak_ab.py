"""Peak RSS of promptcache variants against each other, in interleaved rounds of the gateway bench's cells.

A variant is a peer of `bench/gateway_bench.py` (`optimise`, `observe`, `optimise-w2`, `bare`,
...) with `PROMPTCACHE_*` (or other) environment variables, one `--variant
NAME=PEER[:VAR=VALUE,...]` each; a variable `ROOT=DIR` runs the peer from another checkout (e.g.
`/work/main`, to compare a branch's code against main's). Each round starts every variant afresh, in order, and runs the
chosen cells (`wrk` and `bench/gateway.lua` as the gateway bench does, default SQLite store);
each cell prints its resident set when it started (what the cells before left), its peak, req/s,
p50 and CPU per request, the session records its store dropped and evicted, with the load
average. The machine's other jobs move the peak by 10-20 MB between runs of the same code, so
compare variants within a round and across rounds, not single figures. Not a test.

    .venv/bin/python bench/peak_ab.py --variant now=optimise \
        --variant gate1m=optimise:PROMPTCACHE_PIPELINE_INFLIGHT_BYTES=1048576 \
        [--variant main=optimise:ROOT=/work/main] [--cells grow32,grow64] [--rounds 3] [--seconds 5] \
        [--upstream-delay 2]

`--upstream-delay S` makes the fake upstream answer S seconds after each body, as a model does:
the requests in flight then wait on the upstream holding what they hold after the request
stages, where with an instant upstream most of them wait for the stages.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gateway_bench as gw  # noqa: E402
from proxy_bench import free_port, scratch_dir, wait_ready  # noqa: E402


def parse_variant(text: str) -> tuple[str, str, dict[str, str]]:
    """`NAME=PEER[:VAR=VALUE,...]` -> (name, peer, environment variables)."""
    name, _, spec = text.partition("=")
    peer, _, variables = spec.partition(":")
    return name, peer, dict(v.split("=", 1) for v in variables.split(",") if v)


def run_variant(
    name: str,
    peer_name: str,
    env: dict[str, str],
    up: str,
    up_pid: int,
    tmp: Path,
    workloads: dict[str, Path],
    cells: list[str],
    seconds: float,
    salt: str,
) -> str:
    """Start one variant, warm it, run `cells`, stop it; its one-line summary."""
    root = Path(env.pop("ROOT", str(gw.ROOT)))
    default_root = gw.ROOT
    gw.ROOT = root
    try:
        peer = gw.start_peer(peer_name, up, Path(tempfile.mkdtemp(dir=tmp)), {**os.environ, **env})
    finally:
        gw.ROOT = default_root
    if peer is None:
        return f"{name}: not available"
    spec = {cell[0]: cell for cell in gw.CELLS}
    parts = []
    try:
        asyncio.run(gw.ready(peer))
        gw.wrk(peer, workloads["small"], "first", 1, 1, f"warm{salt}")
        for key in cells:
            _, workload, mode, conns = spec[key]
            cell = gw.wrk(peer, workloads[workload], mode, conns, seconds, f"{salt}{key}", up_pid)
            parts.append(
                f"{key} {cell['rss']:.0f} MB (from {cell['rss_start']:.0f}), {cell['rps']:.0f} req/s, "
                f"p50 {cell['p50']:.2f} ms, {cell['cpu']:.2f} ms CPU/req, {int(cell['errors'])} errors"
                + "".join(f", {int(cell[f'store {w}'])} {w}" for w in ("dropped", "evicted") if f"store {w}" in cell)
            )
    finally:
        gw.stop_peer(peer)
    return f"{name}: " + "; ".join(parts) + f" | load {gw.loadavg()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", action="append", required=True, help="NAME=PEER[:VAR=VALUE,...], repeated")
    parser.add_argument("--cells", default="grow32,grow64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--upstream-delay", type=float, default=0.0, help="seconds the fake upstream waits")
    args = parser.parse_args()
    variants = [parse_variant(v) for v in args.variant]
    cells = [c for c in args.cells.split(",") if c]
    tmp = scratch_dir("pc-ab-")
    for sub in ("body", "proxy", "fcgi", "uwsgi", "scgi"):
        (tmp / sub).mkdir()
    workloads = gw.write_workloads(tmp)
    up_port = free_port()
    upstream = subprocess.Popen(
        [sys.executable, str(gw.ROOT / "bench" / "fake_upstream.py"), str(up_port), str(args.upstream_delay)]
    )
    up = f"http://127.0.0.1:{up_port}"
    print(f"load average before: {gw.loadavg()}; upstream delay {args.upstream_delay:g} s", flush=True)
    try:
        asyncio.run(wait_ready(up + "/ready"))
        for r in range(args.rounds):
            for name, peer, env in variants:
                line = run_variant(
                    name, peer, dict(env), up, upstream.pid, tmp, workloads, cells, args.seconds, f"r{r}{name}"
                )
                print(f"round {r} {line}", flush=True)
    finally:
        upstream.terminate()
        upstream.wait(timeout=10)
    print(f"load average after: {gw.loadavg()}")


if __name__ == "__main__":
    main()
