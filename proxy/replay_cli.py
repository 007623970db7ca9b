"""`promptcache replay TRACE...`: hit ratio and cost of recorded conversations, with and without
promptcache, against the upstream simulator.

    promptcache replay workloads/cc-billing-header.jsonl [--strategy all] [--json]
    promptcache replay suite                      # every workload of the suite
    promptcache replay tool-loop-parallel         # a suite workload by name
    promptcache replay workloads/clients --gap 360  # recorded traces at uniform 6-minute pacing
    promptcache replay workloads/clients --gap 360 --tenant-history  # ... a tenant seen before
    promptcache replay workloads/clients --gap 360 --keep-warm  # ... pinged before expiry

A TRACE is a JSONL file (`proxy/workloads/trace.py`), a directory of them, a workload name of
the suite (`proxy/workloads/suite.py`; workloads too big to commit are generated into
`--cache-dir`), or `suite`. Strategies (`proxy/workloads/strategies.py`): `none` (the client's
bytes), `naive` (a gateway's two 5-minute markers), `promptcache` (through a fresh proxy), or
`all`. The upstream is the in-process simulator on a manual clock that follows the trace's gaps
(`--upstream sim`, default) or a running `promptcache simulate --clock manual` at a URL.

Prints, per trace and strategy and in total: input tokens read / written / neither, hit ratio
(read / all input), input-side cost in USD (`rules/pricing.yaml`), savings against no caching,
the oracle's clairvoyant optimum and minimum cost with the causal bound beside them
(`proxy/workloads/oracle.py`), attainment = read / clairvoyant read, cost / minimum, and the
requests per divergence cause as promptcache measures them (`proxy/workloads/causes.py`:
the proxy's own `promptcache_prefix_divergences_total` for `promptcache`, the same pure core on
the bytes sent for `none` / `naive`). `--json` carries the same, `--per-request` adds each
request's usage and cause.
Progress goes to stderr. Exit status: 0, 1 when the upstream fails, 2 for a bad argument.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import orjson

from proxy.workloads.report import Report, format_text, to_json
from proxy.workloads.strategies import STRATEGIES
from proxy.workloads.suite import BY_NAME, SUITE, load_workload
from proxy.workloads.trace import Trace, TraceError, load_trace, with_gaps


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/promptcache/workloads`, else `~/.cache/promptcache/workloads`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "promptcache" / "workloads"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "traces", nargs="+", metavar="TRACE", help="JSONL file, directory, workload name, or 'suite'"
    )
    parser.add_argument(
        "--upstream", default="sim", help="sim (in-process simulator, default) or a simulator URL"
    )
    parser.add_argument("--strategy", default="all", choices=(*STRATEGIES, "all"), help="default: all")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--per-request", action="store_true", help="also every request's usage and cause")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where generated workloads are kept")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument(
        "--tenant-history",
        action="store_true",
        help="promptcache's proxy first sees each trace as an earlier conversation of the same tenant",
    )
    parser.add_argument(
        "--keep-warm",
        action="store_true",
        help="promptcache runs with keep_warm on; its pings play on the trace clock",
    )
    parser.add_argument(
        "--gap",
        type=float,
        default=None,
        metavar="SECONDS",
        help="replace every gap after the first request with SECONDS (uniform pacing)",
    )


def resolve_traces(items: list[str], cache_dir: Path) -> list[Trace]:
    """Load every named trace (see the module docstring). Raises `TraceError` or `KeyError`."""
    traces: list[Trace] = []
    for item in items:
        path = Path(item)
        if item == "suite":
            traces.extend(load_workload(w.name, cache_dir) for w in SUITE)
        elif path.is_dir():
            traces.extend(load_trace(p) for p in sorted(path.glob("*.jsonl")))
        elif path.exists():
            traces.append(load_trace(path))
        elif item in BY_NAME:
            traces.append(load_workload(item, cache_dir))
        else:
            raise KeyError(
                f"{item}: no such file, directory or workload (known: suite, {', '.join(BY_NAME)})"
            )
    return traces


async def replay(
    traces: list[Trace],
    strategies: list[str],
    upstream: str,
    quiet: bool,
    tenant_history: bool = False,
    keep_warm: bool = False,
) -> Report:
    from proxy.workloads.runner import Progress, replay_traces

    progress = Progress(enabled=not quiet)
    return await replay_traces(traces, strategies, upstream, progress, tenant_history, keep_warm)


def run(args: argparse.Namespace) -> int:
    cache_dir = args.cache_dir or default_cache_dir()
    try:
        traces = resolve_traces(list(args.traces), cache_dir)
    except (TraceError, KeyError, FileNotFoundError) as exc:
        print(f"promptcache replay: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 2
    if getattr(args, "gap", None) is not None:
        if args.gap < 0:
            print("promptcache replay: --gap must be >= 0", file=sys.stderr)
            return 2
        traces = [with_gaps(t, args.gap) for t in traces]
    strategies = list(STRATEGIES) if args.strategy == "all" else [args.strategy]
    upstream = args.upstream
    if upstream != "sim" and not upstream.startswith(("http://", "https://")):
        print("promptcache replay: --upstream must be 'sim' or an http(s):// URL", file=sys.stderr)
        return 2
    try:
        import uvloop

        history = bool(getattr(args, "tenant_history", False))
        warm = bool(getattr(args, "keep_warm", False))
        report = uvloop.run(replay(traces, strategies, upstream, args.quiet, history, warm))
    except (OSError, RuntimeError) as exc:
        print(f"promptcache replay: {exc}", file=sys.stderr)
        return 1
    if args.json:
        sys.stdout.write(
            orjson.dumps(to_json(report, args.per_request), option=orjson.OPT_INDENT_2).decode() + "\n"
        )
    else:
        print(format_text(report, args.per_request))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="promptcache replay", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
