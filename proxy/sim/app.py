"""aiohttp application of the upstream simulator: provider routes and admin endpoints.

Contract:
- `create_sim_app(config, clock)` builds the app (default config `rules/simulator.yaml`, default
  real clock); the tokenizer loads off the loop in a `cleanup_ctx` step. `start_sim(host, port,
  config, clock)` starts it on the running loop and returns `(runner, "http://HOST:PORT")`.
- Platform routes (`proxy.sim.platforms`): Vertex AI `POST /v1/projects/{p}/locations/{r}/
  publishers/anthropic/models/{model}:rawPredict` (`:streamRawPredict`), Bedrock InvokeModel
  `POST /model/{model}/invoke` (`/invoke-with-response-stream`: AWS event-stream frames) and
  Converse `POST /model/{model}/converse` (`/converse-stream`; `proxy.sim.converse`), each
  with its platform's rejections; `/v1/messages` applies the `anthropic_platform` given to
  `create_sim_app` (default `direct`).
- Provider routes: `POST /v1/messages`, `POST /v1/messages/count_tokens` (Anthropic; any query
  string such as `?beta=true`, any `anthropic-beta` values), `POST /v1/chat/completions`,
  `POST /v1/responses` (OpenAI), `GET /v1/models[/{id}]` (Anthropic shape when the request has an
  `anthropic-version` or `x-api-key` header, else OpenAI; an unknown path's 404 likewise, unless
  its path is one API's only: `_provider`). Tenant = SHA-256 of the API key (`x-api-key`,
  `api-key` or `Authorization: Bearer`); a missing key is a 401 in the provider's error shape.
- Admin: `GET /_sim/clock`, `POST /_sim/clock {"advance": s} | {"set": epoch_s}` (manual clock
  only), `GET /_sim/cache` (live entries; tenant as a 12-hex-digit hash prefix, never the key),
  `DELETE /_sim/cache` (flush entries and OpenAI routing windows).
- Each request reads the clock once at its start (TTLs count from there, docs/provider-rules.md 1.7), and
  its cache writes are committed just before its response starts (1.5). Handlers never await
  between planning and committing, and nothing blocks the loop except CPU work on the body.
- A request body of `OFFLOOP_BODY_BYTES` or more is rendered and counted on a worker thread
  (`_counted`), with a `TokenCounter` of its own (a counter is not thread-safe; one such request
  renders at a time), before its plan is made on the loop: 2 MiB of text costs ~0.3 s of
  tokenising, which would otherwise stall every other request and `/healthz`. Counts are the same
  on either counter (the counting is deterministic); only the memos differ.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import orjson
from aiohttp import web

from proxy.sim import anthropic, anthropic_wire, converse, diagnostics, gateway, openai, openai_wire
from proxy.sim.cache import CacheStore, Entry
from proxy.sim.clock import Clock, ClockError
from proxy.sim.config import SimConfig
from proxy.sim.diagnostics import Fingerprints
from proxy.sim.errors import Rejected, anthropic_error_body, openai_error_body
from proxy.sim.eventstream import chunk_event
from proxy.sim.platforms import (
    AWS_ERROR_TYPES,
    BEDROCK_NO_CACHING,
    PLATFORMS,
    Platform,
    body_betas,
    check_betas,
    check_body,
    check_caching,
    model_name,
)
from proxy.sim.replies import choose_reply
from proxy.sim.tokens import TokenCounter, load_o200k

MAX_BODY_BYTES: Final = 64 * 1024 * 1024
OFFLOOP_BODY_BYTES: Final = 256 * 1024
"""Bodies this large or larger are rendered off the loop (~20 ms of tokenising and up)."""
EVENTSTREAM: Final = "application/vnd.amazon.eventstream"
ANTHROPIC_NO_KEY: Final = "x-api-key header is required"
OPENAI_NO_KEY: Final = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header "
    "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)


@dataclass(slots=True)
class SimState:
    """Everything the simulator keeps between requests (one per app)."""

    config: SimConfig
    clock: Clock
    store: CacheStore = field(default_factory=CacheStore)
    router: openai.Router = field(default_factory=openai.Router)
    fingerprints: Fingerprints = field(default_factory=Fingerprints)
    """OpenAI Responses fingerprints for `prompt_cache_diagnostics` (proxy.sim.diagnostics)."""
    counter: TokenCounter | None = None
    """Set by the startup step; `None` only before the app has started."""
    offloop: TokenCounter | None = None
    """The worker thread's counter for large bodies (built on first use, same encoding)."""
    offloop_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while a worker thread uses `offloop` (one large body renders at a time)."""
    anthropic_platform: str = "direct"
    """The platform whose rules `/v1/messages` applies (`proxy.sim.platforms`)."""
    openai_platform: str = "direct"
    """`litellm` / `openrouter`: Chat requests for Claude models go through `proxy.sim.gateway`."""
    requests: int = 0

    def next_request(self) -> int:
        self.requests += 1
        return self.requests

    def tokens(self) -> TokenCounter:
        if self.counter is None:  # app used without its startup step (unit tests)
            self.counter = TokenCounter()
        return self.counter


STATE: Final = web.AppKey("promptcache_sim_state", SimState)

T = TypeVar("T")


async def _counted(request: web.Request, work: Callable[[TokenCounter], T]) -> T:
    """`work(counter)`: on the loop for a small body, on a worker thread with the state's
    `offloop` counter for a body of `OFFLOOP_BODY_BYTES` or more (see the module docstring).
    `work` must touch nothing but its arguments (no store, no clock)."""
    state = request.app[STATE]
    counter = state.tokens()
    if len(await request.read()) < OFFLOOP_BODY_BYTES:
        return work(counter)
    async with state.offloop_lock:
        if state.offloop is None:
            state.offloop = TokenCounter(counter.encoding, max_counts=counter.max_counts)
        return await asyncio.to_thread(work, state.offloop)


def create_sim_app(
    config: SimConfig | None = None,
    clock: Clock | None = None,
    anthropic_platform: str = "direct",
    openai_platform: str = "direct",
) -> web.Application:
    """The simulator as an aiohttp app (see the module docstring); `anthropic_platform` is the
    platform `/v1/messages` behaves as (`proxy.sim.platforms.PLATFORMS`: `direct`,
    `strict-compatible`, `vertex`, `bedrock`, `foundry`); `openai_platform` `litellm` or
    `openrouter` makes `/v1/chat/completions` serve Claude model names as that gateway does
    (`proxy.sim.gateway`)."""
    if anthropic_platform not in PLATFORMS:
        raise ValueError(f"unknown platform {anthropic_platform!r} (known: {', '.join(PLATFORMS)})")
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_error_middleware])
    app[STATE] = SimState(config if config is not None else SimConfig.load(), clock or Clock.real())
    if openai_platform not in ("direct", *gateway.GATEWAYS):
        raise ValueError(f"unknown OpenAI platform {openai_platform!r}")
    app[STATE].anthropic_platform = anthropic_platform
    app[STATE].openai_platform = openai_platform
    app.cleanup_ctx.append(_load_tokenizer)
    app.router.add_post("/v1/messages", anthropic_messages)
    vertex = "/v1/projects/{project}/locations/{region}/publishers/anthropic/models/{action}"
    app.router.add_post(vertex, vertex_predict)
    app.router.add_post("/model/{model}/invoke", bedrock_invoke)
    app.router.add_post("/model/{model}/invoke-with-response-stream", bedrock_invoke)
    app.router.add_post("/model/{model}/converse", bedrock_converse)
    app.router.add_post("/model/{model}/converse-stream", bedrock_converse)
    app.router.add_post("/v1/messages/count_tokens", anthropic_count_tokens)
    app.router.add_post("/v1/chat/completions", openai_chat)
    app.router.add_post("/v1/responses", openai_responses)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model_id}", get_model)
    app.router.add_get("/_sim/clock", get_clock)
    app.router.add_post("/_sim/clock", set_clock)
    app.router.add_get("/_sim/cache", list_cache)
    app.router.add_delete("/_sim/cache", flush_cache)
    return app


async def start_sim(
    host: str = "127.0.0.1",
    port: int = 0,
    config: SimConfig | None = None,
    clock: Clock | None = None,
    anthropic_platform: str = "direct",
    openai_platform: str = "direct",
) -> tuple[web.AppRunner, str]:
    """Start the simulator on the running loop; returns the runner and `http://HOST:PORT`."""
    if config is None:
        config = await asyncio.to_thread(SimConfig.load)
    app = create_sim_app(config, clock, anthropic_platform, openai_platform)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1]
    shown = f"[{host}]" if ":" in host else host
    return runner, f"http://{shown}:{bound}"


async def _load_tokenizer(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    if state.counter is None:
        state.counter = TokenCounter(await asyncio.to_thread(load_o200k))
    yield


# --- plumbing ---------------------------------------------------------------------------


_OPENAI_ONLY: Final = ("/v1/chat/", "/v1/responses", "/v1/completions", "/v1/embeddings")
"""Path prefixes only OpenAI's API has: its error shape whatever the headers."""
_ANTHROPIC_ONLY: Final = ("/v1/messages", "/v1/projects/", "/v1/complete", "/v1/organizations/", "/v1/skills")
"""Path prefixes only Anthropic's API has (checked after `_OPENAI_ONLY`: `/v1/completions`)."""


def _provider(request: web.Request) -> str:
    """Whose API `request` is addressed to, for its error shape: by path where only one API has
    it, else (a shared name such as `/v1/models` or `/v1/files`, or an unknown path) Anthropic's
    when the request carries one of its headers (`anthropic-version`, `x-api-key`), else OpenAI's."""
    path = request.path
    if path.startswith("/model/"):
        return "bedrock"
    if path.startswith("/_sim/"):
        return "admin"
    if path.startswith(_OPENAI_ONLY):
        return "openai"
    if path.startswith(_ANTHROPIC_ONLY):
        return "anthropic"
    if "anthropic-version" in request.headers or "x-api-key" in request.headers:
        return "anthropic"
    return "openai"


def _json(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(data), status=status, content_type="application/json", headers=headers
    )


@web.middleware
async def _error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        try:
            return await handler(request)
        except (web.HTTPNotFound, web.HTTPMethodNotAllowed):
            # The real APIs answer unknown paths (and methods) with a JSON 404 in their own shape.
            if _provider(request) == "openai":
                raise Rejected(404, f"Invalid URL ({request.method} {request.path})") from None
            raise Rejected(404, "Not Found") from None
    except Rejected as exc:
        provider = _provider(request)
        if provider == "anthropic":
            return _json(anthropic_error_body(exc), exc.status)
        if provider == "openai":
            return _json(openai_error_body(exc), exc.status)
        if provider == "bedrock":
            kind = AWS_ERROR_TYPES.get(exc.status, "InternalServerException")
            return _json({"message": exc.message}, exc.status, headers={"x-amzn-ErrorType": kind})
        return _json({"error": {"message": exc.message}}, exc.status)


def _tenant(request: web.Request, missing: str) -> str:
    key = request.headers.get("x-api-key") or request.headers.get("api-key")
    if not key:
        auth = request.headers.get("Authorization", "")
        if auth[:7].lower() == "bearer ":
            key = auth[7:].strip()
    if not key:
        raise Rejected(401, missing)
    # the header's own bytes: aiohttp decodes them with `surrogateescape` (a key that is not UTF-8)
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as bad:
            raise Rejected(
                400, f"The request body is not valid UTF-8 (byte 0x{raw[bad.start]:02x} at offset {bad.start})"
            ) from exc
        raise Rejected(400, f"The request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise Rejected(400, "The request body must be a JSON object")
    try:
        orjson.dumps(body)
    except orjson.JSONEncodeError as exc:
        # orjson writes at most 254 levels, and the simulator re-serialises parts of every body
        # (token counts, echoed fields, mid-stream): a body nested deeper is refused up front, an
        # assumption (the APIs document no depth limit) that keeps it a 400, never a 500 or a
        # stream cut after its headers.
        raise Rejected(400, "The request body is nested too deeply.") from exc
    return body


def _model(body: Mapping[str, Any], missing: str) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise Rejected(400, missing, param="model")
    return model


async def _send(
    request: web.Request,
    store: CacheStore,
    writes: list[Entry],
    headers: dict[str, str],
    body: Any = None,
    frames: Iterable[bytes] | None = None,
    content_type: str = "text/event-stream",
) -> web.StreamResponse:
    """Commit the request's cache writes as its response starts, then send JSON or a stream
    (SSE, or AWS event-stream frames)."""
    store.commit(writes)
    if frames is None:
        return _json(body, headers=headers)
    resp = web.StreamResponse(headers={**headers, "Content-Type": content_type, "Cache-Control": "no-cache"})
    await resp.prepare(request)
    for frame in frames:
        await resp.write(frame)
    await resp.write_eof()
    return resp


# --- Anthropic --------------------------------------------------------------------------


def _anthropic_preamble(request: web.Request) -> str:
    tenant = _tenant(request, ANTHROPIC_NO_KEY)
    if "anthropic-version" not in request.headers:
        raise Rejected(400, "anthropic-version: header is required")
    return tenant


def _betas(request: web.Request) -> frozenset[str]:
    values = request.headers.getall("anthropic-beta", [])
    return frozenset(v.strip() for value in values for v in value.split(",") if v.strip())


def _check_prewarm(body: Mapping[str, Any], stream: bool) -> None:
    """`max_tokens: 0` pre-warming refusals (docs/provider-rules.md 1.12)."""
    thinking = body.get("thinking")
    output_config = body.get("output_config")
    tool_choice = body.get("tool_choice")
    if stream:
        raise Rejected(400, "max_tokens: 0 (cache pre-warming) is not supported with stream: true")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        raise Rejected(400, "max_tokens: 0 (cache pre-warming) is not supported with thinking enabled")
    if isinstance(output_config, dict) and output_config.get("format") is not None:
        raise Rejected(400, "max_tokens: 0 (cache pre-warming) is not supported with output_config.format")
    if isinstance(tool_choice, dict) and tool_choice.get("type") in ("tool", "any"):
        raise Rejected(400, "max_tokens: 0 (cache pre-warming) is not supported with a forced tool_choice")


async def anthropic_messages(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    platform = PLATFORMS[state.anthropic_platform]
    tenant = _anthropic_preamble(request)
    body = await _body(request)
    return await _anthropic(request, platform, tenant, body, str(body.get("model") or ""), body.get("stream") is True)


async def vertex_predict(request: web.Request) -> web.StreamResponse:
    """Vertex AI `.../publishers/anthropic/models/{model}:rawPredict` (`:streamRawPredict`)."""
    model, _, action = request.match_info["action"].rpartition(":")
    if action not in ("rawPredict", "streamRawPredict") or not model:
        raise Rejected(404, f"The requested URL {request.path} was not found on this server.")
    platform = PLATFORMS["vertex"]
    tenant = _tenant(request, ANTHROPIC_NO_KEY)
    body = check_body(platform, await _body(request))
    stream = action == "streamRawPredict" or body.get("stream") is True
    return await _anthropic(request, platform, tenant, {**body, "model": model}, model_name(platform, model), stream)


def _aws_tenant(request: web.Request) -> str:
    """A Bedrock API key (bearer) or the access key id of a SigV4 `Authorization`."""
    auth = request.headers.get("Authorization", "")
    if auth.startswith("AWS4-HMAC-SHA256 "):
        found = re.search(r"Credential=([^/,\s]+)", auth)
        if found:
            return hashlib.sha256(found.group(1).encode()).hexdigest()
    return _tenant(request, "Missing Authentication Token")


async def bedrock_invoke(request: web.Request) -> web.StreamResponse:
    """Bedrock InvokeModel `/model/{model}/invoke` and `/invoke-with-response-stream`."""
    platform = PLATFORMS["bedrock"]
    model = request.match_info["model"]
    tenant = _aws_tenant(request)
    raw = await _body(request)
    check_betas(platform, body_betas(platform, raw))
    body = check_body(platform, raw)
    name = model_name(platform, model)
    check_caching(platform, name, body)
    stream = request.path.endswith("/invoke-with-response-stream")
    body = {k: v for k, v in body.items() if k != "stream"}
    return await _anthropic(request, platform, tenant, {**body, "model": model}, name, stream, aws_stream=stream)


async def bedrock_converse(request: web.Request) -> web.StreamResponse:
    """Bedrock Converse `/model/{model}/converse` and `/converse-stream` (`proxy.sim.converse`)."""
    state = request.app[STATE]
    now = state.clock.now()
    platform = PLATFORMS["bedrock"]
    model = request.match_info["model"]
    tenant = _aws_tenant(request)
    raw = await _body(request)
    name = model_name(platform, model)
    no_caching = any(fnmatch.fnmatchcase(name, p) for p in platform.no_cache_models)
    if no_caching and b'"cachePoint"' in orjson.dumps(raw):
        raise Rejected(403, BEDROCK_NO_CACHING)
    body = converse.to_messages(raw, name)
    n = state.next_request()
    settings = state.config.anthropic_model(name)
    prompt = await _counted(request, lambda c: anthropic.parse_request(body, frozenset(), c, settings))
    counter = state.tokens()
    reply = choose_reply(anthropic_wire.conversation(body), request.headers)
    content = anthropic_wire.content_blocks(reply, f"toolu_sim_{n:06d}")
    text = "".join(str(b.get("text", "")) for b in content if b.get("type") == "text") or "ok"
    out = anthropic_wire.output_tokens(reply, counter)
    plan = anthropic.plan_cache(prompt, settings, tenant, now, state.store)
    usage = converse.usage(plan.usage.as_dict(out), out)
    headers = {"x-amzn-RequestId": f"req_sim_{n:06d}"}
    if request.path.endswith("/converse-stream"):
        frames = list(converse.stream_frames(text, "end_turn", usage))
        return await _send(request, state.store, plan.writes, headers, frames=frames, content_type=EVENTSTREAM)
    return await _send(request, state.store, plan.writes, headers, body=converse.response_body(text, "end_turn", usage))


async def _anthropic(
    request: web.Request,
    platform: Platform,
    tenant: str,
    body: dict[str, Any],
    model: str,
    stream: bool,
    *,
    aws_stream: bool = False,
) -> web.StreamResponse:
    """One Messages request as `platform` serves it (`model`: Anthropic's spelling)."""
    state = request.app[STATE]
    now = state.clock.now()
    betas = _betas(request)
    check_betas(platform, betas)
    n = state.next_request()
    settings = state.config.anthropic_model(model)
    keys = platform.marker_keys
    prompt = await _counted(request, lambda c: anthropic.parse_request(body, betas, c, settings, marker_keys=keys))
    counter = state.tokens()
    if body["max_tokens"] == 0:
        _check_prewarm(body, stream)
        content: list[dict[str, Any]] = []
        stop, out = "max_tokens", 0
    else:
        reply = choose_reply(anthropic_wire.conversation(body), request.headers)
        content = anthropic_wire.content_blocks(reply, f"toolu_sim_{n:06d}")
        stop, out = anthropic_wire.stop_reason(reply), anthropic_wire.output_tokens(reply, counter)
    plan = anthropic.plan_cache(prompt, settings, tenant, now, state.store)
    msg_id = f"msg_sim_{n:06d}"
    headers = {"request-id": f"req_sim_{n:06d}"}
    if aws_stream:
        events = anthropic_wire.stream_events(msg_id, prompt.model, content, stop, plan.usage, out)
        frames = [chunk_event(_with_bedrock_metrics(data, plan.usage.as_dict(out), out)) for _, data in events]
        return await _send(request, state.store, plan.writes, headers, frames=frames, content_type=EVENTSTREAM)
    if stream:
        frames_sse = anthropic_wire.sse_events(msg_id, prompt.model, content, stop, plan.usage, out)
        return await _send(request, state.store, plan.writes, headers, frames=frames_sse)
    data = anthropic_wire.message_body(msg_id, prompt.model, content, stop, plan.usage, out)
    return await _send(request, state.store, plan.writes, headers, body=data)


def _with_bedrock_metrics(data: dict[str, Any], usage: dict[str, Any], out: int) -> dict[str, Any]:
    """Bedrock adds `amazon-bedrock-invocationMetrics` to the `message_stop` event."""
    if data.get("type") != "message_stop":
        return data
    metrics = {
        "inputTokenCount": usage["input_tokens"],
        "outputTokenCount": out,
        "invocationLatency": 1,
        "firstByteLatency": 1,
        "cacheReadInputTokenCount": usage["cache_read_input_tokens"],
        "cacheWriteInputTokenCount": usage["cache_creation_input_tokens"],
    }
    return {**data, "amazon-bedrock-invocationMetrics": metrics}


async def anthropic_count_tokens(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    _anthropic_preamble(request)
    body = await _body(request)
    n = state.next_request()
    settings = state.config.anthropic_model(str(body.get("model") or ""))
    betas = _betas(request)
    prompt = await _counted(
        request, lambda c: anthropic.parse_request(body, betas, c, settings, require_max_tokens=False)
    )
    return _json({"input_tokens": prompt.total_tokens}, headers={"request-id": f"req_sim_{n:06d}"})


# --- OpenAI -----------------------------------------------------------------------------


async def openai_chat(request: web.Request) -> web.StreamResponse:
    return await _openai(request, chat=True)


async def openai_responses(request: web.Request) -> web.StreamResponse:
    return await _openai(request, chat=False)


async def _openai(request: web.Request, *, chat: bool) -> web.StreamResponse:
    state = request.app[STATE]
    now = state.clock.now()
    tenant = _tenant(request, OPENAI_NO_KEY)
    body = await _body(request)
    model = _model(body, "you must provide a model parameter")
    if chat and state.openai_platform in gateway.GATEWAYS and gateway.is_claude(model):
        return await _gateway_claude(request, tenant, body, model)
    n = state.next_request()
    settings = state.config.openai_model(model)
    render = openai.render_chat if chat else openai.render_responses
    rendered = await _counted(request, lambda c: render(body, c))
    counter = state.tokens()
    conv = openai_wire.chat_conversation(body) if chat else openai_wire.responses_conversation(body)
    reply = choose_reply(conv, request.headers)
    cache_key = body.get("prompt_cache_key") if isinstance(body.get("prompt_cache_key"), str) else None
    machine = state.router.machine(tenant, model, cache_key, rendered.tokens, now, settings)
    plan = openai.plan_cache(rendered, body, model, settings, tenant, machine, now, state.store)
    out = openai_wire.output_tokens(reply, counter)
    stream = body.get("stream") is True
    headers = {"x-request-id": f"req_sim_{n:06d}"}
    if chat:
        ids = openai_wire.Ids(f"chatcmpl-sim{n:06d}", f"msg_sim_{n:06d}", f"call_sim_{n:06d}", int(now))
        usage = openai_wire.chat_usage(plan, out, settings.breakpoints)
        if stream:
            options = body.get("stream_options")
            include = isinstance(options, dict) and options.get("include_usage") is True
            frames = openai_wire.chat_chunks(model, reply, ids, usage, include)
            return await _send(request, state.store, plan.writes, headers, frames=frames)
        return await _send(
            request, state.store, plan.writes, headers, body=openai_wire.chat_body(model, reply, ids, usage)
        )
    ids = openai_wire.Ids(f"resp_sim_{n:06d}", openai_wire.item_id(reply, n), f"call_sim_{n:06d}", int(now))
    usage = openai_wire.responses_usage(plan, out, settings.breakpoints)
    current = diagnostics.fingerprint(body, model, rendered.tokens)
    options = body.get("prompt_cache_options")
    compared = options.get("comparison_response_id") if isinstance(options, dict) else None
    diagnosis = None
    if isinstance(compared, str):
        diagnosis = diagnostics.diagnose(state.fingerprints.get(tenant, compared), current, settings.breakpoints)
    state.fingerprints.put(tenant, ids.response, current)
    if stream:
        frames = openai_wire.responses_events(body, model, reply, ids, usage, diagnosis)
        return await _send(request, state.store, plan.writes, headers, frames=frames)
    data = openai_wire.responses_body(body, model, reply, ids, usage, diagnosis)
    return await _send(request, state.store, plan.writes, headers, body=data)


async def _gateway_claude(request: web.Request, tenant: str, body: dict[str, Any], model: str) -> web.StreamResponse:
    """A Chat request for Claude behind an OpenAI-wire gateway (`proxy.sim.gateway`)."""
    state = request.app[STATE]
    now = state.clock.now()
    n = state.next_request()
    messages_body = gateway.chat_to_messages(body)
    settings = state.config.anthropic_model(messages_body["model"])
    prompt = await _counted(request, lambda c: anthropic.parse_request(messages_body, frozenset(), c, settings))
    counter = state.tokens()
    plan = anthropic.plan_cache(prompt, settings, tenant, now, state.store)
    reply = choose_reply(openai_wire.chat_conversation(body), request.headers)
    out = openai_wire.output_tokens(reply, counter)
    usage = gateway.chat_usage(plan.usage.as_dict(out), out)
    ids = openai_wire.Ids(f"chatcmpl-sim{n:06d}", f"msg_sim_{n:06d}", f"call_sim_{n:06d}", int(now))
    headers = {"x-request-id": f"req_sim_{n:06d}"}
    if body.get("stream") is True:
        options = body.get("stream_options")
        include = isinstance(options, dict) and options.get("include_usage") is True
        frames = openai_wire.chat_chunks(model, reply, ids, usage, include)
        return await _send(request, state.store, plan.writes, headers, frames=frames)
    return await _send(request, state.store, plan.writes, headers, body=openai_wire.chat_body(model, reply, ids, usage))


# --- models -----------------------------------------------------------------------------


def _model_object(provider: str, model_id: str) -> dict[str, Any]:
    if provider == "anthropic":
        return {
            "type": "model",
            "id": model_id,
            "display_name": model_id,
            "created_at": "2026-01-01T00:00:00Z",
        }
    return {"id": model_id, "object": "model", "created": 1_767_225_600, "owned_by": "promptcache-sim"}


async def list_models(request: web.Request) -> web.Response:
    provider = _provider(request)
    _tenant(request, ANTHROPIC_NO_KEY if provider == "anthropic" else OPENAI_NO_KEY)
    ids = request.app[STATE].config.model_ids(provider)
    data = [_model_object(provider, i) for i in ids]
    if provider == "anthropic":
        first, last = (ids[0], ids[-1]) if ids else (None, None)
        return _json({"data": data, "has_more": False, "first_id": first, "last_id": last})
    return _json({"object": "list", "data": data})


async def get_model(request: web.Request) -> web.Response:
    provider = _provider(request)
    _tenant(request, ANTHROPIC_NO_KEY if provider == "anthropic" else OPENAI_NO_KEY)
    return _json(_model_object(provider, request.match_info["model_id"]))


# --- admin ------------------------------------------------------------------------------


async def get_clock(request: web.Request) -> web.Response:
    clock = request.app[STATE].clock
    return _json({"now": clock.now(), "manual": clock.is_manual})


async def set_clock(request: web.Request) -> web.Response:
    clock = request.app[STATE].clock
    body = await _body(request)
    try:
        if (
            "advance" in body
            and isinstance(body["advance"], int | float)
            and not isinstance(body["advance"], bool)
        ):
            now = clock.advance(body["advance"])
        elif "set" in body and isinstance(body["set"], int | float) and not isinstance(body["set"], bool):
            now = clock.set(body["set"])
        else:
            raise Rejected(400, 'expected {"advance": seconds} or {"set": epoch_seconds}')
    except ClockError as exc:
        raise Rejected(409 if not clock.is_manual else 400, str(exc)) from exc
    return _json({"now": now, "manual": clock.is_manual})


async def list_cache(request: web.Request) -> web.Response:
    state = request.app[STATE]
    now = state.clock.now()
    entries = [
        {
            "provider": e.namespace.split("/", 1)[0],
            "tenant": e.tenant[:12],
            "namespace": e.namespace,
            "digest": e.digest.hex()[:16],
            "tokens": e.tokens,
            "ttl": e.label,
            "ttl_seconds": e.ttl,
            "expires_at": e.expires_at,
            "expires_in_seconds": e.expires_at - now,
        }
        for e in state.store.live(now)
    ]
    return _json({"now": now, "count": len(entries), "entries": entries})


async def flush_cache(request: web.Request) -> web.Response:
    state = request.app[STATE]
    flushed = state.store.flush()
    state.router.reset()
    return _json({"flushed": flushed})
