"""measure's pure core: divergence position and cause, predicted reads, `expired`.

Every case compares a variant of `bodies.BASE` with a previous record built from `BASE` itself.
Byte offsets are the canonical block lengths of `BASE`: 76, 53, 45, 14, 70, 62 (ends 76, 129,
174, 188, 258, 320).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.divergence import (
    Divergence,
    find_divergence,
    is_expired,
    lookback_positions,
    params_digest,
    read_rules,
)
from proxy.divergence import marker_positions as _marker_positions
from proxy.divergence import predict_read as _predict_read
from proxy.prefix import chain_blocks
from proxy.providers import ANTHROPIC
from proxy.providers.base import Block, Usage
from proxy.store.codec import SessionRecord
from tests.measure.bodies import BASE, record_for, variant

PATH = "/v1/messages"
RULES = read_rules(ANTHROPIC, BASE)
"""Anthropic's read rules: the 20-position lookback, tool runs counted once (docs/provider-rules.md 1.5)."""


def marker_positions(blocks: list[Block], body: dict[str, Any]) -> tuple[int, ...]:
    return _marker_positions([b.value for b in blocks], body, RULES)


def predict_read(*args: Any, **kwargs: Any) -> tuple[int | None, int]:
    return _predict_read(*args, lookback=RULES.lookback, **kwargs)


def record_of(body: dict[str, Any]) -> SessionRecord:
    """The record the session stage would keep after sending `body`."""
    return record_for(ANTHROPIC, body)


def divergence_of(name: str, **kwargs: Any) -> Divergence:
    body = variant(name)
    blocks = ANTHROPIC.prefix_blocks(body)
    return find_divergence(
        record_of(BASE),
        chain_blocks(blocks),
        blocks,
        body["model"],
        params_digest(ANTHROPIC, body),
        **kwargs,
    )


def _is_cwd_line(block: Block) -> bool:
    return isinstance(block.value, dict) and str(block.value.get("text", "")).startswith("cwd:")


@pytest.mark.parametrize(
    ("name", "kwargs", "expected"),
    [
        ("identical", {}, Divergence("none", "none", 6, 320, 80, 1.0, 6)),
        ("none", {}, Divergence("none", "none", 6, 320, 80, 1.0, 6)),
        ("model_changed", {}, Divergence("model_changed", "none", 0, 0, 0, 0.0, 6)),
        ("tools_changed", {}, Divergence("tools_changed", "tools", 0, 0, 0, 0.0, 0)),
        ("params_changed", {}, Divergence("params_changed", "none", 0, 0, 0, 0.0, 6)),
        ("system_changed", {}, Divergence("system_changed", "system", 2, 129, 33, 129 / 318, 2)),
        (
            "system_volatile_text",
            {"is_volatile": _is_cwd_line},
            Divergence("system_volatile_text", "system", 2, 129, 33, 129 / 318, 2),
        ),
        ("messages_changed", {}, Divergence("messages_changed", "messages", 5, 258, 65, 258 / 320, 5)),
        (
            "history_rewritten",
            {"history_rewritten": True},
            Divergence("history_rewritten", "messages", 3, 174, 44, 174 / 319, 3),
        ),
    ],
)
def test_divergence_per_cause(name: str, kwargs: dict[str, Any], expected: Divergence) -> None:
    assert divergence_of(name, **kwargs) == expected


def test_first_request() -> None:
    blocks = ANTHROPIC.prefix_blocks(BASE)
    got = find_divergence(None, chain_blocks(blocks), blocks, BASE["model"], b"")
    assert got == Divergence("first_request", "none", 0, 0, 0, 0.0, 0)


def test_history_flag_only_applies_to_messages() -> None:
    assert divergence_of("system_changed", history_rewritten=True).cause == "system_changed"
    assert divergence_of("messages_changed", history_rewritten=True).cause == "history_rewritten"


def test_tools_change_wins_over_params_change() -> None:
    body = variant("tools_changed")
    body["tool_choice"] = {"type": "any"}
    blocks = ANTHROPIC.prefix_blocks(body)
    got = find_divergence(
        record_of(BASE), chain_blocks(blocks), blocks, body["model"], params_digest(ANTHROPIC, body)
    )
    assert (got.cause, got.block_index) == ("tools_changed", 0)


def test_shorter_fork_shares_everything_it_sends() -> None:
    body = variant("identical")
    body["messages"] = body["messages"][:1]
    blocks = ANTHROPIC.prefix_blocks(body)
    got = find_divergence(
        record_of(BASE), chain_blocks(blocks), blocks, body["model"], params_digest(ANTHROPIC, body)
    )
    assert got == Divergence("none", "none", 4, 188, 47, 1.0, 4)


def test_markers_from_blocks_and_automatic_caching() -> None:
    blocks = ANTHROPIC.prefix_blocks(BASE)
    assert marker_positions(blocks, BASE) == (2, 5)
    automatic = {**variant("identical"), "cache_control": {"type": "ephemeral"}}
    automatic["system"][1].pop("cache_control")
    automatic["messages"][2]["content"][0].pop("cache_control")
    assert marker_positions(ANTHROPIC.prefix_blocks(automatic), automatic) == (5,)
    nulled = variant("identical")
    nulled["system"][1]["cache_control"] = None
    assert marker_positions(ANTHROPIC.prefix_blocks(nulled), nulled) == (5,)


def _blocks(kinds: list[str]) -> list[Block]:
    return [Block("messages", f"b{i}", kind, {"type": kind}) for i, kind in enumerate(kinds)]


def test_lookback_positions_merge_tool_runs() -> None:
    kinds = ["text", "tool_use", "tool_use", "tool_result", "tool_result", "text", "tool_use"]
    assert lookback_positions(_blocks(kinds), RULES.run_kinds) == [0, 1, 1, 2, 2, 3, 4]


def test_predicted_read_is_the_furthest_reachable_shared_breakpoint() -> None:
    current = variant("none")
    blocks = ANTHROPIC.prefix_blocks(current)
    previous = record_of(BASE)
    got = predict_read(
        previous.breakpoints,
        previous.ends,
        6,
        marker_positions(blocks, current),
        lookback_positions(blocks, RULES.run_kinds),
    )
    assert got == (5, 80)
    # Diverged at block 5: only the system breakpoint (block 2, 174 bytes) is still shared.
    assert predict_read(previous.breakpoints, previous.ends, 5, (7,), lookback_positions(blocks, RULES.run_kinds)) == (
        2,
        44,
    )
    # Below the model minimum nothing was written, so nothing can be read.
    positions = lookback_positions(blocks, RULES.run_kinds)
    assert predict_read(previous.breakpoints, previous.ends, 6, (7,), positions, min_tokens=80) == (5, 80)
    assert predict_read(previous.breakpoints, previous.ends, 6, (7,), positions, min_tokens=81) == (None, 0)


def test_lookback_window_is_twenty_positions() -> None:
    ends = list(range(100, 100 * 31, 100))  # 30 blocks, 100 bytes each
    positions = list(range(30))
    assert predict_read((5,), ends, 30, (24,), positions) == (5, 150)
    assert predict_read((5,), ends, 30, (25,), positions) == (None, 0)
    # A run of tool_result blocks counts once: position 5 is reachable from block 29 again.
    runs = [min(i, 6) if i < 6 else 6 + max(0, i - 16) for i in range(30)]
    assert runs[29] - runs[5] < 20
    assert predict_read((5,), ends, 30, (29,), runs) == (5, 150)


@pytest.mark.parametrize(
    ("predicted", "usage", "expected"),
    [
        (80, Usage(cache_read=0, cache_write_5m=300), True),
        (80, Usage(cache_read=39, cache_write_5m=300), True),
        (80, Usage(cache_read=40, cache_write_5m=300), False),
        (80, Usage(cache_read=0, cache_write_5m=0, input_none=300), False),
        (0, Usage(cache_read=0, cache_write_5m=300), False),
        (80, None, False),
    ],
)
def test_expired(predicted: int, usage: Usage | None, expected: bool) -> None:
    assert is_expired(predicted, usage) is expected


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(["text", "tool_use", "tool_result", "image"]), min_size=1, max_size=40),
    st.lists(st.integers(0, 45), max_size=4),
    st.lists(st.integers(0, 45), max_size=4),
    st.integers(0, 45),
    st.sampled_from([None, 1, 3, 20]),
)
def test_predict_read_from_kinds_is_from_positions(
    kinds: list[str], previous: list[int], current: list[int], shared: int, lookback: int | None
) -> None:
    """The marker rule walking only between the markers (`lookback_distance`) answers as the
    rule over every block's lookback position."""
    from proxy.divergence import kind_positions, lookback_distance

    ends = [10 * (i + 1) for i in range(len(kinds))]
    runs = frozenset({"tool_use", "tool_result"})
    positions = kind_positions(kinds, runs)
    full = _predict_read(previous, ends, shared, current, positions, lookback=lookback)
    lazy = _predict_read(previous, ends, shared, current, None, lookback=lookback, kinds=kinds, run_kinds=runs)
    assert full == lazy
    for b in range(len(kinds)):
        for p in range(b, len(kinds)):
            assert lookback_distance(kinds, runs, b, p, 5) == min(positions[p] - positions[b], 5)


def test_lookback_distance_exact() -> None:
    from proxy.divergence import lookback_distance

    kinds = ["text", "tool_use", "tool_use", "tool_result", "text", "text"]
    runs = frozenset({"tool_use"})
    assert [lookback_distance(kinds, runs, 0, p, 20) for p in range(6)] == [0, 1, 1, 2, 3, 4]
    assert lookback_distance(kinds, runs, 0, 5, 3) == 3
