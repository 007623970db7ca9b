"""Divergence causes of replayed requests (`proxy/workloads/causes.py`): the tracker applied to
requests as a strategy sent them, and the proxy's counter read back, with exact values."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from proxy.providers.base import Usage
from proxy.rules import load_rules
from proxy.workloads.causes import CauseTracker, cause_counts, new_cause
from tests.workloads.test_oracle import SYSTEM, turns

PATH = "/v1/messages"
HEADERS = ("x-claude-code-session-id", "x-session-id")
AUTO = {"type": "auto"}


def body(messages: list[dict[str, str]], model: str = "claude-opus-4-5", **extra: object) -> dict:
    return {"model": model, "max_tokens": 64, "system": SYSTEM, "messages": messages, **extra}


def marked(messages: list[dict[str, str]]) -> dict:
    """`body` with a 5-minute marker on the system prompt (a breakpoint at block 0)."""
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    return {**body(messages), "system": system}


def test_causes_per_conversation_in_send_order() -> None:
    tracker = CauseTracker(load_rules(), HEADERS)
    a, b = {"x-session-id": "a"}, {"X-Session-Id": "b"}
    got = [
        tracker.cause(PATH, a, body(turns("u1")), None),
        tracker.cause(PATH, b, body(turns("v1")), None),  # another session: its own first request
        tracker.cause(PATH, a, body(turns("u1", "a1", "u2")), None),  # append
        tracker.cause(PATH, b, body(turns("v1", "b1", "v2"), model="claude-sonnet-4-5"), None),
        tracker.cause(PATH, a, body(turns("u1", "a1", "u2"), temperature=0.5), None),  # identical blocks
        tracker.cause(PATH, a, body(turns("u1", "a1", "u2"), tool_choice=AUTO), None),
        tracker.cause(PATH, a, body(turns("u1", "a1", "x2"), tool_choice=AUTO), None),  # last message changed
        tracker.cause(
            PATH, a, body(turns("u0", "a1", "x2", "a2", "u3"), tool_choice=AUTO), None
        ),  # an earlier one
        tracker.cause(PATH, {}, body(turns("u1")), None),  # no session: its own conversation
    ]
    assert got == [
        "first_request",
        "first_request",
        "none",
        "model_changed",
        "none",
        "params_changed",
        "messages_changed",
        "history_rewritten",
        "first_request",
    ]


def test_a_predicted_read_that_came_back_as_a_write_is_expired() -> None:
    tracker = CauseTracker(None, HEADERS)
    assert (
        tracker.cause(PATH, {}, marked(turns("u1")), Usage(cache_write_5m=700, seen=True)) == "first_request"
    )
    # The previous breakpoint (system, ~700 tokens) lies in the shared prefix: a read was due.
    wrote = Usage(input_none=10, cache_write_5m=700, seen=True)
    assert tracker.cause(PATH, {}, marked(turns("u1", "a1", "u2")), wrote) == "expired"
    read = Usage(input_none=10, cache_read=700, seen=True)
    assert tracker.cause(PATH, {}, marked(turns("u1", "a1", "u2", "a2", "u3")), read) == "none"
    # Without usage (or without a marker to read) nothing can be called expired.
    assert tracker.cause(PATH, {}, marked(turns("u1", "a1", "u2", "a2", "u3", "a3", "u4")), None) == "none"


def test_volatile_system_text_uses_the_default_rules() -> None:
    tracker = CauseTracker(load_rules(), HEADERS)
    first = {**body(turns("u1")), "system": [{"type": "text", "text": "Current time: 2026-11-29 10:15"}]}
    later = {**body(turns("u1")), "system": [{"type": "text", "text": "Current time: 2026-11-29 10:20"}]}
    assert [tracker.cause(PATH, {}, b, None) for b in (first, later)] == [
        "first_request",
        "system_volatile_text",
    ]
    assert CauseTracker(None, HEADERS).cause(PATH, {}, first, None) == "first_request"


def test_cause_counts_and_new_cause_read_the_proxy_counter() -> None:
    registry = CollectorRegistry()
    counter = Counter(
        "promptcache_prefix_divergences_total", "test", ["provider", "section", "cause"], registry=registry
    )
    assert cause_counts(registry) == {}
    counter.labels("anthropic", "none", "first_request").inc()
    counter.labels("anthropic", "none", "none").inc(2)
    counter.labels("openai", "none", "none").inc()
    counter.labels("anthropic", "system", "system_changed").inc(0)
    before = cause_counts(registry)
    assert before == {"first_request": 1, "none": 3}
    counter.labels("anthropic", "messages", "history_rewritten").inc()
    assert new_cause(before, cause_counts(registry)) == "history_rewritten"
    assert new_cause(before, before) is None
