"""The workload generators: deterministic bytes, committed traces up to date, each cache-breaking
behaviour present, no credentials."""

from __future__ import annotations

import orjson
import pytest

from proxy.sim.anthropic import parse_request
from proxy.sim.config import SimConfig
from proxy.sim.tokens import TokenCounter
from proxy.workloads.stable import masked_digest
from proxy.workloads.suite import BY_NAME, COMMITTED_DIR, SUITE, generate
from proxy.workloads.trace import Trace, TraceError, TraceRequest, dumps_trace, load_trace, loads_trace

COMMITTED = [w for w in SUITE if w.committed]


def _trace(name: str) -> Trace:
    return load_trace(COMMITTED_DIR / f"{name}.jsonl") if BY_NAME[name].committed else generate(BY_NAME[name])


@pytest.mark.parametrize("workload", SUITE, ids=lambda w: w.name)
def test_same_seed_same_bytes(workload):
    assert dumps_trace(generate(workload)) == dumps_trace(generate(workload))


@pytest.mark.parametrize("workload", COMMITTED, ids=lambda w: w.name)
def test_committed_trace_matches_its_generator(workload):
    path = COMMITTED_DIR / f"{workload.name}.jsonl"
    assert path.read_bytes() == dumps_trace(generate(workload)), "run: python -m proxy.workloads write"


def test_committed_suite_is_small_and_named_after_workloads():
    files = sorted(COMMITTED_DIR.glob("*.jsonl"))
    assert [f.stem for f in files] == sorted(w.name for w in COMMITTED)
    assert sum(f.stat().st_size for f in files) < 15_000_000


def test_round_trip_and_header_line():
    trace = generate(BY_NAME["model-switch"])
    data = dumps_trace(trace)
    assert orjson.loads(data.split(b"\n", 1)[0]) == {
        "trace": "model-switch",
        "description": trace.description,
    }
    again = loads_trace(data)
    assert again == trace
    assert dumps_trace(again) == data


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"gap": 0, "path": "/v1/messages", "headers": {"X-Api-Key": "sk"}, "body": {}}', "credential"),
        (
            b'{"gap": 0, "path": "/v1/messages", "headers": {"authorization": "Bearer x"}, "body": {}}',
            "credential",
        ),
        (b'{"gap": -1, "path": "/v1/messages", "body": {}}', "gap"),
        (b'{"gap": 1, "path": "/v1/embeddings", "body": {}}', "path"),
        (b'{"gap": 1, "path": "/v1/messages", "body": []}', "body"),
        (b"not json", "invalid JSON"),
    ],
)
def test_invalid_lines_are_refused(line, message):
    with pytest.raises(TraceError, match=message):
        loads_trace(line, "t")


def test_writing_a_secret_header_is_refused():
    trace = Trace("t", "", (TraceRequest(0.0, "/v1/messages", {}, {"x-api-key": "sk-live"}),))
    with pytest.raises(TraceError, match="credential"):
        dumps_trace(trace)


# --- each behaviour is really in the suite ------------------------------------------------


def _system_text(body, index):
    return body["system"][index]["text"]


def test_billing_header_changes_every_request():
    bodies = [r.body for r in _trace("cc-billing-header").requests]
    headers = [_system_text(b, 0) for b in bodies]
    assert all(h.startswith("x-anthropic-billing-header: cc_version=") and "cch=" in h for h in headers)
    assert len(set(headers)) == len(headers)
    assert len({_system_text(b, 2) for b in bodies}) == 1


def test_volatile_system_lines_change_every_request():
    systems = [r.body["system"] for r in _trace("volatile-system-counters").requests]
    for prefix in ("Current time: ", "Request id: ", "Context used: "):
        values = [next(line for line in s.split("\n") if line.startswith(prefix)) for s in systems]
        assert len(set(values)) == len(values), prefix


def test_tools_shuffled_and_schema_keys_reordered():
    bodies = [r.body for r in _trace("tools-shuffled").requests]
    orders = [tuple(t["name"] for t in b["tools"]) for b in bodies]
    assert len(set(orders)) > len(orders) // 2 and len({frozenset(o) for o in orders}) == 1
    bodies = [r.body for r in _trace("schema-keys-reordered").requests]
    raw = {orjson.dumps([t["input_schema"] for t in b["tools"]]) for b in bodies}
    canonical = {
        orjson.dumps([t["input_schema"] for t in b["tools"]], option=orjson.OPT_SORT_KEYS) for b in bodies
    }
    assert len(raw) == len(bodies) and len(canonical) == 1


def test_history_rerendered_and_reserialised():
    bodies = [r.body for r in _trace("history-rerendered").requests]
    first = [b["messages"][0] for b in bodies]
    assert len({orjson.dumps(m) for m in first}) == len(first)
    assert len({masked_digest(m) for m in first}) == 1
    uses = [
        [blk for m in b["messages"] for blk in m["content"] if blk.get("type") == "tool_use"][0]["input"]
        for b in bodies[2:]
    ]
    assert len({tuple(u) for u in uses}) > 1


def _markers(body):
    found = sum(1 for t in body.get("tools", []) if "cache_control" in t)
    system = body.get("system")
    if isinstance(system, list):
        found += sum(1 for b in system if "cache_control" in b)
    for m in body["messages"]:
        if isinstance(m["content"], list):
            found += sum(1 for b in m["content"] if "cache_control" in b)
    return found + (1 if "cache_control" in body else 0)


def test_client_marker_counts():
    assert {_markers(r.body) for r in _trace("no-markers").requests} == {0}
    four = [_markers(r.body) for r in _trace("client-markers-4").requests if len(r.body["messages"]) >= 3]
    five = [_markers(r.body) for r in _trace("client-markers-5").requests if len(r.body["messages"]) >= 3]
    assert four and set(four) == {4}
    assert five and set(five) == {5}


def test_long_tool_loops_exceed_the_lookback_window():
    trace = _trace("tool-loop-parallel")
    counter = TokenCounter()
    settings = SimConfig.load().anthropic_model("claude-sonnet-4-6")
    human = [r for r in trace.requests if r.body["messages"][-1]["content"][0]["type"] == "text"]
    assert len(human) == 2
    first, second = (parse_request(r.body, frozenset(), counter, settings) for r in human)
    assert second.blocks[-1].position - first.blocks[-1].position > 20
    parallel = max(
        sum(1 for b in m["content"] if b["type"] == "tool_use")
        for r in trace.requests
        for m in r.body["messages"]
        if m["role"] == "assistant"
    )
    assert parallel >= 3


def test_pacing_human_and_machine():
    human = [r.gap for r in _trace("human-pacing").requests[1:]]
    assert max(human) <= 2400 and sum(1 for g in human if g >= 360) >= 4
    machine = sorted(r.gap for r in _trace("tool-loop-parallel").requests[1:])
    assert machine[-2] <= 4, "all but the one human gap are machine pacing (seconds)"


def test_compaction_model_switch_sessions_and_openai():
    counts = [len(r.body["messages"]) for r in _trace("compaction").requests]
    assert any(b < a for a, b in zip(counts, counts[1:], strict=False))
    models = [r.body["model"] for r in _trace("model-switch").requests]
    assert models[0] == models[-1] == "claude-sonnet-4-6" and "claude-opus-5" in models
    shared = _trace("shared-system-sessions").requests
    assert len({r.headers["x-session-id"] for r in shared}) == 4
    assert len({orjson.dumps(r.body["tools"]) for r in shared}) == 1
    assert {r.path for r in _trace("openai-chat-agent").requests} == {"/v1/chat/completions"}
    assert {r.body["model"] for r in _trace("openai-responses-agent").requests} == {"gpt-5.6"}


def test_context_grows_from_20k_to_160k_tokens():
    from proxy.workloads.oracle import optimum

    totals = [b.total for b in optimum(_trace("long-context-growth")).requests]
    assert 18_000 <= totals[0] <= 26_000 and 150_000 <= totals[-1] <= 170_000
