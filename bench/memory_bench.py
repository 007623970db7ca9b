"""Where `promptcache serve`'s resident memory goes under the gateway bench's 600 KB load.

Runs the proxy in this process (uvloop, default SQLite store in a temp dir) in front of
`bench/fake_upstream.py`, drives it with `wrk` and `bench/gateway.lua` exactly as
`bench/gateway_bench.py` does (the 600 KB first request at 1 connection, growing 600 KB sessions
at 32 and 64 connections), and prints the process's RSS after start and after each phase, with
its peak (VmHWM). With `--trace N` it runs `tracemalloc` (N frames) and, at the highest traced
memory seen (sampled every 50 ms), prints the top allocation sites: what the Python heap holds at
peak, per cause, and the exact highest traced memory of each phase. Each phase also prints
glibc's arenas one by one (the event loop's main heap and the threads'), and the most the
request path held back in it (records waiting for their background write, requests inside and
waiting at the admission gate: `Backlog`). Tracing slows the proxy
(fewer requests in flight), so its peak is lower than an untraced run's; read the sites, not the
total. Not a test.

    .venv/bin/python bench/memory_bench.py [--seconds 5] [--mode optimise] [--trace 6] [--top 30] \
        [--upstream-delay 2]

`--upstream-delay S`: the fake upstream answers S seconds after each body (a model's wait), so
the requests in flight wait on the upstream, not for the request stages.

The allocator settings are `serve`'s (`malloc_*`, `proxy.allocator`), from `PROMPTCACHE_*`
variables as `serve` reads them (e.g. `PROMPTCACHE_MALLOC_TRIM_INTERVAL=0` to compare).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_bench import TURNS, write_workloads, wrk_command  # noqa: E402
from proxy_bench import free_port, scratch_dir, wait_ready  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

PHASES = (
    # name, workload, wrk mode, connections
    ("first1", "agent", "first", 1),
    ("grow32", "agent", "grow", 32),
    ("grow64", "agent", "grow", 64),
)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"
    )]


def malloc_mb() -> str:
    """glibc's heap: bytes in use, free inside the heap (held, not returned), mmapped chunks."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return "malloc stats unavailable"
    return (
        f"malloc in use {info.uordblks / 1e6:.0f} MB, free in heap {info.fordblks / 1e6:.0f} MB, "
        f"mmapped {info.hblkhd / 1e6:.0f} MB"
    )


def arenas_mb() -> str:
    """glibc's arenas one by one (`malloc_info`): the main arena (the `brk` heap, the event loop's
    thread) and one per other thread that allocated (the SQLite thread, executors): bytes taken
    from the system and free inside."""
    import re

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.open_memstream.restype = ctypes.c_void_p
        buf, size = ctypes.c_char_p(), ctypes.c_size_t()
        stream = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
        libc.malloc_info(0, ctypes.c_void_p(stream))
        libc.fclose(ctypes.c_void_p(stream))
        text = ctypes.string_at(buf, size.value).decode()
        libc.free(buf)
    except (OSError, AttributeError):
        return "arenas unavailable"
    out = []
    for match in re.finditer(r'<heap nr="(\d+)">(.*?)</heap>', text, re.S):
        body = match.group(2)
        free = sum(int(x) for x in re.findall(r'<total type="(?:fast|rest)" count="\d+" size="(\d+)"/>', body))
        current = re.search(r'<system type="current" size="(\d+)"/>', body)
        held = int(current.group(1)) if current else 0
        out.append(f"{match.group(1)}: {held / 1e6:.0f}/{free / 1e6:.0f}")
    return "arenas (MB taken/free) " + " ".join(out)


def pymalloc_mb() -> str:
    """CPython's small-object allocator: arenas held (1 MiB each) and the bytes of live objects
    in them (`sys._debugmallocstats`, read through a temporary file on fd 2)."""
    import re

    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    arenas = re.search(r"# arenas allocated current\s*=\s*([\d,]+)", text)
    live = re.search(r"# bytes in allocated blocks\s*=\s*([\d,]+)", text)
    if arenas is None or live is None:
        return "pymalloc stats unavailable"
    n = int(arenas.group(1).replace(",", ""))
    return f"pymalloc {n} MiB of arenas, {int(live.group(1).replace(',', '')) / 1e6:.0f} MB live"


def status_mb(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


async def run_wrk(url: str, workload: Path, mode: str, conns: int, seconds: float, salt: str) -> str:
    turns = TURNS if workload.name == "agent" else 0
    cmd = wrk_command(url, workload, mode, conns, seconds, turns, salt)
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out, _ = await proc.communicate()
    line = next((x for x in out.decode().splitlines() if x.startswith("WRKJSON ")), "WRKJSON {}")
    return line.split(" ", 1)[1]


class Backlog:
    """The most the request path held back during a phase, sampled every 50 ms: records waiting
    for their background write (`RecordStore.pending_writes` / `pending_bytes`, each counted as what
    it holds, `proxy.store._held`, bounded by `proxy.store.MAX_PENDING_BYTES`), and requests inside the
    admission gate and waiting at it (`proxy.admission.BodyGate`, their raw bytes held). At the
    highest RSS sampled it also notes what those held then: the raw bytes inside the gate and
    waiting at it (`BodyGate.held`, `waiting_bytes`), and the pending records' sidecar values
    as counted per record and as distinct objects (`RecordStore.pending_value_bytes`: records of
    sessions re-sending one conversation share them, so the count overstates their memory)."""

    def __init__(self, services: object) -> None:
        self.services = services
        self.reset()

    def reset(self) -> None:
        self.records = self.record_bytes = self.inside = self.waiting = 0
        self.rss = 0.0
        self.heap = ""
        self.held_then = ""

    def _heap_at_rss_peak(self) -> None:
        """The heap's make-up (`malloc_mb`, `pymalloc_mb`) at the highest RSS sampled: whether
        the peak is live memory or free memory glibc kept."""
        rss = status_mb("VmRSS")
        if rss > self.rss:
            self.rss = rss
            self.heap = f"{malloc_mb()}; {pymalloc_mb()}"
            self.held_then = self._held_now()

    def _held_now(self) -> str:
        """What the gate's requests and the pending records hold at this moment (class docstring)."""
        parts = []
        gate = getattr(self.services, "gate", None)
        if gate is not None:
            parts.append(
                f"raw bodies {gate.held / 1e6:.1f} MB inside the gate ({gate.inside}), "
                f"{gate.waiting_bytes / 1e6:.1f} MB waiting at it ({gate.waiting})"
            )
        store = getattr(self.services, "store", None)
        if store is not None:
            counted, distinct = store.pending_value_bytes()
            parts.append(
                f"{store.pending_writes} pending records ({store.pending_bytes / 1e6:.1f} MB counted), "
                f"their sidecar values {counted / 1e6:.1f} MB counted per record, {distinct / 1e6:.1f} MB distinct"
            )
        return "; ".join(parts)

    def sample(self) -> None:
        store = getattr(self.services, "store", None)
        if store is not None:
            self.records = max(self.records, store.pending_writes)
            self.record_bytes = max(self.record_bytes, store.pending_bytes)
        gate = getattr(self.services, "gate", None)
        if gate is not None:
            self.inside = max(self.inside, gate.inside)
            self.waiting = max(self.waiting, gate.waiting)
        self._heap_at_rss_peak()

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            self.sample()

    def line(self) -> str:
        return (
            f"most held back: {self.records} records waiting for their write ({self.record_bytes / 1e6:.0f} MB "
            f"counted), {self.inside} requests inside the admission gate, {self.waiting} waiting at it; "
            f"at the highest RSS sampled ({self.rss:.0f} MB): {self.heap}; then held: {self.held_then}"
        )


class Peak:
    """The snapshot at the highest traced memory seen (sampled)."""

    def __init__(self, frames: int) -> None:
        self.frames = frames
        self.best = 0
        self.snapshot: tracemalloc.Snapshot | None = None
        self.rss_at_best = 0.0
        self.where = ""

    async def watch(self, phase: list[str]) -> None:
        while True:
            await asyncio.sleep(0.05)
            if not self.frames:
                continue
            current, _ = tracemalloc.get_traced_memory()
            if current > self.best * 1.05 + 2_000_000:
                self.best = current
                self.rss_at_best = status_mb("VmRSS")
                self.where = phase[0]
                self.snapshot = tracemalloc.take_snapshot()


def print_sites(snapshot: tracemalloc.Snapshot, top: int) -> None:
    stats = snapshot.statistics("traceback")
    total = sum(s.size for s in stats)
    print(f"traced at peak: {total / 1e6:.1f} MB in {sum(s.count for s in stats)} blocks; top sites:")
    for stat in stats[:top]:
        frames = [f for f in stat.traceback if "/proxy/" in f.filename or "/bench/" in f.filename]
        shown = frames[-3:] if frames else list(stat.traceback)[-2:]
        where = " <- ".join(f"{'/'.join(f.filename.split('/')[-2:])}:{f.lineno}" for f in reversed(shown))
        print(f"  {stat.size / 1e6:7.2f} MB {stat.count:7d}  {where}")
    by_file: dict[str, int] = {}
    for stat in snapshot.statistics("filename"):
        name = stat.traceback[0].filename
        key = name.split("/proxy/", 1)[1] if "/proxy/" in name else name.rsplit("/", 1)[-1]
        by_file[key] = by_file.get(key, 0) + stat.size
    print("by file of the innermost frame:")
    for key, size in sorted(by_file.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {size / 1e6:7.2f} MB  {key}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--mode", default="optimise")
    parser.add_argument("--trace", type=int, default=0, help="tracemalloc frames (0: off)")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--phases", default=",".join(p[0] for p in PHASES))
    parser.add_argument(
        "--upstream-delay", type=float, default=0.0, help="seconds the fake upstream waits before each answer"
    )
    args = parser.parse_args()
    print(f"load average before: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    print(f"interpreter + bench imports: RSS {status_mb('VmRSS'):.0f} MB")
    if args.trace:
        tracemalloc.start(args.trace)
    from proxy.app import start_proxy
    from proxy.settings import load_settings

    tmp = scratch_dir("pc-mem-")
    workloads = write_workloads(tmp)
    up_port = free_port()
    fake = [sys.executable, str(ROOT / "bench" / "fake_upstream.py"), str(up_port), str(args.upstream_delay)]
    upstream = subprocess.Popen(fake)
    up = f"http://127.0.0.1:{up_port}"
    await wait_ready(up + "/ready")
    os.environ["PROMPTCACHE_STATE_DIR"] = str(tmp)
    settings = load_settings(
        overrides={"port": 0, "upstream": up, "mode": args.mode, "store": f"sqlite://{tmp}/sessions.db"}
    )
    from proxy import allocator
    from proxy.appkeys import SERVICES

    applied = allocator.configure(settings.malloc_arena_max, settings.malloc_mmap_threshold)
    runner, url = await start_proxy(settings)
    gate = runner.app[SERVICES].gate
    trimmer = allocator.Trimmer(settings.malloc_trim_interval, lambda: gate.admitted if gate is not None else 0)
    trim_every = settings.malloc_trim_interval
    print(f"allocator (as serve sets it): {applied or 'glibc defaults'}, trim every {trim_every:g} s")
    print(f"started: RSS {status_mb('VmRSS'):.0f} MB; {malloc_mb()}; {pymalloc_mb()}; {arenas_mb()}")
    phase = ["start"]
    peak = Peak(args.trace)
    watcher = asyncio.ensure_future(peak.watch(phase))
    backlog = Backlog(runner.app[SERVICES])
    backlog_watcher = asyncio.ensure_future(backlog.watch())
    trimming = trimmer.running()
    await trimming.__aenter__()
    try:
        for name, workload, mode, conns in PHASES:
            if name not in args.phases.split(","):
                continue
            phase[0] = name
            if args.trace:
                tracemalloc.reset_peak()
            backlog.reset()
            started = time.perf_counter()
            result = await run_wrk(url, workloads[workload], mode, conns, args.seconds, f"mem{name}")
            print(
                f"after {name} ({time.perf_counter() - started:.1f} s): RSS {status_mb('VmRSS'):.0f} MB, "
                f"peak {status_mb('VmHWM'):.0f} MB; {malloc_mb()}; {pymalloc_mb()}; {arenas_mb()}; wrk {result}"
            )
            print(f"  {backlog.line()}")
            if args.trace:
                now, top = tracemalloc.get_traced_memory()
                print(f"  traced Python memory: now {now / 1e6:.0f} MB, highest in the phase {top / 1e6:.0f} MB")
        trimmed = time.perf_counter()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        print(
            f"after malloc_trim(0) ({1000 * (time.perf_counter() - trimmed):.1f} ms): "
            f"RSS {status_mb('VmRSS'):.0f} MB; {malloc_mb()}"
        )
        if args.trace:
            import gc

            gc.collect()
            print("held after the phases (caches, before shutdown):")
            print_sites(tracemalloc.take_snapshot(), args.top)
    finally:
        await trimming.__aexit__(None, None, None)
        print(f"trims: {trimmer.trims}, {trimmer.released / 1e6:.0f} MB of RSS given back")
        watcher.cancel()
        backlog_watcher.cancel()
        await runner.cleanup()
        upstream.terminate()
        upstream.wait(timeout=10)
    print(f"after cleanup: RSS {status_mb('VmRSS'):.0f} MB, peak {status_mb('VmHWM'):.0f} MB; {malloc_mb()}")
    print(f"load average after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    if peak.snapshot is not None:
        print(f"tracemalloc peak in phase {peak.where}, RSS then {peak.rss_at_best:.0f} MB")
        print_sites(peak.snapshot, args.top)


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
