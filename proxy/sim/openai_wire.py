"""OpenAI response shapes: Chat Completions and Responses, JSON and SSE.

Contract (docs/provider-rules.md 2.4; openai-python types `CompletionUsage`, `ResponseUsage`, stream events):
- Chat: `prompt_tokens` includes cached tokens; `prompt_tokens_details.cached_tokens` is always
  present (0 on a miss); `cache_write_tokens` only on breakpoint (GPT-5.6+) models. Streaming
  sends `chat.completion.chunk` frames; with `stream_options.include_usage` every chunk carries
  `usage: null` and one extra chunk with empty `choices` and the whole usage comes last; then
  `data: [DONE]`.
- Responses: `usage.input_tokens` includes cached; `input_tokens_details.cached_tokens` and
  `cache_write_tokens` are always present. Streaming sends `event:`/`data:` frames from
  `response.created` to `response.completed` (which carries the usage), with `sequence_number`s.
  A call of a function tool is a `function_call` item (`response.function_call_arguments.*`
  events), a call of a custom tool a `custom_tool_call` item with an `input` string
  (`response.custom_tool_call_input.*` events), as openai-python's `responses/` types define them.
- Conversations (`chat_conversation`, `responses_conversation`): offered tools are Chat
  `function` tools; Responses `function` and `custom` tools, namespace members, and the tools of
  `additional_tools` input items. The last user text skips trailing system/developer messages.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from proxy.sim.openai import OpenAIPlan
from proxy.sim.replies import Conversation, Reply, Tool, functions
from proxy.sim.tokens import TokenCounter


@dataclass(frozen=True, slots=True)
class Ids:
    """Deterministic ids of one request (from the simulator's request counter)."""

    response: str
    item: str
    call: str
    created: int


def output_tokens(reply: Reply, counter: TokenCounter) -> int:
    if reply.tool_call is not None:
        return counter.count(reply.tool_call.name) + counter.count(reply.tool_call.arguments)
    return counter.count(reply.text or "")


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") in ("text", "input_text")
        )
    return ""


_INSTRUCTION_ROLES: Final = frozenset({"system", "developer"})


def _last_user_text(items: list[dict[str, Any]]) -> str | None:
    """Own text of the last user message once trailing system/developer messages (and, in
    Responses, `additional_tools` items) are skipped: instructions appended after the user's turn
    are not the user speaking. A tool output (or an assistant message) last gives `None`."""
    end = len(items)
    while end and (
        items[end - 1].get("role") in _INSTRUCTION_ROLES or items[end - 1].get("type") == "additional_tools"
    ):
        end -= 1
    last = items[end - 1] if end else None
    if last is None or last.get("role") != "user" or last.get("type", "message") != "message":
        return None
    return _text_of(last.get("content"))


def chat_conversation(body: Mapping[str, Any]) -> Conversation:
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    turns = sum(1 for m in messages if m.get("role") == "user")
    offered = body.get("tools")
    tools = functions(
        *(
            str(t["function"]["name"])
            for t in (offered if isinstance(offered, list) else [])
            if isinstance(t, dict) and isinstance(t.get("function"), dict) and "name" in t["function"]
        )
    )
    return Conversation(turns, tools, _last_user_text(messages))


def responses_tools(tools: Any, namespace: str | None = None) -> list[Tool]:
    """Tools a Responses tool list offers: `function` and `custom` entries, and the members of
    `namespace` entries (openai-python `responses/namespace_tool.py`). Server tools (web search,
    file search ...) cannot be scripted and are left out."""
    out: list[Tool] = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            continue
        kind = tool.get("type")
        if kind in ("function", "custom"):
            out.append(Tool(tool["name"], kind, namespace))
        elif kind == "namespace" and namespace is None:
            out.extend(responses_tools(tool.get("tools"), tool["name"]))
    return out


def responses_conversation(body: Mapping[str, Any]) -> Conversation:
    """Reply-relevant facts of a Responses request. Offered tools: top-level `tools`, then the
    `tools` of every `additional_tools` input item (tools made available at that item; openai-python
    `beta/beta_response_input_item_param.py` `AdditionalTools`)."""
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    items = [i for i in (items if isinstance(items, list) else []) if isinstance(i, dict)]
    turns = sum(1 for i in items if i.get("role") == "user" and i.get("type", "message") == "message")
    tools = responses_tools(body.get("tools"))
    for item in items:
        if item.get("type") == "additional_tools":
            tools.extend(responses_tools(item.get("tools")))
    return Conversation(turns, tuple(tools), _last_user_text(items))


# --- Chat Completions -------------------------------------------------------------------


def chat_usage(plan: OpenAIPlan, out: int, breakpoints: bool) -> dict[str, Any]:
    details: dict[str, Any] = {"cached_tokens": plan.cached_tokens, "audio_tokens": 0}
    if breakpoints:
        details["cache_write_tokens"] = plan.cache_write_tokens
    return {
        "prompt_tokens": plan.prompt_tokens,
        "completion_tokens": out,
        "total_tokens": plan.prompt_tokens + out,
        "prompt_tokens_details": details,
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _chat_message(reply: Reply, ids: Ids) -> tuple[dict[str, Any], str]:
    if reply.tool_call is not None:
        call = {
            "id": ids.call,
            "type": "function",
            "function": {"name": reply.tool_call.name, "arguments": reply.tool_call.arguments},
        }
        return {"role": "assistant", "content": None, "refusal": None, "tool_calls": [call]}, "tool_calls"
    return {"role": "assistant", "content": reply.text, "refusal": None}, "stop"


def chat_body(model: str, reply: Reply, ids: Ids, usage: dict[str, Any]) -> dict[str, Any]:
    message, finish = _chat_message(reply, ids)
    return {
        "id": ids.response,
        "object": "chat.completion",
        "created": ids.created,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": usage,
        "service_tier": "default",
        "system_fingerprint": "fp_promptcache_sim",
    }


def chat_chunks(
    model: str, reply: Reply, ids: Ids, usage: dict[str, Any], include_usage: bool
) -> Iterator[bytes]:
    """`data:` frames of a streamed chat completion, ending with `data: [DONE]`."""
    base = {
        "id": ids.response,
        "object": "chat.completion.chunk",
        "created": ids.created,
        "model": model,
        "service_tier": "default",
        "system_fingerprint": "fp_promptcache_sim",
    }

    def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
        frame: dict[str, Any] = {
            **base,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            frame["usage"] = None
        return b"data: " + orjson.dumps(frame) + b"\n\n"

    if reply.tool_call is not None:
        call = reply.tool_call
        yield chunk(
            {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "tool_calls": [
                    {
                        "index": 0,
                        "id": ids.call,
                        "type": "function",
                        "function": {"name": call.name, "arguments": ""},
                    }
                ],
            },
            None,
        )
        yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": call.arguments}}]}, None)
        finish = "tool_calls"
    else:
        yield chunk({"role": "assistant", "content": "", "refusal": None}, None)
        text = reply.text or ""
        cut = text.find(" ", len(text) // 2)
        for piece in [text] if cut < 0 else [text[:cut], text[cut:]]:
            yield chunk({"content": piece}, None)
        finish = "stop"
    yield chunk({}, finish)
    if include_usage:
        yield b"data: " + orjson.dumps({**base, "choices": [], "usage": usage}) + b"\n\n"
    yield b"data: [DONE]\n\n"


# --- Responses --------------------------------------------------------------------------


def responses_usage(plan: OpenAIPlan, out: int, breakpoints: bool) -> dict[str, Any]:
    details: dict[str, Any] = {
        "cached_tokens": plan.cached_tokens,
        "cache_write_tokens": plan.cache_write_tokens,
    }
    if breakpoints:
        details["cache_write_tokens_details"] = {
            "ttl_30m_tokens": plan.cache_write_tokens,
            "ttl_12h_tokens": 0,
        }
    return {
        "input_tokens": plan.prompt_tokens,
        "input_tokens_details": details,
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": plan.prompt_tokens + out,
    }


def _output_item(reply: Reply, ids: Ids, status: str) -> dict[str, Any]:
    """The output item of a reply: a `message`, a `function_call`, or a `custom_tool_call`
    (openai-python `responses/response_custom_tool_call.py`: `input` string, no `status`); a call
    of a namespaced tool carries its `namespace`. Arguments / input are empty while in progress."""
    call = reply.tool_call
    if call is not None:
        done = status == "completed"
        item: dict[str, Any]
        if call.is_custom:
            item = {
                "type": "custom_tool_call",
                "id": ids.item,
                "call_id": ids.call,
                "name": call.name,
                "input": call.arguments if done else "",
            }
        else:
            item = {
                "type": "function_call",
                "id": ids.item,
                "call_id": ids.call,
                "name": call.name,
                "arguments": call.arguments if done else "",
                "status": status,
            }
        if call.namespace is not None:
            item["namespace"] = call.namespace
        return item
    content = [{"type": "output_text", "text": reply.text or "", "annotations": [], "logprobs": []}]
    return {
        "type": "message",
        "id": ids.item,
        "status": status,
        "role": "assistant",
        "content": content if status == "completed" else [],
    }


def item_id(reply: Reply, n: int) -> str:
    """Id of the output item of request number `n`: `msg_`, `fc_` or `ctc_` + `sim_NNNNNN`."""
    call = reply.tool_call
    prefix = "msg" if call is None else "ctc" if call.is_custom else "fc"
    return f"{prefix}_sim_{n:06d}"


def responses_body(
    body: Mapping[str, Any],
    model: str,
    reply: Reply | None,
    ids: Ids,
    usage: dict[str, Any] | None,
    diagnosis: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A `Response` object; `reply=None` gives the in-progress shell of `response.created`.
    `diagnosis` is the `prompt_cache_diagnostics` object (proxy.sim.diagnostics), when asked."""
    data = {
        "id": ids.response,
        "object": "response",
        "created_at": ids.created,
        "status": "completed" if reply is not None else "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": model,
        "output": [_output_item(reply, ids, "completed")] if reply is not None else [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": {"effort": None, "summary": None},
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": usage,
        "metadata": body.get("metadata") or {},
    }
    if diagnosis is not None:
        data["prompt_cache_diagnostics"] = diagnosis
    return data


def responses_events(
    body: Mapping[str, Any],
    model: str,
    reply: Reply,
    ids: Ids,
    usage: dict[str, Any],
    diagnosis: dict[str, Any] | None = None,
) -> Iterator[bytes]:
    """`event:`/`data:` frames of a streamed response, `response.created` .. `response.completed`."""
    seq = 0

    def frame(kind: str, data: dict[str, Any]) -> bytes:
        nonlocal seq
        payload = {"type": kind, "sequence_number": seq, **data}
        seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    shell = responses_body(body, model, None, ids, None)
    yield frame("response.created", {"response": shell})
    yield frame("response.in_progress", {"response": shell})
    yield frame(
        "response.output_item.added", {"output_index": 0, "item": _output_item(reply, ids, "in_progress")}
    )
    if reply.tool_call is not None and reply.tool_call.is_custom:
        where = {"item_id": ids.item, "output_index": 0}
        text = reply.tool_call.arguments
        yield frame("response.custom_tool_call_input.delta", {**where, "delta": text})
        yield frame("response.custom_tool_call_input.done", {**where, "input": text})
    elif reply.tool_call is not None:
        args = reply.tool_call.arguments
        yield frame(
            "response.function_call_arguments.delta", {"item_id": ids.item, "output_index": 0, "delta": args}
        )
        yield frame(
            "response.function_call_arguments.done",
            {"item_id": ids.item, "output_index": 0, "arguments": args, "name": reply.tool_call.name},
        )
    else:
        text = reply.text or ""
        where = {"item_id": ids.item, "output_index": 0, "content_index": 0}
        empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        yield frame("response.content_part.added", {**where, "part": empty})
        cut = text.find(" ", len(text) // 2)
        for piece in [text] if cut < 0 else [text[:cut], text[cut:]]:
            yield frame("response.output_text.delta", {**where, "delta": piece, "logprobs": []})
        yield frame("response.output_text.done", {**where, "text": text, "logprobs": []})
        yield frame("response.content_part.done", {**where, "part": {**empty, "text": text}})
    yield frame(
        "response.output_item.done", {"output_index": 0, "item": _output_item(reply, ids, "completed")}
    )
    yield frame("response.completed", {"response": responses_body(body, model, reply, ids, usage, diagnosis)})
