"""reorder: segments, durable-first order, markers of split blocks, moving to the user message."""

from __future__ import annotations

from proxy.pipeline.reorder import reorder_body
from proxy.pipeline.segments import classifier_for
from proxy.providers import ANTHROPIC, OPENAI
from tests.pipeline.helpers import MOVING_RULES, RULES

MESSAGES = "/v1/messages"
EPH = {"type": "ephemeral"}
CLAUDE_CODE_PROMPT = (
    "You are Claude Code.\n"
    "\n"
    "Keep answers short.\n"
    "\n"
    "<env>\n"
    "Working directory: /home/alice/app\n"
    "Today's date: 2026-11-29\n"
    "</env>\n"
    "Current time: 2026-11-29T20:09:13Z\n"
    "\n"
    "Use the tools."
)


def test_segments_join_back_to_the_text_and_classify_by_kind() -> None:
    segments = classifier_for(RULES).segments(CLAUDE_CODE_PROMPT)
    assert "".join(s.text for s in segments) == CLAUDE_CODE_PROMPT
    assert [(s.tier, s.rule) for s in segments] == [
        ("stable", None),
        ("session", "env-block"),
        ("volatile", "timestamp"),
        ("stable", None),
    ]
    assert segments[2].text == "Current time: 2026-11-29T20:09:13Z\n\n"


def test_one_marked_block_with_env_and_time_splits_and_the_marker_goes_to_its_stable_part() -> None:
    body = {
        "model": "claude-sonnet-4-6",
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3; cch=1;"},
            {"type": "text", "text": CLAUDE_CODE_PROMPT, "cache_control": EPH},
        ],
        "messages": [{"role": "user", "content": "hi"}],
    }
    out, plan = reorder_body(ANTHROPIC, MESSAGES, body, RULES)
    assert out["system"] == [
        {
            "type": "text",
            "text": "You are Claude Code.\n\nKeep answers short.\n\nUse the tools.",
            "cache_control": EPH,
        },
        {
            "type": "text",
            "text": "<env>\nWorking directory: /home/alice/app\nToday's date: 2026-11-29\n</env>\n",
        },
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3; cch=1;"},
        {"type": "text", "text": "Current time: 2026-11-29T20:09:13Z\n\n"},
    ]
    assert plan.tiers == ("stable", "session", "volatile", "volatile")
    assert out["messages"] is body["messages"]
    assert reorder_body(ANTHROPIC, MESSAGES, out, RULES)[0] is out


def test_string_system_splits_into_blocks_only_when_tiers_differ() -> None:
    stable = {"model": "m", "system": "You are helpful.\n\nBe brief.", "messages": []}
    assert reorder_body(ANTHROPIC, MESSAGES, stable, RULES)[0] is stable
    body = {"model": "m", "system": "Current time: 2026-11-29T20:09:13Z\nYou are helpful.", "messages": []}
    out, _ = reorder_body(ANTHROPIC, MESSAGES, body, RULES)
    assert out["system"] == [
        {"type": "text", "text": "You are helpful."},
        {"type": "text", "text": "Current time: 2026-11-29T20:09:13Z\n"},
    ]


def test_volatile_segment_moves_onto_the_newest_user_message_after_tool_results() -> None:
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}
    body = {
        "model": "m",
        "system": "Current time: 2026-11-29T20:09:13Z\nYou are helpful.",
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {}}]},
            {"role": "user", "content": [result, {"type": "text", "text": "continue"}]},
        ],
    }
    out, plan = reorder_body(ANTHROPIC, MESSAGES, body, MOVING_RULES)
    assert out["system"] == "You are helpful."
    assert out["messages"][:2] == body["messages"][:2]
    assert out["messages"][2]["content"] == [
        result,
        {"type": "text", "text": "Current time: 2026-11-29T20:09:13Z\n"},
        {"type": "text", "text": "continue"},
    ]
    assert plan.moved == ("Current time: 2026-11-29T20:09:13Z\n",)


def test_without_a_user_message_to_take_it_the_volatile_segment_stays_last() -> None:
    body = {
        "model": "gpt-5.1",
        "messages": [
            {"role": "system", "content": "Current time: 2026-11-29T20:09:13Z\nYou are helpful."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": []},
            {"role": "tool", "tool_call_id": "c", "content": "ok"},
        ],
    }
    out, _ = reorder_body(OPENAI, "/v1/chat/completions", body, MOVING_RULES)
    assert out["messages"][0] == {
        "role": "system",
        "content": [
            {"type": "text", "text": "You are helpful."},
            {"type": "text", "text": "Current time: 2026-11-29T20:09:13Z\n"},
        ],
    }
    assert out["messages"][1:] == body["messages"][1:]


def test_openai_head_messages_sort_across_messages_and_keep_roles() -> None:
    body = {
        "model": "gpt-5.1",
        "messages": [
            {"role": "developer", "content": "Tokens used: 5 of 100"},
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "hi"},
        ],
    }
    out, plan = reorder_body(OPENAI, "/v1/chat/completions", body, RULES)
    assert out["messages"] == [body["messages"][1], body["messages"][0], body["messages"][2]]
    assert plan.tiers == ("stable", "volatile")


def test_responses_instructions_sort_inside_the_string() -> None:
    body = {"model": "gpt-5.1", "instructions": "Tokens used: 5 of 100\nYou are helpful.\n", "input": "hi"}
    out, plan = reorder_body(OPENAI, "/v1/responses", body, RULES)
    assert out == {**body, "instructions": "You are helpful.\nTokens used: 5 of 100\n"}
    assert plan.tiers == ("volatile",)
    unterminated = {**body, "instructions": "Tokens used: 5 of 100\nYou are helpful."}
    assert reorder_body(OPENAI, "/v1/responses", unterminated, RULES)[0] is unterminated
