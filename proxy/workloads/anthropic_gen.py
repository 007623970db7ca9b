"""Render scripts as Anthropic Messages requests, with the quirks of real clients.

Contract: `render_session(script, client, shared, seed)` returns the session's requests as
`Event`s (absolute trace seconds); the same arguments give the same bodies. Each request carries
the whole conversation so far (the client resends history every turn). Quirks (`Client`) model
what breaks a provider's prefix cache: a volatile first system block (billing header with a
per-request `cch`), timestamps / UUIDs / context counters in the system prompt, tools shuffled
or schema keys reordered per request, earlier user messages re-rendered with the current time,
`tool_use.input` re-serialised with another key order, and the client's own `cache_control`
placement (none, Claude Code style, automatic, last human message, Hermes `system_and_3`, or
five markers, which the API refuses).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Final

import orjson

from proxy.workloads import text
from proxy.workloads.script import TOOL_CALL_HEADER, Event, Script, Tool

PATH: Final = "/v1/messages"
COMPACT_PROMPT: Final = (
    "Your task is to create a detailed summary of the conversation so far, paying close attention "
    "to the user's explicit requests and your previous actions."
)
CONTINUED: Final = (
    "This session is being continued from a previous conversation that ran out of context. "
    "The conversation is summarized below:\n"
)
MARKER_STYLES: Final = frozenset({"none", "claude-code", "automatic", "last-human", "system-and-3", "five"})


@dataclass(frozen=True, slots=True)
class Client:
    """How a client renders requests (see the module docstring)."""

    system_style: str = "blocks"
    """`blocks` (a list of text blocks) or `string`."""
    billing_header: bool = False
    """A first system block `x-anthropic-billing-header: cc_version=...; cch=<per request>;`."""
    volatile: tuple[str, ...] = ()
    """System lines that change every request: `timestamp`, `uuid`, `counter`."""
    volatile_at: str = "bottom"
    """`top` (before the long instructions) or `bottom` (in the environment section)."""
    markers: str = "none"
    """One of `MARKER_STYLES`."""
    ttl: str | None = None
    """`ttl` of the client's markers (`None` = the API default, 5 minutes)."""
    shuffle_tools: bool = False
    reorder_schema: bool = False
    rerender_history: bool = False
    """Each user message starts with a reminder holding the *current* time, re-rendered."""
    reserialise_inputs: bool = False
    """`tool_use.input` keys come out in another order on every request."""
    reminders: bool = False
    """A `<system-reminder>` text block after each batch of tool results."""
    stream: bool = False
    string_content: bool = False
    """Human messages as plain strings instead of text blocks."""
    session_header: str | None = "x-claude-code-session-id"
    betas: str | None = None
    max_tokens: int = 8192


@dataclass(frozen=True, slots=True)
class Shared:
    """What every session of one trace shares."""

    instructions: str
    """The long, stable part of the system prompt."""
    intro: str = "You are Claude Code, Anthropic's official CLI for Claude."


def tool_json(tool: Tool) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "input_schema": tool.schema()}


def _system(client: Client, shared: Shared, cwd: str, now: int, rng: random.Random, context: int) -> Any:
    volatile = []
    if "timestamp" in client.volatile:
        volatile.append(f"Current time: {text.timestamp(now)}")
    if "uuid" in client.volatile:
        volatile.append(f"Request id: {text.uuid4(rng)}")
    if "counter" in client.volatile:
        volatile.append(f"Context used: {context} tokens of 200000 ({context * 100 // 200000}%)")
    env = f"<env>\nWorking directory: {cwd}\nIs directory a git repo: Yes\nPlatform: linux\n</env>"
    if client.volatile_at == "top":
        main = (
            "\n".join(volatile) + "\n\n" + shared.instructions + "\n\n" + env
            if volatile
            else (shared.instructions + "\n\n" + env)
        )
    else:
        tail = ("\n" + "\n".join(volatile)) if volatile else ""
        main = shared.instructions + "\n\n" + env + tail
    if client.system_style == "string":
        return shared.intro + "\n\n" + main
    blocks = []
    if client.billing_header:
        cch = text.hex_string(rng, 5)
        blocks.append(
            {
                "type": "text",
                "text": f"x-anthropic-billing-header: cc_version=2.1.328.a1b; cc_entrypoint=cli; cch={cch};",
            }
        )
    blocks.append({"type": "text", "text": shared.intro})
    blocks.append({"type": "text", "text": main})
    return blocks


def _marker(client: Client) -> dict[str, str]:
    return {"type": "ephemeral", "ttl": client.ttl} if client.ttl else {"type": "ephemeral"}


def _mark_message(message: dict[str, Any], marker: dict[str, str]) -> None:
    content = message["content"]
    if isinstance(content, str):
        message["content"] = content = [{"type": "text", "text": content}]
    content[-1]["cache_control"] = dict(marker)


def _mark_system(body: dict[str, Any], marker: dict[str, str]) -> None:
    system = body.get("system")
    if isinstance(system, str):
        body["system"] = system = [{"type": "text", "text": system}]
    if system:
        system[-1]["cache_control"] = dict(marker)


def apply_markers(body: dict[str, Any], client: Client) -> None:
    """Place the client's own `cache_control` markers (in place) per `client.markers`."""
    style = client.markers
    marker = _marker(client)
    messages = body["messages"]
    if style == "none":
        return
    if style == "automatic":
        body["cache_control"] = marker
        return
    _mark_system(body, marker)
    if style == "claude-code":
        _mark_message(messages[-1], marker)
    elif style == "last-human":
        for message in reversed(messages):
            content = message["content"]
            is_results = isinstance(content, list) and any(b.get("type") == "tool_result" for b in content)
            if message["role"] == "user" and not is_results:
                _mark_message(message, marker)
                break
    elif style in ("system-and-3", "five"):
        for message in messages[-3:]:
            _mark_message(message, marker)
        if style == "five" and body.get("tools"):
            body["tools"][-1]["cache_control"] = dict(marker)


def _render_messages(
    history: list[dict[str, Any]], client: Client, now: int, rng: random.Random
) -> list[Any]:
    raw = text.fill_now(orjson.dumps(history), now, client.rerender_history)
    messages: list[Any] = orjson.loads(raw)
    if client.reserialise_inputs:
        for message in messages:
            if isinstance(message["content"], list):
                for block in message["content"]:
                    if block.get("type") == "tool_use":
                        block["input"] = text.reordered(block["input"], rng)
    return messages


def _user_message(client: Client, parts: list[str], born: int) -> dict[str, Any]:
    if client.rerender_history:
        parts = [f"<system-reminder>\nCurrent time: {text.now_sentinel(born)}\n</system-reminder>", *parts]
    if client.string_content:
        return {"role": "user", "content": "\n\n".join(parts)}
    return {"role": "user", "content": [{"type": "text", "text": p} for p in parts]}


def render_session(script: Script, client: Client, shared: Shared, seed: int, cwd: str) -> list[Event]:
    """The session's requests (see the module docstring)."""
    events: list[Event] = []
    history: list[dict[str, Any]] = []
    tools = [tool_json(t) for t in script.tools]
    headers: dict[str, str] = {}
    if client.session_header:
        headers[client.session_header] = script.session_id
    if client.betas:
        headers["anthropic-beta"] = client.betas
    now = script.start

    def send(model: str) -> None:
        rng = random.Random(seed * 1_000_003 + len(events))
        context = len(orjson.dumps(history)) // 4
        request_tools = [dict(t) for t in tools]
        if client.shuffle_tools:
            rng.shuffle(request_tools)
        if client.reorder_schema:
            request_tools = [
                {**t, "input_schema": text.reordered(t["input_schema"], rng)} for t in request_tools
            ]
        body: dict[str, Any] = {"model": model, "max_tokens": client.max_tokens}
        body["system"] = _system(client, shared, cwd, now, rng, context)
        body["tools"] = request_tools
        body["messages"] = _render_messages(history, client, now, rng)
        if client.stream:
            body["stream"] = True
        apply_markers(body, client)
        events.append(Event(now, PATH, dict(headers), body))

    for h, turn in enumerate(script.turns):
        if turn.compact_before and history:
            now += 5
            history.append(_user_message(client, [COMPACT_PROMPT], now))
            send(turn.model)
            history = []
        now += turn.gap
        parts = [turn.text]
        if turn.attachment:
            parts.append(f"Contents of /repo/docs/part_{h}.py:\n{turn.attachment}")
        if turn.compact_before:
            parts.insert(0, CONTINUED + turn.summary)
        history.append(_user_message(client, parts, now))
        send(turn.model)
        for step in turn.steps:
            uses = [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.input} for c in step.calls]
            history.append({"role": "assistant", "content": [{"type": "text", "text": step.text}, *uses]})
            results: list[dict[str, Any]] = [
                {"type": "tool_result", "tool_use_id": c.id, "content": c.result} for c in step.calls
            ]
            if client.reminders:
                results.append(
                    {
                        "type": "text",
                        "text": f"<system-reminder>\n{len(results)} tool results above.\n</system-reminder>",
                    }
                )
            history.append({"role": "user", "content": results})
            now += step.gap
            send(turn.model)
        history.append({"role": "assistant", "content": [{"type": "text", "text": turn.answer}]})
    if script.abandoned and events and script.tools:
        events[-1].headers[TOOL_CALL_HEADER] = script.tools[0].name
    return events
