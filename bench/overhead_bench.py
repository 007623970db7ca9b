"""Overhead of `promptcache serve` against peers, all in front of the same fast fake upstream.

Columns: direct (no proxy), nginx (Debian package, if installed), a bare aiohttp pass-through
(bench/bare_passthrough.py), promptcache in `observe` mode and in `optimise` mode (full
pipeline). Rows: bodies of ~1 KB and ~600 KB, concurrency 1, 16 and 64. Printed: p50 and p99
latency added over direct (ms), requests per second, and promptcache's requests per second as
a ratio of the bare pass-through's; then promptcache's peak RSS (VmHWM). One run, one machine:
compare ratios. Not a test.

    python bench/overhead_bench.py [--requests 600] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bodies import anthropic_body, small_body  # noqa: E402
from proxy_bench import free_port, pct, run_load, wait_ready  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

NGINX_CONF = """
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fcgi; uwsgi_temp_path {dir}/uwsgi; scgi_temp_path {dir}/scgi;
  client_max_body_size 64m; client_body_buffer_size 1m;
  upstream up {{ server 127.0.0.1:{up}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off; proxy_request_buffering on;
    }}
  }}
}}
"""


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--quick", action="store_true", help="fewer requests, for a smoke run")
    parser.add_argument("--store", default=None,
                        help="session store URL (default: SQLite in a temp dir, as users run it)")
    args = parser.parse_args()
    n_small = 150 if args.quick else args.requests
    tmp = Path(tempfile.mkdtemp(prefix="pc-bench-"))
    ports = {name: free_port() for name in ("up", "bare", "nginx", "observe", "optimise")}
    up_url = f"http://127.0.0.1:{ports['up']}"
    env = {**os.environ, "PROMPTCACHE_LOG_LEVEL": "WARNING"}
    procs: dict[str, subprocess.Popen[bytes]] = {
        "up": subprocess.Popen([sys.executable, str(ROOT / "bench/fake_upstream.py"), str(ports["up"])]),
        "bare": subprocess.Popen(
            [sys.executable, str(ROOT / "bench/bare_passthrough.py"), str(ports["bare"]), up_url]
        ),
    }
    for mode in ("observe", "optimise"):
        procs[mode] = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--port", str(ports[mode]), "--upstream", up_url,
             "--store", args.store or f"sqlite://{tmp}/{mode}.db", "--mode", mode],
            env=env, stdout=subprocess.DEVNULL,
        )
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if nginx:
        conf = tmp / "nginx.conf"
        conf.write_text(NGINX_CONF.format(dir=tmp, up=ports["up"], port=ports["nginx"]))
        procs["nginx"] = subprocess.Popen([nginx, "-c", str(conf), "-g", "daemon off;"],
                                          stderr=subprocess.DEVNULL)
    targets = {"direct": up_url, "bare": f"http://127.0.0.1:{ports['bare']}",
               "observe": f"http://127.0.0.1:{ports['observe']}",
               "optimise": f"http://127.0.0.1:{ports['optimise']}"}
    if nginx:
        targets["nginx"] = f"http://127.0.0.1:{ports['nginx']}"
    try:
        for name, url in targets.items():
            await wait_ready(url + ("/healthz" if name in ("observe", "optimise") else "/ready"))
        bodies = {"1KB": orjson.dumps(small_body()), "600KB": orjson.dumps(anthropic_body(600_000))}
        columns = [c for c in ("nginx", "bare", "observe", "optimise") if c in targets]
        print(f"added latency over direct (ms, p50/p99) and requests/s; {time.strftime('%Y-%m-%d')}, "
              f"{os.cpu_count()} cores")
        header = f"{'body':>5} {'conc':>4} | {'direct rps':>10} | " + " | ".join(
            f"{c + ' p50/p99/rps':>24}" for c in columns) + " | optimise rps / bare"
        print(header)
        for body_name, body in bodies.items():
            for concurrency in (1, 16, 64):
                total = n_small if body_name == "1KB" else max(n_small // 6, 40)
                d_lat, d_rps = await run_load(targets["direct"] + "/v1/messages", body, concurrency, total)
                d50, d99 = pct(d_lat, 0.5), pct(d_lat, 0.99)
                cells, rps = [], {}
                for column in columns:
                    lat, r = await run_load(targets[column] + "/v1/messages", body, concurrency, total)
                    rps[column] = r
                    cells.append(f"{pct(lat, 0.5) - d50:7.2f}/{pct(lat, 0.99) - d99:7.2f}/{r:7.0f}")
                ratio = rps["optimise"] / rps["bare"]
                print(f"{body_name:>5} {concurrency:>4} | {d_rps:10.0f} | " + " | ".join(f"{c:>24}" for c in cells)
                      + f" | {ratio:.2f}")
        print(f"peak RSS (VmHWM): optimise {peak_rss_mb(procs['optimise'].pid):.0f} MB, "
              f"observe {peak_rss_mb(procs['observe'].pid):.0f} MB, bare {peak_rss_mb(procs['bare'].pid):.0f} MB")
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
