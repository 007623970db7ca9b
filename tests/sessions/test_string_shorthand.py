"""String content is shorthand for one text block (finding P2): the prefix chain, the message
digests behind session inference and `history_rewritten`, and replay all treat
`content: "x"` and `content: [{"type": "text", "text": "x"}]` (markers aside) as one block, and
nothing else: other keys (`citations`), another key order or two blocks are real differences."""

from __future__ import annotations

import copy
from typing import Any

import orjson

from proxy.pipeline.replay import Masker, first_mismatch, splice, stripped_bytes, view_messages
from proxy.prefix import canonical_value, digest_bytes, scan_prompt, shared_blocks
from proxy.providers import ANTHROPIC, OPENAI_CHAT
from proxy.rules import load_rules, volatile_patterns
from proxy.session_identity import SessionIndex
from proxy.store.codec import Sidecar

MESSAGES = "/v1/messages"
CHAT = "/v1/chat/completions"
MASKER = Masker(volatile_patterns(load_rules()))
EPH = {"type": "ephemeral"}
SYSTEM = "You are a careful assistant."


def _body(*contents: Any, system: Any = SYSTEM) -> dict[str, Any]:
    roles = ("user", "assistant")
    return {
        "model": "claude-sonnet-4-6",
        "system": system,
        "messages": [{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)],
    }


def _chain(body: dict[str, Any], adapter: Any = ANTHROPIC) -> Any:
    return scan_prompt(adapter.layout(body)).chain


def test_canonical_value_expands_strings_only() -> None:
    message = {"role": "user", "content": "hi"}
    before = copy.deepcopy(message)
    assert canonical_value("x") == {"type": "text", "text": "x"}
    assert canonical_value(message) == {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    assert message == before  # never mutated
    block = {"type": "tool_result", "tool_use_id": "t", "content": "r"}
    assert canonical_value(block) is block  # a block, not a message: left alone
    listed = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    assert canonical_value(listed) is listed


def test_digest_bytes_are_the_canonical_values_bytes() -> None:
    for text in ("", "Say hello.", 'quote " and \\ and \n', "caf\u00e9 \U0001f600"):
        assert digest_bytes(text, orjson.dumps(text)) == orjson.dumps(canonical_value(text))
    block = {"type": "text", "text": "x"}
    assert digest_bytes(block, orjson.dumps(block)) == orjson.dumps(block)


def test_prefix_chain_string_equals_one_marked_text_block() -> None:
    a = _body([{"type": "text", "text": "Say hello.", "cache_control": EPH}])
    b = _body("Say hello.", "Hello.", "Thanks.")
    chain_a, chain_b = _chain(a), _chain(b)
    assert shared_blocks(chain_a, chain_b) == len(chain_a) == 2
    # offsets count each block as sent: the string's own JSON, the block's without its marker
    assert chain_b.ends[:2] == (len(orjson.dumps(SYSTEM)), len(orjson.dumps(SYSTEM)) + len(b'"Say hello."'))
    assert chain_a.ends[1] - chain_a.ends[0] == len(b'{"type":"text","text":"Say hello."}')
    # a string system and its one-block list are the same block too
    listed = _body("Say hello.", system=[{"type": "text", "text": SYSTEM, "cache_control": EPH}])
    assert _chain(listed).chain == _chain(_body("Say hello.")).chain


def test_prefix_chain_tells_real_differences() -> None:
    plain = _chain(_body("Say hello."))
    cited = _body([{"type": "text", "text": "Say hello.", "citations": []}])
    reordered = _body([{"text": "Say hello.", "type": "text"}])
    split = _body([{"type": "text", "text": "Say "}, {"type": "text", "text": "hello."}])
    for other in (cited, reordered, split):
        assert shared_blocks(plain, _chain(other)) == 1, other["messages"]


def test_openai_chat_string_equals_one_text_part() -> None:
    a = {"model": "gpt-5.1", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    b = {"model": "gpt-5.1", "messages": [{"role": "user", "content": "hi"}]}
    assert _chain(a, OPENAI_CHAT).chain == _chain(b, OPENAI_CHAT).chain


def test_message_digests_fold_the_shorthand_and_keep_real_differences() -> None:
    text = "Current time: 2026-11-29T20:09:13Z\nSay hello."
    plain = {"role": "user", "content": text}
    marked = {"role": "user", "content": [{"type": "text", "text": text, "cache_control": EPH}]}
    assert MASKER.digests(plain) == MASKER.digests(marked)
    restamped = {"role": "user", "content": text.replace("20:09", "21:15")}
    assert MASKER.digest(restamped) == MASKER.digest(marked)  # masking still applies
    cited = {"role": "user", "content": [{"type": "text", "text": text, "citations": []}]}
    two = {"role": "user", "content": [{"type": "text", "text": text}, {"type": "text", "text": ""}]}
    assert len({MASKER.digest(plain), MASKER.digest(cited), MASKER.digest(two)}) == 3


def test_inference_appends_and_nothing_is_rewritten() -> None:
    a = _body([{"type": "text", "text": "Say hello.", "cache_control": EPH}])
    b = _body("Say hello.", [{"type": "text", "text": "Hello."}], [{"type": "text", "text": "Thanks."}])
    view_a = view_messages(ANTHROPIC, a, MASKER)
    view_b = view_messages(ANTHROPIC, b, MASKER)
    assert view_b.boundaries[0] == view_a.boundaries[-1]
    index = SessionIndex(clock=lambda: 0.0)
    index.register("t", "s", view_a.boundaries)
    assert index.infer("t", view_b.boundaries).kind == "append"
    stored = (Sidecar(0, view_a.digests[0], stripped_bytes(a["messages"][0]), view_a.exact[0]),)
    assert first_mismatch(view_b.digests, stored, view_b.system_positions) is None


def test_replay_sends_the_form_sent_before() -> None:
    sent = {"role": "user", "content": [{"type": "text", "text": "Say hello.", "cache_control": EPH}]}
    view_a = view_messages(ANTHROPIC, _body(sent["content"]), MASKER)
    sidecar = Sidecar(0, view_a.digests[0], stripped_bytes(sent), view_a.exact[0])
    b = _body("Say hello.", "Hello.", "Thanks.")
    before = copy.deepcopy(b)
    view_b = view_messages(ANTHROPIC, b, MASKER)
    result = splice(b["messages"], view_b.digests, (sidecar,), view_b.system_positions, view=view_b)
    assert result.replayed == 1 and result.positions == (0,)
    assert result.items is not None
    assert result.items[0] == {"role": "user", "content": [{"type": "text", "text": "Say hello."}]}
    assert result.items[1:] == b["messages"][1:] and b == before
    # and back: a list now, a string before
    string_sidecar = Sidecar(0, view_b.digests[0], stripped_bytes(b["messages"][0]), view_b.exact[0])
    c = _body([{"type": "text", "text": "Say hello."}], "Hello.", "Thanks.")
    view_c = view_messages(ANTHROPIC, c, MASKER)
    back = splice(c["messages"], view_c.digests, (string_sidecar,), view_c.system_positions, view=view_c)
    assert back.items is not None and back.items[0] == {"role": "user", "content": "Say hello."}


def test_string_system_and_its_one_block_list_share_the_head() -> None:
    listed = _body("Say hello.", system=[{"type": "text", "text": SYSTEM, "cache_control": EPH}])
    plain = _body("Say hello.")
    assert view_messages(ANTHROPIC, listed, MASKER).head == view_messages(
        ANTHROPIC, plain, MASKER
    ).head
