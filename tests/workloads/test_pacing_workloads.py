"""Human-pacing workloads and replay inputs: the lognormal human gaps, short and abandoned
conversations, uniform gaps, and recorded answers read back from the next request."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from proxy.workloads.replies import recorded_tool_call, reply_headers
from proxy.workloads.script import TOOL_CALL_HEADER, ScriptSpec, _human_gap, make_script, make_tools
from proxy.workloads.suite import BY_NAME, COMMITTED_DIR, HUMAN_GAP_LOGNORMAL, PACING, generate
from proxy.workloads.trace import Trace, TraceRequest, load_trace, with_gaps


def test_human_gap_distribution_matches_the_stated_shape():
    spec = ScriptSpec(("m",), human_gap_lognormal=HUMAN_GAP_LOGNORMAL)
    rng = random.Random(1)
    gaps = [_human_gap(rng, spec) for _ in range(20000)]
    assert 225 <= statistics.median(gaps) <= 255  # median ~4 minutes
    above = lambda s: sum(1 for g in gaps if g > s) / len(gaps)  # noqa: E731
    assert 0.27 <= above(600) <= 0.32  # ~30% above 10 minutes
    assert 0.04 <= above(3600) <= 0.06  # ~5% above an hour
    assert min(gaps) >= 15 and max(gaps) <= 14400
    # sigma from the stated shares: ln(600/240) / z(0.70) and ln(3600/240) / z(0.95)
    assert math.log(2.5) / 0.5244 == pytest.approx(1.75, abs=0.01)
    assert math.log(15) / 1.6449 == pytest.approx(1.65, abs=0.01)


def test_short_and_abandoned_sessions():
    tools = make_tools(random.Random(2), 3)
    spec = ScriptSpec(("m",), turns_range=(3, 3), loop_steps=(2, 2), short_share=1.0)
    script = make_script(random.Random(3), spec, tools, "s", 0, "t")
    assert len(script.turns) == 1 and len(script.turns[0].steps) <= 1 and not script.abandoned
    spec = ScriptSpec(("m",), turns_range=(3, 3), loop_steps=(2, 2), abandon_share=1.0)
    script = make_script(random.Random(3), spec, tools, "s", 0, "t")
    assert script.abandoned and len(script.turns) == 3
    assert [len(t.steps) for t in script.turns] == [2, 2, 1] and script.turns[-1].answer == ""


@pytest.mark.parametrize("name", PACING)
def test_pacing_workloads_have_several_conversations_with_human_gaps(name):
    trace = generate(BY_NAME[name])
    human = [r.gap for r in trace.requests if r.gap > 60]
    assert len(human) >= 10
    tool_steps = [r.gap for r in trace.requests if 0 < r.gap <= 30]
    assert tool_steps and max(tool_steps) <= 30
    if name.startswith("realistic"):
        assert trace.duration > 4 * 3600  # a working day, several conversations


def test_an_abandoned_conversation_says_its_last_answer_was_a_tool_call():
    trace = generate(BY_NAME["realistic-cc"])
    marked = [i for i, r in enumerate(trace.requests) if TOOL_CALL_HEADER in r.headers]
    assert len(marked) == 1
    assert reply_headers(trace)[marked[0]] == {}  # the trace's own header is kept


def test_reply_headers_follow_the_next_request_of_the_conversation():
    trace = load_trace(COMMITTED_DIR / "clients" / "claude-code.jsonl")
    # request 1 asks for a command; request 2 carries Bash's tool_result
    assert [h.get(TOOL_CALL_HEADER) for h in reply_headers(trace)] == [None, "Bash", None, None, None]
    chat = [
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "function": {"name": "ls"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "r"},
    ]
    tools = [{"type": "function", "function": {"name": "ls", "parameters": {}}}]
    body = {"model": "gpt-5.1", "tools": tools}
    requests = (
        TraceRequest(0, "/v1/chat/completions", {**body, "messages": chat[:1]}),
        TraceRequest(1, "/v1/chat/completions", {**body, "messages": chat}),
    )
    assert recorded_tool_call(Trace("t", "", requests), 0) == "ls"
    assert recorded_tool_call(Trace("t", "", requests), 1) is None
    unoffered = (TraceRequest(0, requests[0].path, {"messages": chat[:1]}), requests[1])
    assert recorded_tool_call(Trace("t", "", unoffered), 0) is None  # the simulator would refuse it
    responses = (
        TraceRequest(0, "/v1/responses", {"input": [{"role": "user", "content": "u"}], "tools": [{"name": "x"}]}),
        TraceRequest(
            2,
            "/v1/responses",
            {
                "input": [
                    {"role": "user", "content": "u"},
                    {"type": "reasoning", "summary": []},
                    {"type": "function_call", "call_id": "1", "name": "x", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "1", "output": "o"},
                ]
            },
        ),
    )
    assert recorded_tool_call(Trace("t", "", responses), 0) == "x"


def test_with_gaps_sets_every_gap_after_the_first():
    trace = load_trace(COMMITTED_DIR / "clients" / "aider.jsonl")
    paced = with_gaps(trace, 360)
    assert paced.name == "aider@360s"
    assert [r.gap for r in paced.requests] == [trace.requests[0].gap] + [360.0] * (len(trace.requests) - 1)
    assert [r.body for r in paced.requests] == [r.body for r in trace.requests]
