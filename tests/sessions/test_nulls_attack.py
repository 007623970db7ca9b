"""Attack pass, session 16 (atk1): explicit nulls read as absent (`proxy.nulls`) where the
reading is not the API's, or depends on what the process saw before."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.pipeline.replay import Masker
from proxy.providers import ANTHROPIC


def _masked(values: list[Any]) -> list[bytes]:
    """The masked digests of `values` examined in turn by one fresh `Masker` (Anthropic rules)."""
    masker = Masker()
    return [masker.examine_all([v], nulls=ANTHROPIC.identity_nulls)[1][0] for v in values]


def test_a_projected_digest_does_not_depend_on_what_the_memo_saw_first() -> None:
    """`{"role": null, "content": "hi"}` and its one-text-block form have one exact digest (the
    canonical form), so the projection memoised under it must be the same for both: it was made
    from the form seen first (the null dropped before `canonical_value`, which then no longer
    saw a `role`), so a process that had seen the other form gave another masked digest than a
    fresh one (session identity and replay depended on history)."""
    short = {"role": None, "content": "hi"}
    listed = {"role": None, "content": [{"type": "text", "text": "hi"}]}
    fresh_short, fresh_listed = _masked([short])[0], _masked([listed])[0]
    assert fresh_short == fresh_listed
    assert _masked([listed, short]) == [fresh_short, fresh_short]
    assert _masked([short, listed]) == [fresh_short, fresh_short]
    assert orjson.dumps(short) != orjson.dumps(listed)


RESULT = "\n".join(f"line {i}: def f{i}(x): return x * {i}" for i in range(40))


def _responses_turns(question: dict[str, Any]) -> list[dict[str, Any]]:
    """Three Responses requests; the third re-sends the first item as `question`."""
    first = {"role": "user", "content": "What is in a.py?"}
    call = {"type": "function_call", "call_id": "call_1", "name": "read", "arguments": '{"path":"a.py"}'}
    result = {"type": "function_call_output", "call_id": "call_1", "output": RESULT}
    base = {"model": "gpt-5", "instructions": "You read code.", "store": False}
    return [
        {**base, "input": [first]},
        {**base, "input": [first, call, result]},
        {**base, "input": [question, call, result, {"role": "user", "content": "Thanks."}]},
    ]


async def test_a_null_item_type_is_not_a_message_item_replayed_as_one() -> None:
    """A Responses input item without `type` is a message; one whose `type` is null is not
    (the simulator renders it as an item of another kind, `render_responses`; the SDK types
    declare `type` a literal, never nullable, and no `model_dump()` writes it null). The null
    was read as the key absent, so replay sent the earlier message bytes in its place: the
    upstream read another prompt than the client's (optimise), where a process with no earlier
    requests sends the client's bytes. A null `type` or `role` is a value, not an absence."""
    from proxy.providers import OPENAI_RESPONSES
    from proxy.sim.openai import render_responses
    from proxy.sim.tokens import TokenCounter
    from tests.sessions.test_fast_paths import _services, run_exchange

    counter = TokenCounter()
    odd = {"type": None, "role": "user", "content": "What is in a.py?"}
    bodies = _responses_turns(odd)
    services = _services("optimise")
    headers = {"x-api-key": "key-a", "authorization": "Bearer sk-a"}
    sent = [await run_exchange(services, OPENAI_RESPONSES, orjson.dumps(b), headers) for b in bodies]
    third = sent[2]
    assert third.failed_stage is None
    assert orjson.loads(third.outgoing)["input"][0] == odd
    assert third.replayed == 0
    rendered = list(render_responses(orjson.loads(third.outgoing), counter).tokens)
    assert rendered == list(render_responses(bodies[2], counter).tokens)


def test_a_responses_tool_with_null_fields_is_rendered_as_the_proxy_chains_it() -> None:
    """The prefix chain digests a tool's null-valued top-level keys as absent (`prefix.null_free`:
    `FunctionToolParam.strict`, `description` are `Optional` in the SDK types), as the Anthropic
    simulator digests and counts a tool (`_strip`); the Responses simulator rendered the tool
    with its nulls, so the proxy predicted the whole prefix shared (cause `none`) where the
    simulator's cache missed from the first tool token."""
    from proxy.prefix import scan_prompt, shared_blocks
    from proxy.providers import OPENAI_RESPONSES
    from proxy.sim.openai import render_responses
    from proxy.sim.tokens import TokenCounter

    counter = TokenCounter()
    tool = {"type": "function", "name": "read", "parameters": {"type": "object", "default": None}}
    plain = {"model": "gpt-5", "tools": [tool], "input": [{"role": "user", "content": "hi " * 400}]}
    nulls = {**plain, "tools": [{**tool, "strict": None, "description": None}]}
    a, b = (scan_prompt(OPENAI_RESPONSES.layout(x)).chain for x in (plain, nulls))
    assert shared_blocks(a, b) == 2
    assert list(render_responses(nulls, counter).tokens) == list(render_responses(plain, counter).tokens)
    # a null inside the schema is data, for both
    inner = {**plain, "tools": [{**tool, "parameters": {"type": "object"}}]}
    c = scan_prompt(OPENAI_RESPONSES.layout(inner)).chain
    assert shared_blocks(a, c) == 0
    assert list(render_responses(inner, counter).tokens) != list(render_responses(plain, counter).tokens)


@pytest.mark.xfail(strict=True, reason="open: the null rule covers every key, not the declared nullable fields")
async def test_a_null_of_a_key_the_api_does_not_know_is_sent_as_the_client_wrote_it() -> None:
    """Open finding (not fixed): `proxy.nulls` reads a null of ANY key of a message or block as
    the key absent, not only of the fields the SDK types declare nullable (`citations`,
    `caller`, `refusal`, ...). The Messages API refuses a key it does not know whatever its value
    ("messages.1.content.0.text.bogus: Extra inputs are not permitted"; a message has only `role`
    and `content`), so a client's re-sent message with such a null is a 400 from a process with
    no earlier requests, and replay turns it into the earlier bytes (a 200). The simulator does
    not refuse unknown keys, so only the bytes sent show it."""
    from proxy.providers import ANTHROPIC as adapter
    from tests.sessions.test_fast_paths import _services, run_exchange

    base = {"model": "claude-sonnet-4-6", "max_tokens": 64, "system": "You read code."}
    question = {"role": "user", "content": "What is in a.py?"}
    reply = {"role": "assistant", "content": [{"type": "text", "text": "It defines " + RESULT}]}
    odd = {"role": "assistant", "content": [{**reply["content"][0], "bogus": None}], "id": None}
    bodies = [
        {**base, "messages": [question]},
        {**base, "messages": [question, reply, {"role": "user", "content": "And?"}]},
        {
            **base,
            "messages": [question, odd, {"role": "user", "content": "And?"}, reply, {"role": "user", "content": "Ok"}],
        },
    ]
    services = _services("optimise")
    headers = {"x-api-key": "key-a"}
    sent = [await run_exchange(services, adapter, orjson.dumps(b), headers) for b in bodies]
    assert orjson.loads(sent[2].outgoing)["messages"][1] == odd


def test_the_simulator_refuses_a_text_block_or_part_whose_text_is_null_or_missing() -> None:
    """The simulator digests a null `text` as absent (`_strip`, `_rendered`) but counted it as
    the text "None" (4 tokens, 3 without it: one cache entry, two prompt sizes), and accepted
    both, where the APIs refuse a text block or part without a string `text`."""
    from proxy.sim.anthropic import parse_request
    from proxy.sim.config import SimConfig
    from proxy.sim.errors import Rejected
    from proxy.sim.openai import render_chat, render_responses
    from proxy.sim.tokens import TokenCounter

    counter = TokenCounter()
    settings = SimConfig.load().anthropic_model("claude-sonnet-4-6")
    errors = []
    for block in ({"type": "text", "text": None}, {"type": "text"}):
        body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [block]}]}
        with pytest.raises(Rejected) as caught:
            parse_request(body, frozenset(), counter, settings)
        errors.append(caught.value.message)
        chat = {"model": "gpt-5", "messages": [{"role": "user", "content": [block]}]}
        with pytest.raises(Rejected) as caught:
            render_chat(chat, counter)
        errors.append(caught.value.message)
        part = {**block, "type": "input_text"}
        with pytest.raises(Rejected) as caught:
            render_responses({"model": "gpt-5", "input": [{"role": "user", "content": [part]}]}, counter)
        errors.append(caught.value.message)
    assert errors == [
        "messages.0.content.0.text.text: Input should be a valid string",
        "Invalid type for 'messages[0].content[0].text': expected a string, but got null instead.",
        "Invalid type for 'input[0].content[0].text': expected a string, but got null instead.",
        "messages.0.content.0.text.text: Field required",
        "Missing required parameter: 'messages[0].content[0].text'.",
        "Missing required parameter: 'input[0].content[0].text'.",
    ]
