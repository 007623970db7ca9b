"""The oracle: hand-computed bounds from the simulator's documented token rule (o200k_base count
of each text block + 3 tokens on a message's first block), TTL, minimum and volatile lines."""

from __future__ import annotations

import random

import pytest

from proxy.sim.tokens import TokenCounter
from proxy.workloads import text
from proxy.workloads.oracle import _Price, causal_ttls, cheapest_sequence, optimum
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


INPUT, WRITE_5M, WRITE_1H, READ = 5.00e-6, 6.25e-6, 10.00e-6, 0.50e-6  # USD per token, Opus 5


def three(gaps: tuple[float, float, float]) -> tuple[Trace, int, int, int]:
    messages = [turns("u1"), turns("u1", "a1", "u2"), turns("u1", "a1", "u2", "a2", "u3")]
    t1 = COUNTER.count(SYSTEM) + message_tokens("u1")
    t2 = t1 + message_tokens("a1") + message_tokens("u2")
    t3 = t2 + message_tokens("a2") + message_tokens("u3")
    trace = Trace("t", "", tuple(request(gap, m) for gap, m in zip(gaps, messages, strict=True)))
    return trace, t1, t2, t3


def test_clairvoyant_reads_whatever_was_sent_within_the_hour_and_the_causal_bound_sits_beside():
    trace, t1, t2, t3 = three((0, 10, 400))
    best = optimum(trace)
    assert [b.total for b in best.requests] == [t1, t2, t3]
    # Clairvoyant: request 2's prefix is read 400 s later (a 1-hour entry where the next read
    # is 5-60 minutes away).
    assert [b.read for b in best.requests] == [0, t1, t2]
    # Causal: no gap over 5 minutes was seen before the 400 s one, so 5-minute entries, gone.
    assert causal_ttls(trace) == [300.0, 300.0, 3600.0]
    assert [b.causal_read for b in best.requests] == [0, t1, 0]
    assert best.read == t1 + t2 and best.causal_read == t1 and best.limit_binding == 0


def test_clairvoyant_minimum_cost_never_writes_what_is_not_read_and_pays_1h_only_for_two_reads():
    # 0, 10, 410: system+u1 (sent at 0, 10, 410): 5m write, read (refreshed to an hour), read.
    # a1+u2 (sent at 10, 410): a 1h write read once costs 10 + 0.5 > 5 + 5: never written.
    # a2+u3 (sent once): uncached.
    trace, t1, t2, t3 = three((0, 10, 400))
    best = optimum(trace).requests
    assert [(p.read, p.write_5m, p.write_1h, p.none) for p in (b.plan for b in best)] == [
        (0, t1, 0, 0),
        (t1, 0, 0, t2 - t1),
        (t1, 0, 0, t3 - t1),
    ]
    assert [b.min_cost for b in best] == pytest.approx(
        [t1 * WRITE_5M, t1 * READ + (t2 - t1) * INPUT, t1 * READ + (t3 - t1) * INPUT]
    )
    # 0, 400, 1400: system+u1 read twice after gaps over 5 minutes: a 1h write pays (10 + 2 x 0.5).
    trace, t1, t2, t3 = three((0, 400, 1000))
    best = optimum(trace).requests
    assert [b.read for b in best] == [0, t1, t2]
    assert [(p.read, p.write_5m, p.write_1h, p.none) for p in (b.plan for b in best)] == [
        (0, 0, t1, 0),
        (t1, 0, 0, t2 - t1),
        (t1, 0, 0, t3 - t1),
    ]
    assert sum(b.min_cost for b in best) == pytest.approx(
        t1 * (WRITE_1H + 2 * READ) + (t2 - t1) * 2 * INPUT + (t3 - t2) * INPUT
    )


def test_causal_bound_counts_a_client_1h_marker_from_the_start():
    messages = [turns("u1"), turns("u1", "a1", "u2"), turns("u1", "a1", "u2", "a2", "u3")]
    t1 = COUNTER.count(SYSTEM) + message_tokens("u1")
    t2 = t1 + message_tokens("a1") + message_tokens("u2")
    paced = Trace("t", "", tuple(request(gap, m) for gap, m in zip((0, 400, 1000), messages, strict=True)))
    assert causal_ttls(paced) == [300.0, 3600.0, 3600.0]
    assert [b.causal_read for b in optimum(paced).requests] == [0, 0, t2]
    first = request(0, messages[0])
    marked = {
        **first.body,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
    }
    client_1h = Trace(
        "t", "", (TraceRequest(0, first.path, marked), request(400, messages[1]), request(1000, messages[2]))
    )
    assert causal_ttls(client_1h) == [3600.0, 3600.0, 3600.0]
    assert [b.causal_read for b in optimum(client_1h).requests] == [0, t1, t2]
    quick = Trace("t", "", tuple(request(gap, m) for gap, m in zip((0, 250, 250), messages, strict=True)))
    assert [b.causal_read for b in optimum(quick).requests] == [0, t1, t2]


def test_entries_expire_after_an_hour_idle_and_below_the_minimum_nothing_is_written():
    trace = Trace("t", "", (request(0, turns("u1")), request(3600, turns("u1", "a1", "u2"))))
    best = optimum(trace)
    assert [b.read for b in best.requests] == [0, 0]
    assert [b.plan.none for b in best.requests] == [b.total for b in best.requests]
    tiny = Trace("t", "", (request(0, turns("u1"), "short"), request(5, turns("u1", "a1", "u2"), "short")))
    assert optimum(tiny).read == 0 and optimum(tiny).min_cost == pytest.approx(INPUT * optimum(tiny).total)


UNIT = _Price(input=1.0, read=0.1, write_5m=1.25, write_1h=2.0)


@pytest.mark.parametrize(
    ("times", "kinds"),
    [
        ([0], ["none"]),
        ([0, 10, 20], ["write_5m", "read", "read"]),
        ([0, 400], ["none", "none"]),  # 2.0 + 0.1 > 1 + 1
        ([0, 400, 800], ["write_1h", "read", "read"]),
        ([0, 4000, 4010], ["none", "write_5m", "read"]),
        ([0, 250, 500, 900], ["write_5m", "read", "read", "read"]),  # a read refreshes to an hour
        ([0, 299.9, 600], ["write_5m", "read", "read"]),
        ([0, 300, 600], ["write_1h", "read", "read"]),  # a 5m entry is gone at exactly 300 s
        ([0, 3000, 6599.0, 10198.0], ["write_1h", "read", "read", "read"]),
        ([0, 3000, 6599.0, 10199.0], ["write_1h", "read", "read", "none"]),  # an hour idle: gone
    ],
)
def test_cheapest_sequence_of_one_block(times, kinds):
    assert cheapest_sequence(times, UNIT) == kinds


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
