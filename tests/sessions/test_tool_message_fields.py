"""A Chat tool message re-sent without a field it had is replayed from the sidecar (issue 12,
finding 6).

Hermes Agent on Chat Completions sends `{"role": "tool", "tool_call_id", "name", "content"}` and,
after `--resume`, the same message without `name`: the prefix breaks at the first tool message
(only OpenAI's 128-token rounding hides it on a short session). Session identity and replay ignore
the optional `name` (`OpenAIChatAdapter.identity_optional`), so the message goes upstream as first
sent and the next turn reads the whole previous request.
"""

from __future__ import annotations

from typing import Any

from proxy.pipeline.replay import Masker, view_messages
from proxy.providers import OPENAI_CHAT
from proxy.sim.openai import render_chat
from proxy.sim.tokens import TokenCounter
from tests.pipeline.test_simulator import GUIDE
from tests.pipeline.test_simulator_turns import _both

CHAT = "/v1/chat/completions"
HEADERS = {"authorization": "Bearer sk-sim-test", "content-type": "application/json"}
OUTPUT = "\n".join(f"file_{i}.py: {i * 37} lines, last changed by the build script" for i in range(80))


def _body(resumed: bool) -> dict[str, Any]:
    tool: dict[str, Any] = {"role": "tool", "tool_call_id": "call_1", "content": OUTPUT}
    if not resumed:
        tool["name"] = "list_files"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": GUIDE},
        {"role": "user", "content": "What is in the repository?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "list_files", "arguments": "{}"}}
            ],
        },
        tool,
        {"role": "assistant", "content": "Eighty Python files."},
        {"role": "user", "content": "Which one is the longest?"},
    ]
    if resumed:
        messages += [{"role": "assistant", "content": "file_79.py."}, {"role": "user", "content": "Thanks."}]
    return {"model": "gpt-4o", "messages": messages}


def test_identity_ignores_a_dropped_tool_name() -> None:
    masker = Masker()
    first = view_messages(OPENAI_CHAT, _body(resumed=False), masker)
    later = view_messages(OPENAI_CHAT, _body(resumed=True), masker)
    assert later.digests[: len(first.digests)] == first.digests
    assert later.exact[3] != first.exact[3]  # the bytes differ; only the identity ignores it
    other = _body(resumed=True)
    other["messages"][3] = {**other["messages"][3], "content": "nothing"}
    assert view_messages(OPENAI_CHAT, other, masker).digests[3] != first.digests[3]


async def test_resumed_tool_message_is_replayed_with_its_name(make_proxy: Any) -> None:
    bodies = [(CHAT, _body(resumed=False)), (CHAT, _body(resumed=True))]
    async with _both(make_proxy, bodies, HEADERS) as runs:
        assert runs.sent[1]["messages"][3] == _body(resumed=False)["messages"][3]
        counter = TokenCounter()
        first, second = (render_chat(body, counter).tokens for body in runs.sent)
        shared = next((i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), len(first))
        assert shared >= len(first) - 3  # all of the first request (its reply priming aside)
        cached = [u["prompt_tokens_details"]["cached_tokens"] for u in runs.usages]
        assert cached == [0, shared // 128 * 128]
        direct = runs.direct[1]["prompt_tokens_details"]["cached_tokens"]
        assert direct < cached[1] - 128  # the client alone breaks at the tool message
