"""A conversation re-sent in the official SDK's `model_dump()` form is not an edit (attack pass,
session 15, fidelity).

An app that stores its replies with `model_dump()` and sends them back gets explicit nulls the
earlier requests did not have (anthropic `TextBlock`: `"citations": null`; `ToolUseBlock`:
`"caller"`, `"toolset_name"`; openai `ChatCompletionMessage`: `"refusal"`, `"annotations"`,
`"audio"`, `"function_call"`, `"tool_calls"`; Responses items: `"status"`, `"phase"`,
`"encrypted_content"`, an `output_text`'s `"logprobs"`). The APIs read such a null as the field
absent (`proxy.nulls`), so session identity keeps the session, replay sends the earlier bytes
and the cause is what it is without the nulls, in both modes. A null inside a tool call's input
(`{"limit": null}`) is data: dropping it is still an edit. Every dict below is made by the
installed SDKs' own models, never typed by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest
from anthropic.types import TextBlock, ToolUseBlock
from hypothesis import given
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionMessage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseReasoningItem

from proxy.nulls import VALUES, NullAbsent, block_without_nulls, has_nulls, without_nulls
from proxy.pipeline.replay import Masker, view_messages
from proxy.prefix import scan_prompt, shared_blocks
from proxy.providers import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES
from proxy.sim.anthropic import parse_request
from proxy.sim.config import SimConfig
from proxy.sim.openai import render_chat, render_responses
from proxy.sim.tokens import TokenCounter
from tests.pipeline.test_simulator import GUIDE
from tests.sessions.test_fast_paths import _services, run_exchange

sim_app = pytest.importorskip("proxy.sim.app")
sim_clock = pytest.importorskip("proxy.sim.clock")
SONNET = "claude-sonnet-4-6"

HEADERS = {"x-api-key": "key-a", "authorization": "Bearer sk-a"}
RESULT = "\n".join(f"line {i}: def f{i}(x): return x * {i}" for i in range(40))

Form = Callable[[Any], dict[str, Any]]


def plain(model: Any) -> dict[str, Any]:
    """The reply as an app writes it by hand from the SDK object: only the fields it has."""
    out: dict[str, Any] = model.model_dump(exclude_none=True)
    return out


def dumped(model: Any) -> dict[str, Any]:
    """The reply as `model_dump()` stores it: every optional field, null when unset."""
    out: dict[str, Any] = model.model_dump()
    return out


# --- the three APIs' conversations, from the SDKs' response models ----------------------


def _anthropic_replies() -> tuple[list[Any], list[Any]]:
    first = [
        TextBlock.model_validate({"type": "text", "text": "Let me read it."}),
        ToolUseBlock.model_validate(
            {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "a.py", "limit": None}}
        ),
    ]
    return first, [TextBlock.model_validate({"type": "text", "text": "It defines forty functions."})]


def anthropic_turns(early: Form, late: Form, edit: bool = False) -> list[dict[str, Any]]:
    """Three requests: the question; the first reply (as `early`) and its tool result; both
    replies (as `late`) and a thanks. `edit`: the third request drops the null from the tool
    call's input (a change of what the model called the tool with)."""
    first, second = _anthropic_replies()
    question = {"role": "user", "content": "What is in a.py?"}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": RESULT}]}
    again = [late(block) for block in first]
    if edit:
        again[1] = {**again[1], "input": {"path": "a.py"}}
    base = {"model": "claude-sonnet-4-6", "max_tokens": 64, "system": "You read code."}
    return [
        {**base, "messages": [question]},
        {**base, "messages": [question, {"role": "assistant", "content": [early(b) for b in first]}, result]},
        {
            **base,
            "messages": [
                question,
                {"role": "assistant", "content": again},
                result,
                {"role": "assistant", "content": [late(b) for b in second]},
                {"role": "user", "content": "Thanks."},
            ],
        },
    ]


def chat_turns(early: Form, late: Form, edit: bool = False) -> list[dict[str, Any]]:
    """The same conversation on Chat Completions (`ChatCompletionMessage` replies)."""
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "read", "arguments": '{"path":"a.py","limit":null}'},
    }
    first = ChatCompletionMessage.model_validate({"role": "assistant", "content": None, "tool_calls": [call]})
    second = ChatCompletionMessage.model_validate({"role": "assistant", "content": "It defines forty functions."})
    question = {"role": "system", "content": "You read code."}, {"role": "user", "content": "What is in a.py?"}
    result = {"role": "tool", "tool_call_id": "call_1", "content": RESULT}
    again = late(first)
    if edit:
        again["tool_calls"][0]["function"]["arguments"] = '{"path":"a.py"}'
    return [
        {"model": "gpt-4o", "messages": [*question]},
        {"model": "gpt-4o", "messages": [*question, early(first), result]},
        {
            "model": "gpt-4o",
            "messages": [*question, again, result, late(second), {"role": "user", "content": "Thanks."}],
        },
    ]


def responses_turns(early: Form, late: Form, edit: bool = False) -> list[dict[str, Any]]:
    """The same conversation on Responses (its output items re-sent as input items)."""
    reasoning = ResponseReasoningItem.model_validate({"type": "reasoning", "id": "rs_1", "summary": []})
    call = ResponseFunctionToolCall.model_validate(
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": "read",
            "arguments": '{"path":"a.py","limit":null}',
            "status": "completed",
        }
    )
    reply = ResponseOutputMessage.model_validate(
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "It defines forty functions.", "annotations": []}],
        }
    )
    question = {"role": "user", "content": "What is in a.py?"}
    result = {"type": "function_call_output", "call_id": "call_1", "output": RESULT}
    again = [late(reasoning), late(call)]
    if edit:
        again[1] = {**again[1], "arguments": '{"path":"a.py"}'}
    base = {"model": "gpt-5", "instructions": "You read code.", "store": False}
    return [
        {**base, "input": [question]},
        {**base, "input": [question, early(reasoning), early(call), result]},
        {**base, "input": [question, *again, result, late(reply), {"role": "user", "content": "Thanks."}]},
    ]


APIS = {
    "anthropic": (ANTHROPIC, anthropic_turns),
    "chat": (OPENAI_CHAT, chat_turns),
    "responses": (OPENAI_RESPONSES, responses_turns),
}


def test_the_sdk_forms_differ_by_nulls_only() -> None:
    """The premise, per API: the `model_dump()` form holds nulls the plain one has not, and
    the plain form is the dumped one without them (`proxy.nulls.without_nulls`)."""
    for adapter, turns in APIS.values():
        with_nulls = turns(dumped, dumped)[2]
        without = turns(plain, plain)[2]
        key = "messages" if "messages" in without else "input"
        assert orjson.dumps(with_nulls) != orjson.dumps(without)
        rule = adapter.identity_nulls
        assert rule == NullAbsent(("content",))
        assert [without_nulls(m, rule) for m in with_nulls[key]] == without[key]


def test_without_nulls_two_levels_copy_on_write() -> None:
    rule = NullAbsent(("content",))
    block = {"type": "tool_use", "id": "t", "name": "f", "input": {"x": None}, "caller": None}
    message = {"role": "assistant", "content": [block, {"type": "text", "text": "a"}], "refusal": None}
    out = without_nulls(message, rule)
    assert out == {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"x": None}}, {"type": "text", "text": "a"}],
    }
    assert out["content"][1] is message["content"][1]  # unchanged blocks are the same objects
    assert out["content"][0]["input"] is block["input"]  # a null inside a value is data
    assert message["refusal"] is None and "caller" in block  # never mutated
    bare = {"role": "user", "content": [{"type": "text", "text": "a"}]}
    assert without_nulls(bare, rule) is bare
    assert block_without_nulls("x") == "x" and block_without_nulls(bare) is bare


_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=3))
_VALUE = st.recursive(
    _SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("abxy"), inner, max_size=3),
    max_leaves=6,
)
_KEYS = st.sampled_from(["type", "role", "text", "citations", "content", "refusal", "input"])
_BLOCK = st.dictionaries(_KEYS, _VALUE, max_size=4)
_MESSAGE = st.builds(
    lambda top, blocks: {**top, "content": blocks} if blocks is not None else top,
    st.dictionaries(_KEYS.filter(lambda k: k != "content"), _VALUE, max_size=4),
    st.none() | st.lists(_BLOCK | _SCALAR, max_size=4),
)


def _reference(message: Any) -> Any:
    """`without_nulls` written plainly: null-valued keys left out of the message and of the
    objects in its `content` list, a null `type` or `role` kept."""
    if not isinstance(message, dict):
        return message
    out = {k: v for k, v in message.items() if v is not None or k in VALUES}
    if isinstance(message.get("content"), list):
        out["content"] = [
            {k: v for k, v in b.items() if v is not None or k in VALUES} if isinstance(b, dict) else b
            for b in message["content"]
        ]
    return out


@given(_MESSAGE | _SCALAR)
def test_without_nulls_is_idempotent_preserves_content_and_never_mutates(message: Any) -> None:
    rule = NullAbsent(("content",))
    before = orjson.dumps(message)
    out = without_nulls(message, rule)
    assert out == _reference(message)
    assert orjson.dumps(message) == before  # the caller's value is never mutated
    assert without_nulls(out, rule) is out  # idempotent, and nothing left to drop
    assert has_nulls(message, rule) is (out is not message)
    assert (out is message) is (out == message)  # the same object exactly when nothing was dropped


@pytest.mark.parametrize("api", sorted(APIS))
def test_identity_and_chain_ignore_the_dumps_nulls(api: str) -> None:
    adapter, turns = APIS[api]
    masker = Masker()
    plain_view = view_messages(adapter, turns(plain, plain)[2], masker)
    dumped_view = view_messages(adapter, turns(plain, dumped)[2], masker)
    assert dumped_view.digests == plain_view.digests
    assert dumped_view.boundaries == plain_view.boundaries
    assert dumped_view.exact != plain_view.exact  # the bytes differ: only identity ignores it
    edited = view_messages(adapter, turns(plain, dumped, edit=True)[2], masker)
    position = 1 if api == "anthropic" else 2
    assert [i for i, (a, b) in enumerate(zip(edited.digests, plain_view.digests, strict=True)) if a != b] == [position]
    a, b = (scan_prompt(adapter.layout(turns(plain, late)[2])).chain for late in (plain, dumped))
    assert shared_blocks(a, b) == len(a) == len(b)


async def _run(adapter: Any, bodies: list[dict[str, Any]], mode: str) -> list[tuple[Any, ...]]:
    """Per request: (session id, inference kind, history_rewritten, replayed, cause, sent body)."""
    services = _services(mode)
    out = []
    for body in bodies:
        ex = await run_exchange(services, adapter, orjson.dumps(body), HEADERS)
        assert ex.failed_stage is None
        assert ex.measurement is not None and ex.session_inference is not None
        kind = ex.session_inference.kind
        out.append((ex.session_id, kind, ex.history_rewritten, ex.replayed, ex.measurement.cause, ex.outgoing))
    return out


def _array(adapter: Any, sent: bytes) -> list[Any]:
    body = orjson.loads(sent)
    return body["messages"] if adapter is not OPENAI_RESPONSES else body["input"]


CAUSES = ["first_request", "none", "none"]
"""The causes of the three requests without any null (the baseline, asserted below)."""


@pytest.mark.parametrize("mode", ["observe", "optimise"])
@pytest.mark.parametrize("api", sorted(APIS))
async def test_a_model_dump_resend_keeps_session_replay_and_cause(api: str, mode: str) -> None:
    adapter, turns = APIS[api]
    position = 1 if api == "anthropic" else 2
    baseline = await _run(adapter, turns(plain, plain), mode)
    assert [r[4] for r in baseline] == CAUSES
    assert [r[2] for r in baseline] == [None, None, None]
    for early, late in ((plain, dumped), (dumped, plain), (dumped, dumped)):
        runs = await _run(adapter, turns(early, late), mode)
        assert [r[0] for r in runs] == [r[0] for r in baseline]  # the one session
        assert [r[1] for r in runs] == [r[1] for r in baseline]
        assert [r[2] for r in runs] == [None, None, None]  # not a rewrite of history
        assert [r[4] for r in runs] == CAUSES
        second, third = _array(adapter, runs[1][5]), _array(adapter, runs[2][5])
        if mode == "optimise" and early is not late:
            # the earlier reply goes upstream as it was first sent: the provider's prefix is
            # byte-identical; only that message (the other reply is new on the third request)
            assert runs[2][3] == (2 if api == "responses" else 1)
            assert third[position] == second[position]
            assert orjson.dumps(third[position]) == orjson.dumps(second[position])
        else:
            assert [r[3] for r in runs] == [0, 0, 0]
            assert third[position] == turns(early, late)[2]["messages" if api != "responses" else "input"][position]


@pytest.mark.parametrize("mode", ["observe", "optimise"])
@pytest.mark.parametrize("api", sorted(APIS))
async def test_a_null_inside_a_tool_input_is_data(api: str, mode: str) -> None:
    adapter, turns = APIS[api]
    position = 1 if api == "anthropic" else 2
    for late in (plain, dumped):
        runs = await _run(adapter, turns(plain, late, edit=True), mode)
        assert runs[2][2] == position
        assert runs[2][4] == "history_rewritten"
        # replay stops at the edit: before it only the Responses reasoning item differs (by its
        # nulls: replayed as first sent, in optimise mode)
        assert runs[2][3] == (1 if api == "responses" and late is dumped and mode == "optimise" else 0)


# --- the simulator, and the official SDK end to end ---------------------------------------


def test_the_simulator_caches_both_forms_alike() -> None:
    """The simulator's prefix reads a null optional field as absent, as the APIs do: the same
    Anthropic block digests, the same OpenAI token sequences; a null in a tool input still
    counts (`proxy.sim.anthropic._strip`, `proxy.sim.openai._rendered`)."""
    counter = TokenCounter()
    settings = SimConfig.load().anthropic_model(SONNET)
    forms = [anthropic_turns(plain, late)[2] for late in (plain, dumped)]
    edited = anthropic_turns(plain, dumped, edit=True)[2]
    a, b, c = (parse_request(body, frozenset(), counter, settings) for body in (*forms, edited))
    assert [x.chain for x in a.blocks] == [x.chain for x in b.blocks]
    assert [x.tokens for x in a.blocks] == [x.tokens for x in b.blocks]
    assert [x.chain for x in c.blocks] != [x.chain for x in a.blocks]
    for render, turns in ((render_chat, chat_turns), (render_responses, responses_turns)):
        tokens = [list(render(turns(plain, late)[2], counter).tokens) for late in (plain, dumped)]
        assert tokens[0] == tokens[1]
        assert list(render(turns(plain, dumped, edit=True)[2], counter).tokens) != tokens[0]


async def _sdk_conversation(base_url: str, late: Form, key: str) -> list[Any]:
    """Three turns with the official SDK (automatic caching): the first reply appended as
    `plain` on the second turn, both replies as `late` on the third. The usage per turn."""
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key=key, max_retries=0)
    question = {"role": "user", "content": GUIDE + "\n\nWhat is in a.py?"}
    asks = [{"role": "user", "content": "And then?"}, {"role": "user", "content": "Thanks."}]
    usages: list[Any] = []
    replies: list[Any] = []
    async with client:
        for turn in range(3):
            history: list[Any] = [question]
            for reply, ask in zip(replies, asks, strict=False):
                form = plain if turn == 1 else late
                history += [{"role": "assistant", "content": [form(b) for b in reply]}, ask]
            message = await client.messages.create(
                model=SONNET, max_tokens=32, messages=history, cache_control={"type": "ephemeral"}
            )
            replies.append(message.content)
            usages.append(message.usage.model_dump(exclude_none=True))
    return usages


async def test_the_anthropic_sdk_through_promptcache_and_the_simulator(make_proxy: Any) -> None:
    """Straight to the simulator and through promptcache (optimise): the third turn re-sends
    the replies in `model_dump()` form and is billed exactly as with the plain dicts (it reads
    the whole second request); promptcache counts it an append of the one session."""
    runner, sim = await sim_app.start_sim("127.0.0.1", 0, clock=sim_clock.Clock.manual_at())
    try:
        proxy = await make_proxy(upstream=sim)
        runs: dict[tuple[str, str], list[Any]] = {}
        for base in (sim, proxy.url):
            for name, late in (("plain", plain), ("dumped", dumped)):
                async with aiohttp.ClientSession() as client, client.delete(f"{sim}/_sim/cache") as resp:
                    assert resp.status == 200
                runs[(base, name)] = await _sdk_conversation(base, late, f"sk-ant-sim-{name}")
        for base in (sim, proxy.url):
            usage = runs[(base, "dumped")]
            assert usage == runs[(base, "plain")]
            whole = usage[1]["input_tokens"] + usage[1]["cache_read_input_tokens"]
            assert usage[2]["cache_read_input_tokens"] == whole + usage[1]["cache_creation_input_tokens"]
        a = {"provider": "anthropic"}
        assert proxy.sample("promptcache_prefix_divergences_total", section="none", cause="none", **a) == 4
        assert proxy.sample("promptcache_prefix_divergences_total", section="none", cause="first_request", **a) == 2
        assert (
            proxy.sample("promptcache_prefix_divergences_total", section="messages", cause="history_rewritten", **a)
            == 0
        )
    finally:
        await runner.cleanup()
