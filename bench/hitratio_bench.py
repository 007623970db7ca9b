"""Hit ratio of none vs naive vs promptcache over the whole workload suite, and attainment.

Replays every workload of `proxy/workloads/suite.py` against the in-process simulator under the
three strategies (`promptcache replay suite`), then prints one row per workload: requests, hit
ratio (read / all input tokens) per strategy, the oracle's optimum, promptcache's attainment
(read tokens / optimum read tokens) and its input-cost saving against `none`. Workloads below
the target attainment (default 0.99) are listed with the gap in tokens and the requests that
lose most, for the pipeline's authors. Deterministic: same code, same numbers. Not a test.

    python bench/hitratio_bench.py [--markdown] [--target 0.99] [--check] [--cache-dir DIR]

`--markdown` prints a README-ready table; `--check` exits 1 when a workload misses the target.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import uvloop

from proxy.replay_cli import default_cache_dir, resolve_traces
from proxy.workloads.report import Report, TraceResult
from proxy.workloads.runner import Progress, replay_traces
from proxy.workloads.strategies import STRATEGIES

PC = "promptcache"


def _saving(trace: TraceResult) -> float:
    none, pc = trace.tallies["none"].cost, trace.tallies[PC].cost
    return (none - pc) / none if none else 0.0


def rows(report: Report) -> list[list[str]]:
    out = []
    for t in report.traces:
        out.append(
            [t.name, str(t.requests)]
            + [f"{t.tallies[s].hit_ratio:.1%}" for s in STRATEGIES]
            + [f"{t.optimum_share:.1%}", f"{t.attainment(PC):.3f}", f"{_saving(t):.1%}"]
        )
    tn, tp = report.total("none"), report.total(PC)
    share = report.optimum_read / report.optimum_total if report.optimum_total else 0.0
    saving = (tn.cost - tp.cost) / tn.cost if tn.cost else 0.0
    out.append(
        ["**total**", str(tn.requests)]
        + [f"{report.total(s).hit_ratio:.1%}" for s in STRATEGIES]
        + [f"{share:.1%}", f"{report.attainment(PC):.3f}", f"{saving:.1%}"]
    )
    return out


HEADERS = [
    "workload",
    "requests",
    "none",
    "naive",
    "promptcache",
    "optimum",
    "attainment",
    "cost saved vs none",
]


def markdown(report: Report) -> str:
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "|".join(["---"] + ["---:"] * (len(HEADERS) - 1)) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows(report)]
    return "\n".join(lines)


def text(report: Report) -> str:
    table = [HEADERS] + [[c.replace("**", "") for c in r] for r in rows(report)]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADERS))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in table
    )


def misses(report: Report, target: float) -> str:
    lines = []
    for t in report.traces:
        attained = t.attainment(PC)
        if attained >= target:
            continue
        gap = t.optimum_read - t.tallies[PC].read
        lines.append(
            f"- {t.name}: attainment {attained:.3f} (target {target}), {gap} read tokens short of the optimum"
        )
        losses = sorted(
            (
                (bound - o.read, i, bound, o.read, o.error)
                for i, (bound, o) in enumerate(zip(t.optimum_reads, t.outcomes[PC], strict=True))
            ),
            reverse=True,
        )
        for lost, i, bound, read, error in losses[:3]:
            if lost > 0:
                why = f" ({error[:80]})" if error else ""
                lines.append(f"    request {i}: read {read} of {bound} possible{why}")
        if t.stage_errors:
            lines.append(f"    {t.stage_errors} pipeline stage errors (fail-open passthroughs)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--target", type=float, default=0.99)
    parser.add_argument("--check", action="store_true", help="exit 1 when a workload misses the target")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    traces = resolve_traces(["suite"], args.cache_dir or default_cache_dir())
    started = time.perf_counter()
    report = uvloop.run(replay_traces(traces, list(STRATEGIES), "sim", Progress(enabled=not args.quiet)))
    elapsed = time.perf_counter() - started
    print(markdown(report) if args.markdown else text(report))
    missed = misses(report, args.target)
    print()
    if missed:
        print(f"Workloads below attainment {args.target} (promptcache):")
        print(missed)
    else:
        print(f"Every workload reaches attainment >= {args.target}.")
    print(
        f"\n({len(traces)} workloads, {sum(t.requests for t in report.traces)} requests x "
        f"{len(STRATEGIES)} strategies in {elapsed:.1f} s)",
        file=sys.stderr,
    )
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
