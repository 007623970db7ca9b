"""promptcache against other gateways, all in front of the same fast fake upstream, in one run.

Peers: calling the fake upstream directly (the zero line), a bare aiohttp pass-through
(`bench/bare_passthrough.py`), the same with two processes on one port (`bare-w2`, the 64
connection cells only: the machine's ceiling for a second process, shared with wrk and the fake
upstream on the same cores), nginx (`proxy_pass`, one worker process), `promptcache serve`
in observe and optimise mode (default SQLite store in a temp dir), optimise with `--workers 2`,
`transport` (promptcache with its stages switched off, `bench/transport_peer.py`: the cost outside
the stages and the store; not in the default peers), and the LiteLLM proxy when
`scripts/install-bench` put it in `.bench-venv/litellm`. The load generator is `wrk` (C, its
own process; `bench/gateway.lua` builds each body), so no client code runs inside a measured
process.

Workloads (Anthropic Messages):
- 1 KB: every request a new one-turn conversation (distinct bytes), 1 and 32 connections.
- 600 KB growing sessions: a ~540 KB agent history, then each request of a session is the
  previous one plus one assistant tool_use and one user tool_result (~1.6 KB), 40 turns per
  session (~600 KB at the end), then a new session; 1 connection (appended turns) and 32
  sessions on 32 connections.
- 600 KB first request: every request opens a new session with the full ~600 KB body, the
  same history each time under a new first message (a conversation resumed or forked under a new
  session: the proxy has seen its later messages before).
- 600 KB cold first request: the same, but every message of the history carries the request's
  salt, so no message was seen before (a new conversation of the same agent: only the system
  prompt and tools repeat).
- 64 connections (1 KB and 600 KB growing): optimise with 1 worker vs `--workers 2`, and bare
  with 1 process vs 2 (the ceiling).

Prints one table of ratios (added p50 = peer's p50 minus the direct p50 of the same workload;
req/s relative to the bare pass-through), the peak RSS of each peer (largest process of its
tree; the peak is started afresh at each cell, so the per-cell line shows which cell sets it,
beside the resident set the cells before left, which a cell's peak cannot go below) and the load
average before and after (the 2 cores may be shared). For `--workers 2` it also prints the
CPU-bound ceiling: from the one-process cell's CPU per request of the peer and of the rest of
the rig (wrk and the fake upstream, on the same cores), the most one and two processes could
serve (`cpu_ceiling`) and their ratio: what `--workers 2` can reach on this machine at best. For
each promptcache peer it prints what its session store lost during the cells (its `/metrics`:
failed reads, i.e. turns without replay, failed writes, timeouts among them, records dropped
before their write, records evicted by the caps). Not a test.

    scripts/install-bench            # wrk, nginx (apt) and LiteLLM (own venv), once
    .venv/bin/python bench/gateway_bench.py [--seconds 5] [--peers bare,nginx,observe,...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_bench import free_port, scratch_dir, wait_ready  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LUA = ROOT / "bench" / "gateway.lua"
LITELLM = ROOT / ".bench-venv" / "litellm" / "bin" / "litellm"
MODEL = "claude-sonnet-4-6"
MARK = "@@SESSION@@"
TURNS = 40
MASTER_KEY = "sk-bench-master"


def _split(body: dict[str, object]) -> list[bytes]:
    """The serialised body without its closing `]}` (messages come last), cut at each MARK."""
    raw = orjson.dumps(body)
    assert raw.endswith(b"]}"), raw[-10:]
    heads = raw[:-2].split(MARK.encode())
    assert len(heads) >= 2, "no MARK in the body"
    return heads


def _turn(k: int) -> bytes:
    call = f"toolu_g{k:05d}"
    pair = [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": f"Turn {k}: reading the next file."},
                {"type": "tool_use", "id": call, "name": "tool_1", "input": {"path": f"src/mod{k}.py"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call, "content": f"def f{k}(x):\n    return x + {k}\n" * 50},
            ],
        },
    ]
    return b"," + orjson.dumps(pair)[1:-1]


def small_request() -> dict[str, object]:
    """About 1 KB, MARK in its only message."""
    return {
        "model": MODEL,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": f"Request {MARK}. " + "Summarise this paragraph please. " * 28}],
    }


def agent_body() -> dict[str, object]:
    """A ~540 KB agent history ending with a tool_result, MARK in its first message."""
    from bodies import anthropic_body

    agent = anthropic_body(540_000)
    agent["messages"][0] = {"role": "user", "content": f"Start the task ({MARK})."}
    agent["messages"].pop()  # the trailing "Continue.": every turn ends with a tool_result
    return agent


def agent_cold_body() -> dict[str, object]:
    """A ~600 KB agent history (the full length of a grown `agent_body` session) with MARK in
    every message, so that each request's history is new bytes from its first message on."""
    from bodies import anthropic_body

    agent = anthropic_body(600_000)
    for message in agent["messages"]:
        content = message["content"]
        if isinstance(content, str):
            message["content"] = f"({MARK}) {content}"
        else:
            block = content[0]
            key = "text" if block["type"] == "text" else "content"
            block[key] = f"({MARK}) {block[key]}"
    return agent


def write_workloads(tmp: Path) -> dict[str, Path]:
    """Body pieces for gateway.lua: `small` (1 KB, no turns), `agent` (~540 KB + TURNS turns)
    and `agentcold` (~600 KB, the salt in every message, no turns)."""
    out = {}
    for name, body, turns in (
        ("small", small_request(), 0),
        ("agent", agent_body(), TURNS),
        ("agentcold", agent_cold_body(), 0),
    ):
        d = tmp / name
        d.mkdir()
        for i, head in enumerate(_split(body)):
            (d / f"head_{i}").write_bytes(head)
        for k in range(1, turns + 1):
            (d / f"turn_{k}").write_bytes(_turn(k))
        out[name] = d
    return out


@dataclass
class Peer:
    name: str
    url: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    bearer: str | None = None

    def pids(self) -> list[int]:
        pids: list[int] = []
        for proc in self.procs:
            pids.append(proc.pid)
            pids.extend(_descendants(proc.pid))
        return pids


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return out
    for child in map(int, children):
        out.append(child)
        out.extend(_descendants(child))
    return out


def reset_peak_rss(pids: list[int]) -> None:
    """Start the peak resident set (VmHWM) of `pids` afresh from their current RSS (Linux:
    `5` written to `/proc/PID/clear_refs`; without permission the peak stays the lifetime one)."""
    for pid in pids:
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        except OSError:
            continue


def peak_rss_mb(pids: list[int], key: str = "VmHWM") -> float:
    """The largest VmHWM (peak resident set) among `pids`, MB (`key="VmRSS"`: the largest
    resident set now)."""
    best = 0.0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith(key + ":"):
                    best = max(best, int(line.split()[1]) / 1024)
        except OSError:
            continue
    return best


NGINX_CONF = """
worker_processes 1;
user root;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
  client_max_body_size 64m;
  client_body_buffer_size 4m;
  upstream fake {{ server 127.0.0.1:{up}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://fake;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
}}
"""

LITELLM_CONF = """
model_list:
  - model_name: {model}
    litellm_params:
      model: anthropic/{model}
      api_base: http://127.0.0.1:{up}
      api_key: bench-key
general_settings:
  master_key: {key}
"""


def start_peer(name: str, up: str, tmp: Path, env: dict[str, str]) -> Peer | None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    if name.startswith("bare"):
        _, _, count = name.partition("-w")
        cmd = [sys.executable, str(ROOT / "bench" / "bare_passthrough.py"), str(port), up]
        if count:  # several processes on one port, as `serve --workers N`: the machine's ceiling
            return Peer(name, url, [subprocess.Popen([*cmd, "--reuse-port"], **quiet) for _ in range(int(count))])
        return Peer(name, url, [subprocess.Popen(cmd, **quiet)])
    if name == "nginx":
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if not Path(nginx).exists():
            return None
        conf = tmp / f"nginx-{port}.conf"
        conf.write_text(NGINX_CONF.format(tmp=tmp, up=up.rsplit(":", 1)[1], port=port))
        return Peer(name, url, [subprocess.Popen([nginx, "-c", str(conf), "-g", "daemon off;"], **quiet)])
    if name.startswith(("observe", "optimise", "transport")):
        mode, _, workers = name.partition("-w")
        state = tmp / name
        state.mkdir()
        # `transport`: promptcache with its stages switched off (bench/transport_peer.py)
        launch = [str(ROOT / "bench" / "transport_peer.py")] if mode == "transport" else ["-m", "proxy"]
        mode = "observe" if mode == "transport" else mode
        cmd = [
            sys.executable,
            *launch,
            "serve",
            "--port",
            str(port),
            "--upstream",
            up,
            "--mode",
            mode,
            "--store",
            f"sqlite://{state}/sessions.db",
        ]
        if workers:
            cmd += ["--workers", workers]
        peer_env = {**env, "PROMPTCACHE_STATE_DIR": str(state), "PROMPTCACHE_LOG_LEVEL": "WARNING"}
        return Peer(name, url, [subprocess.Popen(cmd, env=peer_env, cwd=ROOT, **quiet)])
    if name == "litellm":
        if not LITELLM.exists():
            return None
        conf = tmp / "litellm.yaml"
        conf.write_text(LITELLM_CONF.format(model=MODEL, up=up.rsplit(":", 1)[1], key=MASTER_KEY))
        lenv = {**env, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MASTER_KEY": MASTER_KEY, "LITELLM_LOG": "ERROR"}
        proc = subprocess.Popen(
            [str(LITELLM), "--config", str(conf), "--port", str(port), "--num_workers", "1"], env=lenv, cwd=tmp, **quiet
        )
        return Peer(name, url, [proc], bearer=MASTER_KEY)
    raise ValueError(name)


async def ready(peer: Peer) -> None:
    """Wait until `peer` answers a 1 KB POST (any status)."""
    import aiohttp

    body = orjson.dumps({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    headers = {"x-api-key": "bench-key", "anthropic-version": "2023-06-01", "content-type": "application/json"}
    if peer.bearer:
        headers["authorization"] = f"Bearer {peer.bearer}"
    async with aiohttp.ClientSession() as http:
        for _ in range(600):
            try:
                async with http.post(peer.url + "/v1/messages", data=body, headers=headers) as r:
                    await r.read()
                    return
            except aiohttp.ClientError:
                await asyncio.sleep(0.1)
    raise RuntimeError(f"{peer.name} did not start")


STORE_LOSSES: Final = (
    ("get errors", "promptcache_session_store_errors_total", {"operation": "get"}),
    ("put errors", "promptcache_session_store_errors_total", {"operation": "put"}),
    ("timeouts", "promptcache_session_store_faults_total", {"kind": "timeout"}),
    ("locked", "promptcache_session_store_faults_total", {"kind": "locked"}),
    ("dropped", "promptcache_session_store_writes_dropped_total", {}),
    ("evicted", "promptcache_session_store_evictions_total", {}),
)
"""What a promptcache peer's `/metrics` says its session store lost: reads and writes that failed
(a failed read is a turn without replay), of them the timeouts and the locked file (another
worker process holding the SQLite file's write lock too long), records dropped before
their write (too many pending), and records evicted to stay within the store's caps (a cell
that writes past the tenant cap makes the writer delete as it writes)."""


def stop_peer(peer: Peer) -> None:
    """Terminate the peer's processes, killing any still running 20 s later."""
    for proc in peer.procs:
        proc.terminate()
    for proc in peer.procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def store_losses(peer: Peer) -> dict[str, float] | None:
    """The `STORE_LOSSES` counters of a promptcache peer now (summed over backends and workers),
    `None` for other peers or when `/metrics` does not answer."""
    if not peer.name.startswith(("observe", "optimise", "transport")):
        return None
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(peer.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    found = dict.fromkeys((label for label, _, _ in STORE_LOSSES), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for label, name, labels in STORE_LOSSES:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    found[label] += sample.value
    return found


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by `pids` (their threads included)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def wrk_command(url: str, workload: Path, mode: str, conns: int, seconds: float, turns: int, salt: str) -> list[str]:
    """The `wrk` command line for one cell: one thread for one connection, else two, each
    running `conns / threads` sessions in round robin on its `conns / threads` connections
    (`gateway.lua`'s SESSIONS is per thread), so a cell of `conns` connections holds `conns`
    sessions at once."""
    threads = 1 if conns == 1 else 2
    return [
        "wrk",
        "-t",
        str(threads),
        "-c",
        str(conns),
        "-d",
        f"{max(1, round(seconds))}s",
        "--timeout",
        "30s",
        "-s",
        str(LUA),
        url,
        "--",
        str(workload),
        mode,
        str(max(1, conns // threads)),
        str(turns),
        salt,
    ]


def wrk(
    peer: Peer, workload: Path, mode: str, conns: int, seconds: float, salt: str, upstream_pid: int = 0
) -> dict[str, float]:
    """One wrk run; returns requests, rps, p50/p99 (ms), errors, the peer's CPU ms per request
    (`cpu`: user + system time of its processes over the run, divided by the requests served;
    less sensitive to other jobs on the cores than latency), the CPU ms per request of the rest
    of the rig (`rig_cpu`: wrk itself and the fake upstream `upstream_pid`, which share the cores
    with the peer), and the peer's resident set when the run started (`rss_start`, MB: what the
    cells before left resident; `rss` is the peak from there)."""
    pids = peer.pids()
    cpu_before = cpu_seconds(pids)
    rig_before = cpu_seconds([upstream_pid]) if upstream_pid else 0.0
    wrk_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    rss_start = peak_rss_mb(pids, "VmRSS")
    reset_peak_rss(pids)
    turns = TURNS if workload.name == "agent" else 0
    cmd = wrk_command(peer.url, workload, mode, conns, seconds, turns, salt)
    if peer.bearer:
        cmd.append(peer.bearer)
    losses_before = store_losses(peer)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("WRKJSON "))
    data = orjson.loads(line.split(" ", 1)[1])
    cpu = cpu_seconds(pids) - cpu_before
    wrk_after = resource.getrusage(resource.RUSAGE_CHILDREN)  # wrk: the one child reaped meanwhile
    rig = wrk_after.ru_utime + wrk_after.ru_stime - wrk_before.ru_utime - wrk_before.ru_stime
    if upstream_pid:
        rig += cpu_seconds([upstream_pid]) - rig_before
    losses_after = store_losses(peer)
    lost = {}
    if losses_before is not None and losses_after is not None:
        lost = {f"store {k}": losses_after[k] - losses_before[k] for k in losses_after}
    return {
        **lost,
        "rss": peak_rss_mb(pids),
        "rss_start": rss_start,
        "cpu": 1000 * cpu / max(1, data["requests"]),
        "rig_cpu": 1000 * rig / max(1, data["requests"]),
        "requests": data["requests"],
        "rps": data["requests"] / (data["duration_us"] / 1e6),
        "p50": data["p50_us"] / 1000,
        "p99": data["p99_us"] / 1000,
        "errors": data["errors"] + data["status"],
    }


CELLS = (
    # key, workload, mode, connections
    ("small1", "small", "first", 1),
    ("small32", "small", "first", 32),
    ("grow1", "agent", "grow", 1),
    ("first1", "agent", "first", 1),
    ("cold1", "agentcold", "first", 1),
    ("grow32", "agent", "grow", 32),
    ("small64", "small", "first", 64),
    ("grow64", "agent", "grow", 64),
)
WIDE_ONLY = {"small64", "grow64"}  # run for bare, bare-w2, optimise and optimise-w2 only
WIDE_PEERS = ("direct", "bare", "bare-w2", "optimise", "optimise-w2")
CEILING_PEERS = ("bare-w2",)  # the 64-connection cells only: two processes against one


def cpu_ceiling(peer_ms: float, rig_ms: float, workers: int, cores: int) -> float:
    """The most requests/s `workers` processes of a peer can serve on `cores` cores shared with
    the rig (wrk and the fake upstream), from CPU ms per request: each process uses at most one
    core (`workers / peer_ms`) and all of them with the rig at most every core
    (`cores / (peer_ms + rig_ms)`). 0 when a figure is missing."""
    if peer_ms <= 0:
        return 0.0
    return 1000 * min(workers / peer_ms, cores / (peer_ms + max(0.0, rig_ms)))


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per cell (default 5)")
    parser.add_argument("--peers", default="bare,bare-w2,nginx,observe,optimise,optimise-w2,litellm")
    parser.add_argument(
        "--cells", default="", help="comma-separated cells to run (default all: " + ",".join(c[0] for c in CELLS) + ")"
    )
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk not found: run scripts/install-bench")
    tmp = scratch_dir("pc-gw-")
    for sub in ("body", "proxy", "fcgi", "uwsgi", "scgi"):
        (tmp / sub).mkdir()
    workloads = write_workloads(tmp)
    env = dict(os.environ)
    up_port = free_port()
    upstream_proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "fake_upstream.py"), str(up_port)])
    up = f"http://127.0.0.1:{up_port}"
    await wait_ready(up + "/ready")
    names = ["direct"] + [p for p in args.peers.split(",") if p]
    results: dict[str, dict[str, dict[str, float]]] = {}
    rss: dict[str, float] = {}
    skipped: list[str] = []
    load_before = loadavg()
    started = time.time()
    try:
        for name in names:
            peer = Peer("direct", up) if name == "direct" else start_peer(name, up, tmp, env)
            if peer is None:
                skipped.append(name)
                continue
            try:
                await ready(peer)
                wrk(peer, workloads["small"], "first", 1, 1, f"warm{name}")
                results[name] = {}
                for key, workload, mode, conns in CELLS:
                    if args.cells and key not in args.cells.split(","):
                        continue
                    if key in WIDE_ONLY and name not in WIDE_PEERS:
                        continue
                    if name in CEILING_PEERS and key not in WIDE_ONLY:
                        continue
                    results[name][key] = wrk(
                        peer, workloads[workload], mode, conns, args.seconds, f"{name}{key}", upstream_proc.pid
                    )
                rss[name] = max((cell["rss"] for cell in results[name].values()), default=0.0)
            finally:
                stop_peer(peer)
    finally:
        upstream_proc.terminate()
        upstream_proc.wait(timeout=10)
    report(results, rss, skipped, load_before, loadavg(), time.time() - started, args.seconds)


def report(
    results: dict[str, dict[str, dict[str, float]]],
    rss: dict[str, float],
    skipped: list[str],
    before: str,
    after: str,
    elapsed: float,
    seconds: float,
) -> None:
    direct = results["direct"]
    peers = [p for p in results if p != "direct"]

    def added(peer: str, key: str) -> float | None:
        cell = results[peer].get(key)
        return None if cell is None else cell["p50"] - direct[key]["p50"]

    def rps(peer: str, key: str) -> float | None:
        cell = results[peer].get(key)
        return None if cell is None else cell["rps"]

    def fmt_added(peer: str, key: str) -> str:
        a, b = added(peer, key), added("bare", key) if "bare" in results else None
        if a is None:
            return "-"
        if b is None or peer == "bare":
            return f"{a:.2f} ms"
        return f"{a:.2f} ms ({a / b:.1f}x)" if b > 0 else f"{a:.2f} ms"

    def fmt_rps(peer: str, key: str) -> str:
        a, b = rps(peer, key), rps("bare", key) if "bare" in results else None
        if a is None:
            return "-"
        return f"{a / b:.2f}" if b else f"{a:.0f}/s"

    def fmt_cpu(peer: str, key: str) -> str:
        cell, base = results[peer].get(key), results.get("bare", {}).get(key)
        if cell is None:
            return "-"
        if base is None or peer == "bare" or not base["cpu"]:
            return f"{cell['cpu']:.2f} ms"
        return f"{cell['cpu']:.2f} ms ({cell['cpu'] / base['cpu']:.1f}x)"

    rows = [
        ("1 KB, 1 connection, added p50 (x bare)", lambda p: fmt_added(p, "small1")),
        ("1 KB, 32 connections, req/s vs bare", lambda p: fmt_rps(p, "small32")),
        ("1 KB, 32 connections, CPU per request (x bare)", lambda p: fmt_cpu(p, "small32")),
        ("600 KB growing session, 1 connection, appended turn, added p50", lambda p: fmt_added(p, "grow1")),
        (
            "600 KB first request of a session (history seen before), 1 connection, added p50",
            lambda p: fmt_added(p, "first1"),
        ),
        ("600 KB cold first request (every message new), 1 connection, added p50", lambda p: fmt_added(p, "cold1")),
        ("600 KB growing, 32 sessions, req/s vs bare", lambda p: fmt_rps(p, "grow32")),
        ("1 KB, 64 connections, req/s vs bare", lambda p: fmt_rps(p, "small64")),
        ("600 KB growing, 64 sessions, req/s vs bare", lambda p: fmt_rps(p, "grow64")),
        ("peak RSS (largest process)", lambda p: f"{rss.get(p, 0):.0f} MB"),
    ]
    print(
        f"\ngateway bench: {seconds:g} s per cell, wrk, fake upstream; load average before {before}, "
        f"after {after}; {elapsed:.0f} s in all"
    )
    print("| workload | " + " | ".join(peers) + " |")
    print("|---|" + "---:|" * len(peers))
    for label, cell in rows:
        print(f"| {label} | " + " | ".join(cell(p) for p in peers) + " |")
    for one_name, two_name, label in (
        ("optimise", "optimise-w2", "--workers 2 vs 1"),
        ("bare", "bare-w2", "ceiling: bare aiohttp, 2 processes (SO_REUSEPORT) vs 1"),
    ):
        if one_name in results and two_name in results:
            for key in ("small64", "grow64"):
                one, two = rps(one_name, key), rps(two_name, key)
                if one and two:
                    print(f"{label}, {key}: {two / one:.2f}x ({two:.0f} vs {one:.0f} req/s)")
                cell, cell_two = results[one_name].get(key), results[two_name].get(key)
                cores = os.cpu_count() or 1
                if one and cell and cell_two:
                    bound_one = cpu_ceiling(cell["cpu"], cell["rig_cpu"], 1, cores)
                    bound_two = cpu_ceiling(cell["cpu"], cell["rig_cpu"], 2, cores)
                    print(
                        f"  CPU bound, {key}: 2 processes at most {bound_two / bound_one:.2f}x 1 "
                        f"({bound_two:.0f} vs {bound_one:.0f} req/s: one core each at most, {cores} cores for "
                        f"{cell['cpu']:.2f} ms {one_name} + {cell['rig_cpu']:.2f} ms wrk and fake upstream per "
                        f"request); 1 process served {one / bound_one:.2f} of its bound; "
                        f"{two_name} used {cell_two['cpu']:.2f} ms per request"
                    )
    print(
        "peak RSS per cell (MB, largest process; each cell's peak counted from its start, "
        "from: the resident set the cells before left): "
        + "; ".join(
            f"{p} " + " ".join(f"{k} {c['rss']:.0f} (from {c['rss_start']:.0f})" for k, c in results[p].items())
            for p in peers
        )
    )
    print("direct (no gateway): " + ", ".join(f"{k} p50 {v['p50']:.2f} ms {v['rps']:.0f}/s" for k, v in direct.items()))
    errors = {p: int(sum(c["errors"] for c in results[p].values())) for p in results}
    print("errors (socket + non-2xx): " + ", ".join(f"{p} {n}" for p, n in errors.items()))
    for p in peers:  # the session store's losses during the cells (the peer's /metrics)
        cells = results[p]
        keys = [f"store {label}" for label, _, _ in STORE_LOSSES]
        if not any(k in c for c in cells.values() for k in keys):
            continue
        total = ", ".join(f"{k[6:]} {sum(c.get(k, 0) for c in cells.values()):.0f}" for k in keys)
        per_cell = "; ".join(
            f"{cell} " + " ".join(f"{k[6:]} {c[k]:.0f}" for k in keys if c.get(k))
            for cell, c in cells.items()
            if any(c.get(k) for k in keys)
        )
        print(f"{p} session store during the run: {total}" + (f" ({per_cell})" if per_cell else ""))
    if skipped:
        print("not run (not installed: scripts/install-bench): " + ", ".join(skipped))


if __name__ == "__main__":
    asyncio.run(main())
