"""reorder: segments, durable-first order, markers of split blocks, moving to the user message."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.pipeline.reorder import reorder_body
from proxy.pipeline.segments import classifier_for
from proxy.providers import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES, route
from tests.pipeline.helpers import RULES, STAYING_RULES

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
    out, plan = reorder_body(ANTHROPIC, body, STAYING_RULES)
    # the billing header is API-significant: a stable (pinned) block, it keeps its place
    assert out["system"] == [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3; cch=1;"},
        {
            "type": "text",
            "text": "You are Claude Code.\n\nKeep answers short.\n\nUse the tools.",
            "cache_control": EPH,
        },
        {
            "type": "text",
            "text": "<env>\nWorking directory: /home/alice/app\nToday's date: 2026-11-29\n</env>\n",
        },
        {"type": "text", "text": "Current time: 2026-11-29T20:09:13Z\n\n"},
    ]
    assert plan.tiers == ("session", "stable", "session", "volatile")  # the header ends the shared prefix
    assert out["messages"] is body["messages"]
    assert reorder_body(ANTHROPIC, out, STAYING_RULES)[0] is out


def test_packaged_rules_keep_the_billing_header_first_and_move_the_time_onto_the_user_message() -> None:
    body = {
        "model": "claude-sonnet-4-6",
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3; cch=1;"},
            {"type": "text", "text": CLAUDE_CODE_PROMPT, "cache_control": EPH},
        ],
        "messages": [{"role": "user", "content": "hi"}],
    }
    out, plan = reorder_body(ANTHROPIC, body, RULES)
    assert out["system"] == [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3; cch=1;"},
        {
            "type": "text",
            "text": "You are Claude Code.\n\nKeep answers short.\n\nUse the tools.",
            "cache_control": EPH,
        },
        {
            "type": "text",
            "text": "<env>\nWorking directory: /home/alice/app\nToday's date: 2026-11-29\n</env>\n",
        },
    ]
    assert out["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Current time: 2026-11-29T20:09:13Z\n\n"},
                {"type": "text", "text": "hi"},
            ],
        }
    ]
    assert plan.tiers == ("session", "stable", "session")
    assert plan.moved == ("Current time: 2026-11-29T20:09:13Z\n\n",)
    assert reorder_body(ANTHROPIC, out, RULES)[0] is out


def test_string_system_splits_into_blocks_only_when_tiers_differ() -> None:
    stable = {"model": "m", "system": "You are helpful.\n\nBe brief.", "messages": []}
    assert reorder_body(ANTHROPIC, stable, RULES)[0] is stable
    body = {"model": "m", "system": "Current time: 2026-11-29T20:09:13Z\nYou are helpful.", "messages": []}
    out, _ = reorder_body(ANTHROPIC, body, RULES)  # no user message: nothing moves
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
    out, plan = reorder_body(ANTHROPIC, body, RULES)
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
            {"role": "assistant", "content": "Hello."},
        ],
    }
    out, _ = reorder_body(OPENAI_CHAT, body, RULES)
    assert out["messages"][0] == {
        "role": "system",
        "content": [
            {"type": "text", "text": "You are helpful."},
            {"type": "text", "text": "Current time: 2026-11-29T20:09:13Z\n"},
        ],
    }
    assert out["messages"][1:] == body["messages"][1:]


def test_chat_tool_turn_last_takes_the_moved_text_as_its_first_part() -> None:
    body = {
        "model": "gpt-5.1",
        "messages": [
            {"role": "system", "content": "Current time: 2026-11-29T20:09:13Z\nYou are helpful."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": []},
            {"role": "tool", "tool_call_id": "c", "content": "ok"},
        ],
    }
    out, plan = reorder_body(OPENAI_CHAT, body, RULES)
    assert out["messages"] == [
        {"role": "system", "content": "You are helpful."},
        *body["messages"][1:3],
        {
            "role": "tool",
            "tool_call_id": "c",
            "content": [
                {"type": "text", "text": "Current time: 2026-11-29T20:09:13Z\n"},
                {"type": "text", "text": "ok"},
            ],
        },
    ]
    assert plan.tiers == ("stable",) and reorder_body(OPENAI_CHAT, out, RULES)[0] is out


def test_a_head_message_whose_every_line_moves_leaves_the_array() -> None:
    body = {
        "model": "gpt-5.1",
        "messages": [
            {"role": "developer", "content": "Current time: 2026-11-29T20:09:13Z"},
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "hi"},
        ],
    }
    before = copy.deepcopy(body)
    out, plan = reorder_body(OPENAI_CHAT, body, RULES)
    assert out["messages"] == [
        {"role": "system", "content": "You are helpful."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Current time: 2026-11-29T20:09:13Z"}, {"type": "text", "text": "hi"}],
        },
    ]
    assert plan.moved == ("Current time: 2026-11-29T20:09:13Z",) and plan.tiers == ("stable",)
    assert plan.dropped_messages == 1 and body == before
    again, replan = reorder_body(OPENAI_CHAT, out, RULES)
    assert again is out and replan.dropped_messages == 0


ENVIRONMENT = (
    "<environment_context>\n"
    "  <cwd>/home/dev/app</cwd>\n"
    "  <current_time>2026-11-30T09:00:03Z</current_time>\n"
    "</environment_context>"
)


def test_a_wrapped_line_moves_with_its_wrapper_and_the_rest_keeps_it() -> None:
    segments = classifier_for(RULES).segments(ENVIRONMENT)
    assert [(s.wrap, s.tier, s.rule) for s in segments] == [
        (1, "stable", None),
        (0, "session", "home-path"),
        (0, "volatile", "timestamp"),
        (-1, "stable", None),
    ]
    body = {
        "model": "gpt-5.6",
        "instructions": "You are a coding agent.",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": ENVIRONMENT}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ],
    }
    out, plan = reorder_body(OPENAI_RESPONSES, body, RULES)
    assert out["input"][0]["content"] == [
        {
            "type": "input_text",
            "text": "<environment_context>\n  <cwd>/home/dev/app</cwd>\n</environment_context>",
        }
    ]
    assert out["input"][1:3] == body["input"][1:3]
    assert out["input"][3] == {
        "type": "function_call_output",
        "call_id": "c1",
        "output": [
            {
                "type": "input_text",
                "text": "<environment_context>\n"
                "  <current_time>2026-11-30T09:00:03Z</current_time>\n"
                "</environment_context>",
            },
            {"type": "input_text", "text": "ok"},
        ],
    }
    assert plan.tiers == ("stable", "session")
    assert reorder_body(OPENAI_RESPONSES, out, RULES)[0] is out
    kept, staying = reorder_body(OPENAI_RESPONSES, body, STAYING_RULES)
    assert kept["input"] == body["input"]  # nothing leaves: the section sorts whole, volatile
    assert staying.tiers == ("stable", "volatile")


def test_a_wrapped_section_sorts_as_one_piece_with_its_latest_tier() -> None:
    text = "Intro.\n<ctx>\nKeep it short.\n  <cwd>/home/dev/app</cwd>\n</ctx>\nOutro."
    segments = classifier_for(RULES).segments(text)
    assert "".join(s.text for s in segments) == text
    assert [s.wrap for s in segments] == [0, 1, 0, 0, -1, 0]
    body = {"model": "m", "system": text, "messages": [{"role": "user", "content": "hi"}]}
    out, plan = reorder_body(ANTHROPIC, body, RULES)
    assert out["system"] == [
        {"type": "text", "text": "Intro.\nOutro."},
        {"type": "text", "text": "<ctx>\nKeep it short.\n  <cwd>/home/dev/app</cwd>\n</ctx>\n"},
    ]
    assert plan.tiers == ("stable", "session")
    unpaired = "<ctx>\nCurrent time: 2026-11-30T09:00:03Z\nYou are helpful.\n"
    assert [s.wrap for s in classifier_for(RULES).segments(unpaired)] == [0, 0, 0]


def test_openai_head_messages_sort_across_messages_and_keep_roles() -> None:
    body = {
        "model": "gpt-5.1",
        "messages": [
            {"role": "developer", "content": "Tokens used: 5 of 100"},
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "hi"},
        ],
    }
    out, plan = reorder_body(OPENAI_CHAT, body, STAYING_RULES)
    assert out["messages"] == [body["messages"][1], body["messages"][0], body["messages"][2]]
    assert plan.tiers == ("stable", "volatile")


def test_responses_instructions_sort_inside_the_string() -> None:
    body = {"model": "gpt-5.1", "instructions": "Tokens used: 5 of 100\nYou are helpful.\n", "input": "hi"}
    out, plan = reorder_body(OPENAI_RESPONSES, body, STAYING_RULES)
    assert out == {**body, "instructions": "You are helpful.\nTokens used: 5 of 100\n"}
    assert plan.tiers == ("volatile",)
    # An unterminated last line moves up with the newline moving along: same lines, same
    # characters, the volatile line last and still unterminated.
    unterminated = {**body, "instructions": "Tokens used: 5 of 100\nYou are helpful."}
    sorted_out, _ = reorder_body(OPENAI_RESPONSES, unterminated, STAYING_RULES)
    assert sorted_out == {**body, "instructions": "You are helpful.\nTokens used: 5 of 100"}
    assert reorder_body(OPENAI_RESPONSES, sorted_out, STAYING_RULES)[0] is sorted_out
    moved, moved_plan = reorder_body(OPENAI_RESPONSES, body, RULES)
    assert moved == {
        **body,
        "instructions": "You are helpful.\n",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Tokens used: 5 of 100\n"},
                    {"type": "input_text", "text": "hi"},
                ],
            }
        ],
    }
    assert moved_plan.tiers == ("stable",)


def test_a_head_item_without_content_is_kept_in_place_when_the_head_is_rebuilt() -> None:
    tools = {"type": "additional_tools", "role": "developer", "tools": [{"type": "function", "name": "wait"}]}
    body = {
        "model": "gpt-6.2-sol",
        "input": [
            tools,
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "Tokens used: 5 of 100"}],
            },
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are helpful."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        ],
    }
    out, plan = reorder_body(OPENAI_RESPONSES, body, STAYING_RULES)
    assert out["input"] == [tools, body["input"][2], body["input"][1], body["input"][3]]
    assert plan.tiers == ("stable", "volatile")


def test_unsplittable_text_whose_last_piece_ends_in_a_blank_line_keeps_its_lines() -> None:
    """Found by the content-preserving property: a session line followed by a blank line, then an
    unterminated stable line, in Responses `instructions` (not splittable)."""
    text = "Working directory: /home/alice/project\n\nYou are a careful coding agent."
    body = {"model": "gpt-4o", "instructions": text, "input": [{"role": "user", "content": "hi"}]}
    out, _ = reorder_body(OPENAI_RESPONSES, body, RULES)
    assert sorted(out["instructions"].split("\n")) == sorted(text.split("\n"))


def test_a_wrapper_split_across_groups_keeps_its_blank_lines_once() -> None:
    # hypothesis found it: the blank line after `<context>` went with the tag into both copies
    system = "<context>\n\nYou are a careful coding agent.\nCurrent time: 2026-11-29T20:09:13Z\n</context>"
    body = {"model": "m", "system": system, "messages": [{"role": "user", "content": "hi"}]}
    out, _ = reorder_body(ANTHROPIC, body, RULES)
    assert out["system"] == "<context>\n\nYou are a careful coding agent.\n</context>"
    assert out["messages"][0]["content"] == [
        {"type": "text", "text": "<context>\nCurrent time: 2026-11-29T20:09:13Z\n</context>"},
        {"type": "text", "text": "hi"},
    ]


def test_a_line_longer_than_the_rule_limit_is_content_and_never_scanned() -> None:
    from proxy.rules import MAX_RULE_LINE_CHARS

    long_line = "Current time: 2026-11-29T20:09:13Z " + "1%" * MAX_RULE_LINE_CHARS
    short = "Current time: 2026-11-29T20:09:13Z"
    segments = classifier_for(RULES).segments(f"You are helpful.\n{long_line}\n{short}\n")
    assert [(s.text, s.tier) for s in segments] == [
        (f"You are helpful.\n{long_line}\n", "stable"),
        (short + "\n", "volatile"),
    ]


def test_heading_sections_reorder_idempotently() -> None:
    """Texts the property tests found: a heading a section rule matches after a fence line, and a
    volatile line sorted behind a heading section that then takes it in (instructions stay one
    block and take the tier their sorted text classifies as)."""
    for path, body in (
        (
            "/v1/chat/completions",
            {
                "model": "gpt-4o",
                "messages": [
                    {"role": "system", "content": "```\n# Memory\n</context>"},
                    {"role": "user", "content": "hi"},
                ],
            },
        ),
        (
            "/v1/responses",
            {
                "model": "gpt-5.6",
                "instructions": "Tokens used: 1234 of 200000\n# Memory",
                "input": [{"role": "user", "content": "hi"}],
            },
        ),
    ):
        for rules in (RULES, STAYING_RULES):
            out, plan = reorder_body(route(path)[0], body, rules)
            again, replan = reorder_body(route(path)[0], out, rules)
            assert again == out and replan.tiers == plan.tiers


def test_a_closing_tag_never_opened_is_text_inside_a_heading_section() -> None:
    """The property tests found it (session 12): `</context>` with no `<context>` before it ended
    the `# Memory` section, sorting then put it first, and the section swallowed `<env>` and
    left the timestamp line to move to the user message on the second pass only. A closing tag
    ends a heading section only when its opening tag comes before the heading."""
    classifier = classifier_for(RULES)
    text = "# Memory\n</context>\n<env>\n# Current time: 2026-12-01T09:31:00Z"
    assert [(s.text, s.tier) for s in classifier.segments(text)] == [
        ("# Memory\n</context>\n<env>\n", "session"),
        ("# Current time: 2026-12-01T09:31:00Z", "volatile"),
    ]
    wrapped = "<context>\n# Memory\nfoo\n</context>\nbar"
    assert [(s.text, s.wrap) for s in classifier.segments(wrapped)] == [
        ("<context>\n", 1),
        ("# Memory\nfoo\n", 0),
        ("</context>\n", -1),
        ("bar", 0),
    ]
    body = {
        "model": "gpt-4o",
        "messages": [{"role": "system", "content": text}, {"role": "user", "content": "You are careful."}],
    }
    out, plan = reorder_body(route("/v1/chat/completions")[0], body, RULES)
    again, replan = reorder_body(route("/v1/chat/completions")[0], out, RULES)
    assert again == out and replan.moved == ()
    assert plan.moved == ("# Current time: 2026-12-01T09:31:00Z",)


def test_a_sorted_prompt_that_segments_differently_is_settled_in_the_same_request() -> None:
    """Attack pass (session 12): sorting can put a line behind a heading section that then
    takes it in, or move away the tag line that ended one, so the next pass over the output
    changed it again (674 of 120,000 generated prompts). The reorder now plans its own output
    again until nothing changes, in the same request: what it sends is what a second pass keeps."""
    chat, responses = route("/v1/chat/completions")[0], route("/v1/responses")[0]
    tag_mix = "# Current time: 2026-12-01T09:31:00Z\n</env>\n# Memory\n  <env>"
    body = {"model": "gpt-5.6", "instructions": tag_mix, "input": [{"role": "user", "content": "hi"}]}
    out, plan = reorder_body(responses, body, STAYING_RULES)
    assert out["instructions"] == "</env>\n# Memory\n  <env>\n# Current time: 2026-12-01T09:31:00Z"
    assert (plan.moved, plan.tiers, plan.changed) == ((), ("volatile",), True)
    assert reorder_body(responses, out, STAYING_RULES)[0] == out
    wrapped = (
        "<system-reminder>\ngitStatus: clean\n# Current time: 2026-12-01T09:31:00Z\n</memory>\n<memory>\n"
        "</system-reminder>"
    )
    body = {"model": "gpt-4o", "messages": [{"role": "system", "content": wrapped}, {"role": "user", "content": "hi"}]}
    out, plan = reorder_body(chat, body, RULES)
    assert out["messages"][0]["content"] == [
        {"type": "text", "text": "<system-reminder>\n"},
        {"type": "text", "text": "gitStatus: clean\n</system-reminder>"},
    ]
    assert plan.moved == (
        "<system-reminder>\n# Current time: 2026-12-01T09:31:00Z\n</memory>\n<memory>\n</system-reminder>",
    )
    assert (plan.slots, plan.tiers) == (("move\x1ftimestamp\x1f0",), ("stable", "session"))
    again, replan = reorder_body(chat, out, RULES)
    assert again == out and replan.changed is False


def test_settled_passes_number_their_moved_texts_over_both_passes() -> None:
    from proxy.pipeline.reorder import SystemPlan, _merged

    first = SystemPlan(parts=(), tiers=("stable",), moved=("a",), changed=True, slots=("move\x1ftimestamp\x1f0",))
    then = SystemPlan(
        parts=(),
        tiers=("session",),
        moved=("b", "c"),
        changed=True,
        markers_moved=1,
        slots=("move\x1ftimestamp\x1f0", "move\x1fcwd\x1f0"),
    )
    merged = _merged(first, then)
    assert (merged.moved, merged.slots, merged.tiers, merged.markers_moved) == (
        ("a", "b", "c"),
        ("move\x1ftimestamp\x1f0", "move\x1ftimestamp\x1f1", "move\x1fcwd\x1f0"),
        ("session",),
        1,
    )


_LINES = [
    "# Memory",
    "## Memory",
    "### claudeMd",
    "# Notes",
    "## Tools",
    "#Memory",
    "<env>",
    "</env>",
    "  <env>",
    "<context>",
    "</context>",
    "<memory>",
    "</memory>",
    "<system-reminder>",
    "</system-reminder>",
    "Current time: 2026-12-01T09:31:00Z",
    "# Current time: 2026-12-01T09:31:00Z",
    "Today's date: 2026-11-29",
    "Working directory: /home/alice/app",
    "gitStatus: clean",
    "Tokens used: 1234 of 200000",
    "plain text",
    "more text",
    "",
    "```",
    "- request id: abc",
]


@given(st.lists(st.sampled_from(_LINES), min_size=1, max_size=12), st.booleans(), st.booleans())
@settings(max_examples=300, deadline=None)
def test_reorder_of_headings_tags_and_notes_is_idempotent(lines: list[str], newline: bool, staying: bool) -> None:
    """Property: on system prompts mixing headings, tag lines (closing tags never opened too)
    and volatile lines, on all three APIs, reordering the output again changes nothing."""
    text = "\n".join(lines) + ("\n" if newline else "")
    rules = STAYING_RULES if staying else RULES
    for path, body in (
        (
            "/v1/messages",
            {"model": "m", "max_tokens": 8, "system": text, "messages": [{"role": "user", "content": "hi"}]},
        ),
        (
            "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "system", "content": text}, {"role": "user", "content": "hi"}]},
        ),
        ("/v1/responses", {"model": "m", "instructions": text, "input": [{"role": "user", "content": "hi"}]}),
    ):
        adapter = route(path)[0]
        out, _ = reorder_body(adapter, body, rules)
        again, plan = reorder_body(adapter, out, rules)
        assert again == out and plan.moved == ()
