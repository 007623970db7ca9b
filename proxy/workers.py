"""`promptcache serve --workers N`: N worker processes, each with its own event loop, on one port.

Contract:
- The supervisor (this module, no event loop of its own for requests) prepares what the
  workers must agree on before any starts: the tenant secret (`state_dir/secret`, so tenant
  hashes and session ids match across workers), the SQLite file's schema (one writer creates
  it), the listen port (port 0 is resolved once and held by a bound, non-listening
  `SO_REUSEPORT` socket, so every worker binds the same one) and an empty
  `PROMETHEUS_MULTIPROC_DIR` (prometheus-client's multiprocess mode: every worker writes its
  samples to files there and `/metrics` on any worker sums them; `proxy.handlers.metrics_handler`).
- Each worker is `python -m proxy serve ... --worker-index i`: the same settings, a listener
  with `SO_REUSEPORT` (the kernel spreads new connections over the workers), the shared store
  (SQLite in WAL mode, one file, or Redis; `memory://` is refused because workers would not
  share sessions). A session continues on any worker: its id derives from its first boundary
  when the worker's own index does not know it, and its record comes from the shared store.
  Keep-warm pings only from the worker that served a session's last request (the store check
  in `proxy.keepwarm`).
- SIGTERM or SIGINT: each worker gets SIGTERM and shuts down gracefully (in-flight requests
  finish, pending store writes drain); a worker that has not exited after `STOP_TIMEOUT`
  seconds is killed. A worker that exits on its own stops the others: the supervisor exits with
  status 1 (a process manager restarts the whole set).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

import orjson

from proxy.settings import Settings

STOP_TIMEOUT: Final = 30.0
"""Seconds a worker gets to finish in-flight requests after SIGTERM."""
MULTIPROC_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"

# serve's options passed on to every worker as given (argparse dest -> flag)
_PASSED: Final = ("config", "host", "upstream", "mode", "store", "admin_host", "record", "rules_dir", "workers")


def worker_argv(args: argparse.Namespace, port: int, admin_port: int | None, index: int, ready_fd: int) -> list[str]:
    """The command line of worker `index`: serve's own options, the resolved ports, the pipe it
    reports readiness on."""
    argv = [
        sys.executable,
        "-m",
        "proxy",
        "serve",
        "--port",
        str(port),
        "--worker-index",
        str(index),
        "--ready-fd",
        str(ready_fd),
    ]
    for dest in _PASSED:
        value = getattr(args, dest, None)
        if value is not None:
            argv += ["--" + dest.replace("_", "-"), str(value)]
    if admin_port is not None:
        argv += ["--admin-port", str(admin_port)]
    return argv


def report_ready(fd: int, banner: list[str]) -> None:
    """A worker's last start-up step: its banner lines, one JSON line on the supervisor's pipe."""
    with os.fdopen(fd, "wb") as pipe:
        pipe.write(orjson.dumps(banner) + b"\n")


def _read_ready(fd: int, n: int) -> list[list[str]]:
    """Blocking: the banners of up to `n` workers (fewer when the pipe ends: a worker died)."""
    out = []
    with os.fdopen(fd, "rb") as pipe:
        for line in pipe:
            out.append(orjson.loads(line))
            if len(out) == n:
                break
    return out


def _hold_port(host: str, port: int) -> socket.socket:
    """A bound, non-listening `SO_REUSEPORT` socket on `host:port` (port 0: a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _prepare_state(settings: Settings) -> None:
    """Create the tenant secret and the SQLite schema once, before the workers start."""
    from proxy.store import default_store_url, open_store, tighten_state_dir
    from proxy.tenant import load_secret

    url = settings.store or default_store_url(settings.state_dir)
    if url.startswith("sqlite://"):
        tighten_state_dir(Path(settings.state_dir))
        backend = open_store(url)

        async def touch() -> None:
            opener = getattr(backend, "open", None)
            try:
                if opener is not None:
                    await opener()
            finally:
                await backend.close()

        asyncio.run(touch())
    if not settings.secret:
        load_secret("", Path(settings.state_dir))


def check_workers(settings: Settings) -> str | None:
    """Why `settings` cannot run with several workers, or `None`."""
    if settings.workers > 1 and settings.store.startswith("memory://"):
        return "workers > 1 needs a shared store (sqlite:// or redis://), not memory://"
    return None


def supervise(args: argparse.Namespace, settings: Settings) -> int:
    """Run `settings.workers` workers until SIGTERM/SIGINT (module docstring); the exit status."""
    problem = check_workers(settings)
    if problem:
        print(f"promptcache: {problem}", file=sys.stderr)
        return 2
    try:
        held = [_hold_port(settings.host, settings.port)]
        if settings.admin_port is not None:
            from proxy.admin import admin_host

            held.append(_hold_port(admin_host(settings), settings.admin_port))
    except OSError as exc:
        print(f"promptcache: cannot listen on {settings.host}:{settings.port}: {exc.strerror}", file=sys.stderr)
        return 1
    port = held[0].getsockname()[1]
    admin_port = held[1].getsockname()[1] if len(held) > 1 else None
    _prepare_state(settings)
    own_dir = MULTIPROC_ENV not in os.environ
    metrics_dir = Path(os.environ.get(MULTIPROC_ENV) or tempfile.mkdtemp(prefix="promptcache-metrics-"))
    for stale in metrics_dir.glob("*.db"):
        stale.unlink()
    env = {**os.environ, MULTIPROC_ENV: str(metrics_dir)}
    from proxy.admin import UI_TOKEN_ENV, ui_token_for

    env[UI_TOKEN_ENV] = ui_token_for(settings)  # one UI token for the set (proxy.admin)
    try:
        return asyncio.run(_run(args, settings.workers, port, admin_port, env))
    finally:
        for sock in held:
            sock.close()
        if own_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)


async def _run(args: argparse.Namespace, n: int, port: int, admin_port: int | None, env: dict[str, str]) -> int:
    from prometheus_client import multiprocess

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    read_end, write_end = os.pipe()
    try:
        procs = [
            await asyncio.create_subprocess_exec(
                *worker_argv(args, port, admin_port, i, write_end), env=env, pass_fds=(write_end,)
            )
            for i in range(n)
        ]
    finally:
        os.close(write_end)
    ready = loop.run_in_executor(None, _read_ready, read_end, n)
    waits = [asyncio.ensure_future(p.wait()) for p in procs]
    stopping = asyncio.ensure_future(stop.wait())
    pending: list[asyncio.Future[Any]] = [stopping, ready, *waits]
    await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    if ready.done() and len(ready.result()) == n:
        # every worker listens: worker 0's banner once, for the set
        for line in ready.result()[0]:
            print(line, flush=True)
        await asyncio.wait([stopping, *waits], return_when=asyncio.FIRST_COMPLETED)
    status = 0 if stop.is_set() else 1
    if status:
        print("promptcache: a worker exited; stopping the others", file=sys.stderr)
    for proc in procs:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    _, late = await asyncio.wait(waits, timeout=STOP_TIMEOUT)
    for proc in procs:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    if late:
        await asyncio.wait(late)
    stopping.cancel()
    await ready
    for proc in procs:
        multiprocess.mark_process_dead(proc.pid, env[MULTIPROC_ENV])
    return status
