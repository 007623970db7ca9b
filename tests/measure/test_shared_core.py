"""One divergence core (`proxy.divergence`) behind live measurement and `promptcache explain`.

The same pairs (A = the previous request, B = the current one) go through both paths: the live
response stage (`proxy.measure.measure` on a real `Exchange` whose previous record is A's) and
the offline command's core (`proxy.forensics.explain`). Both must give the same cause, section,
first divergent block and predicted read, with the exact values written here. Also: OpenAI's
prefix caching has no block lookback (docs/provider-rules.md 2.1 and 2.3), so an OpenAI request
that diverges more than 20 blocks before its end still reads the previous breakpoint inside the
shared prefix, where Anthropic's 20-position lookback (1.5) would find nothing.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CollectorRegistry

from proxy.divergence import (
    compare,
    is_rewrite,
    marker_positions,
    predict_read,
    prompt_of,
    read_rules,
    reference_of,
)
from proxy.exchange import Exchange
from proxy.forensics import explain
from proxy.measure import measure
from proxy.metrics import Metrics
from proxy.providers import ANTHROPIC, OPENAI_CHAT
from proxy.providers.base import ProviderAdapter, Usage
from proxy.rules import RuleSet, load_rules
from proxy.services import Services
from proxy.settings import Settings
from tests.measure.bodies import BASE, record_for, variant
from tests.pipeline.strategies import anthropic_bodies

MESSAGES = "/v1/messages"
CHAT = "/v1/chat/completions"
NO_MINIMUM = RuleSet(rules=(), min_tokens_by_prefix=(), default_min_tokens=0)
RULES = load_rules()


record_of = record_for


def live(
    adapter: ProviderAdapter, a: dict[str, Any], b: dict[str, Any], usage: Usage | None, rules: RuleSet
) -> tuple[Any, ...]:
    """B measured by the response stage against A's record (the session's verdict on a rewritten
    history given as the offline rule finds it: the stage sees the client's bytes, not A)."""
    svc = Services(settings=Settings(), metrics=Metrics(CollectorRegistry()), rules=rules)
    ex = Exchange(adapter, adapter.api_path, "", CIMultiDictProxy(CIMultiDict()), orjson.dumps(b))
    ex.body, ex.status, ex.usage = b, 200, usage
    ex.previous = record_of(adapter, a) if a else None
    blocks_a = adapter.prefix_blocks(a)
    messages = [blk.message_index if blk.section == "messages" else None for blk in blocks_a]
    probe = compare(
        ex.previous, prompt_of(adapter, b, read_rules(adapter, b)), read_rules(adapter, b)
    )
    if probe.divergence.section == "messages" and a and is_rewrite(messages, probe.divergence.block_index):
        ex.history_rewritten = 0
    measure(ex, svc)
    m = ex.measurement
    assert m is not None
    return (m.cause, m.divergence.section, m.divergence.block_index, m.block_path, m.predicted_read_tokens)


def offline(
    adapter: ProviderAdapter, a: dict[str, Any], b: dict[str, Any], usage: Usage | None, rules: RuleSet
) -> tuple[Any, ...]:
    x = explain(a, b, adapter.api_path, usage=usage, min_tokens=rules.min_tokens(b.get("model")))
    return (x.cause, x.section, x.block_index, x.block_path, x.predicted_read_tokens)


USAGE = Usage(input_none=20, cache_read=0, cache_write_5m=300, output=10, seen=True)
READ_SYSTEM = Usage(input_none=20, cache_read=44, cache_write_5m=300, output=10, seen=True)

ANTHROPIC_PAIRS = [
    ("none", Usage(cache_read=80, cache_write_5m=20, seen=True), ("none", "none", 6, None, 80)),
    ("none", USAGE, ("expired", "none", 6, None, 80)),
    ("identical", None, ("none", "none", 6, None, 80)),
    ("model_changed", USAGE, ("model_changed", "none", 0, None, 0)),
    ("tools_changed", USAGE, ("tools_changed", "tools", 0, "tools[0]", 0)),
    ("params_changed", USAGE, ("params_changed", "none", 0, None, 0)),
    ("system_changed", USAGE, ("system_changed", "system", 2, "system[1]", 0)),
    ("messages_changed", READ_SYSTEM, ("messages_changed", "messages", 5, "messages[2].content[0]", 44)),
    ("messages_changed", USAGE, ("expired", "messages", 5, "messages[2].content[0]", 44)),
    ("history_rewritten", READ_SYSTEM, ("history_rewritten", "messages", 3, "messages[0].content", 44)),
]


@pytest.mark.parametrize(
    ("name", "usage", "expected"), ANTHROPIC_PAIRS, ids=[f"{p[0]}-{i}" for i, p in enumerate(ANTHROPIC_PAIRS)]
)
def test_anthropic_pairs_answer_the_same_live_and_offline(name: str, usage: Usage | None, expected: tuple) -> None:
    b = variant(name)
    assert live(ANTHROPIC, BASE, b, usage, NO_MINIMUM) == expected
    assert offline(ANTHROPIC, BASE, b, usage, NO_MINIMUM) == expected


def test_a_first_request_answers_the_same() -> None:
    expected = ("first_request", "none", 0, None, 0)
    assert live(ANTHROPIC, {}, BASE, USAGE, NO_MINIMUM) == expected
    assert offline(ANTHROPIC, {}, BASE, USAGE, NO_MINIMUM) == expected


# --- OpenAI: no block lookback -----------------------------------------------------------------

BREAKPOINT = {"mode": "explicit"}
TEXT = "x" * 40
"""40 bytes: 10 tokens by the bytes/4 estimate (no tokenizer loaded)."""


def _chat(n_messages: int, marked: int) -> dict[str, Any]:
    """A GPT-5.6 Chat request (implicit breakpoint mode, the default): a 4,000-byte system part
    with a breakpoint (block 0), then `n_messages` alternating user / assistant messages of
    `TEXT` (message `i` is block `i`), message `marked` a user message whose one text part
    carries a breakpoint."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": [{"type": "text", "text": "s" * 4000, "prompt_cache_breakpoint": BREAKPOINT}]}
    ]
    for i in range(1, n_messages + 1):
        role = "user" if i % 2 else "assistant"
        content: Any = [{"type": "text", "text": TEXT, "prompt_cache_breakpoint": BREAKPOINT}] if i == marked else TEXT
        messages.append({"role": role, "content": content})
    return {"model": "gpt-5.6", "messages": messages}


def _openai_pair() -> tuple[dict[str, Any], dict[str, Any]]:
    """A: system + 29 messages, breakpoints on blocks 0 and 29 (its newest user message).
    B: A with its newest message edited, then 26 more messages (56 blocks), breakpoints on
    blocks 0 and 55. B diverges at block 29, 27 blocks before its end."""
    a = _chat(29, marked=29)
    b = _chat(55, marked=55)
    b["messages"][29]["content"] = [{"type": "text", "text": "y" * 40}]
    return a, b


# The read (docs/provider-rules.md 2.3, implicit mode): the end of the newest user message inside
# the shared prefix (blocks 0-28), message 27, where the request that sent it as its newest
# wrote its implicit breakpoint; B's own turn ends are readable there, however far back.
# Its offset by the harmony rule (proxy.providers.openai_tokens, bytes/4 per text): the system
# message is 2 + 2 ("system") + 1,000 tokens, closed by 1 (1,005); then 13 user messages of
# 2 + 1 + 10 + 1 = 14 and 13 assistant messages of 2 + 3 + 10 + 1 = 16 (messages 1-26: 390);
# message 27 is 14 more: 1,005 + 390 + 14 = 1,409.
OPENAI_READ = 1409


@pytest.mark.parametrize(
    ("usage", "cause"),
    [
        (Usage(input_none=300, cache_read=OPENAI_READ, cache_write_5m=200, seen=True), "messages_changed"),
        (Usage(input_none=300, cache_read=0, cache_write_5m=1609, seen=True), "expired"),
    ],
)
def test_openai_divergence_beyond_twenty_blocks_reads_the_shared_turn_end(usage: Usage, cause: str) -> None:
    a, b = _openai_pair()
    blocks = OPENAI_CHAT.prefix_blocks(b)
    assert len(blocks) == 56 and len(OPENAI_CHAT.prefix_blocks(a)) == 30
    expected = (cause, "messages", 29, "messages[29].content[0]", OPENAI_READ)
    assert live(OPENAI_CHAT, a, b, usage, RULES) == expected
    assert offline(OPENAI_CHAT, a, b, usage, RULES) == expected
    # the OpenAI adapter's rules carry no lookback; Anthropic's 20 positions from B's markers
    # (blocks 0 and 55) reach only the system breakpoint (4,025 canonical bytes: ~1,007 tokens)
    rules = read_rules(OPENAI_CHAT, b)
    assert rules.lookback is None
    previous = record_of(OPENAI_CHAT, a)
    assert previous.breakpoints == (0, 29)
    current = marker_positions([blk.value for blk in blocks], b, rules)
    assert current == (0, 55)
    positions = list(range(56))
    assert predict_read(previous.breakpoints, previous.ends, 29, current, positions, lookback=20) == (0, 1007)


def test_a_claude_model_behind_an_openai_gateway_keeps_anthropics_lookback() -> None:
    from proxy.profiles import load_profiles
    from proxy.providers import adapter_for

    gateway = adapter_for(load_profiles().get("openai", "litellm"), CHAT)
    body = {"model": "claude-sonnet-4-6", "messages": [{"role": "user", "content": "hi"}]}
    assert read_rules(gateway, body).lookback == 20
    assert gateway.predict_read_tokens(body, None, 1, 1, 1, (0,), 0) is None
    assert read_rules(OPENAI_CHAT, body).lookback is None


# --- properties ---------------------------------------------------------------------------------


@st.composite
def anthropic_pairs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """A random body A and a B that keeps, edits or extends it."""
    a = draw(anthropic_bodies())
    b = copy.deepcopy(a)
    action = draw(st.sampled_from(["same", "append", "edit", "drop", "other"]))
    messages = b.get("messages")
    if action == "append" and isinstance(messages, list):
        messages.append({"role": "user", "content": draw(st.text(min_size=1, max_size=20))})
    elif action == "edit" and isinstance(messages, list) and messages:
        i = draw(st.integers(0, len(messages) - 1))
        messages[i] = {"role": messages[i].get("role", "user"), "content": "edited " + draw(st.text(max_size=10))}
    elif action == "drop" and isinstance(messages, list) and messages:
        messages.pop()
    elif action == "other":
        b = draw(anthropic_bodies())
    return a, b


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(anthropic_pairs())
def test_live_and_offline_agree_on_random_pairs(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    a, b = pair
    a.setdefault("model", "claude-sonnet-4-6")
    b.setdefault("model", "claude-sonnet-4-6")
    before = (orjson.dumps(a), orjson.dumps(b))
    usage = Usage(input_none=10, cache_read=0, cache_write_5m=50, seen=True)
    assert live(ANTHROPIC, a, b, usage, NO_MINIMUM) == offline(ANTHROPIC, a, b, usage, NO_MINIMUM)
    assert (orjson.dumps(a), orjson.dumps(b)) == before  # inputs never modified


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(anthropic_pairs())
def test_a_request_compared_with_itself_shares_everything(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    a, _ = pair
    a.setdefault("model", "claude-sonnet-4-6")
    rules = read_rules(ANTHROPIC, a)
    prompt = prompt_of(ANTHROPIC, a, rules)
    got = compare(reference_of(prompt), prompt, rules)
    n = len(prompt.blocks)
    assert (got.cause, got.divergence.section, got.divergence.block_index, got.divergence.shared_blocks) == (
        "none",
        "none",
        n,
        n,
    )
    assert got.divergence.byte_offset == prompt.chain.total_bytes and got.divergence.ratio == 1.0
    # the furthest marker is read when it lies within the lookback of the last one
    assert got.predicted_breakpoint == (prompt.markers[-1] if prompt.markers else None)


def test_the_explain_command_counts_openai_reads_as_a_live_proxy_does(tmp_path) -> None:
    """With the tokenizer loaded (as `serve` loads it at start) live measurement counts OpenAI's
    read in `o200k_base` tokens; `promptcache explain` counts it the same way."""
    import io

    from proxy.explain import explain_command
    from proxy.sim.tokens import TokenCounter, load_o200k

    a, b = _openai_pair()
    (tmp_path / "a.json").write_bytes(orjson.dumps(a))
    (tmp_path / "b.json").write_bytes(orjson.dumps(b))
    svc = Services(settings=Settings(), metrics=Metrics(CollectorRegistry()), rules=RULES)
    svc.tokens = TokenCounter(load_o200k())
    ex = Exchange(OPENAI_CHAT, CHAT, "", CIMultiDictProxy(CIMultiDict()), orjson.dumps(b))
    ex.body, ex.status, ex.usage, ex.previous = b, 200, None, record_of(OPENAI_CHAT, a)
    measure(ex, svc)
    assert ex.measurement is not None
    read = ex.measurement.predicted_read_tokens
    assert ex.measurement.predicted_breakpoint == 27 and read != OPENAI_READ  # real tokens, not bytes/4
    counted = OPENAI_CHAT.predict_read_tokens(b, svc.tokens.count, 56, 29, 30, (0, 29), RULES.min_tokens("gpt-5.6"))
    assert counted == (27, read)
    out = io.StringIO()
    assert explain_command(str(tmp_path / "a.json"), str(tmp_path / "b.json"), out=out, err=io.StringIO()) == 1
    assert f"expected cache read from A's breakpoints: ~{read:,} tokens\n" in out.getvalue()
