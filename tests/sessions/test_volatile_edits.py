"""An edit of a volatile value is an edit: proxy -> recording fake upstream, real HTTP.

The replay stage and session inference compare earlier messages with their volatile values
masked (date-times, epoch times, counters, request ids: rules/default.yaml), so a client that
re-renders `Current time: ...` in its history keeps its cache. A person who edits such a value,
and a second conversation that differs from the first only there, must not get the stored
bytes back (attack pass, session 13: `deploy 2026-12-04...` reached the upstream as `...12-03...`,
and a second conversation's next turn received the first one's message). The sessions' clock is
set by each test (`SessionState.clock`), so what "re-rendered since the session started" means
is exact here."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from tests.fakes.upstream import FakeUpstream
from tests.sessions.conftest import Client, Proxy

MODEL = "claude-sonnet-4-6"
START = 1_796_292_000.0
"""2026-12-03T10:00:00Z."""
SESSION = {"x-session-id": "conversation-1"}
REPLY = {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def turn(*messages: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 64, "messages": list(messages)}


def stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def sent(fake: FakeUpstream, i: int) -> list[bytes]:
    """Request `i` as the upstream got it: each message's orjson bytes (key order kept)."""
    return [orjson.dumps(m) for m in orjson.loads(fake.received[i].body)["messages"]]


def at(proxy: Proxy, seconds: float) -> None:
    """Set the sessions' clock (epoch seconds)."""
    proxy.services.sessions.clock = lambda: seconds


def causes(proxy: Proxy) -> dict[str, float]:
    """Requests by divergence cause (`promptcache_prefix_divergences_total`), the counted ones."""
    out: dict[str, float] = {}
    for metric in proxy.registry.collect():
        for sample in metric.samples:
            if sample.name == "promptcache_prefix_divergences_total" and sample.value:
                out[sample.labels["cause"]] = out.get(sample.labels["cause"], 0) + sample.value
    return out


def replayed(proxy: Proxy) -> float:
    return proxy.sample("promptcache_replayed_messages_total", provider="anthropic")


async def send(proxy: Proxy, client: Client, seconds: float, body: Any, **kw: Any) -> None:
    """Post `body` at `seconds` on the sessions' clock, expect a 200, and wait for its record."""
    at(proxy, seconds)
    status, _ = await client.messages(proxy, body, **kw)
    assert status == 200
    await client.settle(proxy)


async def two_turns(proxy: Proxy, client: Client, first: str, edited: str, gap: float, **kw: Any) -> None:
    await send(proxy, client, START, turn(user(first)), **kw)
    at(proxy, START + gap)
    status, _ = await client.messages(proxy, turn(user(edited), REPLY, user("Go on.")), **kw)
    assert status == 200


async def test_an_edited_date_time_reaches_the_upstream_as_edited(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client
) -> None:
    proxy = await start_proxy(upstream=fake_upstream.url)
    first, edited = "Deploy at 2026-12-03T10:00:00Z, please.", "Deploy at 2026-12-04T10:00:00Z, please."
    await two_turns(proxy, client, first, edited, 30.0, headers=SESSION)
    assert sent(fake_upstream, 1)[0] == orjson.dumps(user(edited))
    assert replayed(proxy) == 0


async def test_an_edited_counter_and_request_id_reach_the_upstream_as_edited(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client
) -> None:
    proxy = await start_proxy(upstream=fake_upstream.url)
    first = "Budget remaining: 500 dollars\nrequest id: 7f3a91"
    edited = "Budget remaining: 5 dollars\nrequest id: 7f3a92"
    await two_turns(proxy, client, first, edited, 30.0, headers=SESSION)
    assert sent(fake_upstream, 1)[0] == orjson.dumps(user(edited))
    assert replayed(proxy) == 0


async def test_a_time_moved_back_is_an_edit(start_proxy: Any, fake_upstream: FakeUpstream, client: Client) -> None:
    proxy = await start_proxy(upstream=fake_upstream.url)
    first, edited = f"Current time: {stamp(START)}", f"Current time: {stamp(START - 3600)}"
    await two_turns(proxy, client, first, edited, 30.0, headers=SESSION)
    assert sent(fake_upstream, 1)[0] == orjson.dumps(user(edited))


async def test_a_re_rendered_current_time_is_still_replayed(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client
) -> None:
    """The time moved forward by the 120 s the session has run: the stored bytes are sent."""
    proxy = await start_proxy(upstream=fake_upstream.url)
    first = f"<reminder>Current time: {stamp(START)}</reminder> Fix the bug."
    later = f"<reminder>Current time: {stamp(START + 120)}</reminder> Fix the bug."
    await two_turns(proxy, client, first, later, 120.0, headers=SESSION)
    assert sent(fake_upstream, 1)[0] == orjson.dumps(user(first))
    assert replayed(proxy) == 1


async def test_a_time_moved_further_than_the_session_has_run_is_an_edit(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client
) -> None:
    """Moved forward by 3,600 s in a session 120 s old (past the 300 s allowance)."""
    proxy = await start_proxy(upstream=fake_upstream.url)
    first = f"<reminder>Current time: {stamp(START)}</reminder> Fix the bug."
    later = f"<reminder>Current time: {stamp(START + 3600)}</reminder> Fix the bug."
    await two_turns(proxy, client, first, later, 120.0, headers=SESSION)
    assert sent(fake_upstream, 1)[0] == orjson.dumps(user(later))
    assert replayed(proxy) == 0


async def test_an_edited_tool_result_reaches_the_upstream_as_edited(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client
) -> None:
    proxy = await start_proxy(upstream=fake_upstream.url)
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "clock", "input": {}}]}

    def result(text: str) -> dict[str, Any]:
        return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": text}]}

    await send(proxy, client, START, turn(user("Time?"), call, result("tokens used: 1200")), headers=SESSION)
    at(proxy, START + 10)
    body = turn(user("Time?"), call, result("tokens used: 1500"), REPLY, user("Thanks."))
    await client.messages(proxy, body, headers=SESSION)
    assert sent(fake_upstream, 1)[2] == orjson.dumps(result("tokens used: 1500"))


async def test_an_edit_is_the_same_message_on_the_next_turn(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client
) -> None:
    """After the edit, the session goes on from the edited message: it is sent as it is, nothing
    is replayed, and the request after is an appended turn again (its history unchanged)."""
    proxy = await start_proxy(upstream=fake_upstream.url)
    first, edited = "Deploy at 2026-12-03T10:00:00Z.", "Deploy at 2026-12-04T10:00:00Z."
    await two_turns(proxy, client, first, edited, 30.0, headers=SESSION)
    await client.settle(proxy)
    at(proxy, START + 60)
    third = turn(user(edited), REPLY, user("Go on."), REPLY, user("And then?"))
    await client.messages(proxy, third, headers=SESSION)
    assert fake_upstream.received[2].body == client.sent[2]
    await client.settle(proxy)
    assert causes(proxy) == {"first_request": 1, "history_rewritten": 1, "none": 1}
    assert replayed(proxy) == 0


async def test_conversations_differing_only_in_a_date_time_are_not_joined(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client
) -> None:
    """Two header-less conversations of one tenant, the same first message but for its date:
    each one's next turn is sent with its own first message."""
    proxy = await start_proxy(upstream=fake_upstream.url)
    mine, yours = user("Plan the launch for 2026-12-07 09:00."), user("Plan the launch for 2026-12-21 09:00.")
    await send(proxy, client, START, turn(mine))
    await send(proxy, client, START + 5, turn(yours))
    await send(proxy, client, START + 10, turn(mine, REPLY, user("Who is invited?")))
    at(proxy, START + 15)
    await client.messages(proxy, turn(yours, REPLY, user("Which room?")))
    assert sent(fake_upstream, 2)[0] == orjson.dumps(mine)
    assert sent(fake_upstream, 3)[0] == orjson.dumps(yours)
    await client.settle(proxy)
    assert len(proxy.services.store.backend) == 3  # two sessions and the tenant's pacing


async def test_a_conversation_told_apart_keeps_its_own_messages_after_a_restart(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client, tmp_path: Path
) -> None:
    """Two header-less conversations differing only in the date of their third message, the
    default SQLite store, a restart between their turns (the inference index is empty then):
    each next turn is sent with its own third message."""
    settings = {"upstream": fake_upstream.url, "store": "", "state_dir": tmp_path / "state"}
    opening = user("Here is the release plan.")
    mine, yours = user("Ship it on 2026-12-07 09:00."), user("Ship it on 2026-12-21 09:00.")
    first = await start_proxy(**settings)
    await send(first, client, START, turn(opening, REPLY, mine))
    await send(first, client, START + 5, turn(opening, REPLY, yours))
    await first.stop()
    second = await start_proxy(**settings)
    await send(second, client, START + 10, turn(opening, REPLY, yours, REPLY, user("Who signs off?")))
    at(second, START + 15)
    await client.messages(second, turn(opening, REPLY, mine, REPLY, user("Which build?")))
    assert sent(fake_upstream, 2)[2] == orjson.dumps(yours)
    assert sent(fake_upstream, 3)[2] == orjson.dumps(mine)


async def test_a_header_less_conversation_edited_goes_on_replaying_its_re_rendered_reminders(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client
) -> None:
    """Every user message starts with `Current time: <now>`, re-rendered on every request; in
    turn 3 the person moves the date in the first message a day on (fresh-user check, session
    14: turn 4 was a new session again, replaying nothing, because the edited message's identity
    followed its re-rendered reminder). Turn 3 starts the edited conversation (the edit is in its
    first message, as a content edit there would); turn 4 continues it and is sent with turn 3's
    bytes for its three earlier user messages."""
    proxy = await start_proxy(upstream=fake_upstream.url)
    questions = ["Book the review for 2026-12-05T15:00:00Z.", "Risks?", "Action items?", "Draft a note."]
    reply = {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}

    def body(n: int, now: float) -> dict[str, Any]:
        messages: list[Any] = []
        for i in range(n):
            question = questions[i].replace("12-05", "12-06") if n >= 3 and i == 0 else questions[i]
            messages += [user(f"Current time: {stamp(now)}\n{question}"), reply]
        return turn(*messages[:-1])

    for n in range(1, 5):
        await send(proxy, client, START + 7 * n, body(n, START + 7 * n))
    third, fourth = sent(fake_upstream, 2), sent(fake_upstream, 3)
    assert fourth[:5] == third[:5]
    assert fourth[:5] != [orjson.dumps(m) for m in body(4, START + 28)["messages"][:5]]
    assert replayed(proxy) == 1 + 3
    assert causes(proxy) == {"first_request": 2, "none": 2}


async def test_a_digit_changed_beside_a_moment_in_one_token_is_another_conversation(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client
) -> None:
    """The timestamp rule masks the whole token a date-time starts (`...Z,login,user=ALICE,...`),
    so two header-less conversations differing in the rest of it masked equal (attack pass,
    session 14: the first one's next turn went upstream with the second one's message)."""
    proxy = await start_proxy(upstream=fake_upstream.url)
    mine = user("Audit log:\n2026-12-03T10:00:00Z,login,user=ALICE,ip=10.0.0.1")
    yours = user("Audit log:\n2026-12-03T10:00:00Z,login,user=BOB,ip=10.0.0.2")
    await send(proxy, client, START, turn(mine))
    await send(proxy, client, START + 5, turn(yours))
    at(proxy, START + 10)
    await client.messages(proxy, turn(mine, REPLY, user("Who?")))
    assert sent(fake_upstream, 2)[0] == orjson.dumps(mine)


async def test_system_prompts_differing_in_a_volatile_line_s_words_are_other_conversations(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client
) -> None:
    """Reorder moves a volatile line onto the user message whole; identity left it out, so two
    support conversations whose only difference was that line (the customer, the time) were one
    session, and replay sent the first customer's note in the second's history (attack pass,
    session 14). Identity now keeps a one-line volatile segment, its values masked."""
    proxy = await start_proxy(upstream=fake_upstream.url)

    def system(who: str, minute: int) -> str:
        note = f"You are helping {who} (order #{who[0]}-7). Current time: 2026-12-03 10:0{minute}"
        return f"You are a support assistant.\n{note}"

    question = user("Where is my order?")
    bodies = [
        (system("alice@example.com", 0), [question]),
        (system("bob@example.com", 2), [question]),
        (system("alice@example.com", 4), [question, REPLY, user("Thanks.")]),
        (system("bob@example.com", 6), [question, REPLY, user("Thanks.")]),
    ]
    for i, (prompt, messages) in enumerate(bodies):
        await send(proxy, client, START + 60 * i, {**turn(*messages), "system": prompt})
    assert b"bob@example.com" not in fake_upstream.received[2].body
    assert b"alice@example.com" not in fake_upstream.received[3].body
    assert b"alice@example.com" in fake_upstream.received[2].body


async def test_a_volatile_system_line_whose_values_change_keeps_its_session(
    start_proxy: Any, fake_upstream: FakeUpstream, client: Client
) -> None:
    """Identity keeps a one-line volatile segment's words, not its values: a header-less client
    whose `Session cost: $0.4N (N requests)` line changes every turn, and which re-renders the
    time in its first message, stays one session and has that message replayed each turn
    (attack pass, session 14: with the whole line kept, each turn was a new session)."""
    proxy = await start_proxy(upstream=fake_upstream.url)
    for n in range(1, 5):
        now = START + 30 * n
        messages: list[Any] = [user(f"Current time: {stamp(now)}\nList the open bugs.")]
        for i in range(1, n):
            messages += [REPLY, user(f"And bug {i}?")]
        body = {**turn(*messages), "system": f"You are terse.\nSession cost: $0.4{n} ({n} requests)"}
        await send(proxy, client, now, body)
    assert causes(proxy) == {"first_request": 1, "none": 3}
    # each turn the re-rendered first message, and each earlier user message that carries the
    # cost line reorder moved onto it when it was the newest: 1 + 2 + 3
    assert replayed(proxy) == 6
