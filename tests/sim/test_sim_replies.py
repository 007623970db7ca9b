"""Scripted replies: the default text, `x-sim-tool-call`, and the `[[tool:NAME]]` rule."""

from __future__ import annotations

import pytest

from proxy.sim.errors import Rejected
from proxy.sim.replies import Conversation, Reply, ToolCall, choose_reply

CONFORMANCE = [
    # (test name, rule in the brief / proxy/sim/replies.py)
    ("test_choose_reply_rules", "default text, header, marker rule, loop termination"),
    ("test_header_errors", "a mistyped script fails loudly (400)"),
    ("test_anthropic_agent_loop", "tool_use -> tool_result -> text, stop_reason tool_use / end_turn"),
    ("test_openai_chat_agent_loop", "tool_calls -> tool message -> text"),
    ("test_responses_agent_loop", "function_call -> function_call_output -> text"),
    ("test_responses_stream_function_call", "Responses streaming events of a function call"),
]

TOOLS = ("read", "bash")


def test_choose_reply_rules() -> None:
    conv = Conversation(2, TOOLS, 'please [[tool:bash {"command": "ls -la", "opts": {"x": 1}}]]')
    assert choose_reply(conv, {}) == Reply(
        tool_call=ToolCall("bash", {"command": "ls -la", "opts": {"x": 1}})
    )
    assert choose_reply(Conversation(2, TOOLS, "[[tool:write]] then [[tool:read]]"), {}) == Reply(
        tool_call=ToolCall("read")
    )
    assert choose_reply(Conversation(3, TOOLS, None), {}) == Reply(text="OK from promptcache-sim (turn 3)")
    assert choose_reply(Conversation(1, (), "[[tool:read]]"), {}) == Reply(
        text="OK from promptcache-sim (turn 1)"
    )
    forced = {"x-sim-tool-call": "read", "x-sim-tool-input": '{"path": "a.txt"}'}
    assert choose_reply(Conversation(1, TOOLS, None), forced) == Reply(
        tool_call=ToolCall("read", {"path": "a.txt"})
    )


def test_header_errors() -> None:
    with pytest.raises(Rejected, match="offers no tool named 'nope'"):
        choose_reply(Conversation(1, TOOLS, None), {"x-sim-tool-call": "nope"})
    with pytest.raises(Rejected, match="must be a JSON object"):
        choose_reply(Conversation(1, TOOLS, None), {"x-sim-tool-call": "read", "x-sim-tool-input": "[1]"})


async def test_anthropic_agent_loop(sim) -> None:
    tools = [{"name": "bash", "input_schema": {"type": "object"}}]
    messages = [
        {"role": "user", "content": [{"type": "text", "text": 'run [[tool:bash {"command": "ls"}]]'}]}
    ]
    body = {"model": "claude-opus-5", "max_tokens": 64, "tools": tools, "messages": messages}
    status, first = await sim.messages(body)
    assert status == 200 and first["stop_reason"] == "tool_use"
    assert first["content"] == [
        {"type": "tool_use", "id": "toolu_sim_000001", "name": "bash", "input": {"command": "ls"}}
    ]
    messages += [
        {"role": "assistant", "content": first["content"]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_sim_000001", "content": "a.txt"}],
        },
    ]
    status, second = await sim.messages(body)
    assert (second["stop_reason"], second["content"]) == (
        "end_turn",
        [{"type": "text", "text": "OK from promptcache-sim (turn 2)"}],
    )
    events = await sim.messages_stream({**body, "messages": messages[:1]})
    block = events[1][1]["content_block"]
    assert (block["type"], block["name"], block["input"]) == ("tool_use", "bash", {})
    assert events[3][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"command":"ls"}'}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


async def test_openai_chat_agent_loop(sim) -> None:
    tools = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "open it [[tool:read]]"}]
    body = {"model": "gpt-4o", "tools": tools, "messages": messages}
    status, first = await sim.post("/v1/chat/completions", body)
    message = first["choices"][0]["message"]
    assert first["choices"][0]["finish_reason"] == "tool_calls"
    assert message["tool_calls"] == [
        {"id": "call_sim_000001", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    ]
    messages += [message, {"role": "tool", "tool_call_id": "call_sim_000001", "content": "contents"}]
    status, second = await sim.post("/v1/chat/completions", body)
    assert second["choices"][0]["message"]["content"] == "OK from promptcache-sim (turn 1)"
    events = await sim.stream("/v1/chat/completions", {**body, "messages": messages[:1]})
    deltas = [d["choices"][0]["delta"] for _, d in events[:-1]]
    assert deltas[0]["tool_calls"][0]["function"] == {"name": "read", "arguments": ""}
    assert deltas[1]["tool_calls"][0]["function"] == {"arguments": "{}"}
    assert events[-2][1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_responses_agent_loop(sim) -> None:
    tools = [{"type": "function", "name": "read", "parameters": {"type": "object"}}]
    items = [{"role": "user", "content": [{"type": "input_text", "text": "[[tool:read]]"}]}]
    body = {"model": "gpt-4o", "tools": tools, "input": items}
    status, first = await sim.post("/v1/responses", body)
    call = first["output"][0]
    assert (call["type"], call["name"], call["call_id"], call["arguments"]) == (
        "function_call",
        "read",
        "call_sim_000001",
        "{}",
    )
    items += [call, {"type": "function_call_output", "call_id": call["call_id"], "output": "text"}]
    status, second = await sim.post("/v1/responses", body)
    assert second["output"][0]["content"][0]["text"] == "OK from promptcache-sim (turn 1)"


async def test_responses_stream_function_call(sim) -> None:
    tools = [{"type": "function", "name": "read", "parameters": {"type": "object"}}]
    body = {"model": "gpt-4o", "tools": tools, "input": "go"}
    events = await sim.stream("/v1/responses", body, headers={"x-sim-tool-call": "read"})
    assert [e for e, _ in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[-1][1]["response"]["output"][0]["arguments"] == "{}"
