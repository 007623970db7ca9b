"""Anthropic cache accounting of the simulator, over real HTTP, with exact usage numbers.

Expected numbers come from the documented formula (proxy/sim/anthropic.py): block tokens are
`o200k_base` counts of each block's rendering, plus 3 tokens on the first block of each message.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson

from proxy.sim import anthropic
from proxy.sim.cache import CacheStore
from proxy.sim.config import SimConfig
from proxy.sim.tokens import IMAGE_TOKENS, TokenCounter

CONFORMANCE = [
    # (test name, docs/provider-rules.md section behind the rule)
    ("test_write_then_read", "1.5 writes at breakpoints, 1.10 usage fields"),
    ("test_below_minimum_caches_nothing", "1.6 silent no-op below the minimum"),
    ("test_minimum_is_per_model_and_cumulative", "1.6 per-model table, cumulative prefix"),
    ("test_lookback_docs_example", "1.5 worked 10/15/35-block example"),
    ("test_tool_runs_count_as_one_position", "1.5 runs of tool_use / tool_result = one position"),
    ("test_ttl_5m_expires", "1.7 5m TTL"),
    ("test_ttl_refreshed_on_read", "1.7 a read refreshes the entry"),
    ("test_ttl_1h_expires", "1.7 1h TTL, ephemeral_1h split"),
    ("test_mixed_ttl_billing", "1.7 A/B/C billing with mixed TTLs"),
    ("test_tenant_isolation", "1.11 isolation per workspace (tenant = API key)"),
    ("test_automatic_caching_moves_forward", "1.1 top-level cache_control"),
    ("test_automatic_walks_back_to_eligible_block", "1.1 last block not eligible -> walk back"),
    ("test_params_fingerprint_levels", "1.8 what invalidates what"),
    ("test_model_is_part_of_the_key", "1.8 cache is per model"),
    ("test_streamed_and_non_streamed_usage_identical", "1.10 message_start + cumulative message_delta"),
    ("test_count_tokens_formula", "token approximation (proxy/sim/tokens.py)"),
    ("test_prewarm_max_tokens_zero", "1.12 pre-warming"),
    ("test_entry_readable_only_after_commit", "1.5 readable once the first response begins"),
    ("test_null_cache_control_is_no_marker", "brief: cache_control null = no marker"),
    ("test_request_ids_are_deterministic", "brief: request-id header, msg_ ids per request counter"),
    ("test_large_body_is_written_then_read", "brief: a 600 KB, 500-block body written whole, then read whole"),
]

tok = TokenCounter().count
MODEL = "claude-sonnet-4-6"  # minimum 1,024
SMALL_MODEL = "claude-opus-5"  # minimum 512
CC = {"type": "ephemeral"}
CC_1H = {"type": "ephemeral", "ttl": "1h"}


def words(n: int, word: str = "word") -> str:
    """Exactly `n` tokens."""
    return f" {word}" * n


def usage(
    read: int = 0, w5m: int = 0, w1h: int = 0, input_tokens: int = 0, output: int | None = None
) -> dict:
    """The input side of an Anthropic usage object."""
    out = {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": w5m + w1h,
        "cache_read_input_tokens": read,
        "cache_creation": {"ephemeral_5m_input_tokens": w5m, "ephemeral_1h_input_tokens": w1h},
        "service_tier": "standard",
    }
    if output is not None:
        out["output_tokens"] = output
    return out


def input_side(u: dict) -> dict:
    return {k: v for k, v in u.items() if k != "output_tokens"}


def body(system: str, user: str = "hi", *, model: str = MODEL, **extra: Any) -> dict:
    return {
        "model": model,
        "max_tokens": 64,
        "system": [{"type": "text", "text": system, "cache_control": CC}],
        "messages": [{"role": "user", "content": user}],
        **extra,
    }


async def test_write_then_read(sim) -> None:
    system = words(1500)
    first = await sim.usage(body(system))
    assert input_side(first) == usage(w5m=tok(system), input_tokens=tok("hi") + 3)
    second = await sim.usage(body(system))
    assert input_side(second) == usage(read=tok(system), input_tokens=tok("hi") + 3)
    assert first["output_tokens"] == second["output_tokens"] == tok("OK from promptcache-sim (turn 1)")


async def test_below_minimum_caches_nothing(sim) -> None:
    system = words(1000)  # 1,000 < 1,024 at the breakpoint
    for _ in range(2):
        u = await sim.usage(body(system))
        assert input_side(u) == usage(input_tokens=tok(system) + tok("hi") + 3)


async def test_minimum_is_per_model_and_cumulative(sim) -> None:
    # 600 tokens: above claude-opus-5's 512, below claude-sonnet-4-6's 1,024.
    system = words(600)
    assert input_side(await sim.usage(body(system, model=SMALL_MODEL))) == usage(
        w5m=600, input_tokens=tok("hi") + 3
    )
    assert (await sim.usage(body(system, model=MODEL)))["cache_creation_input_tokens"] == 0
    # Cumulative: tools (500) + system (600) reach 1,024 at the system breakpoint.
    tools = [{"name": "t", "description": words(480), "input_schema": {"type": "object"}}]
    tools_tokens = tok(orjson.dumps(tools[0]).decode())
    u = await sim.usage(body(system, model=MODEL, tools=tools))
    assert input_side(u) == usage(w5m=tools_tokens + 600, input_tokens=tok("hi") + 3)


def _turn(n_blocks: int, markers: tuple[int, ...]) -> dict:
    """One user message of `n_blocks` ~63-token text blocks, markers on the given 1-based blocks."""
    content = []
    for i in range(1, n_blocks + 1):
        block: dict[str, Any] = {"type": "text", "text": f"block {i}:" + words(60)}
        if i in markers:
            block["cache_control"] = CC
        content.append(block)
    return {"model": SMALL_MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": content}]}


def _cum(n: int) -> int:
    return 3 + sum(tok(f"block {i}:" + words(60)) for i in range(1, n + 1))


async def test_lookback_docs_example(sim) -> None:
    # Turn 1: 10 blocks, write at 10. Turn 2: 15 blocks, hit at 10, write at 15.
    for key in ("one-breakpoint", "two-breakpoints"):
        u1 = await sim.usage(_turn(10, (10,)), key=key)
        assert input_side(u1) == usage(w5m=_cum(10))
        u2 = await sim.usage(_turn(15, (15,)), key=key)
        assert input_side(u2) == usage(read=_cum(10), w5m=_cum(15) - _cum(10))
    # Turn 3: 35 blocks. Checking 35..16 misses the entry at 15: everything is written again.
    u3 = await sim.usage(_turn(35, (35,)), key="one-breakpoint")
    assert input_side(u3) == usage(w5m=_cum(35))
    # A second breakpoint at 15 finds it.
    u3b = await sim.usage(_turn(35, (15, 35)), key="two-breakpoints")
    assert input_side(u3b) == usage(read=_cum(15), w5m=_cum(35) - _cum(15))


def _tool_loop(n_calls: int, result_kind: str) -> tuple[dict, dict]:
    """(turn 1: the head with a marker, turn 2: head + n tool calls + n results, marker on the last)."""
    head = {"role": "user", "content": "instructions:" + words(1100)}
    uses = [
        {"type": "tool_use", "id": f"toolu_{i}", "name": "read", "input": {"i": i}} for i in range(n_calls)
    ]
    if result_kind == "tool_result":
        results = [
            {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"r{i}"} for i in range(n_calls)
        ]
    else:
        results = [{"type": "text", "text": f"r{i}"} for i in range(n_calls)]
    results[-1]["cache_control"] = CC
    turn1 = {"model": MODEL, "max_tokens": 64, "cache_control": CC, "messages": [head]}
    turn2 = {
        "model": MODEL,
        "max_tokens": 64,
        "messages": [head, {"role": "assistant", "content": uses}, {"role": "user", "content": results}],
    }
    return turn1, turn2


async def test_tool_runs_count_as_one_position(sim) -> None:
    head = 3 + tok("instructions:" + words(1100))
    uses = 3 + sum(tok("read") + tok(orjson.dumps({"i": i}).decode()) for i in range(25))
    results = 3 + sum(tok(f"r{i}") for i in range(25))
    for kind in ("tool_result", "text"):
        turn1, turn2 = _tool_loop(25, kind)
        assert input_side(await sim.usage(turn1, key=kind)) == usage(w5m=head)
        u = await sim.usage(turn2, key=kind)
        if kind == "tool_result":
            # 25 results = 1 position, 25 tool_use = 1 position, the head is the 3rd: a hit.
            assert input_side(u) == usage(read=head, w5m=uses + results)
        else:
            # 25 text blocks are 25 positions: the 20-position walk never reaches the head.
            assert input_side(u) == usage(w5m=head + uses + results)


async def test_ttl_5m_expires(sim) -> None:
    system = words(1500)
    await sim.usage(body(system))
    await sim.advance(299)
    assert (await sim.usage(body(system, "x")))["cache_read_input_tokens"] == 1500
    await sim.usage(body(system, "y"), key="other")  # unrelated traffic does not refresh
    await sim.advance(300)  # 300 s after the read at 299
    u = await sim.usage(body(system))
    assert input_side(u) == usage(w5m=1500, input_tokens=tok("hi") + 3)


async def test_ttl_refreshed_on_read(sim) -> None:
    system = words(1500)
    await sim.usage(body(system))
    for _ in range(4):  # 4 x 250 s = 1,000 s in all, each read restarts the 5 minutes
        await sim.advance(250)
        assert (await sim.usage(body(system)))["cache_read_input_tokens"] == 1500
    await sim.advance(300)
    assert (await sim.usage(body(system)))["cache_read_input_tokens"] == 0


async def test_ttl_1h_expires(sim) -> None:
    system = words(1500)
    b = body(system)
    b["system"][0]["cache_control"] = CC_1H
    assert input_side(await sim.usage(b)) == usage(w1h=1500, input_tokens=tok("hi") + 3)
    await sim.advance(3599)
    assert (await sim.usage(b))["cache_read_input_tokens"] == 1500
    await sim.advance(3600)
    assert input_side(await sim.usage(b)) == usage(w1h=1500, input_tokens=tok("hi") + 3)


async def test_mixed_ttl_billing(sim) -> None:
    tools = [{"name": "search", "description": words(600), "input_schema": {"type": "object"}}]
    t = tok(orjson.dumps(tools[0]).decode())
    system, user = words(700, "sys"), words(300, "user")
    s, m = tok(system), 3 + tok(user)

    def request(tools_cc: dict | None, system_cc: dict | None, user_cc: dict | None) -> dict:
        def mark(block: dict, cc: dict | None) -> dict:
            return {**block, "cache_control": cc} if cc else block

        return {
            "model": SMALL_MODEL,
            "max_tokens": 64,
            "tools": [mark(tools[0], tools_cc)],
            "system": [mark({"type": "text", "text": system}, system_cc)],
            "messages": [{"role": "user", "content": [mark({"type": "text", "text": user}, user_cc)]}],
        }

    # Only the tools breakpoint (1h) first: A = 0, B = C = tools.
    assert input_side(await sim.usage(request(CC_1H, None, None))) == usage(w1h=t, input_tokens=s + m)
    # tools 1h (hit), system 1h, messages 5m: A = t, B = t + s, C = t + s + m.
    u = await sim.usage(request(CC_1H, CC_1H, CC))
    assert input_side(u) == usage(read=t, w1h=s, w5m=m)
    # Same again: the highest hit is the last breakpoint.
    assert input_side(await sim.usage(request(CC_1H, CC_1H, CC))) == usage(read=t + s + m)


async def test_tenant_isolation(sim) -> None:
    system = words(1500)
    assert (await sim.usage(body(system), key="tenant-a"))["cache_creation_input_tokens"] == 1500
    u = await sim.usage(body(system), key="tenant-b")
    assert (u["cache_read_input_tokens"], u["cache_creation_input_tokens"]) == (0, 1500)
    assert (await sim.usage(body(system), key="tenant-a"))["cache_read_input_tokens"] == 1500
    async with sim.session.get(sim.url + "/_sim/cache") as r:
        listing = await r.read()
    entries = orjson.loads(listing)["entries"]
    assert len({e["tenant"] for e in entries}) == 2
    assert b"tenant-a" not in listing and b"tenant-b" not in listing


async def test_automatic_caching_moves_forward(sim) -> None:
    first = words(1200)
    turn1 = {
        "model": MODEL,
        "max_tokens": 64,
        "cache_control": CC,
        "messages": [{"role": "user", "content": first}],
    }
    assert input_side(await sim.usage(turn1)) == usage(w5m=3 + 1200)
    reply = "OK from promptcache-sim (turn 1)"
    turn2 = {
        **turn1,
        "messages": [
            {"role": "user", "content": first},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": "next"},
        ],
    }
    u = await sim.usage(turn2)
    assert input_side(u) == usage(read=1203, w5m=3 + tok(reply) + 3 + tok("next"))


async def test_automatic_walks_back_to_eligible_block(sim) -> None:
    text = words(1200)
    b = {
        "model": MODEL,
        "max_tokens": 64,
        "cache_control": CC,
        "messages": [
            {"role": "user", "content": text},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": words(5, "hmm"), "signature": "sig"},
                    {"type": "text", "text": ""},
                ],
            },
        ],
    }
    # The empty text and the thinking block are not eligible: the marker lands on the user text.
    assert input_side(await sim.usage(b)) == usage(w5m=1203, input_tokens=3 + 5)


async def test_params_fingerprint_levels(sim) -> None:
    tools = [
        {
            "name": "lookup",
            "description": words(1100),
            "input_schema": {"type": "object"},
            "cache_control": CC,
        }
    ]
    t = tok(orjson.dumps({k: v for k, v in tools[0].items() if k != "cache_control"}).decode())
    system, user = words(200, "sys"), words(100, "user")
    s, m = tok(system), 3 + tok(user)
    b = {
        "model": MODEL,
        "max_tokens": 64,
        "tools": tools,
        "system": [{"type": "text", "text": system, "cache_control": CC}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": user, "cache_control": CC}]}],
    }
    assert input_side(await sim.usage(b)) == usage(w5m=t + s + m)
    # tool_choice: tools and system entries survive, messages are written again.
    assert input_side(await sim.usage({**b, "tool_choice": {"type": "any"}})) == usage(read=t + s, w5m=m)
    # Thinking config and effort are messages-level too; effort = model default counts as omitted.
    assert input_side(await sim.usage({**b, "output_config": {"effort": "high"}})) == usage(read=t + s + m)
    assert input_side(await sim.usage({**b, "output_config": {"effort": "low"}})) == usage(read=t + s, w5m=m)
    # A different anthropic-beta set invalidates system and messages, not tools.
    beta = {"anthropic-beta": "context-1m-2025-08-07"}
    assert input_side(await sim.usage(b, headers=beta)) == usage(read=t, w5m=s + m)
    # Changing a tool definition invalidates everything.
    changed = copy.deepcopy(b)
    changed["tools"][0]["description"] += " v2"
    t2 = tok(orjson.dumps({k: v for k, v in changed["tools"][0].items() if k != "cache_control"}).decode())
    assert input_side(await sim.usage(changed)) == usage(w5m=t2 + s + m)


async def test_model_is_part_of_the_key(sim) -> None:
    system = words(1500)
    await sim.usage(body(system, model="claude-sonnet-4-6"))
    assert (await sim.usage(body(system, model="claude-sonnet-5")))["cache_read_input_tokens"] == 0


async def test_streamed_and_non_streamed_usage_identical(sim) -> None:
    b = body(words(1500))
    plain = [await sim.usage(b, key="plain") for _ in range(2)]  # a write, then a read
    streamed = []
    for _ in range(2):
        events = await sim.messages_stream(b, key="stream")
        assert [e for e, _ in events] == [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
        start, delta = events[0][1]["message"]["usage"], events[6][1]["usage"]
        assert start["output_tokens"] == 1  # placeholder
        for field in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
            assert delta[field] == start[field]  # cumulative counters repeated
        streamed.append({**start, "output_tokens": delta["output_tokens"]})
    assert streamed == plain
    assert input_side(plain[0]) == usage(w5m=1500, input_tokens=tok("hi") + 3)
    assert input_side(plain[1]) == usage(read=1500, input_tokens=tok("hi") + 3)


async def test_count_tokens_formula(sim) -> None:
    tool = {"name": "get", "description": "Get a thing", "input_schema": {"type": "object"}}
    b = {
        "model": MODEL,
        "tools": [{**tool, "cache_control": CC}],
        "system": "Be brief.",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"q": 1}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "done"}],
            },
        ],
    }
    expected = (
        tok(orjson.dumps(tool).decode())
        + tok("Be brief.")
        + 3
        + tok("look")
        + IMAGE_TOKENS
        + 3
        + tok("get")
        + tok('{"q":1}')
        + 3
        + tok("done")
    )
    status, data = await sim.post(
        "/v1/messages/count_tokens",
        b,
        key=None,
        headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
    )
    assert (status, data) == (200, {"input_tokens": expected})


async def test_prewarm_max_tokens_zero(sim) -> None:
    system = words(1500)
    status, data = await sim.messages({**body(system), "max_tokens": 0})
    assert status == 200
    assert (data["content"], data["stop_reason"]) == ([], "max_tokens")
    assert data["usage"] == usage(w5m=1500, input_tokens=tok("hi") + 3, output=0)
    assert (await sim.usage(body(system, "real question")))["cache_read_input_tokens"] == 1500
    status, data = await sim.messages({**body(system), "max_tokens": 0, "stream": True})
    assert status == 400 and data["error"]["type"] == "invalid_request_error"


def test_entry_readable_only_after_commit(sim_config: SimConfig) -> None:
    """Two requests planned before the first response starts both write (pure core)."""
    settings = sim_config.anthropic_model(MODEL)
    counter = TokenCounter()
    prompt = anthropic.parse_request(body(words(1500)), frozenset(), counter, settings)
    store = CacheStore()
    first = anthropic.plan_cache(prompt, settings, "t", 0.0, store)
    parallel = anthropic.plan_cache(prompt, settings, "t", 0.0, store)
    assert first.usage == parallel.usage and first.usage.cache_creation_input_tokens == 1500
    store.commit(first.writes)  # the first response begins
    after = anthropic.plan_cache(prompt, settings, "t", 1.0, store)
    assert (after.usage.cache_read_input_tokens, after.writes) == (1500, [])


async def test_null_cache_control_is_no_marker(sim) -> None:
    b = body(words(1500))
    b["system"][0]["cache_control"] = None
    b["messages"][0] = {
        "role": "user",
        "content": [{"type": "text", "text": f"t{i}", "cache_control": CC} for i in range(4)],
    }
    status, data = await sim.messages(b)  # 4 real markers + 1 null: accepted
    assert status == 200, data
    assert data["usage"]["cache_creation_input_tokens"] == 1500 + 3 + sum(tok(f"t{i}") for i in range(4))


async def test_request_ids_are_deterministic(sim) -> None:
    ids = []
    for _ in range(2):
        h = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
        async with sim.session.post(sim.url + "/v1/messages", json=body("hello"), headers=h) as r:
            ids.append((r.headers["request-id"], (await r.json())["id"]))
    assert ids == [("req_sim_000001", "msg_sim_000001"), ("req_sim_000002", "msg_sim_000002")]


async def test_large_body_is_written_then_read(sim) -> None:
    """A 600 KB, 500-block body is cached whole: the first request writes it, the second reads it."""
    blocks = [
        {"type": "text", "text": f"paragraph {i}: " + "The quick brown fox jumps over the lazy dog. " * 27}
        for i in range(500)
    ]
    blocks[-1]["cache_control"] = CC
    b = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": blocks}]}
    raw = orjson.dumps(b)
    assert len(raw) > 600_000
    h = {"x-api-key": "k", "anthropic-version": "2023-06-01", "content-type": "application/json"}
    usages = []
    for _ in range(2):  # cold (tokenised) and warm (memoised)
        async with sim.session.post(sim.url + "/v1/messages", data=raw, headers=h) as r:
            assert r.status == 200
            usages.append((await r.json())["usage"])
    written = usages[0]["cache_creation_input_tokens"]
    assert written > 100_000
    assert (usages[0]["cache_read_input_tokens"], usages[1]["cache_creation_input_tokens"]) == (0, 0)
    assert usages[1]["cache_read_input_tokens"] == written
