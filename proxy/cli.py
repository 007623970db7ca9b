"""The `promptcache` command: serve, simulate, replay, explain, check-rules.

Each subcommand is a small function returning an exit status; `main()` dispatches. Settings
errors exit 2 with a message naming the setting.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from proxy import __version__
from proxy.settings import Settings, SettingsError, load_settings

if TYPE_CHECKING:
    from proxy.upstreams import ActiveUpstream


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML settings file")
    parser.add_argument("--host", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="listen port (default 8080)")
    parser.add_argument(
        "--upstream",
        help="auto (default: real APIs when reachable, else the built-in simulator), real, sim, or a base URL",
    )
    parser.add_argument("--mode", choices=("optimise", "observe"), help="optimise (default) or observe")
    parser.add_argument("--store", help="memory://, sqlite:///path or redis://host:port/db")
    parser.add_argument("--admin-port", type=int, help="separate listener for /metrics, /debug and /ui")
    parser.add_argument("--admin-host", help="address of the admin listener (default: --host)")
    parser.add_argument("--record", help="append every request body to this JSONL trace (no credentials)")
    parser.add_argument("--rules-dir", help="folder of rule files (default: the packaged rules/)")
    parser.add_argument(
        "--workers", type=int, help="worker processes on one port (SO_REUSEPORT; default 1): proxy/workers.py"
    )
    parser.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)


def _overrides(args: argparse.Namespace) -> dict[str, object]:
    """Settings given on serve's command line (`None`: not given)."""
    return {
        "host": args.host,
        "port": args.port,
        "upstream": args.upstream,
        "mode": args.mode,
        "store": args.store,
        "admin_port": args.admin_port,
        "admin_host": args.admin_host,
        "record": args.record,
        "rules_dir": args.rules_dir,
        "workers": args.workers,
    }


async def _serve_forever(args: argparse.Namespace) -> int:
    from proxy.admin import admin_host
    from proxy.app import start_admin, start_proxy
    from proxy.appkeys import SERVICES

    overrides = _overrides(args)
    from proxy.pricing import PricingError
    from proxy.profiles import ProfileError
    from proxy.rules import RuleError
    from proxy.teams import TeamFileError

    try:
        settings = load_settings(args.config, overrides=overrides)
    except SettingsError as exc:
        print(f"promptcache: {exc}", file=sys.stderr)
        return 2
    worker = args.worker_index
    from proxy.logs import configure_logging

    configure_logging(settings.log_level, settings.log_format)
    from proxy import allocator

    # before start_proxy: the store's threads make their arenas when they first allocate
    allocator.configure(settings.malloc_arena_max, settings.malloc_mmap_threshold)
    try:
        runner, url = await start_proxy(settings, worker=worker or 0, reuse_port=worker is not None)
    except RuleError as exc:
        print(f"promptcache: invalid rules:\n{exc}", file=sys.stderr)
        return 2
    except ProfileError as exc:
        print(f"promptcache: invalid upstream profile:\n{exc}", file=sys.stderr)
        return 2
    except TeamFileError as exc:
        print(f"promptcache: invalid teams_file: {exc}", file=sys.stderr)
        return 2
    except PricingError as exc:
        print(f"promptcache: invalid pricing:\n{exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"promptcache: cannot listen on {settings.host}:{settings.port}: {exc.strerror}", file=sys.stderr)
        return 1
    runners = [runner]
    ui_base = url
    if settings.admin_port is not None:
        try:
            admin, ui_base = await start_admin(
                runner.app, admin_host(settings), settings.admin_port, reuse_port=worker is not None
            )
            runners.append(admin)
        except OSError as exc:
            print(
                f"promptcache: cannot listen on {admin_host(settings)}:{settings.admin_port} (admin_port): "
                f"{exc.strerror}",
                file=sys.stderr,
            )
            for item in reversed(runners):
                await item.cleanup()
            return 1
    _tune_gc()
    services = runner.app[SERVICES]
    lines = banner_lines(settings, url, services.active_upstreams or {}, ui_base, services.ui_token)
    if args.ready_fd is not None:  # a worker under `--workers`: the supervisor prints (proxy.workers)
        from proxy.workers import report_ready

        report_ready(args.ready_fd, lines)
    else:
        for line in lines:
            print(line, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    gate = services.gate
    trimmer = allocator.Trimmer(settings.malloc_trim_interval, lambda: gate.admitted if gate is not None else 0)
    async with trimmer.running():
        await stop.wait()
    from proxy.shutdown import drain

    await drain(runner, settings.shutdown_grace_seconds)
    for item in reversed(runners):
        await item.cleanup()
    return 0


def banner_lines(
    settings: Settings, url: str, active: Mapping[str, ActiveUpstream], ui_base: str = "", ui_token: str = ""
) -> list[str]:
    """What `serve` prints once it listens: the URL clients use, each provider's upstream mode and
    host (a loud line when `upstream: auto` fell back to the simulator), the store and the state
    directory (a store password is never printed), and the forensic map's URL at `ui_base`: with
    the generated `ui_token` in it when no `admin_token` is set (the one place that token is
    ever written, proxy.admin), else naming the setting."""
    from proxy.store import default_store_url
    from proxy.upstreams import redact_url

    lines = [
        f"promptcache {__version__} listening on {url} (mode {settings.mode})",
        f"  Anthropic: ANTHROPIC_BASE_URL={url}    OpenAI: OPENAI_BASE_URL={url}/v1",
    ]
    for name, item in active.items():
        lines.append(f"  upstream {name}: {item.mode} {item.url}")
    if any(item.fallback for item in active.values()):
        lines.append(
            "  WARNING: no real API was reachable at start (upstream: auto): the built-in SIMULATOR "
            "answers every request; set upstream: real in production"
        )
    lines.append(f"  store: {redact_url(settings.store or default_store_url(settings.state_dir))}")
    lines.append(f"  state dir: {Path(settings.state_dir).expanduser().resolve()}")
    if ui_base:
        if settings.admin_token:
            lines.append(f"  forensic map: {ui_base}/ui/ (with admin_token)")
        elif ui_token:
            lines.append(f"  forensic map: {ui_base}/ui/?token={ui_token}")
    if settings.workers > 1:
        lines.append(f"  workers: {settings.workers} processes on one port (SO_REUSEPORT)")
    return lines


def _tune_gc() -> None:
    """Fewer, cheaper cyclic collections for a server that parses large JSON bodies.

    A parsed 600 KB request is ~100k container objects, so the default gen-0 threshold (700)
    triggers collections mid-request and full ones that took up to 22 ms (measured with
    bench/profile_serve.py). Objects alive after start-up are frozen out of collection.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def _run(coro_factory: object) -> int:
    import uvloop

    return int(uvloop.run(coro_factory))  # type: ignore[arg-type]


def cmd_serve(args: argparse.Namespace) -> int:
    if args.worker_index is None:
        try:
            settings = load_settings(args.config, overrides=_overrides(args))
        except SettingsError:
            settings = None  # reported by _serve_forever
        if settings is not None and settings.workers > 1:
            from proxy.workers import supervise

            return supervise(args, settings)
    return _run(_serve_forever(args))


def _check_rules(args: argparse.Namespace) -> int:
    from proxy.rules import check_rules_command

    return int(check_rules_command(args.dir))


# Subcommands implemented by a module exposing `add_arguments(parser)` and `run(args) -> int`.
_MODULE_COMMANDS = (
    ("simulate", "proxy.sim.cli", "run the upstream simulator as its own server"),
    ("replay", "proxy.replay_cli", "replay recorded traces without and with promptcache; print hit ratio and cost"),
    ("explain", "proxy.explain", "show where B's prefix first diverges from A's, and why"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="promptcache", description="Prompt-cache proxy for LLM APIs.")
    parser.add_argument("--version", action="version", version=f"promptcache {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the proxy")
    _serve_arguments(serve)
    serve.set_defaults(func=cmd_serve)
    for name, module_name, help_text in _MODULE_COMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        command = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(command)
        command.set_defaults(func=module.run)
    check = sub.add_parser("check-rules", help="validate rule files; errors name file, key path and line")
    check.add_argument(
        "dir", nargs="?", default=None, help="a folder of rule files (default: the packaged rules/) or one file"
    )
    check.set_defaults(func=_check_rules)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
