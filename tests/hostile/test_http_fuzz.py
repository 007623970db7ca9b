"""HTTP-level fuzz (issue 11): near-valid bodies on the three pipeline routes, through the proxy
to the simulator, over real HTTP on loopback.

Bodies come from a grammar of valid requests (Anthropic Messages, Chat Completions, Responses:
system, tools, tool calls and results, markers, streaming) with random mutations: a value of the
wrong type, a missing field, huge or empty strings, deep nesting, odd unicode (lone surrogates,
NUL, right-to-left marks, emoji), duplicate keys, markers on every object. Each body goes to the
simulator directly and then through the proxy. Checked for every case:

- no hang: every response arrives within `OUTER` seconds;
- no 5xx made by the proxy: every 5xx carries the header the test's simulator adds to all its
  responses (`x-fuzz-upstream`), so it came from the upstream;
- a body the simulator accepts directly (2xx) is accepted through the proxy (2xx) and costs no
  stage error (`promptcache_stage_errors_total` does not move), so the proxy never loses a
  request it could have served.

Seed: `PROMPTCACHE_FUZZ_SEED` (default fixed; printed with the case count). Cases:
`PROMPTCACHE_FUZZ_EXAMPLES` (default 120, about 20 s on a loaded 2-core machine).
"""

from __future__ import annotations

import asyncio
import copy
import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from proxy.app import start_proxy
from proxy.metrics import STAGES
from proxy.settings import Settings
from proxy.sim.app import create_sim_app
from proxy.sim.clock import Clock
from proxy.sim.config import SimConfig

SEED = int(os.environ.get("PROMPTCACHE_FUZZ_SEED", "1101"))
EXAMPLES = int(os.environ.get("PROMPTCACHE_FUZZ_EXAMPLES", "120"))
OUTER = 30.0
UPSTREAM_HEADER = "x-fuzz-upstream"

# --- the grammar --------------------------------------------------------------------------


@dataclass(frozen=True)
class Dup:
    """An object written with repeated keys (JSON allows it; the last one wins in most parsers)."""

    pairs: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Raw:
    """JSON text written as is (deep nesting beyond orjson's writer, lone surrogates)."""

    text: bytes


def emit(value: Any) -> bytes:
    """JSON text of `value`, honouring `Dup` and `Raw`."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Dup):
        return b"{" + b",".join(orjson.dumps(k) + b":" + emit(v) for k, v in value.pairs) + b"}"
    if isinstance(value, dict):
        return b"{" + b",".join(orjson.dumps(str(k)) + b":" + emit(v) for k, v in value.items()) + b"}"
    if isinstance(value, list):
        return b"[" + b",".join(emit(v) for v in value) + b"]"
    return orjson.dumps(value)


ODD = ["", " ", "\u202eevil", "\u0000nul", "emoji \U0001f600", "\ufeffbom", "é" * 3, "\n" * 40, "a" * 20000]
words = st.sampled_from(["hello", "read the file", "You are terse.", "Today is 2026-12-01", "ok", *ODD])
markers = st.sampled_from(
    [{"type": "ephemeral"}, {"type": "ephemeral", "ttl": "1h"}, {"type": "ephemeral", "ttl": "5m"}, None]
)
names = st.sampled_from(["read", "write", "bash", "grep"])


@st.composite
def anthropic_body(draw: st.DrawFn) -> dict[str, Any]:
    tools = [
        {
            "name": n,
            "description": f"{n} tool",
            "input_schema": {"type": "object", "properties": {"p": {"type": "string"}}},
        }
        for n in draw(st.lists(names, max_size=4, unique=True))
    ]
    messages: list[dict[str, Any]] = []
    for turn in range(draw(st.integers(1, 4))):
        messages.append({"role": "user", "content": [{"type": "text", "text": draw(words)}]})
        if tools and draw(st.booleans()):
            call = {"type": "tool_use", "id": f"tu_{turn}", "name": tools[0]["name"], "input": {"p": draw(words)}}
            messages.append({"role": "assistant", "content": [call]})
            result = {"type": "tool_result", "tool_use_id": f"tu_{turn}", "content": draw(words)}
            messages.append({"role": "user", "content": [result]})
        messages.append({"role": "assistant", "content": draw(words) or "ok"})
    messages.append({"role": "user", "content": draw(words) or "next"})
    body: dict[str, Any] = {"model": "claude-sonnet-4-6", "max_tokens": 16, "messages": messages}
    if draw(st.booleans()):
        body["system"] = draw(
            st.sampled_from([draw(words), [{"type": "text", "text": "You are a careful agent. " * 60}]])
        )
    if tools:
        body["tools"] = tools
    if draw(st.booleans()):
        body["stream"] = True
    return body


@st.composite
def chat_body(draw: st.DrawFn) -> dict[str, Any]:
    tools = [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in draw(st.lists(names, max_size=3, unique=True))
    ]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful agent. " * 60}]
    for turn in range(draw(st.integers(1, 3))):
        messages.append(
            {"role": "user", "content": draw(st.sampled_from([draw(words), [{"type": "text", "text": draw(words)}]]))}
        )
        if tools and draw(st.booleans()):
            fn = {"name": tools[0]["function"]["name"], "arguments": "{}"}
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": f"c{turn}", "type": "function", "function": fn}],
                }
            )
            messages.append({"role": "tool", "tool_call_id": f"c{turn}", "content": draw(words)})
        messages.append({"role": "assistant", "content": draw(words)})
    messages.append({"role": "user", "content": draw(words) or "next"})
    body: dict[str, Any] = {"model": "gpt-5.1", "messages": messages}
    if tools:
        body["tools"] = tools
    if draw(st.booleans()):
        body["stream"] = True
    return body


@st.composite
def responses_body(draw: st.DrawFn) -> dict[str, Any]:
    tools = [
        {"type": "function", "name": n, "parameters": {"type": "object"}}
        for n in draw(st.lists(names, max_size=3, unique=True))
    ]
    items: list[Any] = []
    for turn in range(draw(st.integers(1, 3))):
        items.append(
            {
                "role": "user",
                "content": draw(st.sampled_from([draw(words), [{"type": "input_text", "text": draw(words)}]])),
            }
        )
        if tools and draw(st.booleans()):
            items.append({"type": "function_call", "call_id": f"c{turn}", "name": tools[0]["name"], "arguments": "{}"})
            items.append({"type": "function_call_output", "call_id": f"c{turn}", "output": draw(words)})
        items.append({"role": "assistant", "content": [{"type": "output_text", "text": draw(words)}]})
    items.append({"role": "user", "content": draw(words) or "next"})
    body: dict[str, Any] = {"model": "gpt-5.1", "input": items}
    if draw(st.booleans()):
        body["instructions"] = "You are a careful agent. " * 60
    if tools:
        body["tools"] = tools
    if draw(st.booleans()):
        body["stream"] = True
    return body


WRONG = st.sampled_from([None, 0, -1, 1.5, True, "", "x", [], ["text"], {}, {"a": 1}])
DEEP = Raw(b'{"a":' * 300 + b"1" + b"}" * 300)
SURROGATE = Raw(b'"\\ud800 lone"')


def _paths(value: Any, at: tuple = ()) -> Iterator[tuple]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*at, key)
            yield from _paths(item, (*at, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield (*at, i)
            yield from _paths(item, (*at, i))


def _objects(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, dict):
        yield value
        for item in value.values():
            yield from _objects(item)
    elif isinstance(value, list):
        for item in value:
            yield from _objects(item)


@st.composite
def mutated(draw: st.DrawFn, body: dict[str, Any]) -> Any:
    """`body` with 0-3 mutations (0: the valid body itself, which must pass)."""
    value: Any = orjson.loads(orjson.dumps(body))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["wrong", "drop", "odd", "deep", "surrogate", "markers", "dup", "empty"]))
        paths = list(_paths(value))
        if kind == "markers":
            key = draw(st.sampled_from(["cache_control", "prompt_cache_breakpoint"]))
            for obj in _objects(value):
                if draw(st.booleans()):
                    obj[key] = copy.deepcopy(draw(markers))
            continue
        if kind == "dup" and isinstance(value, dict) and value:
            first = draw(st.sampled_from(sorted(value)))
            return Dup((*value.items(), (first, draw(WRONG))))
        if not paths:
            continue
        path = draw(st.sampled_from(paths))
        parent = value
        for part in path[:-1]:
            parent = parent[part]
        last = path[-1]
        if kind == "drop":
            del parent[last]
        elif kind == "wrong":
            parent[last] = draw(WRONG)
        elif kind == "odd":
            parent[last] = draw(st.sampled_from(ODD))
        elif kind == "deep":
            parent[last] = DEEP
        elif kind == "surrogate":
            parent[last] = SURROGATE
        elif kind == "empty":
            parent[last] = draw(st.sampled_from(["", [], {}]))
    return value


ROUTES = {
    "/v1/messages": (anthropic_body(), {"x-api-key": "fuzz-key", "anthropic-version": "2023-06-01"}),
    "/v1/chat/completions": (chat_body(), {"authorization": "Bearer fuzz-key"}),
    "/v1/responses": (responses_body(), {"authorization": "Bearer fuzz-key"}),
}


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, dict[str, str], bytes]:
    path = draw(st.sampled_from(sorted(ROUTES)))
    strategy, headers = ROUTES[path]
    body = draw(mutated(draw(strategy)))
    session = draw(st.sampled_from([None, "fuzz-1", "fuzz-2"]))
    headers = {**headers, "content-type": "application/json", **({"x-session-id": session} if session else {})}
    return path, headers, emit(body)


# --- the servers, on a loop of their own ------------------------------------------------------


@dataclass
class Servers:
    loop: asyncio.AbstractEventLoop
    sim_url: str = ""
    proxy_url: str = ""
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    cleanups: list[Any] = field(default_factory=list)
    session: aiohttp.ClientSession | None = None
    cases: int = 0

    def run(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout=OUTER + 5)

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
        assert self.session is not None
        async with asyncio.timeout(OUTER):
            async with self.session.post(url, data=body, headers=headers) as response:
                return response.status, dict(response.headers), await response.read()

    async def settle(self) -> int:
        """`GET /healthz` on the proxy connection the last request used."""
        assert self.session is not None
        async with asyncio.timeout(OUTER):
            async with self.session.get(self.proxy_url + "/healthz") as response:
                return response.status

    def stage_errors(self) -> float:
        return sum(self.registry.get_sample_value("promptcache_stage_errors_total", {"stage": s}) or 0 for s in STAGES)


async def _mark_upstream(request: web.Request, response: web.StreamResponse) -> None:
    response.headers[UPSTREAM_HEADER] = "1"


async def _start(servers: Servers, tmp: str) -> None:
    config = await asyncio.to_thread(SimConfig.load)
    sim = create_sim_app(config, Clock.manual_at())
    sim.on_response_prepare.append(_mark_upstream)
    runner = web.AppRunner(sim, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    servers.cleanups.append(runner.cleanup)
    servers.sim_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    settings = Settings(port=0, upstream=servers.sim_url, store=f"sqlite:///{tmp}/sessions.db", state_dir=tmp)
    proxy_runner, servers.proxy_url = await start_proxy(settings, servers.registry)
    servers.cleanups.append(proxy_runner.cleanup)
    # One connection per server: aiohttp serves a connection's requests one after another, so
    # a `/healthz` after a proxied request returns once that request's handler (and its
    # response-side measurement) has finished.
    connector = aiohttp.TCPConnector(limit_per_host=1)
    servers.session = aiohttp.ClientSession(connector=connector, auto_decompress=False)


async def _stop(servers: Servers) -> None:
    if servers.session is not None:
        await servers.session.close()
    for cleanup in reversed(servers.cleanups):
        await cleanup()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fuzz-servers", daemon=True)
    thread.start()
    servers = Servers(loop)
    try:
        servers.run(_start(servers, str(tmp_path_factory.mktemp("fuzz"))))
        yield servers
    finally:
        servers.run(_stop(servers))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=OUTER)
        loop.close()


def check_case(servers: Servers, path: str, headers: dict[str, str], body: bytes) -> None:
    """One case: straight to the simulator, then through the proxy (module docstring)."""
    servers.cases += 1
    direct, _, _ = servers.run(servers.post(servers.sim_url + path, headers, body))
    errors_before = servers.stage_errors()
    status, response_headers, answer = servers.run(servers.post(servers.proxy_url + path, headers, body))
    assert servers.run(servers.settle()) == 200
    if status >= 500:
        assert UPSTREAM_HEADER in response_headers, f"proxy-made {status}: {answer[:300]!r}"
    if 200 <= direct < 300:
        assert 200 <= status < 300, f"the simulator accepts it, through the proxy {status}: {answer[:300]!r}"
        assert servers.stage_errors() == errors_before, "a stage failed on a body the simulator accepts"


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")  # large failing reprs
def test_fuzz_three_routes(servers: Servers, capsys: pytest.CaptureFixture[str]) -> None:
    @seed(SEED)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )
    @given(cases())
    def run(case: tuple[str, dict[str, str], bytes]) -> None:
        check_case(servers, *case)

    try:
        run()
    finally:
        with capsys.disabled():
            print(f"\nhttp fuzz: seed {SEED}, {servers.cases} cases (PROMPTCACHE_FUZZ_SEED to replay)")
