"""The oracle: hand-computed bounds from the simulator's documented token rule (o200k_base count
of each text block + 3 tokens on a message's first block), TTL, minimum and volatile lines."""

from __future__ import annotations

import random

import pytest

from proxy.sim.tokens import TokenCounter
from proxy.workloads import text
from proxy.workloads.oracle import causal_ttls, optimum
from proxy.workloads.stable import stable_forms
from proxy.workloads.suite import COMMITTED_DIR, SUITE
from proxy.workloads.trace import Trace, TraceRequest, load_trace

MODEL = "claude-opus-5"  # 512-token minimum in rules/simulator.yaml
SYSTEM = text.prose(random.Random(7), 700)
COUNTER = TokenCounter()


def message_tokens(content: str) -> int:
    return COUNTER.count(content) + 3


def turns(*texts: str) -> list[dict[str, str]]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]


def request(gap: float, messages: list[dict[str, str]], system: str = SYSTEM) -> TraceRequest:
    return TraceRequest(
        gap, "/v1/messages", {"model": MODEL, "max_tokens": 64, "system": system, "messages": messages}
    )


def test_append_only_session_reads_the_whole_previous_request():
    trace = Trace(
        "t",
        "",
        (
            request(0, turns("u1")),
            request(10, turns("u1", "a1", "u2")),
            request(400, turns("u1", "a1", "u2", "a2", "u3")),
        ),
    )
    t1 = COUNTER.count(SYSTEM) + message_tokens("u1")
    t2 = t1 + message_tokens("a1") + message_tokens("u2")
    t3 = t2 + message_tokens("a2") + message_tokens("u3")
    best = optimum(trace)
    assert [b.total for b in best.requests] == [t1, t2, t3]
    # No gap over 5 minutes was seen before the 400 s one: a causal policy wrote 5-minute
    # entries at request 1, gone by request 2 (it was [0, t1, t2] with 1-hour entries always).
    assert causal_ttls(trace) == [300.0, 300.0, 3600.0]
    assert [b.read for b in best.requests] == [0, t1, 0]
    assert best.read == t1 and best.limit_binding == 0


def test_after_a_long_gap_entries_live_an_hour_and_a_client_1h_marker_counts_from_the_start():
    messages = [turns("u1"), turns("u1", "a1", "u2"), turns("u1", "a1", "u2", "a2", "u3")]
    t1 = COUNTER.count(SYSTEM) + message_tokens("u1")
    t2 = t1 + message_tokens("a1") + message_tokens("u2")
    paced = Trace("t", "", tuple(request(gap, m) for gap, m in zip((0, 400, 1000), messages, strict=True)))
    assert causal_ttls(paced) == [300.0, 3600.0, 3600.0]
    assert [b.read for b in optimum(paced).requests] == [0, 0, t2]
    first = request(0, messages[0])
    marked = {
        **first.body,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
    }
    client_1h = Trace(
        "t", "", (TraceRequest(0, first.path, marked), request(400, messages[1]), request(1000, messages[2]))
    )
    assert causal_ttls(client_1h) == [3600.0, 3600.0, 3600.0]
    assert [b.read for b in optimum(client_1h).requests] == [0, t1, t2]
    # a 5-minute entry refreshed within 5 minutes stays readable
    quick = Trace("t", "", tuple(request(gap, m) for gap, m in zip((0, 250, 250), messages, strict=True)))
    assert [b.read for b in optimum(quick).requests] == [0, t1, t2]


def test_entries_expire_after_an_hour_idle_and_below_the_minimum_nothing_is_written():
    trace = Trace("t", "", (request(0, turns("u1")), request(3600, turns("u1", "a1", "u2"))))
    assert [b.read for b in optimum(trace).requests] == [0, 0]
    tiny = Trace("t", "", (request(0, turns("u1"), "short"), request(5, turns("u1", "a1", "u2"), "short")))
    assert optimum(tiny).read == 0


def test_a_volatile_system_line_is_moved_out_of_the_prefix():
    def system(second: int) -> str:
        return f"Current time: {text.timestamp(second)}\n{SYSTEM}"

    trace = Trace(
        "t", "", (request(0, turns("u1"), system(0)), request(30, turns("u1", "a1", "u2"), system(30)))
    )
    forms = stable_forms(trace)
    assert forms[0].stable["system"] == forms[1].stable["system"] == [{"type": "text", "text": SYSTEM}]
    moved = forms[0].stable["messages"][0]["content"]
    assert moved[-1] == {"type": "text", "text": f"Current time: {text.timestamp(0)}"}
    assert forms[1].stable["messages"][0] == forms[0].stable["messages"][0]  # first-sent bytes replayed
    best = optimum(trace).requests[1]
    assert best.raw_read == 0
    stable_t1 = (
        COUNTER.count(SYSTEM) + message_tokens("u1") + COUNTER.count(f"Current time: {text.timestamp(0)}")
    )
    assert best.stable_read == best.read == stable_t1


def test_openai_automatic_caching_bound_uses_128_token_steps():
    system = text.prose(random.Random(3), 1500)
    chat = [
        TraceRequest(
            0,
            "/v1/chat/completions",
            {
                "model": "gpt-5.1",
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": "u1"}],
            },
        ),
        TraceRequest(
            5,
            "/v1/chat/completions",
            {
                "model": "gpt-5.1",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": "u1"},
                    {"role": "assistant", "content": "a1"},
                    {"role": "user", "content": "u2"},
                ],
            },
        ),
    ]
    best = optimum(Trace("t", "", tuple(chat))).requests
    # first request: <start>system<message>SYSTEM<end> <start>user<message>u1<end> <start>assistant<message>
    first = 3 + COUNTER.count(system) + 1 + 3 + COUNTER.count("u1") + 1 + 3
    assert best[0].total == first and best[0].read == 0
    shared = first - 3  # the reply priming is not part of the second request's prefix
    assert best[1].read == 1024 + (shared - 1024) // 128 * 128


@pytest.mark.parametrize("workload", [w for w in SUITE if w.committed], ids=lambda w: w.name)
def test_committed_workloads_never_need_more_than_four_markers(workload):
    best = optimum(load_trace(COMMITTED_DIR / f"{workload.name}.jsonl"))
    assert best.limit_binding == 0
    assert 0 < best.read < best.total
