"""The long Claude-Code- and Hermes-shaped conversations grown from the recorded client traces
(`proxy/workloads/long_client.py`): what they keep from the recording, how they grow, and each
client's history rendering and markers."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.paths import packaged_workloads_dir
from proxy.workloads.long_client import AGENTS_MD_HEAD, CLAUDE_MD_HEAD, LONG
from proxy.workloads.replies import reply_headers
from proxy.workloads.script import TOOL_CALL_HEADER
from proxy.workloads.suite import BY_NAME, SUITE, generate
from proxy.workloads.trace import load_trace

BASES = {"long-cc": "claude-code", "long-hermes": "hermes-anthropic"}


def _recorded(name: str) -> Any:
    return load_trace(packaged_workloads_dir() / "clients" / f"{BASES[name]}.jsonl").requests[0]


def _markers(body: dict[str, Any]) -> list[tuple[int, int]]:
    out = []
    for i, m in enumerate(body["messages"]):
        for j, block in enumerate(m["content"] if isinstance(m["content"], list) else []):
            if "cache_control" in block:
                out.append((i, j))
    return out


def test_long_workloads_are_named_but_not_in_the_suite() -> None:
    assert [w.name for w in LONG] == ["long-cc", "long-hermes"]
    assert all(BY_NAME[w.name] is w for w in LONG) and not {w.name for w in SUITE} & set(BASES)
    assert generate(LONG[0]) == generate(LONG[0])  # seeded: the same trace every time


@pytest.mark.parametrize("name", ["long-cc", "long-hermes"])
def test_the_recorded_client_s_prompt_tools_and_headers_are_kept(name: str) -> None:
    recorded = _recorded(name)
    trace = generate(BY_NAME[name])
    assert [len(trace.requests)] == [{"long-cc": 18, "long-hermes": 22}[name]]
    for r in trace.requests:
        assert r.path == recorded.path and r.headers == recorded.headers
        assert list(r.body) == list(recorded.body)  # the client's field order
        assert r.body["tools"] == recorded.body["tools"]
        for key in recorded.body.keys() - {"messages", "system"}:
            assert r.body[key] == recorded.body[key]
        if name == "long-cc":
            assert r.body["system"] == recorded.body["system"]  # billing header block included
            first = r.body["messages"][0]["content"]
            assert first[0] == recorded.body["messages"][0]["content"][0]  # attribution reminder
            assert first[1]["text"].startswith(CLAUDE_MD_HEAD)
            assert r.body["messages"][1]["role"] == "system"  # the environment message
        else:
            system = r.body["system"]
            assert len(system) == 1 and system[0]["cache_control"] == {"type": "ephemeral"}
            head = recorded.body["system"][0]["text"] + AGENTS_MD_HEAD
            assert system[0]["text"].startswith(head)


@pytest.mark.parametrize("name", ["long-cc", "long-hermes"])
def test_the_conversation_grows_by_tool_loops_and_human_turns(name: str) -> None:
    trace = generate(BY_NAME[name])
    sizes = [len(orjson.dumps(r.body)) for r in trace.requests]
    assert sizes[0] > 80_000  # ~20k tokens up front (system, tools, the project file)
    growth = [b - a for a, b in zip(sizes, sizes[1:], strict=False)]
    assert min(growth) > 600 and max(growth) < 14_000  # a few hundred to a few thousand tokens
    kinds = [m["role"] for m in trace.requests[-1].body["messages"]]
    uses = [
        b
        for m in trace.requests[-1].body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_use"
    ]
    assert len(uses) == len(trace.requests) - 4  # every request but the 4 human turns' answers a call
    assert kinds.count("assistant") == len(trace.requests) - 1
    # the recorded answer of each request: a tool call, except before the next human turn
    calls = [bool(h.get(TOOL_CALL_HEADER)) for h in reply_headers(trace)]
    assert calls.count(False) == 4 and not calls[-1]
    assert all(0 <= r.gap <= 600 for r in trace.requests)


def test_each_client_renders_and_marks_history_as_recorded() -> None:
    cc = generate(BY_NAME["long-cc"]).requests[5].body
    n = len(cc["messages"])
    assert _markers(cc) == [(n - 1, len(cc["messages"][-1]["content"]) - 1)]  # the last block only
    assert isinstance(cc["messages"][1]["content"], str)  # an earlier one-text message: a string
    result = cc["messages"][-1]["content"][0]
    assert list(result) == ["tool_use_id", "type", "content", "is_error", "cache_control"]
    hermes = generate(BY_NAME["long-hermes"]).requests[5].body
    n = len(hermes["messages"])
    assert [i for i, _ in _markers(hermes)] == [n - 3, n - 2, n - 1]  # system_and_3
    assert isinstance(hermes["messages"][0]["content"], str)
    output = orjson.loads(hermes["messages"][-1]["content"][0]["content"])
    assert list(output) == ["output", "exit_code", "error"] and output["exit_code"] == 0
