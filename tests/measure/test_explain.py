"""`promptcache explain`: one pair per cause, exact outputs; the command's text and exit status."""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.explain import (
    Explanation,
    RequestInput,
    Signals,
    body_signals,
    detect_path,
    explain,
    explain_command,
    plan_lines,
    render,
)
from proxy.providers import ANTHROPIC
from proxy.providers.base import Block, Usage
from proxy.rules import PACKAGED_DIR
from tests.measure.bodies import BASE, variant

COMMON = {"provider": "anthropic", "path": "/v1/messages", "a_blocks": 6, "plan": None}


def _is_cwd_line(block: Block) -> bool:
    return isinstance(block.value, dict) and str(block.value.get("text", "")).startswith("cwd:")


def _expect(**fields: Any) -> Explanation:
    base = {
        **COMMON,
        "section": "none",
        "extends": False,
        "block_path": None,
        "field_path": None,
        "char_offset": None,
        "before": None,
        "after": None,
        "detail": None,
        "a_bytes": 320,
        "b_blocks": 6,
        "predicted_read_tokens": 0,
    }
    return Explanation(**{**base, **fields})


CASES = {
    "none": (
        {},
        _expect(
            cause="none",
            extends=True,
            block_index=6,
            byte_offset=320,
            tokens_before=80,
            detail="B appends 2 block(s) to A",
            b_blocks=8,
            b_bytes=365,
            predicted_read_tokens=80,
        ),
    ),
    "model_changed": (
        {},
        _expect(
            cause="model_changed",
            block_index=0,
            byte_offset=0,
            tokens_before=0,
            detail="model changed: 'claude-sonnet-4-6' -> 'claude-opus-4-8' (the cache is per model)",
            b_bytes=320,
        ),
    ),
    "tools_changed": (
        {},
        _expect(
            cause="tools_changed",
            section="tools",
            block_index=0,
            block_path="tools[0]",
            field_path="tools[0].description",
            char_offset=5,
            byte_offset=35,
            tokens_before=9,
            before="Read a file",
            after="Read one file",
            b_bytes=322,
        ),
    ),
    "params_changed": (
        {},
        _expect(
            cause="params_changed",
            block_index=0,
            byte_offset=0,
            tokens_before=0,
            detail="parameters changed: tool_choice",
            b_bytes=320,
        ),
    ),
    "system_changed": (
        {},
        _expect(
            cause="system_changed",
            section="system",
            block_index=2,
            block_path="system[1]",
            field_path="system[1].text",
            char_offset=13,
            byte_offset=165,
            tokens_before=42,
            before="cwd: /home/u/project",
            after="cwd: /home/u/other",
            b_bytes=318,
        ),
    ),
    "system_volatile_text": (
        {"is_volatile": _is_cwd_line},
        _expect(
            cause="system_volatile_text",
            section="system",
            block_index=2,
            block_path="system[1]",
            field_path="system[1].text",
            char_offset=13,
            byte_offset=165,
            tokens_before=42,
            before="cwd: /home/u/project",
            after="cwd: /home/u/other",
            b_bytes=318,
        ),
    ),
    "messages_changed": (
        {},
        _expect(
            cause="messages_changed",
            section="messages",
            block_index=5,
            block_path="messages[2].content[0]",
            field_path="messages[2].content[0].content",
            char_offset=6,
            byte_offset=316,
            tokens_before=79,
            before="print(1)",
            after="print(2)",
            b_bytes=320,
            predicted_read_tokens=44,
        ),
    ),
    "history_rewritten": (
        {},
        _expect(
            cause="history_rewritten",
            section="messages",
            block_index=3,
            block_path="messages[0].content",
            field_path="messages[0].content",
            char_offset=5,
            byte_offset=180,
            tokens_before=45,
            before="Open main.py",
            after="Open app.py",
            b_bytes=319,
            predicted_read_tokens=44,
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_explain_each_cause(name: str) -> None:
    kwargs, expected = CASES[name]
    variant_name = "system_changed" if name == "system_volatile_text" else name
    assert explain(BASE, variant(variant_name), **kwargs) == expected


def test_first_request_and_expired() -> None:
    first = explain({}, BASE)
    assert (first.cause, first.extends, first.a_blocks, first.b_bytes, first.detail) == (
        "first_request",
        False,
        0,
        320,
        "A is empty: B is a first request, nothing to read",
    )
    # B appends to A, A's breakpoint at block 5 predicts ~80 read tokens; the response wrote instead.
    expired = explain(BASE, variant("none"), usage=Usage(input_none=5, cache_write_5m=360, seen=True))
    assert (expired.cause, expired.extends, expired.predicted_read_tokens) == ("expired", True, 80)
    hit = explain(BASE, variant("none"), usage=Usage(cache_read=80, cache_write_5m=12, seen=True))
    assert hit.cause == "none"


def test_inputs_are_not_modified() -> None:
    a, b = variant("identical"), variant("none")
    before = (orjson.dumps(a), orjson.dumps(b))
    explain(a, b)
    assert (orjson.dumps(a), orjson.dumps(b)) == before


def test_openai_chat_and_responses() -> None:
    a = {
        "model": "gpt-5.1",
        "messages": [{"role": "system", "content": "Rules."}, {"role": "user", "content": "hi"}],
    }
    b = {**a, "messages": [{"role": "system", "content": "Rules!"}, {"role": "user", "content": "hi"}]}
    assert detect_path(a, b) == "/v1/chat/completions"
    got = explain(a, b, "/v1/chat/completions")
    assert (got.provider, got.cause, got.field_path, got.char_offset, got.byte_offset) == (
        "openai",
        "system_changed",
        "messages[0].content",
        5,
        6,
    )
    ra = {"model": "gpt-5.1", "instructions": "Be brief.", "input": [{"role": "user", "content": "one"}]}
    rb = {**ra, "input": [*ra["input"], {"role": "user", "content": "two"}]}
    assert detect_path(ra, rb) == "/v1/responses"
    assert explain(ra, rb, "/v1/responses").extends is True


@pytest.mark.parametrize(
    ("body", "provider", "path"),
    [
        (BASE, "auto", "/v1/messages"),
        ({"model": "claude-x", "messages": []}, "auto", "/v1/messages"),
        ({"model": "gpt-5", "messages": []}, "auto", "/v1/chat/completions"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "auto", "/v1/chat/completions"),
        ({"input": "x"}, "openai", "/v1/responses"),
        ({"messages": []}, "openai", "/v1/chat/completions"),
        ({"input": "x"}, "anthropic", "/v1/messages"),
        ({}, "auto", "/v1/messages"),
    ],
)
def test_detect_path(body: dict[str, Any], provider: str, path: str) -> None:
    assert detect_path({}, body, provider) == path


CLAUDE_CODE_FIRST_TURN = {
    "model": "claude-opus-5-5",
    "max_tokens": 1024,
    "system": [{"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}}],
    "tools": [{"name": "Bash", "description": "Run a command", "input_schema": {"type": "object"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
        {
            "role": "system",
            "content": [{"type": "text", "text": "# Environment\nPrimary working directory: /work"}],
        },
    ],
}


def test_a_system_role_message_does_not_make_an_anthropic_body_openai() -> None:
    """P4 (tests/clients/data/explain-system-role-message-detected-as-openai.json)."""
    # system 2 + cache_control 2 + input_schema 2 + max_tokens with text blocks 1 + claude model 1;
    # the system-role message is a weak OpenAI signal only.
    assert body_signals(CLAUDE_CODE_FIRST_TURN) == Signals(anthropic=8, openai=1, responses=False)
    assert detect_path({}, CLAUDE_CODE_FIRST_TURN) == "/v1/messages"
    bare = {"messages": CLAUDE_CODE_FIRST_TURN["messages"]}
    assert (
        body_signals(bare) == Signals(anthropic=0, openai=1)
        and detect_path({}, bare) == "/v1/chat/completions"
    )
    with_max_tokens = {**bare, "max_tokens": 10}
    assert detect_path({}, with_max_tokens) == "/v1/messages"  # 1:1, a tie is Anthropic


@pytest.mark.parametrize(
    ("body", "headers", "expected"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]},
            None,
            (2, 0),
        ),
        ({"thinking": {"type": "adaptive"}, "top_k": 5, "tool_choice": {"type": "any"}}, None, (6, 0)),
        ({"messages": [{"role": "system", "content": "x"}]}, {"anthropic-version": "2023-06-01"}, (8, 1)),
        ({"prompt_cache_key": "k", "messages": [{"role": "developer", "content": "x"}]}, None, (0, 4)),
        (
            {"model": "gpt-5.1", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            None,
            (0, 3),
        ),
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "max_tokens": 5}, None, (0, 2)),
    ],
    ids=["tool_result", "anthropic-keys", "recorded-header", "openai-keys", "image_url", "function-tool"],
)
def test_body_signals(
    body: dict[str, Any], headers: dict[str, str] | None, expected: tuple[int, int]
) -> None:
    signals = body_signals(body, headers)
    assert (signals.anthropic, signals.openai, signals.responses) == (*expected, False)


def test_responses_signals_and_recorded_paths() -> None:
    responses = {"model": "gpt-6.2-sol", "instructions": "x", "input": [{"role": "system", "content": "y"}]}
    assert body_signals(responses) == Signals(anthropic=0, openai=5, responses=True)
    assert detect_path({}, responses) == "/v1/responses"
    # A trace line's recorded path wins over the body shape, for auto and for --provider openai.
    line = RequestInput({"model": "gpt-5.5", "messages": []}, "/v1/responses", {})
    assert detect_path({}, line) == detect_path({}, line, "openai") == "/v1/responses"
    assert detect_path({}, line, "anthropic") == "/v1/messages"


def test_command_reads_trace_lines(tmp_path: Path) -> None:
    """A recorded trace line (`proxy/trace_recorder.py`) works as an input: its body, path and headers."""
    line = {"gap": 0, "path": "/v1/messages", "headers": {"anthropic-version": "2023-06-01"}, "body": BASE}
    out = io.StringIO()
    assert explain_command(*_files(tmp_path, {}, line), out=out) == 1
    assert out.getvalue().startswith("promptcache explain (anthropic, /v1/messages)\n  A: 0 blocks")
    out = io.StringIO()
    assert explain_command(*_files(tmp_path, line, {**line, "body": variant("none")}), out=out) == 0
    assert "cause: none\n  B appends 2 block(s) to A\n" in out.getvalue()


def _files(tmp_path: Path, a: Any, b: Any) -> tuple[str, str]:
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_bytes(orjson.dumps(a))
    pb.write_bytes(orjson.dumps(b))
    return str(pa), str(pb)


def test_command_prints_the_divergence_and_exits_1(tmp_path: Path) -> None:
    out = io.StringIO()
    assert explain_command(*_files(tmp_path, BASE, variant("system_changed")), out=out) == 1
    plan = plan_lines(
        ANTHROPIC, variant("system_changed"), min_tokens=1024, previous_breakpoints=(2, 5)
    )
    assert plan is not None
    assert out.getvalue() == (
        "promptcache explain (anthropic, /v1/messages)\n"
        "  A: 6 blocks, 320 bytes (~80 tokens)\n"
        "  B: 6 blocks, 318 bytes (~80 tokens)\n"
        "cause: system_changed (section system)\n"
        "first divergence: block 2 (system[1]), system[1].text at character 13\n"
        "  byte 165 of the canonical stream, ~42 tokens before it\n"
        "  A: cwd: /home/u/project\n"
        "  B: cwd: /home/u/other\n"
        "expected cache read from A's breakpoints: ~0 tokens\n"
        "breakpoint plan promptcache would send for B:\n"
        + "".join(f"  {line}\n" for line in plan)
        + "B does not extend A\n"
    )
    # The planner's own lines (claude-sonnet-4-6: 1,024-token minimum, A's markers at 2 and 5).
    assert plan[-1].startswith("injected ") and 1 <= len(plan) - 1 <= 4
    assert all(line.startswith("block ") for line in plan[:-1])


def test_render_without_a_planner() -> None:
    out = io.StringIO()
    render(explain(BASE, variant("none")), out)
    assert "breakpoint plan for B: unavailable (no pure planner in this build)\n" in out.getvalue()


def test_command_exits_0_when_b_extends_a(tmp_path: Path) -> None:
    out = io.StringIO()
    assert explain_command(*_files(tmp_path, BASE, variant("none")), out=out) == 0
    assert (
        "cause: none\n  B appends 2 block(s) to A\nshared prefix: 320 bytes, ~80 tokens\n" in out.getvalue()
    )
    assert out.getvalue().endswith("B extends A\n")


def test_command_reads_a_response_for_expired(tmp_path: Path) -> None:
    a, b = _files(tmp_path, BASE, variant("none"))
    response = tmp_path / "response.json"
    response.write_bytes(
        orjson.dumps({"id": "msg_1", "usage": {"input_tokens": 5, "cache_creation_input_tokens": 360}})
    )
    # The packaged model table: claude-sonnet-4-6 caches nothing below 1,024 tokens, no read is due.
    out = io.StringIO()
    assert explain_command(a, b, "anthropic", str(response), out=out) == 0
    assert "cause: none\n" in out.getvalue() and "breakpoints: ~0 tokens\n" in out.getvalue()
    # A rules folder whose model table has no minimum: ~80 tokens were due and came back written.
    rules = tmp_path / "rules"
    shutil.copytree(PACKAGED_DIR, rules, ignore=shutil.ignore_patterns("models.yaml"))
    (rules / "models.yaml").write_text("version: 1\ndefault_min_tokens: 0\nmin_tokens: {}\n")
    out = io.StringIO()
    assert explain_command(a, b, "anthropic", str(response), out=out, rules_dir=str(rules)) == 0
    assert "cause: expired\n" in out.getvalue()
    assert "expected cache read from A's breakpoints: ~80 tokens\n" in out.getvalue()


def test_command_uses_volatile_rules(tmp_path: Path) -> None:
    a_body, b_body = variant("identical"), variant("identical")
    a_body["system"][1]["text"] = "Current time: 2026-11-29 10:15"
    b_body["system"][1]["text"] = "Current time: 2026-11-29 10:20"
    out = io.StringIO()
    assert explain_command(*_files(tmp_path, a_body, b_body), out=out) == 1
    assert "cause: system_volatile_text (section system)\n" in out.getvalue()
    assert "system[1].text at character 28\n" in out.getvalue()


@pytest.mark.parametrize("content", [b"not json", b"[1, 2]", None])
def test_command_exits_2_on_unreadable_input(tmp_path: Path, content: bytes | None) -> None:
    a = tmp_path / "a.json"
    a.write_bytes(orjson.dumps(BASE))
    b = tmp_path / "b.json"
    if content is not None:
        b.write_bytes(content)
    err = io.StringIO()
    assert explain_command(str(a), str(b), out=io.StringIO(), err=err) == 2
    assert err.getvalue().startswith(f"promptcache explain: {b}: ")


def test_cli_hooks() -> None:
    import argparse

    from proxy import explain as module

    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    args = parser.parse_args(
        ["a.json", "b.json", "--provider", "openai", "--response", "r.json", "--rules", "d"]
    )
    assert (args.a, args.b, args.provider, args.response, args.rules) == (
        "a.json",
        "b.json",
        "openai",
        "r.json",
        "d",
    )
    defaults = parser.parse_args(["a.json", "b.json"])
    assert (defaults.provider, defaults.response, defaults.rules) == ("auto", None, None)


def test_command_takes_literal_empty_reference(tmp_path: Path) -> None:
    """`promptcache explain {} B.json` (the documented "no reference request")."""
    b = tmp_path / "b.json"
    b.write_bytes(orjson.dumps(BASE))
    out = io.StringIO()
    assert explain_command("{}", str(b), out=out) == 1
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["promptcache explain (anthropic, /v1/messages)", "  A: 0 blocks, 0 bytes (~0 tokens)"]
    assert "cause: first_request" in lines
    assert "  A is empty: B is a first request, nothing to read" in lines


def test_first_difference_of_blocks_that_differ_only_in_markers() -> None:
    from proxy.forensics import first_difference

    marked = {"content": [{"type": "text", "text": "x", "cache_control": {}}, {"type": "text", "text": "y"}]}
    plain = {"content": [{"type": "text", "text": "x"}, {"type": "text", "text": "z"}]}
    assert first_difference(marked, plain, "m") == ("m.content[1].text", 0, "y", "z")
    same = {"content": [{"type": "text", "text": "x"}]}
    assert first_difference({"content": [{"type": "text", "text": "x", "cache_control": {}}]}, same, "m") == (
        "m.content[1]",
        None,
        None,
        None,
    )
