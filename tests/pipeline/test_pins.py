"""Pinned system segments (`pin: true` rules, proxy.pipeline.pins): first-seen bytes while the
fields are the same; a real change sent as new bytes, or moved onto the newest user message
with `pin_changes_to_user`.

Pure: `fields`, `pin_body` over several turns (keys, mapping, idempotence, input untouched, the
fallback when no message can take the text, OpenAI). Through the simulator: four turns whose
date line changes on turn 3, with and without the move option (exact usage and causes).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.pipeline.pins import PINS_KEY, fields, pin_body
from proxy.providers import ANTHROPIC, OPENAI_CHAT, route
from proxy.rules import RuleSet, load_rules
from tests.pipeline.helpers import RULES
from tests.pipeline.strategies import (
    ANTHROPIC_MARKER_KEY,
    OPENAI_MARKER_KEY,
    anthropic_bodies,
    content_fingerprint,
    count_markers,
    openai_bodies,
)
from tests.pipeline.test_simulator import GUIDE, HEADERS, Relay, _tokens

sim_app = pytest.importorskip("proxy.sim.app")
sim_clock = pytest.importorskip("proxy.sim.clock")

MESSAGES = "/v1/messages"
CHAT = "/v1/chat/completions"
SONNET = "claude-sonnet-4-6"
MOVING = dataclasses.replace(
    RULES,
    rules=tuple(dataclasses.replace(r, pin_changes_to_user=r.pin) for r in RULES.rules),
)
"""The packaged rules with `pin_changes_to_user` on every pinned rule."""
DATE_KEY = "date\x1ftoday's date\x1f0"
ENV = "<env>\nWorking directory: /home/dev/app\nPlatform: linux\nToday's date: 2026-11-29\n</env>"


def _body(system: Any, *questions: str) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for k, question in enumerate(questions):
        if k:
            messages.append({"role": "assistant", "content": f"Answer {k - 1}."})
        messages.append({"role": "user", "content": question})
    return {"model": SONNET, "max_tokens": 32, "system": system, "messages": messages}


def test_fields_ignore_whitespace_bullets_key_case_and_line_order() -> None:
    base = fields("Today's date: 2026-11-29\nWorking directory: /home/dev/App")
    assert fields("  - today's date :  2026-11-29\n\n* Working   directory:/home/dev/App  ") == base
    assert fields("Working directory: /home/dev/App\nToday's date: 2026-11-29") == base
    assert fields("Today's date: 2026-11-30\nWorking directory: /home/dev/App") != base
    assert fields("Today's date: 2026-11-29\nWorking directory: /home/dev/app") != base  # values keep case


def test_first_request_pins_and_changes_nothing() -> None:
    body = _body(f"{GUIDE}\nToday's date: 2026-11-29\n", "Q0?")
    out, report = pin_body(ANTHROPIC, body, RULES)
    assert out is body
    assert report.pinned == {DATE_KEY: "Today's date: 2026-11-29"}
    assert (report.kept, report.moved, report.changed) == (0, 0, 0)


def test_reformatted_segment_is_sent_with_its_first_seen_bytes() -> None:
    pinned = {"env-block\x1f\x1f0": ENV}
    reformatted = ENV.replace("Platform: linux", "  - platform:   linux").replace("\n</env>", "\n\n</env>")
    body = _body([{"type": "text", "text": GUIDE}, {"type": "text", "text": reformatted + "\n"}], "Q0?")
    before = copy.deepcopy(body)
    out, report = pin_body(ANTHROPIC, body, RULES, pinned)
    assert out["system"] == [{"type": "text", "text": GUIDE}, {"type": "text", "text": ENV + "\n"}]
    assert out["messages"] == body["messages"] and body == before
    assert report.pinned == pinned and report.kept == 1
    assert pin_body(ANTHROPIC, out, RULES, report.pinned)[0] is out  # idempotent


def test_real_change_is_sent_and_becomes_the_pinned_bytes() -> None:
    pinned = {DATE_KEY: "Today's date: 2026-11-29"}
    body = _body(f"{GUIDE}\nToday's date: 2026-11-30\n", "Q0?", "Q1?")
    out, report = pin_body(ANTHROPIC, body, RULES, pinned)
    assert out is body
    assert report.pinned == {DATE_KEY: "Today's date: 2026-11-30"} and report.changed == 1


def test_real_change_moves_onto_the_newest_user_message() -> None:
    pinned = {DATE_KEY: "Today's date: 2026-11-29"}
    system = [{"type": "text", "text": GUIDE}, {"type": "text", "text": "Today's date: 2026-11-30\n"}]
    body = _body(system, "Q0?", "Q1?")
    before = copy.deepcopy(body)
    out, report = pin_body(ANTHROPIC, body, MOVING, pinned)
    assert out["system"] == [{"type": "text", "text": GUIDE}, {"type": "text", "text": "Today's date: 2026-11-29\n"}]
    assert out["messages"][:2] == body["messages"][:2]
    assert out["messages"][2] == {
        "role": "user",
        "content": [{"type": "text", "text": "Today's date: 2026-11-30"}, {"type": "text", "text": "Q1?"}],
    }
    assert report.pinned == pinned and report.moved == 1 and body == before
    assert pin_body(ANTHROPIC, out, MOVING, report.pinned)[0] is out  # idempotent


def test_change_stays_in_the_system_when_no_message_can_take_it() -> None:
    pinned = {DATE_KEY: "Today's date: 2026-11-29"}
    body = {"model": SONNET, "system": f"{GUIDE}\nToday's date: 2026-11-30", "messages": []}
    out, report = pin_body(ANTHROPIC, body, MOVING, pinned)
    assert out is body
    assert report.pinned == {DATE_KEY: "Today's date: 2026-11-30"} and (report.moved, report.changed) == (0, 1)


def test_rules_without_pins_leave_the_body_alone() -> None:
    unpinned = dataclasses.replace(RULES, rules=tuple(dataclasses.replace(r, pin=False) for r in RULES.rules))
    body = _body(f"{GUIDE}\nToday's date: 2026-11-30\n", "Q0?")
    out, report = pin_body(ANTHROPIC, body, unpinned, {DATE_KEY: "Today's date: 2026-11-29"})
    assert out is body and report.pinned == {DATE_KEY: "Today's date: 2026-11-29"}


def test_openai_system_message_is_pinned_too() -> None:
    pinned = {"cwd-host-home\x1fcwd\x1f0": "cwd: /home/dev/app"}
    body = {
        "model": "gpt-5.1",
        "messages": [
            {"role": "system", "content": f"{GUIDE}\n  cwd:   /home/dev/app\n"},
            {"role": "user", "content": "Q0?"},
        ],
    }
    out, report = pin_body(OPENAI_CHAT, body, RULES, pinned)
    assert out["messages"][0] == {"role": "system", "content": f"{GUIDE}\n  cwd: /home/dev/app\n"}
    assert report.kept == 1


# --- through the simulator -----------------------------------------------------------------------


def _turn(turn: int) -> dict[str, Any]:
    """Turn `turn` (1-based) of a conversation whose system prompt ends with today's date; the
    day changes from turn 3 on."""
    day = 29 if turn < 3 else 30
    system = f"{GUIDE}\nToday's date: 2026-11-{day}\n"
    return _body(system, *[f"Question {k}?" for k in range(turn)])


def _rules_dir(tmp_path: Path, move: bool) -> Path:
    text = (Path(load_rules().sources[0])).read_text(encoding="utf-8")
    if move:
        marker = "    tier: session\n    pin: true\n"
        text = text.replace(marker, marker + "    pin_changes_to_user: true\n")
    folder = tmp_path / ("move" if move else "stay")
    folder.mkdir()
    (folder / "default.yaml").write_text(text, encoding="utf-8")
    return folder


@dataclasses.dataclass
class Conversation:
    usages: list[dict[str, Any]]
    totals: list[int]
    """The simulator's token count of each body sent."""
    causes: dict[str, float]
    """Divergence causes the proxy counted."""
    guide: int
    """Tokens of the guide (the system block before the date)."""
    sent: list[dict[str, Any]]


async def _converse(make_proxy: Any, rules_dir: Path, turns: int) -> Conversation:
    runner, sim = await sim_app.start_sim("127.0.0.1", 0, clock=sim_clock.Clock.manual_at())
    relay = Relay(sim)
    try:
        await relay.start()
        proxy = await make_proxy(upstream=relay.url, rules_dir=rules_dir)
        usages, totals = [], []
        headers = {**HEADERS, "x-session-id": "pinned-date"}
        async with aiohttp.ClientSession() as client:
            for turn in range(1, turns + 1):
                async with client.post(f"{proxy.url}{MESSAGES}", data=orjson.dumps(_turn(turn)), headers=headers) as r:
                    assert r.status == 200, await r.text()
                    usages.append((await r.json())["usage"])
                sent = relay.bodies[-1]
                totals.append(await _tokens(sim, sent, len(sent["messages"])))
                async with client.post(f"{sim}/_sim/clock", json={"advance": 10}) as r:
                    assert r.status == 200
        first = relay.bodies[0]
        assert first["system"][1]["text"] == "Today's date: 2026-11-29\n"  # sorted after the guide
        guide = await _tokens(sim, {**first, "system": first["system"][:1]}, 0)
        causes: dict[str, float] = {}
        for cause in ("first_request", "none", "system_changed", "history_rewritten", "messages_changed"):
            for section in ("none", "system", "messages"):
                value = proxy.sample(
                    "promptcache_prefix_divergences_total", provider="anthropic", section=section, cause=cause
                )
                if value:
                    causes[cause] = causes.get(cause, 0.0) + value
        return Conversation(usages, totals, causes, guide, relay.bodies)
    finally:
        if relay.runner is not None:
            await relay.runner.cleanup()
        await runner.cleanup()


async def test_date_change_is_one_system_change_without_the_move(make_proxy: Any, tmp_path: Path) -> None:
    run = await _converse(make_proxy, _rules_dir(tmp_path, move=False), 4)
    usages, totals, causes, guide = run.usages, run.totals, run.causes, run.guide
    assert [b["system"][1]["text"] for b in run.sent] == [f"Today's date: 2026-11-{d}\n" for d in (29, 29, 30, 30)]
    assert causes == {"first_request": 1, "none": 2, "system_changed": 1}
    # turn 3 reads only the guide (the shared marker before the date) and writes the rest
    assert [u["cache_read_input_tokens"] for u in usages] == [0, totals[0], guide, totals[2]]
    assert [u["cache_creation_input_tokens"] for u in usages] == [
        totals[0],
        totals[1] - totals[0],
        totals[2] - guide,
        totals[3] - totals[2],
    ]
    assert all(u["input_tokens"] == 0 for u in usages)


async def test_date_change_moves_onto_the_user_message_and_every_turn_reads(make_proxy: Any, tmp_path: Path) -> None:
    run = await _converse(make_proxy, _rules_dir(tmp_path, move=True), 4)
    usages, totals, causes = run.usages, run.totals, run.causes
    # the system prompt is the first-seen one every turn; the new date rides on turn 3's newest
    # question only (replayed as sent on turn 4, so turn 4 does not repeat it: delivered once)
    def unmarked(system: Any) -> Any:  # marker TTLs follow pacing (proxy.pacing), the text must not move
        if not isinstance(system, list):
            return system
        return [{k: v for k, v in b.items() if k != "cache_control"} for b in system]

    assert all(unmarked(b["system"]) == unmarked(run.sent[0]["system"]) for b in run.sent)
    moved = {"type": "text", "text": "Today's date: 2026-11-30"}
    assert run.sent[3]["messages"][4]["content"][0] == moved
    assert [c["text"] for c in run.sent[3]["messages"][6]["content"]] == ["Question 3?"]
    def bare(messages: list[Any]) -> list[Any]:  # markers move with each turn (the anchor: proxy.pacing)
        return [
            {**m, "content": [{k: v for k, v in c.items() if k != "cache_control"} for c in m["content"]]}
            for m in messages
        ]

    assert bare(run.sent[3]["messages"][:5]) == bare(run.sent[2]["messages"])
    assert causes == {"first_request": 1, "none": 3}
    assert [u["cache_read_input_tokens"] for u in usages] == [0, *totals[:3]]
    assert [u["cache_creation_input_tokens"] for u in usages] == [
        totals[0],
        *[b - a for a, b in zip(totals, totals[1:], strict=False)],
    ]
    assert all(u["input_tokens"] == 0 for u in usages)


def test_rules_fixture_is_the_packaged_set() -> None:
    assert isinstance(RULES, RuleSet) and PINS_KEY == "pinned_segments"
    assert {r.name for r in RULES.rules if r.pin} == {"billing-header", "env-block", "date", "cwd-host-home"}
    assert [r.name for r in RULES.rules if r.pin_changes_to_user] == ["billing-header"]


# --- properties ----------------------------------------------------------------------------------

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _variants(pinned: dict[str, str]) -> list[dict[str, str]]:
    """The body's own mapping, the same fields written otherwise, and other fields."""
    return [
        pinned,
        {k: v.replace(": ", ":   ").replace("\n", "\n\n") for k, v in pinned.items()},
        {k: v + " (changed)" for k, v in pinned.items()},
    ]


def _check(adapter: Any, body: dict[str, Any], rules: RuleSet, key: str) -> None:
    before = orjson.dumps(body)
    own = pin_body(adapter, body, rules)
    assert own[0] is body  # a first request is sent as is
    for pinned in _variants(own[1].pinned):
        out, report = pin_body(adapter, body, rules, pinned)
        assert orjson.dumps(body) == before  # caller input never mutated
        again, _ = pin_body(adapter, out, rules, report.pinned)
        assert orjson.dumps(again) == orjson.dumps(out)  # idempotent
        assert count_markers(adapter, out, key) == count_markers(adapter, body, key)
        # content: only the session's own texts appear, nothing else is edited
        gained = content_fingerprint(adapter, out, key) - content_fingerprint(adapter, body, key)
        allowed = {line for text in pinned.values() for line in text.split("\n")} | {
            line for text in own[1].pinned.values() for line in text.split("\n")
        }
        assert all(item[0] == "line" and item[1] in allowed for item in gained), gained


@FAST
@given(anthropic_bodies(), st.sampled_from([RULES, MOVING]))
def test_pin_body_is_pure_idempotent_and_only_sends_session_text(body: dict[str, Any], rules: RuleSet) -> None:
    _check(ANTHROPIC, body, rules, ANTHROPIC_MARKER_KEY)


@FAST
@given(openai_bodies(), st.sampled_from([RULES, MOVING]))
def test_pin_body_is_pure_idempotent_and_only_sends_session_text_openai(
    case: tuple[str, dict[str, Any]], rules: RuleSet
) -> None:
    path, body = case
    _check(route(path)[0], body, rules, OPENAI_MARKER_KEY)
