"""FakeUpstream: a scripted provider on 127.0.0.1:0 that records every request it receives.

Not a simulator: answers are fixed per path (see `ANTHROPIC_MESSAGE`, `CHAT_COMPLETION`,
`RESPONSE`), enough to check that bytes, headers and usage pass through the proxy unchanged.
Behaviour switches (`mode`): `normal`, `gzip` (gzip-encoded JSON), `stall` (never answers),
`overloaded` (429 to everything),
`hang_stream` (sends the first SSE event, then waits until the client goes away).
`anthropic_script` scripts per-response ids, usage and diagnostics for multi-turn tests.
"""

from __future__ import annotations

import asyncio
import gzip
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict

from proxy.sim.eventstream import chunk_event

ANTHROPIC_USAGE = {
    "input_tokens": 21,
    "cache_creation_input_tokens": 1500,
    "cache_read_input_tokens": 3000,
    "cache_creation": {"ephemeral_5m_input_tokens": 1000, "ephemeral_1h_input_tokens": 500},
    "output_tokens": 7,
}

ANTHROPIC_MESSAGE: dict[str, Any] = {
    "id": "msg_fake_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-6",
    "content": [{"type": "text", "text": "Hello there"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": ANTHROPIC_USAGE,
}

CONVERSE_RESPONSE: dict[str, Any] = {
    "output": {"message": {"role": "assistant", "content": [{"text": "Hello there"}]}},
    "stopReason": "end_turn",
    "usage": {
        "inputTokens": 21,
        "outputTokens": 7,
        "totalTokens": 4528,
        "cacheReadInputTokens": 3000,
        "cacheWriteInputTokens": 1500,
    },
    "metrics": {"latencyMs": 1},
}

CHAT_COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-fake",
    "object": "chat.completion",
    "created": 1764400000,
    "model": "gpt-5.1",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop", "logprobs": None}
    ],
    "usage": {
        "prompt_tokens": 2048,
        "completion_tokens": 5,
        "total_tokens": 2053,
        "prompt_tokens_details": {"cached_tokens": 1920},
    },
}

RESPONSE: dict[str, Any] = {
    "id": "resp_fake",
    "object": "response",
    "created_at": 1764400000,
    "status": "completed",
    "model": "gpt-5.1",
    "output": [
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hi", "annotations": []}],
        }
    ],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "usage": {
        "input_tokens": 4096,
        "input_tokens_details": {"cached_tokens": 3968, "cache_write_tokens": 0},
        "output_tokens": 9,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 4105,
    },
}


def _sse(event: str | None, data: Any) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


def anthropic_stream(base: dict[str, Any] | None = None) -> list[bytes]:
    """The event sequence of a streamed Messages response; usage cumulative on message_delta."""
    base = ANTHROPIC_MESSAGE if base is None else base
    usage = base["usage"]
    start_usage = {**usage, "output_tokens": 1}
    message = {**base, "content": [], "stop_reason": None, "usage": start_usage}
    return [
        _sse("message_start", {"type": "message_start", "message": message}),
        _sse(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        _sse(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello there"}},
        ),
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": usage["output_tokens"]},
            },
        ),
        _sse("message_stop", {"type": "message_stop"}),
    ]


def anthropic_stream_events(base: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON events of `anthropic_stream(base)` (Bedrock wraps each in an event-stream frame)."""
    return [orjson.loads(frame.split(b"data: ", 1)[1]) for frame in anthropic_stream(base)]


def chat_stream(include_usage: bool) -> list[bytes]:
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1764400000, "model": "gpt-5.1"}
    chunks = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}, "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    out = [_sse(None, {**c, "usage": None} if include_usage else c) for c in chunks]
    if include_usage:
        out.append(_sse(None, {**base, "choices": [], "usage": CHAT_COMPLETION["usage"]}))
    out.append(b"data: [DONE]\n\n")
    return out


def responses_stream() -> list[bytes]:
    created = {**RESPONSE, "status": "in_progress", "output": [], "usage": None}
    return [
        _sse("response.created", {"type": "response.created", "sequence_number": 0, "response": created}),
        _sse(
            "response.output_text.delta",
            {
                "type": "response.output_text.delta",
                "sequence_number": 1,
                "item_id": "msg_1",
                "output_index": 0,
                "content_index": 0,
                "delta": "Hi",
                "logprobs": [],
            },
        ),
        _sse("response.completed", {"type": "response.completed", "sequence_number": 2, "response": RESPONSE}),
    ]


@dataclass
class Received:
    method: str
    path: str
    query: str
    headers: CIMultiDict[str]
    body: bytes


@dataclass
class FakeUpstream:
    mode: str = "normal"
    received: list[Received] = field(default_factory=list)
    anthropic_script: list[dict[str, Any]] = field(default_factory=list)
    """Per-response overrides for `/v1/messages`, used first-in first-out: each one's top-level
    keys (`id`, `usage`, `diagnostics` ...) replace `ANTHROPIC_MESSAGE`'s, streamed or not.
    Empty: every answer is `ANTHROPIC_MESSAGE`."""
    client_gone: asyncio.Event = field(default_factory=asyncio.Event)
    runner: web.AppRunner | None = None
    url: str = ""

    async def start(self) -> str:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # records the body bytes as they arrive (a coding the proxy forwarded stays encoded)
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None, auto_decompress=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self.url

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.received.append(
            Received(request.method, request.path, request.query_string, CIMultiDict(request.headers), body)
        )
        if self.mode == "stall":
            await asyncio.Event().wait()
        if self.mode == "overloaded":
            error = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
            return web.json_response(error, status=429)
        text = gzip.decompress(body) if request.headers.get("Content-Encoding") == "gzip" else body
        payload: Any = orjson.loads(text) if text and request.method == "POST" else {}
        is_stream = isinstance(payload, dict) and payload.get("stream") is True
        if request.path.endswith("/converse"):
            return self._json(CONVERSE_RESPONSE)
        if request.path.endswith("/invoke-with-response-stream"):
            return await self._frames(request, anthropic_stream_events(ANTHROPIC_MESSAGE))
        if request.path.endswith(("/v1/messages", ":rawPredict", ":streamRawPredict", "/invoke")):
            is_stream = is_stream or request.path.endswith(":streamRawPredict")
            message = ANTHROPIC_MESSAGE
            if self.anthropic_script:
                message = {**ANTHROPIC_MESSAGE, **self.anthropic_script.pop(0)}
            if is_stream:
                return await self._stream(request, anthropic_stream(message))
            return self._json(message)
        if request.path.endswith("/chat/completions"):  # also Azure /openai/deployments/{d}/...
            if is_stream:
                include = bool((payload.get("stream_options") or {}).get("include_usage"))
                return await self._stream(request, chat_stream(include))
            return self._json(CHAT_COMPLETION)
        if request.path.endswith("/v1/responses"):
            if is_stream:
                return await self._stream(request, responses_stream())
            return self._json(RESPONSE)
        if request.path.endswith("/v1/models"):
            return self._json({"data": [{"id": "claude-sonnet-4-6", "type": "model"}], "has_more": False})
        return web.json_response({"error": {"message": "no such path", "type": "invalid_request_error"}}, status=404)

    def _json(self, data: Any) -> web.Response:
        raw = orjson.dumps(data)
        if self.mode == "gzip":
            return web.Response(
                body=gzip.compress(raw),
                headers={"Content-Type": "application/json", "Content-Encoding": "gzip", "x-fake": "1"},
            )
        return web.Response(body=raw, headers={"Content-Type": "application/json", "x-fake": "1"})

    async def _frames(self, request: web.Request, events: list[dict[str, Any]]) -> web.StreamResponse:
        """Bedrock's `invoke-with-response-stream`: each event in an AWS event-stream `chunk`."""
        response = web.StreamResponse(headers={"Content-Type": "application/vnd.amazon.eventstream"})
        await response.prepare(request)
        for event in events:
            await response.write(chunk_event(event))
        await response.write_eof()
        return response

    async def _stream(self, request: web.Request, events: list[bytes]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        try:
            for i, event in enumerate(events):
                await response.write(event)
                if self.mode == "hang_stream" and i == 0:
                    await asyncio.Event().wait()
            await response.write_eof()
        except (asyncio.CancelledError, ConnectionResetError):
            self.client_gone.set()
            raise
        return response
