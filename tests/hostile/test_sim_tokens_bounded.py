"""Long whitespace runs: tiktoken's pre-tokeniser overflows its stack on a run of about 1M
spaces (`pyo3_runtime.PanicException`, a BaseException), which dropped the simulator's
connection and would escape the proxy's fail-open (its OpenAI predictions count `o200k_base`).
Text is tokenised in bounded pieces, so counting never panics."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.sim.tokens import MAX_PIECE, TokenCounter
from tests.sessions.conftest import Sim

ANTHROPIC = {"x-api-key": "key-s", "anthropic-version": "2023-06-01"}
OPENAI = {"Authorization": "Bearer key-s"}
SPACES = " " * 1_000_000


def test_a_million_spaces_count_without_panicking() -> None:
    # o200k_base's longest run-of-spaces token is 128 spaces; MAX_PIECE is a multiple of 128,
    # so every full piece is MAX_PIECE / 128 tokens and the count is ceil(1e6 / 128).
    assert MAX_PIECE % 128 == 0
    counter = TokenCounter()
    assert counter.count(SPACES) == 7_813
    assert len(counter.encode(SPACES)) == 7_813
    assert counter.count("a" + SPACES + "b") == counter.count("a" + " " * 999_999) + counter.count(" b")


def test_short_text_counts_are_unchanged() -> None:
    counter = TokenCounter()
    assert counter.count("hello world") == 2
    assert counter.count(" " * 1_000) == 9


async def test_the_simulator_answers_a_huge_whitespace_system_prompt(sim: Sim) -> None:
    body = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 8,
        "system": SPACES,
        "messages": [{"role": "user", "content": "hi"}],
    }
    async with sim.session.post(sim.url + "/v1/messages", json=body, headers=ANTHROPIC) as r:
        assert r.status == 200


@pytest.mark.parametrize(("value", "kind"), [(5, "an integer"), (5.5, "a decimal"), (True, "a boolean")])
async def test_responses_input_of_the_wrong_type_is_a_400(sim: Sim, value: Any, kind: str) -> None:
    body = {"model": "gpt-5.1", "input": value}
    async with sim.session.post(sim.url + "/v1/responses", json=body, headers=OPENAI) as r:
        assert r.status == 400
        error = (await r.json())["error"]
    assert error == {
        "message": f"Invalid type for 'input': expected a string or an array, but got {kind} instead.",
        "type": "invalid_request_error",
        "param": "input",
        "code": "invalid_type",
    }


async def test_the_proxy_predicts_over_a_huge_whitespace_message(sim: Sim, start_proxy: Any) -> None:
    """The proxy's OpenAI prediction counts `o200k_base` over the client's text: two turns of a
    session whose first message is 1M spaces are answered and no stage fails."""
    proxy = await start_proxy(upstream=sim.url)
    headers = {**OPENAI, "x-session-id": "spaces"}
    messages: list[dict[str, Any]] = [{"role": "user", "content": SPACES}]
    for _ in range(2):
        body = {"model": "gpt-5.1", "messages": messages}
        async with sim.session.post(proxy.url + "/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status == 200
            reply = (await r.json())["choices"][0]["message"]
        messages = [*messages, {"role": "assistant", "content": reply["content"]}, {"role": "user", "content": "more"}]
        async with sim.session.get(proxy.url + "/healthz") as r:
            assert r.status == 200
    assert proxy.services.tokens is not None
    errors = [proxy.sample("promptcache_stage_errors_total", stage=s) for s in ("observe", "parse", "session")]
    assert errors == [0.0, 0.0, 0.0]
