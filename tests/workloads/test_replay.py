"""`promptcache replay`: exact totals on a hand-made trace, equalities between strategies, and the
oracle's bound against every strategy on every committed trace (one replay of the suite)."""

from __future__ import annotations

import argparse
import io

import orjson
import pytest

from proxy import replay_cli as replay
from proxy.workloads.oracle import optimum
from proxy.workloads.report import format_text, ordered_causes, to_json
from proxy.workloads.runner import Progress, replay_traces
from proxy.workloads.strategies import STRATEGIES, naive_body
from proxy.workloads.suite import COMMITTED_DIR, SUITE
from proxy.workloads.trace import Trace, TraceRequest, dumps_trace, load_trace
from tests.workloads.test_oracle import COUNTER, SYSTEM, message_tokens, request, turns

OPUS_INPUT, OPUS_WRITE_5M, OPUS_READ = 5.00, 6.25, 0.50  # USD per million tokens, rules/pricing.yaml


def small_trace() -> Trace:
    return Trace(
        "small",
        "three turns, the last after 400 s",
        (
            request(0, turns("u1")),
            request(10, turns("u1", "a1", "u2")),
            request(400, turns("u1", "a1", "u2", "a2", "u3")),
        ),
    )


async def test_small_trace_exact_totals():
    t1 = COUNTER.count(SYSTEM) + message_tokens("u1")
    t2 = t1 + message_tokens("a1") + message_tokens("u2")
    t3 = t2 + message_tokens("a2") + message_tokens("u3")
    report = await replay_traces([small_trace()], list(STRATEGIES))
    (result,) = report.traces
    none, naive, pc = (result.tallies[s] for s in STRATEGIES)
    assert (none.requests, none.errors, none.read, none.write, none.none) == (3, 0, 0, 0, t1 + t2 + t3)
    # naive: request 1 writes everything, request 2 reads request 1 (20-position lookback from
    # its last block) and writes the rest, request 3 comes 400 s later: every 5m entry is gone.
    assert (naive.read, naive.write_5m, naive.write_1h, naive.none) == (t1, t2 + t3, 0, 0)
    assert naive.cost == pytest.approx((t1 * OPUS_READ + (t2 + t3) * OPUS_WRITE_5M) / 1e6)
    assert naive.uncached_cost == none.cost == pytest.approx((t1 + t2 + t3) * OPUS_INPUT / 1e6)
    # the clairvoyant optimum reads request 2's prefix 400 s later (a 1h entry); the causal bound
    # beside it does not (no gap over 5 minutes before that one)
    assert result.optimum_read == t1 + t2 and result.optimum_total == t1 + t2 + t3
    assert result.causal_read == t1
    assert result.attainment("naive") == pytest.approx(t1 / (t1 + t2))
    # minimum: system+u1 written 5m, read twice; the rest uncached (a 1h write read once never pays)
    cheapest = t1 * (OPUS_WRITE_5M + 2 * OPUS_READ) + (t3 - t1 + t2 - t1) * OPUS_INPUT
    assert result.min_cost == pytest.approx(cheapest / 1e6)
    assert result.cost_ratio("none") == pytest.approx(none.cost / result.min_cost)
    assert result.share_after_first("naive") == pytest.approx(t1 / (t2 + t3))
    assert result.optimum_share_after_first == pytest.approx((t1 + t2) / (t2 + t3))
    assert pc.errors == 0 and result.stage_errors == 0
    assert all(
        o.read <= bound for o, bound in zip(result.outcomes["promptcache"], result.optimum_reads, strict=True)
    )


async def test_small_trace_divergence_causes():
    report = await replay_traces([small_trace()], list(STRATEGIES))
    (result,) = report.traces
    causes = {s: [o.cause for o in result.outcomes[s]] for s in STRATEGIES}
    assert causes == {
        # the client's bytes: each request appends to the previous one
        "none": ["first_request", "none", "none"],
        # naive turns the last message's string content into a marked text block and sends it
        # as the plain string again on the next turn: the provider renders both alike, and so
        # does the canonical form since finding P2 was fixed
        # (tests/clients/data/pipeline-content-string-vs-text-block.json): an append, `none`;
        # after 400 s the read request 2's markers predicted came back as a write
        "naive": ["first_request", "none", "expired"],
        # what the proxy counted in promptcache_prefix_divergences_total, request by request: the
        # entry request 2 read was re-marked 1h (proxy.pacing, the anchor), so 400 s later it reads
        "promptcache": ["first_request", "none", "none"],
    }
    assert {s: result.tallies[s].causes for s in STRATEGIES} == {
        "none": {"first_request": 1, "none": 2},
        "naive": {"first_request": 1, "none": 1, "expired": 1},
        "promptcache": {"first_request": 1, "none": 2},
    }
    assert report.total("naive").causes == {"first_request": 1, "none": 1, "expired": 1}


def test_naive_marks_the_last_system_block_and_last_message_only():
    body = request(0, turns("u1", "a1", "u2")).body
    out = naive_body("/v1/messages", body)
    assert out["system"] == [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    assert out["messages"][-1]["content"] == [
        {"type": "text", "text": "u2", "cache_control": {"type": "ephemeral"}}
    ]
    assert out["messages"][:2] == body["messages"][:2] and body["system"] == SYSTEM  # input untouched
    chat = {"model": "gpt-5.1", "messages": [{"role": "user", "content": "x"}]}
    assert naive_body("/v1/chat/completions", chat) is chat


async def test_optimum_bounds_every_strategy_on_every_committed_trace():
    traces = [load_trace(COMMITTED_DIR / f"{w.name}.jsonl") for w in SUITE if w.committed]
    report = await replay_traces(traces, list(STRATEGIES))
    for result in report.traces:
        bounds = list(zip(result.optimum_reads, result.client_totals, strict=True))
        for strategy in STRATEGIES:
            over = []
            for i, (o, (bound, client)) in enumerate(zip(result.outcomes[strategy], bounds, strict=True)):
                # The oracle counts the client's tokens: a proxy that adds tokens to a request (a
                # moved segment's wrapper, say) may read at most that many more. none/naive add none.
                sent = o.read + o.write_5m + o.write_1h + o.none
                added = max(0, sent - client) if strategy == "promptcache" else 0
                if o.read > bound + added:
                    over.append((i, o.read, bound, added))
                assert o.status >= 300 or not o.error, (result.name, strategy, i, o.error)
                if strategy != "promptcache":  # usage read right from JSON and SSE alike
                    assert sent == client, (result.name, strategy, i)
            assert not over, f"{result.name} {strategy}: (request, read, optimum, added) {over}"
            # the clairvoyant minimum cost is a lower bound on what any strategy pays
            assert result.min_cost <= result.tallies[strategy].cost * (1 + 1e-9), (result.name, strategy)
        errors = {s: result.tallies[s].errors for s in ("none", "naive")}
        assert errors == (
            {"none": 5, "naive": 5} if result.name == "client-markers-5" else {"none": 0, "naive": 0}
        )
    # Every 2xx request has a cause, under every strategy (the proxy measured each of its own).
    for result in report.traces:
        for strategy in STRATEGIES:
            tally = result.tallies[strategy]
            assert sum(tally.causes.values()) == tally.requests - tally.errors, (result.name, strategy)
    by_name = {r.name: r for r in report.traces}
    # The client's bytes, as promptcache's measurement names their divergences.
    assert {name: ordered_causes(r.tallies["none"].causes) for name, r in by_name.items()} == NONE_CAUSES
    for name in ("cc-billing-header", "model-switch", "shared-system-sessions", "tools-shuffled"):
        assert by_name[name].tallies["naive"].causes == by_name[name].tallies["none"].causes, name
    # naive's marked one-block list and the plain string the client sends next turn are one
    # rendered block (finding P2): every later request appends
    assert by_name["no-markers"].tallies["naive"].causes == {"first_request": 1, "none": 11}
    for name in ("openai-chat-agent", "openai-responses-agent"):
        assert by_name[name].tallies["naive"] == by_name[name].tallies["none"]
    # pre-5.6 OpenAI caching has nothing to choose: the oracle's raw bound is the simulator's count
    chat = by_name["openai-chat-agent"]
    raw = [b.raw_read for b in optimum(traces[[t.name for t in traces].index("openai-chat-agent")]).requests]
    assert [o.read for o in chat.outcomes["none"]] == raw
    # a stable session with no client markers: a marker on the last block each turn is optimal
    assert by_name["no-markers"].tallies["naive"].read == by_name["no-markers"].optimum_read


NONE_CAUSES = {
    "cc-billing-header": {"first_request": 1, "system_volatile_text": 13},
    "volatile-system-counters": {"first_request": 1, "system_volatile_text": 14},
    "tools-shuffled": {"first_request": 1, "tools_changed": 12},
    "schema-keys-reordered": {"first_request": 1, "tools_changed": 12},
    "history-rerendered": {"first_request": 1, "messages_changed": 1, "history_rewritten": 9},
    "no-markers": {"none": 11, "first_request": 1},
    "client-markers-4": {"none": 11, "first_request": 1},
    "client-markers-5": {"first_request": 1},
    "tool-loop-parallel": {"none": 23, "first_request": 1},
    "human-pacing": {"none": 1, "first_request": 1, "expired": 5},
    "compaction": {"none": 15, "first_request": 1, "history_rewritten": 1},
    "model-switch": {"none": 5, "first_request": 1, "model_changed": 2},
    "openai-chat-agent": {"first_request": 1, "system_volatile_text": 9},
    "openai-responses-agent": {"first_request": 1, "system_volatile_text": 12},
    "shared-system-sessions": {"none": 12, "first_request": 4},
}
"""Causes of the committed traces' requests sent as the client sent them (`none`)."""


def _args(**overrides):
    values = {
        "traces": [],
        "upstream": "sim",
        "strategy": "all",
        "json": False,
        "per_request": False,
        "cache_dir": None,
        "quiet": True,
    }
    values.update(overrides)
    return argparse.Namespace(**values)


def test_cli_json_and_text(tmp_path, capsys):
    path = tmp_path / "small.jsonl"
    path.write_bytes(dumps_trace(small_trace()))
    assert replay.run(_args(traces=[str(path)], strategy="naive", json=True, per_request=True)) == 0
    out = orjson.loads(capsys.readouterr().out)
    (trace,) = out["traces"]
    assert trace["trace"] == "small" and list(trace["strategies"]) == ["naive"]
    assert [o["status"] for o in trace["outcomes"]["naive"]] == [200, 200, 200]
    assert (
        out["total"]["naive"]["read"]
        == trace["strategies"]["naive"]["read"]
        == trace["outcomes"]["naive"][1]["read"]
    )
    naive_causes = {"none": 1, "first_request": 1, "expired": 1}  # P2: string = one text block
    assert trace["strategies"]["naive"]["causes"] == out["total"]["naive"]["causes"] == naive_causes
    assert list(naive_causes) == list(trace["strategies"]["naive"]["causes"])  # CAUSES order
    assert [o["cause"] for o in trace["outcomes"]["naive"]] == ["first_request", "none", "expired"]
    assert replay.run(_args(traces=[str(tmp_path)], strategy="none")) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("small ") and lines[3].startswith("small                      optimum")
    assert lines[4].startswith("small                      causal")
    assert lines[5] == "small                      none        causes: none 2, first_request 1"
    assert lines[-4].startswith("TOTAL                      none ")
    assert lines[-3].startswith("TOTAL                      optimum")
    assert lines[-2].startswith("TOTAL                      causal")
    assert lines[-1] == "TOTAL                      none        causes: none 2, first_request 1"


def test_cli_bad_arguments(capsys):
    assert replay.run(_args(traces=["no-such-workload"])) == 2
    assert "no such file, directory or workload" in capsys.readouterr().err
    assert replay.run(_args(traces=["no-markers"], upstream="ftp://x")) == 2


async def test_progress_lines_when_not_a_terminal():
    stream = io.StringIO()
    await replay_traces([small_trace()], ["none"], progress=Progress(stream))
    assert stream.getvalue() == "small none                               3 requests hit 0.0%\n"


async def test_keep_warm_pings_play_on_the_trace_clock():
    t1 = COUNTER.count(SYSTEM) + message_tokens("u1")
    trace = Trace("warm", "", (request(0, turns("u1")), request(400, turns("u1", "a1", "u2"))))
    report = await replay_traces([trace], ["promptcache"], keep_warm=True)
    (result,) = report.traces
    warm = result.keep_warm["promptcache"]
    # a new tenant writes 5m; one ping at 270 s reads and refreshes it, so request 2 (400 s) reads
    assert (warm.pings, warm.read) == (1, t1)
    assert warm.cost == pytest.approx(t1 * OPUS_READ / 1e6)
    assert [o.read for o in result.outcomes["promptcache"]] == [0, t1]
    cold = (await replay_traces([trace], ["promptcache"])).traces[0]
    assert [o.read for o in cold.outcomes["promptcache"]] == [0, 0] and cold.keep_warm == {}
    assert result.tallies["promptcache"].cost < cold.tallies["promptcache"].cost


def _chat_stream_trace() -> Trace:
    """aider on Chat Completions: streamed, without `stream_options.include_usage`, so no
    response carries usage."""
    messages = [{"role": "system", "content": SYSTEM * 3}, {"role": "user", "content": "u1"}]
    body = {"model": "gpt-4o", "stream": True, "messages": messages}
    return Trace(
        "chat-no-usage",
        "streamed Chat without include_usage",
        (
            TraceRequest(0, "/v1/chat/completions", body),
            TraceRequest(10, "/v1/chat/completions", body),
        ),
    )


async def test_a_trace_without_usage_is_named_and_left_out_of_the_totals(capsys):
    small, bare = small_trace(), _chat_stream_trace()
    alone = await replay_traces([small], list(STRATEGIES))
    report = await replay_traces([small, bare], list(STRATEGIES))
    counted, missing = report.traces
    assert not missing.has_usage and counted.has_usage
    assert [missing.tallies[s].no_usage for s in STRATEGIES] == [2, 2, 2]
    assert report.without_usage == ["chat-no-usage"]
    for strategy in STRATEGIES:
        assert report.total(strategy) == alone.total(strategy)
        assert report.attainment(strategy) == alone.attainment(strategy)
    assert (report.optimum_read, report.optimum_total) == (alone.optimum_read, alone.optimum_total)
    text = format_text(report).splitlines()
    assert "chat-no-usage              none           2   0 no usage in 2 responses: left out of the totals" in text
    assert text[-1] == "left out of the totals (responses without usage): chat-no-usage"
    out = to_json(report)
    assert out["without_usage"] == ["chat-no-usage"] and out["traces"][1]["has_usage"] is False
