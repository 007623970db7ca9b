"""The cost guard's regret bound (issue 13): at fast pacing (30 s between requests) every trace of
2+ requests costs at most 1.01x through promptcache what it costs without a proxy, and its read
share over requests 2..N is never below the client's own. Over the recorded client traces
(`workloads/clients/`) and the whole workload suite, in one replay on the simulator."""

from __future__ import annotations

from pathlib import Path

from proxy.workloads.runner import replay_traces
from proxy.workloads.suite import COMMITTED_DIR, SUITE, load_workload
from proxy.workloads.trace import load_trace, with_gaps

FAST = 30.0
BOUND = 1.01


async def test_fast_pacing_costs_at_most_1_01x_no_proxy_and_never_reads_less(tmp_path: Path) -> None:
    clients = [load_trace(path) for path in sorted((COMMITTED_DIR / "clients").glob("*.jsonl"))]
    suite = [load_workload(w.name, tmp_path) for w in SUITE]
    traces = [with_gaps(t, FAST) for t in (*clients, *suite) if len(t.requests) >= 2]
    assert {"aider@30s", "claude-code@30s", "realistic-cc@30s", "model-switch@30s"} <= {t.name for t in traces}
    report = await replay_traces(traces, ["none", "promptcache"])
    over, less = [], []
    for result in report.traces:
        none, pc = result.tallies["none"], result.tallies["promptcache"]
        assert pc.errors == 0, result.name
        if pc.cost > BOUND * none.cost:
            over.append((result.name, round(pc.cost / none.cost, 4)))
        if result.share_after_first("promptcache") < result.share_after_first("none"):
            less.append((result.name, result.share_after_first("promptcache"), result.share_after_first("none")))
    assert over == [] and less == []
