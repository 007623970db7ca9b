"""One memory budget (`memory_budget_mb`, `proxy.memory_budget`) bounds the caches that grow with
the sessions seen, in bytes: decoded records, the inference index, the history, the masker."""

from __future__ import annotations

from typing import Any

import xxhash

from proxy.appkeys import SERVICES
from proxy.history import ENTRY_BYTES, ROW_BYTES, SessionHistory
from proxy.memory_budget import BOUNDARY_BYTES, INDEX_SESSION_BYTES, MIB, SHARES, MemoryBudget
from proxy.session_identity import SessionIndex
from proxy.settings import Settings
from proxy.sim.tokens import TokenCounter, load_o200k
from tests.ui.test_history import _Measurement

ENCODING = load_o200k()


def test_the_shares_split_the_whole_budget() -> None:
    assert abs(sum(SHARES.values()) - 1.0) < 1e-9
    budget = MemoryBudget.of_mb(Settings().memory_budget_mb)
    assert budget.total == 16 * MIB == MemoryBudget().total
    assert (budget.records, budget.index, budget.history) == (
        int(16 * MIB * 0.35),
        int(16 * MIB * 0.25),
        int(16 * MIB * 0.20),
    )
    assert budget.masker_entries == int(16 * MIB * 0.10) // 384 == 4369
    assert budget.token_counts == int(16 * MIB * 0.10) // 192 == 8738


def test_the_token_count_memo_keeps_the_most_recently_counted() -> None:
    counter = TokenCounter(ENCODING, max_counts=3)
    assert [counter.count(t) for t in ("a", "b c", "d e f")] == [1, 2, 3]
    assert counter.count("a") == 1  # a hit: "a" becomes the most recent
    assert counter.count("g h i j") == 4  # full: the least recent, "b c", leaves
    assert [counter.holds(t) for t in ("a", "b c", "d e f", "g h i j")] == [True, False, True, True]
    assert counter.count("b c") == 2  # counted again; now "d e f" is the least recent
    assert [counter.holds(t) for t in ("a", "b c", "d e f", "g h i j")] == [True, True, False, True]
    assert len(counter) == 3


def test_the_index_is_bounded_in_bytes_oldest_session_first() -> None:
    cap = 10 * (30 * BOUNDARY_BYTES + INDEX_SESSION_BYTES)  # ten sessions of 30 boundaries
    index = SessionIndex(max_bytes=cap)
    for s in range(25):
        boundaries = [xxhash.xxh3_128_digest(f"{s}-{i}".encode()) for i in range(30)]
        index.register("t", f"s{s}", boundaries)
        assert index.bytes_held <= cap
    assert len(index) == 10
    newest = [xxhash.xxh3_128_digest(f"24-{i}".encode()) for i in range(30)]
    assert index.infer("t", newest).kind == "append"
    oldest = [xxhash.xxh3_128_digest(f"0-{i}".encode()) for i in range(30)]
    assert index.infer("t", oldest).kind == "new"  # fell out: a new (root) id, no replay lost


def test_the_history_is_bounded_in_bytes_and_keeps_the_newest() -> None:
    one = ENTRY_BYTES + ROW_BYTES  # an entry with one row and no map
    history = SessionHistory(max_sessions=100, max_per_tenant=100, max_bytes=3 * one)
    for i in range(8):
        history.add("t", f"s{i}", _Measurement(), path="/v1/messages", now=float(i))
        assert history.bytes_held <= 3 * one
    assert [e.session_id for e in history.recent()] == ["s7", "s6", "s5"]
    for n in range(6):  # a growing entry pushes the others out, never itself
        history.add("t", "s7", _Measurement(), path="/v1/messages", now=10.0 + n)
    assert [e.session_id for e in history.recent()] == ["s7"]
    assert history.bytes_held == ENTRY_BYTES + 7 * ROW_BYTES


async def test_serve_sizes_its_caches_from_the_budget(make_proxy: Any, fake_upstream: Any) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url, memory_budget_mb=4)
    budget = MemoryBudget.of_mb(4)
    services = proxy.runner.app[SERVICES]
    assert services.store.memo_bytes == budget.records
    assert services.sessions.index.max_bytes == budget.index
    assert services.last_measurements.max_bytes == budget.history
    assert services.tokens is None  # built on the first request that counts tokens (proxy.tokenizer)
    await services.tokenizer.ensure(services)
    assert services.tokens is not None and services.tokens.max_counts == budget.token_counts
    from proxy.pipeline.session import masker_for

    masker = masker_for(services.sessions, services)
    assert masker.raw_index.max_parsed_bytes == budget.parsed_bytes == MIB  # a quarter, raw bytes
    assert MemoryBudget.of_mb(16).parsed_bytes == 4 * MIB
