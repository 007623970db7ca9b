"""Bedrock Converse as the simulator judges it: `cachePoint` rules, then Anthropic accounting.

A Converse body is checked against Bedrock's checkpoint rules (docs/provider-rules.md 4, 7; AWS
prompt-caching guide) and rendered as a Messages body for the simulator's own cache model:

- at most 4 `cachePoint` blocks ("...exceeded the maximum of 4 cache points");
- a checkpoint inside `toolResult.content` is refused (it must be a sibling after it);
- a message whose content is only a checkpoint is refused;
- a checkpoint marks the block before it (tools, system or message content); `ttl` `5m` | `1h`
  must be one the model offers (its per-model table, `rules/simulator.yaml`);
- a checkpoint for a model without caching answers 403 (`proxy.sim.platforms`).

Answers: `{"output": {"message": ...}, "stopReason", "usage": {inputTokens, outputTokens,
totalTokens, cacheReadInputTokens, cacheWriteInputTokens}, "metrics"}`; `converse-stream` sends
event-stream events `messageStart`, `contentBlockDelta`, `contentBlockStop`, `messageStop`,
`metadata` (usage), each payload the event's JSON.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

import orjson

from proxy.sim.errors import Rejected
from proxy.sim.eventstream import encode_message

MAX_POINTS: Final = 4


def _validation(message: str) -> Rejected:
    return Rejected(400, message)


def _marker(point: Any, where: str) -> dict[str, Any]:
    if not isinstance(point, dict) or point.get("type") != "default":
        raise _validation(f"{where}.cachePoint.type: Member must satisfy enum value set: [default]")
    marker: dict[str, Any] = {"type": "ephemeral"}
    if "ttl" in point:
        marker["ttl"] = point["ttl"]
    return marker


def _content(blocks: list[Any], where: str, in_tool_result: bool = False) -> list[dict[str, Any]]:
    """Converse content blocks as Messages blocks, each checkpoint on the block before it."""
    out: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        if not isinstance(block, dict) or len(block) != 1:
            raise _validation(f"{where}.{j}: a content block must have exactly one member")
        ((kind, value),) = block.items()
        if kind == "cachePoint":
            if in_tool_result:
                raise _validation(f"{where}.{j}: cachePoint is not supported inside toolResult content")
            if not out:
                raise _validation(f"{where}.{j}: a cachePoint must follow the content it caches")
            out[-1]["cache_control"] = _marker(value, f"{where}.{j}")
        elif kind == "text":
            out.append({"type": "text", "text": str(value)})
        elif kind == "toolUse":
            out.append(
                {
                    "type": "tool_use",
                    "id": value.get("toolUseId"),
                    "name": value.get("name"),
                    "input": value.get("input") or {},
                }
            )
        elif kind == "toolResult":
            inner = _content(value.get("content") or [], f"{where}.{j}.toolResult.content", True)
            out.append({"type": "tool_result", "tool_use_id": value.get("toolUseId"), "content": inner})
        elif kind == "json":
            out.append({"type": "text", "text": orjson.dumps(value).decode()})
        else:
            out.append({"type": "text", "text": orjson.dumps(block).decode()})
    return out


def to_messages(body: Mapping[str, Any], model: str) -> dict[str, Any]:
    """The Messages body the simulator accounts for this Converse body; raises `Rejected`."""
    points = _count_points(body)
    if points > MAX_POINTS:
        raise _validation(f"The number of cache points in the request ({points}) exceeded the maximum of {MAX_POINTS}.")
    messages = []
    for i, message in enumerate(body.get("messages") or []):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list) or not content:
            raise _validation(f"messages.{i}.content: Member must have length greater than or equal to 1")
        if all(isinstance(b, dict) and "cachePoint" in b for b in content):
            raise _validation(f"messages.{i}.content: a message cannot contain only a cachePoint")
        messages.append({"role": message.get("role"), "content": _content(content, f"messages.{i}.content")})
    out: dict[str, Any] = {"model": model, "messages": messages}
    inference = body.get("inferenceConfig")
    out["max_tokens"] = inference.get("maxTokens", 4096) if isinstance(inference, dict) else 4096
    system = body.get("system")
    if isinstance(system, list) and system:
        out["system"] = _content(system, "system")
    config = body.get("toolConfig")
    tools = config.get("tools") if isinstance(config, dict) else None
    if isinstance(tools, list) and tools:
        rendered: list[dict[str, Any]] = []
        for t, tool in enumerate(tools):
            if isinstance(tool, dict) and "cachePoint" in tool:
                if not rendered:
                    raise _validation(f"toolConfig.tools.{t}: a cachePoint must follow the tools it caches")
                rendered[-1]["cache_control"] = _marker(tool["cachePoint"], f"toolConfig.tools.{t}")
                continue
            spec = tool.get("toolSpec") if isinstance(tool, dict) else None
            if not isinstance(spec, dict):
                raise _validation(f"toolConfig.tools.{t}: toolSpec is required")
            schema = (spec.get("inputSchema") or {}).get("json") or {"type": "object"}
            rendered.append(
                {"name": spec.get("name"), "description": spec.get("description", ""), "input_schema": schema}
            )
        out["tools"] = rendered
    return out


def _count_points(value: Any) -> int:
    if isinstance(value, dict):
        return (1 if "cachePoint" in value else 0) + sum(
            _count_points(v) for k, v in value.items() if k != "cachePoint"
        )
    if isinstance(value, list):
        return sum(_count_points(v) for v in value)
    return 0


def usage(anthropic_usage: Mapping[str, Any], out: int) -> dict[str, Any]:
    read = int(anthropic_usage["cache_read_input_tokens"])
    write = int(anthropic_usage["cache_creation_input_tokens"])
    uncached = int(anthropic_usage["input_tokens"])
    result: dict[str, Any] = {
        "inputTokens": uncached,
        "outputTokens": out,
        "totalTokens": uncached + read + write + out,
        "cacheReadInputTokens": read,
        "cacheWriteInputTokens": write,
    }
    split = anthropic_usage.get("cache_creation") or {}
    details = [
        {"ttl": ttl, "inputTokens": int(split.get(f"ephemeral_{ttl}_input_tokens", 0))}
        for ttl in ("5m", "1h")
        if split.get(f"ephemeral_{ttl}_input_tokens")
    ]
    if details:
        result["cacheDetails"] = details
    return result


def response_body(text: str, stop: str, usage_fields: dict[str, Any]) -> dict[str, Any]:
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": stop,
        "usage": usage_fields,
        "metrics": {"latencyMs": 1},
    }


def _event(name: str, data: Any) -> bytes:
    headers = {":event-type": name, ":content-type": "application/json", ":message-type": "event"}
    return encode_message(headers, orjson.dumps(data))


def stream_frames(text: str, stop: str, usage_fields: dict[str, Any]) -> Iterator[bytes]:
    yield _event("messageStart", {"role": "assistant"})
    yield _event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": text}})
    yield _event("contentBlockStop", {"contentBlockIndex": 0})
    yield _event("messageStop", {"stopReason": stop})
    yield _event("metadata", {"usage": usage_fields, "metrics": {"latencyMs": 1}})
