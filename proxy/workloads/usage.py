"""Read input-side usage from an upstream response (JSON or SSE), for replay accounting.

Contract: `read_usage(path, content_type, data)` returns a `proxy.providers.base.Usage`
(tokens): `cache_read`, `cache_write_5m`, `cache_write_1h`, `input_none` (neither read nor
written) and `output`, with `seen` false when the response carried no usage. Fields as the APIs
report them (docs/provider-rules.md 1.10, 2.4):
- Anthropic: `cache_read_input_tokens`, `cache_creation.ephemeral_{5m,1h}_input_tokens` (else all
  of `cache_creation_input_tokens` as 5m), `input_tokens`; streamed: `message_start`'s usage
  overlaid field by field with each `message_delta`'s (cumulative, last value wins).
- OpenAI Chat / Responses: `prompt_tokens` / `input_tokens` include cached and written tokens;
  `cached_tokens` is the read, `cache_write_tokens` (GPT-5.6+) is counted as `cache_write_5m`;
  streamed: the last chunk with a `usage` object / `response.completed`.
Kept apart from the proxy's own usage tee so replay measures the upstream independently.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.providers.base import Usage
from proxy.sse import SSEDecoder


def _anthropic(usage: dict[str, Any]) -> Usage:
    created = int(usage.get("cache_creation_input_tokens") or 0)
    split = usage.get("cache_creation")
    w1h = int(split.get("ephemeral_1h_input_tokens") or 0) if isinstance(split, dict) else 0
    w5m = int(split.get("ephemeral_5m_input_tokens") or 0) if isinstance(split, dict) else created
    return Usage(
        input_none=int(usage.get("input_tokens") or 0),
        cache_read=int(usage.get("cache_read_input_tokens") or 0),
        cache_write_5m=w5m,
        cache_write_1h=w1h,
        output=int(usage.get("output_tokens") or 0),
        seen=True,
    )


def _openai(usage: dict[str, Any]) -> Usage:
    prompt = int(usage.get("prompt_tokens", usage.get("input_tokens")) or 0)
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    read = int(details.get("cached_tokens") or 0)
    write = int(details.get("cache_write_tokens") or 0)
    output = int(usage.get("completion_tokens", usage.get("output_tokens")) or 0)
    return Usage(
        input_none=prompt - read - write, cache_read=read, cache_write_5m=write, output=output, seen=True
    )


def _from_events(path: str, events: list[tuple[str, Any]]) -> Usage:
    if path == "/v1/messages":
        merged: dict[str, Any] = {}
        for name, data in events:
            if name == "message_start":
                merged.update((data.get("message") or {}).get("usage") or {})
            elif name == "message_delta":
                merged.update(data.get("usage") or {})
        return _anthropic(merged) if merged else Usage()
    last: dict[str, Any] | None = None
    for name, data in events:
        if name == "response.completed":
            last = (data.get("response") or {}).get("usage") or last
        elif isinstance(data.get("usage"), dict):
            last = data["usage"]
    return _openai(last) if last else Usage()


def read_usage(path: str, content_type: str, data: bytes) -> Usage:
    """Usage of one response body (see the module docstring)."""
    if "text/event-stream" in content_type:
        decoder = SSEDecoder()
        raw = decoder.decode(data) + decoder.flush()
        events = []
        for event in raw:
            if event.data == "[DONE]":
                continue
            try:
                parsed = orjson.loads(event.data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(parsed, dict):
                events.append((str(parsed.get("type", event.event)), parsed))
        return _from_events(path, events)
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return Usage()
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return Usage()
    return _anthropic(usage) if path == "/v1/messages" else _openai(usage)
