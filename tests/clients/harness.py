"""Plumbing for the real-client suite: servers on a private loop, installs, isolation, replay.

- `Stack`: the upstream simulator (manual clock) and, optionally, a promptcache proxy in front of it,
  served by an event loop on a background thread, so tests stay synchronous and can run client
  processes with `subprocess`. Every port is checked to really answer before a client is pointed at it.
  The proxy also listens on a Unix socket, which `netns_bridge.py` relays into a client's private
  network namespace.
- `ensure_installed`: installs each client from its registry into `<repo>/.clients/` (npm for Claude
  Code and Codex, one venv per Python client), once; later runs reuse it.
- `run_isolated`: runs a client command with no network but the proxy (`unshare -n` + the bridge when
  the kernel allows it, else proxy variables pointing at a closed loopback port).
- `replay`: sends a recorded trace, request by request, straight to a fresh simulator (`none`) or
  through a fresh proxy in front of one (`promptcache`), and reads the usage of every response. This
  replayer is deliberately independent of `proxy/replay_cli.py`, so the suite judges that code too.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import hashlib
import http.client
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import orjson
import yaml

ROOT: Final = Path(__file__).resolve().parents[2]
CLIENTS_DIR: Final = Path(os.environ.get("PROMPTCACHE_CLIENTS_DIR") or ROOT / ".clients")
TRACES_DIR: Final = ROOT / "workloads" / "clients"
DATA_DIR: Final = Path(__file__).resolve().parent / "data"
BRIDGE: Final = Path(__file__).resolve().parent / "netns_bridge.py"

DUMMY_KEY: Final = "sk-promptcache-client-suite-0000"
"""The API key every client sends; the suite asserts it never reaches a trace."""
RESULTS: Final[list[dict[str, str]]] = []
"""Rows of the per-client table (README-ready markdown), printed at the end of the run."""
PIPELINE_PATHS: Final = ("/v1/messages", "/v1/chat/completions", "/v1/responses")
DEAD_PROXY: Final = "http://127.0.0.1:9"
"""Proxy variables point here (discard port, nothing listens): a client that ignores NO_PROXY for a
remote host gets a refused loopback connection instead of reaching the internet."""


# --- servers ---------------------------------------------------------------------------------


@functools.cache
def _sim_config() -> Any:
    from proxy.sim.config import SimConfig

    return SimConfig.load()


@functools.cache
def _token_counter() -> Any:
    from proxy.sim.tokens import TokenCounter, load_o200k

    return TokenCounter(load_o200k())


def wait_http(url: str, path: str, timeout: float = 10.0) -> None:
    """Bounded poll until `url` accepts TCP and answers `GET path` with 200; raises otherwise."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port
    if not port:
        raise AssertionError(f"{url}: no port")
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection(host, port, timeout=2)
            conn.request("GET", path)
            status = conn.getresponse().status
            conn.close()
            if status == 200:
                return
            last = AssertionError(f"GET {path} answered {status}")
        except OSError as exc:
            last = exc
        time.sleep(0.05)  # bounded polling of a port, not synchronisation
    raise AssertionError(f"{url} did not answer GET {path} within {timeout}s: {last}")


@dataclass
class Stack:
    """Simulator (+ proxy) on a background event loop. Use as a context manager."""

    with_proxy: bool = True
    record: Path | None = None
    mode: str = "optimise"
    sim_url: str = ""
    proxy_url: str = ""
    unix_socket: str = ""
    upstream_statuses: list[tuple[str, str, int]] = field(default_factory=list)
    """(method, path, status) of every request the simulator answered."""
    upstream_headers: list[dict[str, str]] = field(default_factory=list)
    """Headers (credentials left out) of every pipeline request the simulator answered, in order."""
    upstream_bodies: list[bytes] = field(default_factory=list)
    """Bodies of those requests, as the simulator received them."""
    clock: Any = None
    registry: Any = None
    """The proxy's Prometheus registry (stage errors, divergences ...)."""
    ui_token: str = ""
    """The token the proxy's `/ui/` pages need (`proxy.admin`: generated at start)."""
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _stop: asyncio.Event | None = None
    _tmp: str = ""

    def __enter__(self) -> Stack:
        ready: Future[None] = Future()
        self._tmp = tempfile.mkdtemp(prefix="pc-stack-")
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="client-suite-stack", daemon=True
        )
        self._thread.start()
        ready.result(timeout=60)
        wait_http(self.sim_url, "/_sim/clock")
        if self.with_proxy:
            wait_http(self.proxy_url, "/healthz")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=60)
        shutil.rmtree(self._tmp, ignore_errors=True)

    def _run(self, ready: Future[None]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(ready))
        except BaseException as exc:  # noqa: BLE001 - surfaced through `ready`
            if not ready.done():
                ready.set_exception(exc)
        finally:
            loop.close()

    async def _main(self, ready: Future[None]) -> None:
        from aiohttp import web
        from prometheus_client import CollectorRegistry

        from proxy.app import start_proxy
        from proxy.appkeys import SERVICES
        from proxy.settings import Settings
        from proxy.sim.app import STATE, create_sim_app
        from proxy.sim.clock import Clock

        self._stop = asyncio.Event()
        self.clock = Clock.manual_at()
        sim_app = create_sim_app(_sim_config(), self.clock)
        sim_app[STATE].counter = _token_counter()
        statuses, seen_headers, seen_bodies = (
            self.upstream_statuses,
            self.upstream_headers,
            self.upstream_bodies,
        )

        @web.middleware
        async def tap(request: web.Request, handler: Any) -> web.StreamResponse:
            body = await request.read() if request.path in PIPELINE_PATHS else b""
            response = await handler(request)
            statuses.append((request.method, request.path, response.status))
            if request.path in PIPELINE_PATHS:
                secret = ("authorization", "x-api-key", "api-key", "cookie")
                seen_headers.append(
                    {k.lower(): v for k, v in request.headers.items() if k.lower() not in secret}
                )
                seen_bodies.append(body)
            return response

        sim_app.middlewares.insert(0, tap)
        runners: list[web.AppRunner] = []
        try:
            sim_runner = web.AppRunner(sim_app, access_log=None)
            await sim_runner.setup()
            runners.append(sim_runner)
            await web.TCPSite(sim_runner, "127.0.0.1", 0).start()
            self.sim_url = f"http://127.0.0.1:{sim_runner.addresses[0][1]}"
            if self.with_proxy:
                settings = Settings(
                    port=0,
                    upstream=self.sim_url,
                    store="memory://",
                    state_dir=Path(self._tmp),
                    secret="client-suite-secret-0123456789abcdef",
                    mode=self.mode,
                    record=self.record,
                    log_level="WARNING",
                )
                self.registry = CollectorRegistry()
                proxy_runner, self.proxy_url = await start_proxy(settings, self.registry)
                self.ui_token = proxy_runner.app[SERVICES].ui_token
                runners.insert(0, proxy_runner)
                self.unix_socket = os.path.join(self._tmp, "proxy.sock")
                await web.UnixSite(proxy_runner, self.unix_socket).start()
            ready.set_result(None)
            await self._stop.wait()
        finally:
            for runner in runners:
                await runner.cleanup()

    def samples(self, prefix: str) -> dict[str, float]:
        """Non-zero samples of the proxy's metrics whose name starts with `prefix`."""
        out: dict[str, float] = {}
        for metric in self.registry.collect() if self.registry is not None else ():
            for sample in metric.samples:
                if sample.name.startswith(prefix) and sample.value and not sample.name.endswith("_created"):
                    labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                    out[f"{sample.name}{{{labels}}}"] = sample.value
        return out

    def pipeline_statuses(self) -> list[int]:
        return [status for _, path, status in self.upstream_statuses if path in PIPELINE_PATHS]


# --- installs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Install:
    """One install unit in `.clients/<name>`: npm packages or one Python venv."""

    name: str
    kind: str  # "npm" or "venv"
    specs: tuple[str, ...]

    @property
    def path(self) -> Path:
        return CLIENTS_DIR / self.name

    @property
    def stamp(self) -> Path:
        digest = hashlib.sha256("\n".join(self.specs).encode()).hexdigest()[:12]
        return self.path / f".installed-{digest}"


INSTALLS: Final = {
    "npm": Install("npm", "npm", ("@anthropic-ai/claude-code@2.1.328", "@openai/codex@0.171.0")),
    # anthropic: Hermes lazy-installs this pin at first use of its Anthropic provider; installing it
    # here keeps runtime installs off (HERMES_DISABLE_LAZY_INSTALLS=1).
    "hermes": Install("hermes", "venv", ("hermes-agent==0.19.0", "anthropic==0.87.0")),
    "aider": Install("aider", "venv", ("aider-chat==0.86.2",)),
}


class InstallError(RuntimeError):
    pass


_install_lock = threading.Lock()
_install_futures: dict[str, Future[Path]] = {}


def _install(unit: Install) -> Path:
    if unit.stamp.exists():
        return unit.path
    CLIENTS_DIR.mkdir(parents=True, exist_ok=True)
    # Another pytest run in the same tree may be installing the same unit: one at a time.
    with (CLIENTS_DIR / f".{unit.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _install_locked(unit)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _install_locked(unit: Install) -> Path:
    if unit.stamp.exists():
        return unit.path
    if unit.path.exists():
        shutil.rmtree(unit.path)
    unit.path.mkdir(parents=True)
    log = unit.path / "install.log"
    if unit.kind == "npm":
        if shutil.which("npm") is None:
            raise InstallError("npm is not on PATH")
        (unit.path / "package.json").write_text('{"private": true}\n')
        commands = [["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", *unit.specs]]
    else:
        python = str(unit.path / "bin" / "python")
        commands = [
            [sys.executable, "-m", "venv", str(unit.path)],
            [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *unit.specs],
        ]
    started = time.monotonic()
    with log.open("wb") as out:
        for command in commands:
            done = subprocess.run(command, cwd=unit.path, stdout=out, stderr=subprocess.STDOUT, timeout=900)
            if done.returncode != 0:
                tail = log.read_text(errors="replace")[-1500:]
                raise InstallError(f"{' '.join(command[:4])} ... failed ({done.returncode}):\n{tail}")
    unit.stamp.write_text(f"installed in {time.monotonic() - started:.1f}s\n")
    return unit.path


def start_installs(names: Iterable[str]) -> None:
    """Start installing `names` concurrently (no-op for those started or done)."""
    with _install_lock:
        for name in names:
            if name in _install_futures:
                continue
            future: Future[Path] = Future()
            _install_futures[name] = future

            def work(unit: Install = INSTALLS[name], fut: Future[Path] = future) -> None:
                try:
                    fut.set_result(_install(unit))
                except BaseException as exc:  # noqa: BLE001 - surfaced to the waiting test
                    fut.set_exception(exc)

            threading.Thread(target=work, name=f"install-{name}", daemon=True).start()


def ensure_installed(name: str) -> Path:
    """The install folder of `name`, installing it first if needed; raises `InstallError`."""
    start_installs([name])
    return _install_futures[name].result(timeout=1200)


# --- running clients with no network but the proxy -----------------------------------------------


@functools.cache
def netns_available() -> bool:
    """True when `unshare -n` works here (root or user namespaces), so clients get a private netns.
    `PROMPTCACHE_CLIENTS_NO_NETNS=1` turns it off (the clients then only get the proxy variables)."""
    if os.environ.get("PROMPTCACHE_CLIENTS_NO_NETNS") or shutil.which("unshare") is None:
        return False
    try:
        done = subprocess.run(
            ["unshare", "-n", sys.executable, str(BRIDGE), "--", "true"], capture_output=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def base_env(home: Path) -> dict[str, str]:
    """A minimal environment: throwaway HOME, no inherited credentials, proxies to a dead port."""
    env = {
        "HOME": str(home),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "TMPDIR": str(home / "tmp"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "HTTP_PROXY": DEAD_PROXY,
        "HTTPS_PROXY": DEAD_PROXY,
        "ALL_PROXY": DEAD_PROXY,
        "http_proxy": DEAD_PROXY,
        "https_proxy": DEAD_PROXY,
        "all_proxy": DEAD_PROXY,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    return env


@dataclass
class Turn:
    """One client process run."""

    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run_isolated(
    stack: Stack,
    argv: Sequence[str],
    env: dict[str, str],
    cwd: Path,
    stdin: str | None = None,
    timeout: float = 180.0,
) -> Turn:
    """Run a client; inside a private network namespace whose only peer is the proxy, when available."""
    command = list(argv)
    if netns_available():
        port = urlsplit(stack.proxy_url).port
        command = [
            "unshare",
            "-n",
            sys.executable,
            str(BRIDGE),
            "--map",
            f"{port}={stack.unix_socket}",
            "--",
            *argv,
        ]
    started = time.monotonic()
    done = subprocess.run(
        command,
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )
    return Turn(list(argv), done.returncode, done.stdout, done.stderr, time.monotonic() - started)


# --- traces ----------------------------------------------------------------------------------


def load_records(path: Path) -> list[dict[str, Any]]:
    """Request records of a JSONL trace (the optional header line skipped)."""
    records = []
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        item = orjson.loads(line)
        if "body" in item:
            records.append(item)
    return records


def write_trace(path: Path, name: str, description: str, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [orjson.dumps({"trace": name, "description": description})]
    lines += [orjson.dumps(record) for record in records]
    path.write_bytes(b"\n".join(lines) + b"\n")


# --- usage and replay ------------------------------------------------------------------------


@dataclass
class Usage:
    read: int = 0
    write_5m: int = 0
    write_1h: int = 0
    uncached: int = 0
    output: int = 0
    seen: bool = False

    @property
    def write(self) -> int:
        return self.write_5m + self.write_1h

    @property
    def total(self) -> int:
        return self.read + self.write + self.uncached


def _sse_events(data: bytes) -> list[tuple[str, Any]]:
    events: list[tuple[str, Any]] = []
    for chunk in data.replace(b"\r\n", b"\n").split(b"\n\n"):
        name, payload = "", []
        for line in chunk.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode()
            elif line.startswith(b"data:"):
                payload.append(line[5:].strip())
        if not payload or payload == [b"[DONE]"]:
            continue
        try:
            value = orjson.loads(b"\n".join(payload))
        except orjson.JSONDecodeError:
            continue
        events.append((name or str(value.get("type", "")), value))
    return events


def _anthropic_usage(raw: dict[str, Any]) -> Usage:
    created = int(raw.get("cache_creation_input_tokens") or 0)
    split = raw.get("cache_creation") if isinstance(raw.get("cache_creation"), dict) else None
    w1h = int(split.get("ephemeral_1h_input_tokens") or 0) if split else 0
    w5m = int(split.get("ephemeral_5m_input_tokens") or 0) if split else created
    return Usage(
        read=int(raw.get("cache_read_input_tokens") or 0),
        write_5m=w5m,
        write_1h=w1h,
        uncached=int(raw.get("input_tokens") or 0),
        output=int(raw.get("output_tokens") or 0),
        seen=True,
    )


def _openai_usage(raw: dict[str, Any]) -> Usage:
    prompt = int(raw.get("prompt_tokens", raw.get("input_tokens")) or 0)
    details = raw.get("prompt_tokens_details") or raw.get("input_tokens_details") or {}
    read = int(details.get("cached_tokens") or 0)
    write = int(details.get("cache_write_tokens") or 0)
    output = int(raw.get("completion_tokens", raw.get("output_tokens")) or 0)
    return Usage(read=read, write_5m=write, uncached=prompt - read - write, output=output, seen=True)


def read_usage(path: str, data: bytes) -> Usage:
    """Input-side usage of one response (JSON or SSE) of `path`."""
    stripped = data.lstrip()
    if stripped.startswith(b"{"):
        body = orjson.loads(stripped)
        raw = body.get("usage") or {}
        return _anthropic_usage(raw) if path == "/v1/messages" else _openai_usage(raw)
    events = _sse_events(data)
    if path == "/v1/messages":
        merged: dict[str, Any] = {}
        for name, value in events:
            if name == "message_start":
                merged.update((value.get("message") or {}).get("usage") or {})
            elif name == "message_delta":
                merged.update(value.get("usage") or {})
        return _anthropic_usage(merged) if merged else Usage()
    last: dict[str, Any] | None = None
    for name, value in events:
        if name == "response.completed":
            last = (value.get("response") or {}).get("usage")
        elif isinstance(value.get("usage"), dict) and "choices" in value:
            last = value["usage"]
    return _openai_usage(last) if last else Usage()


def _headers_for(record: dict[str, Any]) -> dict[str, str]:
    headers = {"content-type": "application/json"}
    if record["path"] == "/v1/messages":
        headers["x-api-key"] = DUMMY_KEY
        headers["anthropic-version"] = "2023-06-01"
    else:
        headers["authorization"] = f"Bearer {DUMMY_KEY}"
    for name, value in (record.get("headers") or {}).items():
        if name.lower() not in ("authorization", "x-api-key", "api-key", "cookie"):
            headers[name] = value
    return headers


def post(base_url: str, path: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=60)
    try:
        conn.request("POST", path, body=orjson.dumps(body), headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@dataclass
class Replay:
    strategy: str
    usages: list[Usage]
    models: list[str]
    paths: list[str]

    def later(self) -> list[Usage]:
        return self.usages[1:]

    def hit_ratio_after_first(self) -> float:
        total = sum(u.total for u in self.later())
        return sum(u.read for u in self.later()) / total if total else 0.0

    def cost(self, pricing: Pricing) -> float:
        return sum(
            pricing.cost(path, model, usage)
            for path, model, usage in zip(self.paths, self.models, self.usages, strict=True)
        )


def replay(records: list[dict[str, Any]], strategy: str) -> Replay:
    """Send `records` in order to a fresh simulator, straight (`none`) or through a fresh proxy."""
    if strategy not in ("none", "promptcache"):
        raise ValueError(strategy)
    usages: list[Usage] = []
    with Stack(with_proxy=strategy == "promptcache") as stack:
        base = stack.proxy_url if strategy == "promptcache" else stack.sim_url
        for index, record in enumerate(records):
            if index and record.get("gap"):
                stack.clock.advance(float(record["gap"]))
            status, data = post(base, record["path"], record["body"], _headers_for(record))
            if status != 200:
                raise AssertionError(
                    f"replay {strategy}: request {index} ({record['path']}) answered {status}: {data[:400]!r}"
                )
            usage = read_usage(record["path"], data)
            if not usage.seen:
                raise AssertionError(f"replay {strategy}: request {index}: no usage in the response")
            usages.append(usage)
    models = [str(r["body"].get("model", "")) for r in records]
    return Replay(strategy, usages, models, [r["path"] for r in records])


KNOWN_REGRESSIONS: Final[dict[str, str]] = {}
"""Traces whose no-regression checks fail because of a reported pipeline finding (xfail, not strict)."""


def dropped_content(straight: Replay, through: Replay) -> list[str]:
    """Requests whose prompt, as the simulator counts it, differs through promptcache by more than
    1% (32 tokens at least): reordering and markers move text, they never add or remove any."""
    out = []
    for index, (a, b) in enumerate(zip(straight.usages, through.usages, strict=True)):
        if abs(a.total - b.total) > max(32, a.total // 100):
            out.append(f"request {index}: {a.total} input tokens straight, {b.total} through promptcache")
    return out


PER_TURN_CLIENTS: Final = frozenset({"claude-code"})
"""Clients checked turn by turn (`costlier_turns`): promptcache must never read less nor write
more on any request than the client gets on its own (issue 12: Claude Code's billing header
stays where the client put it)."""


def costlier_turns(straight: Replay, through: Replay) -> list[str]:
    """Requests that read fewer tokens or write more through promptcache than straight."""
    out = []
    for index, (a, b) in enumerate(zip(straight.usages, through.usages, strict=True)):
        if b.read < a.read or b.write > a.write:
            out.append(f"request {index}: read/write {a.read}/{a.write} straight, {b.read}/{b.write} through")
    return out


TARGET: Final = 0.987
"""Share of input tokens after the first request to read from cache, where the optimum allows it."""


def optimum_after_first(records: list[dict[str, Any]], name: str) -> float | None:
    """The oracle's best possible hit ratio after the first request (`proxy.workloads.oracle`), or
    None when that module is not available."""
    try:
        from proxy.workloads.oracle import optimum
        from proxy.workloads.trace import loads_trace
    except ImportError:
        return None
    data = b"\n".join(orjson.dumps(r) for r in records) + b"\n"
    bounds = optimum(loads_trace(data, name), _sim_config(), _token_counter()).requests[1:]
    total = sum(b.total for b in bounds)
    return sum(b.read for b in bounds) / total if total else None


def result_row(
    trace: str, records: list[dict[str, Any]], straight: Replay, through: Replay, optimum: float | None
) -> dict[str, str]:
    pricing = Pricing.load()
    return {
        "trace": trace,
        "API": ", ".join(sorted({r["path"] for r in records})),
        "requests": str(len(records)),
        "hit ratio after 1st, straight": fmt_ratio(straight.hit_ratio_after_first()),
        "hit ratio after 1st, promptcache": fmt_ratio(through.hit_ratio_after_first()),
        "optimum after 1st": "n/a" if optimum is None else fmt_ratio(optimum),
        "input cost straight": f"${straight.cost(pricing):.4f}",
        "input cost promptcache": f"${through.cost(pricing):.4f}",
    }


# --- cost ------------------------------------------------------------------------------------


@dataclass
class Pricing:
    """List prices from `rules/pricing.yaml` (USD per million tokens), longest-prefix match."""

    families: list[tuple[str, tuple[str, ...], dict[str, float]]]
    other: dict[str, dict[str, float]]

    @classmethod
    def load(cls, path: Path = ROOT / "rules" / "pricing.yaml") -> Pricing:
        raw = yaml.safe_load(path.read_text())
        families = [
            (
                str(item["provider"]),
                tuple(item["prefixes"]),
                {k: float(v) for k, v in item.items() if isinstance(v, (int, float))},
            )
            for item in (raw.get("families") or {}).values()
        ]
        other = {
            p: {k: float(v) for k, v in row.items() if isinstance(v, (int, float))}
            for p, row in (raw.get("other") or {}).items()
        }
        return cls(families, other)

    def prices(self, path: str, model: str) -> dict[str, float]:
        provider = "anthropic" if path == "/v1/messages" else "openai"
        best: dict[str, float] | None = None
        best_len = -1
        for fam_provider, prefixes, prices in self.families:
            if fam_provider != provider:
                continue
            for prefix in prefixes:
                matches = model == prefix or (
                    model.startswith(prefix)
                    and not model[len(prefix)].isalnum()
                    and model[len(prefix)] != "."
                )
                if matches and len(prefix) > best_len:
                    best, best_len = prices, len(prefix)
        return best if best is not None else self.other.get(provider, {})

    def cost(self, path: str, model: str, usage: Usage) -> float:
        p = self.prices(path, model)
        base = p.get("input", 0.0)
        return (
            usage.uncached * base
            + usage.read * p.get("cache_read", base)
            + usage.write_5m * p.get("cache_write_5m", base)
            + usage.write_1h * p.get("cache_write_1h", base)
        ) / 1e6


# --- conversation views (provider-neutral) -----------------------------------------------------


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict):
                for key in ("text", "output", "content"):
                    if key in part:
                        out.extend(_texts(part[key]))
            elif isinstance(part, str):
                out.append(part)
    return out


def conversation_text(body: dict[str, Any]) -> str:
    """All message text of a request (Anthropic, Chat or Responses), in order."""
    items = body.get("messages") if "messages" in body else body.get("input")
    if isinstance(items, str):
        return items
    parts: list[str] = []
    for item in items or []:
        if not isinstance(item, dict):
            continue
        parts.extend(_texts(item.get("content")))
        if "output" in item:
            parts.extend(_texts(item["output"]))
    return "\n".join(parts)


@dataclass
class ToolExchange:
    call_id: str
    name: str
    arguments: str
    result: str


def tool_exchanges(body: dict[str, Any]) -> list[ToolExchange]:
    """Tool calls in a request's history matched with their results, for all three APIs."""
    calls: dict[str, tuple[str, str]] = {}
    results: dict[str, str] = {}
    items = body.get("messages") if "messages" in body else body.get("input")
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        content = item.get("content")
        for block in content if isinstance(content, list) else []:  # Anthropic
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use":
                calls[str(block.get("id"))] = (
                    str(block.get("name")),
                    orjson.dumps(block.get("input")).decode(),
                )
            elif block.get("type") == "tool_result":
                results[str(block.get("tool_use_id"))] = "\n".join(_texts(block.get("content")))
        for call in item.get("tool_calls") or []:  # Chat
            fn = call.get("function") or {}
            calls[str(call.get("id"))] = (str(fn.get("name")), str(fn.get("arguments")))
        if item.get("role") == "tool":
            results[str(item.get("tool_call_id"))] = "\n".join(_texts(content))
        if item.get("type") in ("function_call", "custom_tool_call"):  # Responses
            calls[str(item.get("call_id"))] = (
                str(item.get("name")),
                str(item.get("arguments") or item.get("input")),
            )
        elif item.get("type") in ("function_call_output", "custom_tool_call_output"):
            results[str(item.get("call_id"))] = "\n".join(_texts(item.get("output")))
    return [
        ToolExchange(cid, name, args, results[cid]) for cid, (name, args) in calls.items() if cid in results
    ]


def fmt_ratio(value: float) -> str:
    return f"{100 * value:.1f}%"


def table(rows: list[dict[str, str]], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(row.get(c, "") for c in columns) + " |" for row in rows]
    return "\n".join(lines)
