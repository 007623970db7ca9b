"""Render scripts as OpenAI Chat Completions or Responses requests, with client quirks.

Contract: `render_session(script, client, shared, seed, cwd)` returns the session's requests as
`Event`s; same arguments, same bodies. Chat: a system message, user / assistant (`tool_calls`) /
`tool` messages, function tools, optionally streamed with `include_usage`. Responses (Codex-like):
`instructions`, an `input` list of message / `function_call` / `function_call_output` items, a
`prompt_cache_key`. Quirks: timestamps, UUIDs or counters in the system prompt (`volatile`),
an environment message re-rendered with the current time every request (`rerender_history`),
tools shuffled, schema keys reordered. No client markers: caching is automatic (GPT-5.6+
implicit mode when the model has breakpoints).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Final

import orjson

from proxy.workloads import text
from proxy.workloads.script import TOOL_CALL_HEADER, Event, Script, Tool

CHAT: Final = "/v1/chat/completions"
RESPONSES: Final = "/v1/responses"


@dataclass(frozen=True, slots=True)
class Client:
    """How an OpenAI client renders requests."""

    api: str = "chat"
    """`chat` or `responses`."""
    volatile: tuple[str, ...] = ()
    """System lines that change every request: `timestamp`, `uuid`, `counter`."""
    volatile_at: str = "top"
    rerender_history: bool = False
    """An environment message holding the *current* time, re-rendered in every request."""
    shuffle_tools: bool = False
    reorder_schema: bool = False
    stream: bool = True
    prompt_cache_key: bool = False
    """Send `prompt_cache_key` = the session id (Codex does)."""
    session_header: str | None = "x-session-id"


@dataclass(frozen=True, slots=True)
class Shared:
    instructions: str
    intro: str = "You are a coding agent running in a terminal on the user's machine."


def _tool(tool: Tool, api: str) -> dict[str, Any]:
    if api == "chat":
        return {
            "type": "function",
            "function": {"name": tool.name, "description": tool.description, "parameters": tool.schema()},
        }
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.schema(),
        "strict": False,
    }


def _system(client: Client, shared: Shared, cwd: str, now: int, rng: random.Random, context: int) -> str:
    volatile = []
    if "timestamp" in client.volatile:
        volatile.append(f"Current date and time: {text.timestamp(now)}")
    if "uuid" in client.volatile:
        volatile.append(f"Trace id: {text.uuid4(rng)}")
    if "counter" in client.volatile:
        volatile.append(f"Tokens used so far: {context}")
    env = f"Working directory: {cwd}\nShell: bash"
    lines = "\n".join(volatile)
    if client.volatile_at == "top" and volatile:
        return f"{shared.intro}\n{lines}\n\n{shared.instructions}\n\n{env}"
    tail = f"\n{lines}" if volatile else ""
    return f"{shared.intro}\n\n{shared.instructions}\n\n{env}{tail}"


def _env_item(cwd: str, born: int) -> dict[str, Any]:
    env = (
        f"<environment_context>\n  <cwd>{cwd}</cwd>\n"
        f"  <current_time>{text.now_sentinel(born)}</current_time>\n</environment_context>"
    )
    return {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": env}]}


def render_session(script: Script, client: Client, shared: Shared, seed: int, cwd: str) -> list[Event]:
    """The session's requests (see the module docstring)."""
    events: list[Event] = []
    history: list[dict[str, Any]] = []
    tools = [_tool(t, client.api) for t in script.tools]
    path = CHAT if client.api == "chat" else RESPONSES
    headers = {client.session_header: script.session_id} if client.session_header else {}
    now = script.start
    if client.api == "responses" and client.rerender_history:
        history.append(_env_item(cwd, now))

    def send(model: str) -> None:
        rng = random.Random(seed * 1_000_003 + len(events))
        raw = orjson.dumps(history)
        context = len(raw) // 4
        items: list[Any] = orjson.loads(text.fill_now(raw, now, client.rerender_history))
        request_tools = list(tools)
        if client.shuffle_tools:
            rng.shuffle(request_tools)
        if client.reorder_schema:
            request_tools = [text.reordered(t, rng) for t in request_tools]
        system = _system(client, shared, cwd, now, rng, context)
        body: dict[str, Any] = {"model": model}
        if client.api == "chat":
            body["messages"] = [{"role": "system", "content": system}, *items]
            body["tools"] = request_tools
        else:
            body["instructions"] = system
            body["input"] = items
            body["tools"] = request_tools
            body["tool_choice"] = "auto"
            body["parallel_tool_calls"] = True
            body["store"] = False
        if client.prompt_cache_key:
            body["prompt_cache_key"] = script.session_id
        if client.stream:
            body["stream"] = True
            if client.api == "chat":
                body["stream_options"] = {"include_usage": True}
        events.append(Event(now, path, dict(headers), body))

    for turn in script.turns:
        now += turn.gap
        content = turn.text + (f"\n\n{turn.attachment}" if turn.attachment else "")
        if client.api == "chat":
            history.append({"role": "user", "content": content})
        else:
            history.append(
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": content}]}
            )
        send(turn.model)
        for step in turn.steps:
            if client.api == "chat":
                calls = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": orjson.dumps(c.input).decode()},
                    }
                    for c in step.calls
                ]
                history.append({"role": "assistant", "content": step.text, "tool_calls": calls})
                history.extend(
                    {"role": "tool", "tool_call_id": c.id, "content": c.result} for c in step.calls
                )
            else:
                history.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": step.text}],
                    }
                )
                history.extend(
                    {
                        "type": "function_call",
                        "call_id": c.id,
                        "name": c.name,
                        "arguments": orjson.dumps(c.input).decode(),
                    }
                    for c in step.calls
                )
                history.extend(
                    {"type": "function_call_output", "call_id": c.id, "output": c.result} for c in step.calls
                )
            now += step.gap
            send(turn.model)
        if client.api == "chat":
            history.append({"role": "assistant", "content": turn.answer})
        else:
            history.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": turn.answer}],
                }
            )
    if script.abandoned and events and script.tools:
        events[-1].headers[TOOL_CALL_HEADER] = script.tools[0].name
    return events
