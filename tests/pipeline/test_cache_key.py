"""The `prompt_cache_key` promptcache sets for OpenAI (issue 12, finding 5): stable per session,
shared by conversations that share at least ~1,024 tokens of prefix, at most 64 characters, the
client's own key kept, and never splitting conversations that share a prefix without the proxy.
"""

from __future__ import annotations

from typing import Any

import orjson
import xxhash

from proxy.pipeline.breakpoints import place_breakpoints
from proxy.providers import OPENAI_CHAT
from tests.pipeline.helpers import optimise
from tests.pipeline.test_simulator import GUIDE
from tests.pipeline.test_simulator_turns import _both

CHAT = "/v1/chat/completions"
HEADERS = {"authorization": "Bearer sk-sim-test", "content-type": "application/json"}
SHARED = "\n".join([GUIDE] * 6)  # about 12k tokens shared by both conversations


def _chat(tail: str, question: str, history: int = 0) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"{SHARED}\n{tail}"}]
    for k in range(history):
        messages += [{"role": "user", "content": f"q{k}"}, {"role": "assistant", "content": f"a{k}"}]
    messages.append({"role": "user", "content": question})
    return {"model": "gpt-4o", "messages": messages}


def _key(body: dict[str, Any]) -> str | None:
    return place_breakpoints(OPENAI_CHAT, body)[1].cache_key


def test_key_is_shared_by_a_long_common_prefix_and_stable_per_session() -> None:
    first = _key(_chat("You review Python.", "hi"))
    assert first is not None and len(first) <= 64
    assert _key(_chat("You review Rust, and only Rust.", "hello")) == first  # differs after 12k tokens
    assert _key(_chat("You review Python.", "later", history=3)) == first  # the same session later
    assert (
        _key(
            {"model": "gpt-4o", "messages": [{"role": "system", "content": "short"}, {"role": "user", "content": "x"}]}
        )
        != first
    )
    own = {**_chat("You review Python.", "hi"), "prompt_cache_key": "client-key"}
    out, plan = place_breakpoints(OPENAI_CHAT, own)
    assert plan.cache_key is None and out["prompt_cache_key"] == "client-key"


async def test_conversations_sharing_a_prefix_are_not_routed_apart(make_proxy: Any) -> None:
    bodies = [
        (CHAT, _chat("You review Python.", "first?")),
        (CHAT, _chat("You review Rust, and only Rust.", "second?")),
    ]
    async with _both(make_proxy, bodies, HEADERS) as runs:
        direct = [u["prompt_tokens_details"]["cached_tokens"] for u in runs.direct]
        through = [u["prompt_tokens_details"]["cached_tokens"] for u in runs.usages]
        assert direct[1] > 10_000  # without the proxy the second reads the shared prefix
        assert through == direct
        assert runs.sent[0]["prompt_cache_key"] == runs.sent[1]["prompt_cache_key"]


def _reference_key(system_text: str) -> str:
    """The key's definition, written out: xxh3-128 of the first 1,024 estimated tokens (4,096
    bytes) of the tools + stable system blocks' orjson bytes (no tools here: the system text)."""
    return "pc-" + xxhash.xxh3_128(orjson.dumps(system_text)[:4096]).hexdigest()


def test_the_key_is_exact_and_digests_stable_content_only() -> None:
    assert _key(_chat("You review Python.", "hi")) == _reference_key(SHARED)
    keys = set()
    for turn in range(3):  # a todo checklist under a timestamped heading, inside the first 1,024 tokens
        todo = f"## Todo (updated 2026-12-01T09:0{turn}:00Z)\n" + "".join(
            f"- [{'x' if k < turn else ' '}] step {k}\n" for k in range(turn + 2)
        )
        body = _chat("You review Python.", f"turn {turn}?", history=turn)
        body["messages"][0]["content"] = f"{todo}\n# Guide\n{body['messages'][0]['content']}"
        out, plan = optimise(OPENAI_CHAT, body)
        assert out["messages"][-1]["content"][0]["text"] == f"{todo}\n"  # the section moved whole
        keys.add(plan.cache_key)
    assert keys == {_reference_key(f"# Guide\n{SHARED}")}  # the key never digested the changing section
