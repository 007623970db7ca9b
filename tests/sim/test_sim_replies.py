"""Scripted replies: the default text, `x-sim-tool-call`, `x-sim-reply`, and the `[[tool:NAME]]`
and `[[reply:TEXT]]` markers; which text the markers are read in, per API."""

from __future__ import annotations

import functools
from typing import Any

import orjson
import pytest

from proxy.sim import anthropic_wire, openai_wire
from proxy.sim.errors import Rejected
from proxy.sim.replies import Conversation, Reply, Tool, ToolCall, choose_reply, functions
from proxy.sim.tokens import TokenCounter, load_o200k

CONFORMANCE = [
    # (test name, rule in the brief / proxy/sim/replies.py)
    ("test_choose_reply_rules", "default text, header, marker rule, loop termination"),
    ("test_header_errors", "a mistyped script fails loudly (400)"),
    ("test_anthropic_agent_loop", "tool_use -> tool_result -> text, stop_reason tool_use / end_turn"),
    ("test_openai_chat_agent_loop", "tool_calls -> tool message -> text"),
    ("test_responses_agent_loop", "function_call -> function_call_output -> text"),
    ("test_responses_stream_function_call", "Responses streaming events of a function call"),
    ("test_reply_markers_and_header", "x-sim-reply / [[reply:TEXT]], verbatim or a JSON string"),
    ("test_custom_tools_get_the_payload_verbatim", "custom tools take a string input"),
    ("test_anthropic_last_user_text_skips_trailing_system", "S1: trailing system messages skipped"),
    ("test_openai_last_user_text", "Chat / Responses: trailing instructions skipped, tool output last"),
    ("test_responses_offered_tools", "S2: tools, namespaces, custom tools, additional_tools items"),
    ("test_responses_custom_tool_call", "S2: custom_tool_call item and its streaming events"),
    (
        "test_additional_tools_render_as_a_developer_message_of_tool_definitions",
        "S2: additional_tools tokens counted where the item stands",
    ),
    ("test_marker_before_a_trailing_system_message_end_to_end", "S1 through the Messages endpoint"),
    ("test_scripted_reply_end_to_end", "S3: header and marker through the Messages endpoint"),
]

TOOLS = functions("read", "bash")


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
    with pytest.raises(Rejected, match="x-sim-tool-call and x-sim-reply cannot be combined"):
        choose_reply(Conversation(1, TOOLS, None), {"x-sim-tool-call": "read", "x-sim-reply": "hi"})


def test_reply_markers_and_header() -> None:
    edit = "hello.py\n```python\n<<<<<<< SEARCH\nprint('hello')\n=======\nprint('hi')\n>>>>>>> REPLACE\n```"
    verbatim = Conversation(1, TOOLS, f"Change it. [[reply:{edit}]] thanks")
    assert choose_reply(verbatim, {}) == Reply(text=edit)
    quoted = Conversation(1, TOOLS, '[[reply:"line 1\\nline \\"2\\""]]')
    assert choose_reply(quoted, {}) == Reply(text='line 1\nline "2"')
    # First applicable marker in text order: an unoffered tool is skipped, a reply always applies.
    mixed = Conversation(1, TOOLS, "[[tool:write]] [[reply:first]] [[tool:read]]")
    assert choose_reply(mixed, {}) == Reply(text="first")
    assert choose_reply(Conversation(1, TOOLS, "[[tool:read]] [[reply:x]]"), {}) == Reply(
        tool_call=ToolCall("read")
    )
    assert choose_reply(Conversation(1, TOOLS, "[[reply:]]"), {}) == Reply(text="")
    # Tool results last: no marker text, the default reply.
    assert choose_reply(Conversation(2, TOOLS, None), {}) == Reply(text="OK from promptcache-sim (turn 2)")
    # The header wins over markers; a JSON string literal is decoded, anything else is verbatim.
    assert choose_reply(verbatim, {"x-sim-reply": "plain \\n text"}) == Reply(text="plain \\n text")
    assert choose_reply(verbatim, {"x-sim-reply": '"a\\nb"'}) == Reply(text="a\nb")
    assert choose_reply(verbatim, {"x-sim-reply": ""}) == Reply(text="")


def test_custom_tools_get_the_payload_verbatim() -> None:
    tools = (Tool("exec", "custom", "functions"), Tool("wait", "function", "functions"))
    conv = Conversation(1, tools, 'go [[tool:exec {"code":"console.log(1)"}]]')
    assert choose_reply(conv, {}) == Reply(
        tool_call=ToolCall("exec", '{"code":"console.log(1)"}', "functions")
    )
    conv = Conversation(1, tools, "go [[tool:exec console.log('a b')]] [[tool:wait]]")
    assert choose_reply(conv, {}) == Reply(tool_call=ToolCall("exec", "console.log('a b')", "functions"))
    assert choose_reply(Conversation(1, tools, "[[tool:exec]]"), {}) == Reply(
        tool_call=ToolCall("exec", "", "functions")
    )
    assert choose_reply(Conversation(1, tools, "[[tool:wait not json]]"), {}) == Reply(
        tool_call=ToolCall("wait", {}, "functions")
    )
    forced = {"x-sim-tool-call": "exec", "x-sim-tool-input": "1 + 1"}
    assert choose_reply(Conversation(1, tools, None), forced) == Reply(
        tool_call=ToolCall("exec", "1 + 1", "functions")
    )
    assert (
        ToolCall("exec", "x = {}").arguments == "x = {}" and ToolCall("read", {"a": 1}).arguments == '{"a":1}'
    )


def _text(text: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": text}]


def test_anthropic_last_user_text_skips_trailing_system() -> None:
    tools = [{"name": "Bash", "input_schema": {"type": "object"}}]
    env = {"role": "system", "content": _text("# Environment")}
    body = {"tools": tools, "messages": [{"role": "user", "content": _text("run [[tool:Bash]]")}, env, env]}
    assert anthropic_wire.conversation(body) == Conversation(1, functions("Bash"), "run [[tool:Bash]]")
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}
    looped = {"tools": tools, "messages": [{"role": "user", "content": [result]}, env]}
    assert anthropic_wire.conversation(looped).last_user_text is None
    prefill = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}]}
    assert anthropic_wire.conversation(prefill) == Conversation(1, (), None)
    assert anthropic_wire.conversation({"messages": [env]}) == Conversation(0, (), None)


def test_openai_last_user_text() -> None:
    chat = {
        "messages": [
            {"role": "system", "content": "rules"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "developer", "content": "late rule"},
        ]
    }
    assert openai_wire.chat_conversation(chat) == Conversation(1, (), "a\nb")
    tool_last = {"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "out"}]}
    assert openai_wire.chat_conversation(tool_last).last_user_text is None
    items = [
        {"role": "user", "content": "one"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "two"}]},
        {"type": "additional_tools", "role": "developer", "tools": []},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rule"}]},
    ]
    assert openai_wire.responses_conversation({"input": items}) == Conversation(2, (), "two")
    output = {"type": "function_call_output", "call_id": "c", "output": "x"}
    assert openai_wire.responses_conversation({"input": [*items, output]}).last_user_text is None
    assert openai_wire.responses_conversation({"input": "hi"}) == Conversation(1, (), "hi")


def test_responses_offered_tools() -> None:
    body = {
        "tools": [
            {"type": "function", "name": "read"},
            {"type": "custom", "name": "apply_patch"},
            {"type": "web_search"},
            {
                "type": "namespace",
                "name": "crm",
                "tools": [{"type": "function", "name": "lookup"}, {"type": "namespace", "name": "deep"}],
            },
        ],
        "input": [
            {
                "type": "additional_tools",
                "role": "developer",
                "tools": [
                    {
                        "type": "namespace",
                        "name": "functions",
                        "description": "",
                        "tools": [{"type": "custom", "name": "exec"}, {"type": "function", "name": "wait"}],
                    },
                    {"type": "function", "name": "late"},
                ],
            },
            {"role": "user", "content": "go"},
        ],
    }
    assert openai_wire.responses_conversation(body).offered_tools == (
        Tool("read"),
        Tool("apply_patch", "custom"),
        Tool("lookup", "function", "crm"),
        Tool("exec", "custom", "functions"),
        Tool("wait", "function", "functions"),
        Tool("late"),
    )


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


ADDITIONAL_TOOLS: dict[str, Any] = {
    "type": "additional_tools",
    "role": "developer",
    "tools": [
        {
            "type": "namespace",
            "name": "functions",
            "description": "",
            "tools": [{"type": "custom", "name": "exec", "description": "Run JavaScript."}],
        }
    ],
}


async def test_responses_custom_tool_call(sim) -> None:
    user = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "[[tool:exec 1+1]]"}],
    }
    body = {"model": "gpt-6.2-sol", "input": [ADDITIONAL_TOOLS, user]}
    status, data = await sim.post("/v1/responses", body)
    assert status == 200
    assert data["output"] == [
        {
            "type": "custom_tool_call",
            "id": "ctc_sim_000001",
            "call_id": "call_sim_000001",
            "name": "exec",
            "input": "1+1",
            "namespace": "functions",
        }
    ]
    events = await sim.stream("/v1/responses", body)
    assert [e for e, _ in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[2][1]["item"]["input"] == "" and events[3][1]["delta"] == "1+1"
    assert events[4][1] == {
        "type": "response.custom_tool_call_input.done",
        "sequence_number": 4,
        "item_id": "ctc_sim_000002",
        "output_index": 0,
        "input": "1+1",
    }
    # The loop closes: the call and its output go back, the reply is text.
    call = data["output"][0]
    output = {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "2"}
    status, second = await sim.post("/v1/responses", {**body, "input": [*body["input"], call, output]})
    assert second["output"][0]["content"][0]["text"] == "OK from promptcache-sim (turn 1)"
    # Function tools of a namespace carry it too.
    wait = {"type": "function", "name": "wait", "parameters": {"type": "object"}}
    tools = {**ADDITIONAL_TOOLS, "tools": [{**ADDITIONAL_TOOLS["tools"][0], "tools": [wait]}]}
    status, data = await sim.post(
        "/v1/responses", {**body, "input": [tools, user]}, headers={"x-sim-tool-call": "wait"}
    )
    assert (data["output"][0]["type"], data["output"][0]["namespace"]) == ("function_call", "functions")


async def test_additional_tools_render_as_a_developer_message_of_tool_definitions(sim) -> None:
    """Counted like top-level tools, inside a developer message at the item's place (prefix order)."""
    counter = sim_counter()
    user = {"role": "user", "content": "hi"}
    tools_json = [orjson.dumps(t).decode() for t in ADDITIONAL_TOOLS["tools"]]
    # <start> developer <message> <tools> JSON <end> <end>, then <start> user <message> hi <end>,
    # then the priming <start> assistant <message>.
    expected = (
        3 + counter.count("developer") + sum(counter.count(t) for t in tools_json) + 2
        + 3 + counter.count("user") + counter.count("hi")
        + 2 + counter.count("assistant")
    )  # fmt: skip
    status, data = await sim.post("/v1/responses", {"model": "gpt-5.1", "input": [ADDITIONAL_TOOLS, user]})
    assert status == 200 and data["usage"]["input_tokens"] == expected == 44
    # The same tools at the top level render before the messages, without the message envelope.
    status, top = await sim.post(
        "/v1/responses", {"model": "gpt-5.1", "tools": ADDITIONAL_TOOLS["tools"], "input": [user]}
    )
    assert top["usage"]["input_tokens"] == expected - 3 - counter.count("developer") == 40


async def test_scripted_reply_end_to_end(sim) -> None:
    finding = "Change hello.py to print hi. [[reply:hello.py\n```python\nprint('hi')\n```]]"
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": finding}],
    }
    status, data = await sim.messages(body)
    assert (status, data["stop_reason"], data["content"]) == (
        200,
        "end_turn",
        [{"type": "text", "text": "hello.py\n```python\nprint('hi')\n```"}],
    )
    status, data = await sim.messages(body, headers={"x-sim-reply": '"one\\ntwo"'})
    assert data["content"] == [{"type": "text", "text": "one\ntwo"}]
    assert data["usage"]["output_tokens"] == sim_counter().count("one\ntwo")
    status, chat = await sim.post(
        "/v1/chat/completions",
        {"model": "gpt-5.1", "messages": [{"role": "user", "content": "[[reply:fine]]"}]},
    )
    assert chat["choices"][0]["message"]["content"] == "fine"
    status, resp = await sim.post("/v1/responses", {"model": "gpt-5.1", "input": "[[reply:fine too]]"})
    assert resp["output"][0]["content"][0]["text"] == "fine too"


async def test_marker_before_a_trailing_system_message_end_to_end(sim) -> None:
    """S1 (tests/clients/data/sim-tool-marker-trailing-system-message.json)."""
    tools = [{"name": "Bash", "input_schema": {"type": "object"}}]
    messages = [
        {"role": "user", "content": _text('Run this: [[tool:Bash {"command":"echo hi"}]]')},
        {"role": "system", "content": _text("# Environment\nPrimary working directory: /work")},
    ]
    body = {"model": "claude-opus-5-5", "max_tokens": 1024, "tools": tools, "messages": messages}
    status, data = await sim.messages(body)
    assert (status, data["stop_reason"], data["content"]) == (
        200,
        "tool_use",
        [{"type": "tool_use", "id": "toolu_sim_000001", "name": "Bash", "input": {"command": "echo hi"}}],
    )


@functools.cache
def sim_counter() -> TokenCounter:
    """The simulator's own tokenizer (o200k_base), loaded once."""
    return TokenCounter(load_o200k())
