"""OpenAI cache accounting of the simulator (Chat Completions and Responses), exact numbers.

Rendering (proxy/sim/openai.py): each message is `<start> role <message> content <end>` (3
structural tokens + the role's 1 token + content), the prompt ends with `<start> assistant
<message>` (3 tokens). So a lone user message of n content tokens is n + 7 prompt tokens.
"""

from __future__ import annotations

from typing import Any

from proxy.sim.tokens import TokenCounter

CONFORMANCE = [
    # (test name, docs/provider-rules.md section behind the rule)
    ("test_threshold_1024", "2.1 automatic for prompts >= 1,024 tokens; 2.4 cached_tokens 0 present"),
    ("test_hits_in_128_token_steps", "2.1 / 2.5 hits in 128-token increments"),
    ("test_include_usage_chunk", "2.4 final usage chunk only with include_usage, then [DONE]"),
    ("test_streamed_and_non_streamed_usage_identical", "2.4 usage fields, streamed and not"),
    ("test_responses_usage", "2.4 Responses input_tokens_details"),
    ("test_prompt_cache_key_routes", "2.1 prompt_cache_key combined with the prefix hash"),
    ("test_overflow_beyond_15_per_minute", "2.1 ~15 requests/minute per prefix+key"),
    ("test_in_memory_retention", "2.2 in-memory 5-10 min idle (default 10), refreshed on use"),
    ("test_extended_retention", "2.2 prompt_cache_retention 24h"),
    ("test_gpt56_explicit_breakpoint_exact", "2.3 exact match at a breakpoint, not rounded; 1.25x write"),
    ("test_gpt56_no_fallback_to_shorter_prefix", "2.3 no fallback to an unmarked prefix"),
    ("test_gpt56_write_limit", "2.3 at most 4 writes: implicit + latest 3 / latest 4 explicit"),
    ("test_gpt56_explicit_mode_without_breakpoints", "2.3 explicit mode, none -> no caching"),
    ("test_tenant_isolation", "2.1 caches scoped to the organization"),
]

tok = TokenCounter().count
BP = {"mode": "explicit"}


def words(n: int, word: str = "word") -> str:
    return f" {word}" * n


def chat(content: Any, model: str = "gpt-4o", **extra: Any) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


async def chat_usage(sim, body: dict, key: str = "tenant-a") -> dict:
    status, data = await sim.post("/v1/chat/completions", body, key=key)
    assert status == 200, data
    return data["usage"]


def cached(u: dict) -> int:
    return u["prompt_tokens_details"]["cached_tokens"]


async def test_threshold_1024(sim) -> None:
    below = chat(words(1016))
    for _ in range(2):
        u = await chat_usage(sim, below)
        assert (u["prompt_tokens"], cached(u)) == (1023, 0)
    at = chat(words(1017))
    assert [cached(await chat_usage(sim, at)) for _ in range(2)] == [0, 1024]
    assert "cache_write_tokens" not in u["prompt_tokens_details"]


async def test_hits_in_128_token_steps(sim) -> None:
    first = chat(words(1400))
    u = await chat_usage(sim, first)
    assert (u["prompt_tokens"], cached(u)) == (1407, 0)
    assert cached(await chat_usage(sim, first)) == 1280  # largest 1024 + 128k <= 1407
    # Shared prefix 3 + 1300 = 1303 tokens -> 1280; 3 + 1250 = 1253 -> 1152.
    assert cached(await chat_usage(sim, chat(words(1300) + words(200, "other")))) == 1280
    assert cached(await chat_usage(sim, chat(words(1250) + words(200, "else")))) == 1152
    # A difference inside the first 1,024 tokens: nothing.
    assert cached(await chat_usage(sim, chat(words(1000) + words(400, "else")))) == 0


async def test_include_usage_chunk(sim) -> None:
    body = chat(words(1200), stream_options={"include_usage": True})
    events = await sim.stream("/v1/chat/completions", body)
    assert events[-1] == ("", "[DONE]")
    usage_chunk = events[-2][1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["prompt_tokens"] == 1207
    assert all(data["usage"] is None for _, data in events[:-2])
    assert "".join(d["choices"][0]["delta"].get("content") or "" for _, d in events[:-2]) == (
        "OK from promptcache-sim (turn 1)"
    )
    plain = await sim.stream("/v1/chat/completions", chat(words(1200)))
    assert plain[-1] == ("", "[DONE]")
    assert all("usage" not in d and d["choices"] for _, d in plain[:-1])


async def test_streamed_and_non_streamed_usage_identical(sim) -> None:
    body = chat(words(1300), stream_options={"include_usage": True})
    plain = [await chat_usage(sim, body, key="plain") for _ in range(2)]
    streamed = [
        (await sim.stream("/v1/chat/completions", body, key="stream"))[-2][1]["usage"] for _ in range(2)
    ]
    assert streamed == plain and [cached(u) for u in plain] == [0, 1280]
    rbody = {"model": "gpt-4o", "input": words(1300)}
    rplain = []
    for _ in range(2):
        status, data = await sim.post("/v1/responses", rbody, key="r-plain")
        rplain.append(data["usage"])
    rstreamed = []
    for _ in range(2):
        events = await sim.stream("/v1/responses", rbody, key="r-stream")
        assert events[-1][0] == "response.completed"
        assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
        rstreamed.append(events[-1][1]["response"]["usage"])
    assert rstreamed == rplain
    assert [u["input_tokens_details"]["cached_tokens"] for u in rplain] == [0, 1280]


async def test_responses_usage(sim) -> None:
    body = {"model": "gpt-4o", "instructions": words(1200), "input": "hi"}
    # Each message: <start> role <message> ... <end> = 4 + content; then the 3-token priming.
    expected = (4 + 1200) + (4 + tok("hi")) + 3
    outputs = tok("OK from promptcache-sim (turn 1)")
    for cached_tokens in (0, 1152):
        status, data = await sim.post("/v1/responses", body)
        assert status == 200
        assert data["usage"] == {
            "input_tokens": expected,
            "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
            "output_tokens": outputs,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": expected + outputs,
        }
        assert data["output"][0]["content"][0]["text"] == "OK from promptcache-sim (turn 1)"


async def test_prompt_cache_key_routes(sim) -> None:
    base = words(1300)
    assert cached(await chat_usage(sim, chat(base, prompt_cache_key="a"))) == 0
    assert cached(await chat_usage(sim, chat(base, prompt_cache_key="b"))) == 0
    assert cached(await chat_usage(sim, chat(base, prompt_cache_key="a"))) == 1280
    assert cached(await chat_usage(sim, chat(base))) == 0


async def test_overflow_beyond_15_per_minute(sim) -> None:
    body = chat(words(1300), prompt_cache_key="busy")
    hits = [cached(await chat_usage(sim, body)) for _ in range(17)]
    # 1 write, 14 hits on machine 0; the 16th lands on machine 1 (cold), the 17th hits there.
    assert hits == [0] + [1280] * 14 + [0, 1280]
    await sim.advance(61)  # the window empties: back on machine 0
    assert cached(await chat_usage(sim, body)) == 1280


async def test_in_memory_retention(sim) -> None:
    body = chat(words(1300))
    await chat_usage(sim, body)
    await sim.advance(599)
    assert cached(await chat_usage(sim, body)) == 1280  # refreshed at 599
    await sim.advance(599)
    assert cached(await chat_usage(sim, body)) == 1280
    await sim.advance(600)
    assert cached(await chat_usage(sim, body)) == 0


async def test_extended_retention(sim) -> None:
    body = chat(words(1300), prompt_cache_retention="24h")
    await chat_usage(sim, body)
    await sim.advance(86_399)
    assert cached(await chat_usage(sim, body)) == 1280


def gpt56(system_parts: list[dict], user: str, **extra: Any) -> dict:
    return {
        "model": "gpt-5.6",
        "messages": [{"role": "system", "content": system_parts}, {"role": "user", "content": user}],
        **extra,
    }


async def test_gpt56_explicit_breakpoint_exact(sim) -> None:
    system = [{"type": "text", "text": words(1100), "prompt_cache_breakpoint": BP}]
    marker = 3 + 1100  # <start> system <message> + text
    turn_end = marker + 1 + 4 + tok("first")  # system <end>, then the whole user message
    u = await chat_usage(sim, gpt56(system, "first"))
    assert (cached(u), u["prompt_tokens_details"]["cache_write_tokens"]) == (0, turn_end)
    u = await chat_usage(sim, gpt56(system, "first"))
    assert (cached(u), u["prompt_tokens_details"]["cache_write_tokens"]) == (turn_end, 0)
    # A new question: exact hit at the marker (1,103, not a multiple of 128), write to the new end.
    new_end = marker + 1 + 4 + tok("second")
    u = await chat_usage(sim, gpt56(system, "second"))
    assert (cached(u), u["prompt_tokens_details"]["cache_write_tokens"]) == (1103, new_end - 1103)
    # The same conversation through Responses renders to the same tokens: it reads that entry.
    items = [
        {
            "role": "system",
            "content": [{"type": "input_text", "text": words(1100), "prompt_cache_breakpoint": BP}],
        },
        {"role": "user", "content": "second"},
    ]
    status, data = await sim.post("/v1/responses", {"model": "gpt-5.6", "input": items})
    assert data["usage"]["input_tokens_details"] == {
        "cached_tokens": new_end,
        "cache_write_tokens": 0,
        "cache_write_tokens_details": {"ttl_30m_tokens": 0, "ttl_12h_tokens": 0},
    }


async def test_gpt56_no_fallback_to_shorter_prefix(sim) -> None:
    system = [{"type": "text", "text": words(1300)}]
    results = {}
    for model in ("gpt-4o", "gpt-5.6"):
        await chat_usage(sim, gpt56(system, "one", model=model) | {"model": model})
        u = await chat_usage(sim, gpt56(system, "two") | {"model": model})
        results[model] = cached(u)
    # gpt-4o falls back to 128-token steps of the shared prefix; gpt-5.6 matches only at
    # breakpoints (the implicit one moved with the new user message): nothing.
    assert results == {"gpt-4o": 1280, "gpt-5.6": 0}


async def test_gpt56_write_limit(sim) -> None:
    parts = [
        {"type": "text", "text": words(1100, w), "prompt_cache_breakpoint": BP}
        for w in ("word", "text", "data", "code", "line", "file")
    ]
    assert all(tok(p["text"]) == 1100 for p in parts)
    offsets = [3 + 1100 * (i + 1) for i in range(6)]
    implicit = offsets[-1] + 1
    body = {"model": "gpt-5.6", "messages": [{"role": "user", "content": parts}]}
    u = await chat_usage(sim, body, key="implicit")
    assert u["prompt_tokens_details"]["cache_write_tokens"] == implicit
    async with sim.session.get(sim.url + "/_sim/cache") as r:
        written = sorted(e["tokens"] for e in (await r.json())["entries"])
    assert written == [*offsets[-3:], implicit]
    u = await chat_usage(sim, body | {"prompt_cache_options": {"mode": "explicit"}}, key="explicit")
    assert u["prompt_tokens_details"]["cache_write_tokens"] == offsets[-1]
    async with sim.session.get(sim.url + "/_sim/cache") as r:
        written = sorted(e["tokens"] for e in (await r.json())["entries"])
    assert written == sorted([*offsets[-3:], implicit, *offsets[-4:]])


async def test_gpt56_explicit_mode_without_breakpoints(sim) -> None:
    body = gpt56([{"type": "text", "text": words(1300)}], "q", prompt_cache_options={"mode": "explicit"})
    for _ in range(2):
        u = await chat_usage(sim, body)
        assert (cached(u), u["prompt_tokens_details"]["cache_write_tokens"]) == (0, 0)


async def test_tenant_isolation(sim) -> None:
    body = chat(words(1300))
    await chat_usage(sim, body, key="a")
    assert cached(await chat_usage(sim, body, key="b")) == 0
    assert cached(await chat_usage(sim, body, key="a")) == 1280
