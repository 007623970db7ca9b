"""Session identity: explicit ids (headers, metadata.user_id, OpenAI fields) and inference."""

from __future__ import annotations

import pytest
import xxhash
from multidict import CIMultiDict

from proxy.providers import ANTHROPIC, OPENAI_CHAT
from proxy.providers.anthropic import session_in_user_id
from proxy.session_identity import (
    Inference,
    SessionIndex,
    explicit_id,
    explicit_session,
    fork_id,
    root_id,
)

HEADERS = ("x-claude-code-session-id", "x-session-id")
UUID = "0b6f2a4e-3c1d-4e5f-9a8b-7c6d5e4f3a2b"


def b(*names: str) -> list[bytes]:
    return [n.encode().ljust(16, b"\x00") for n in names]


@pytest.mark.parametrize(
    "user_id, expected",
    [
        ('{"device_id":"d","account_uuid":"a","session_id":"' + UUID + '"}', UUID),
        (f"user_abc123_account__session_{UUID}", UUID),
        (f"user_abc_account_{UUID}_session_{UUID}", UUID),
        ("user_abc123", None),
        ('{"device_id":"d"}', None),
        ("{not json", None),
        ('{"session_id": 7}', None),
    ],
)
def test_session_in_user_id(user_id: str, expected: str | None) -> None:
    assert session_in_user_id(user_id) == expected


def test_explicit_sources_first_match_wins() -> None:
    body = {"metadata": {"user_id": f"user_x_account__session_{UUID}"}, "prompt_cache_key": "k", "user": "u"}
    headers = CIMultiDict({"X-Session-Id": "from-header"})
    assert explicit_session(headers, body, HEADERS, ANTHROPIC) == ("header", "from-header")
    assert explicit_session(CIMultiDict(), body, HEADERS, ANTHROPIC) == ("metadata", UUID)
    assert explicit_session(CIMultiDict(), body, HEADERS, OPENAI_CHAT) == ("prompt_cache_key", "k")
    assert explicit_session(CIMultiDict(), {"user": "u"}, HEADERS, OPENAI_CHAT) == ("user", "u")
    assert explicit_session(CIMultiDict(), {"user": "u"}, HEADERS, ANTHROPIC) is None
    assert explicit_session(CIMultiDict(), {"user": ""}, HEADERS, OPENAI_CHAT) is None
    assert explicit_session(CIMultiDict(), {"metadata": {"user_id": "user_only"}}, HEADERS, ANTHROPIC) is None


def test_explicit_ids_are_hashed_and_store_safe() -> None:
    sid = explicit_id("a/b c:d")
    assert sid.startswith("x") and len(sid) == 33 and sid[1:].isalnum()
    assert explicit_id("same") == explicit_id("same") != explicit_id("other")


def test_new_append_fork() -> None:
    index = SessionIndex()
    first = b("h+u1")
    new = index.infer("t", first)
    assert (new.kind, new.session_id) == ("new", root_id(first[0]))
    index.register("t", new.session_id, first)

    appended = b("h+u1", "a1", "u2")
    assert index.infer("t", appended).kind == "append"
    assert index.infer("t", appended).session_id == new.session_id
    assert index.infer("t", appended).shared_messages == 1
    index.register("t", new.session_id, appended)

    retry = index.infer("t", appended)
    assert (retry.kind, retry.session_id, retry.shared_messages) == ("append", new.session_id, 3)

    forked = index.infer("t", b("h+u1", "a1", "u2-edited"))
    assert forked.kind == "fork" and forked.parent == new.session_id and forked.shared_messages == 2
    assert forked.session_id == fork_id(new.session_id, appended[1])
    index.register("t", forked.session_id, b("h+u1", "a1", "u2-edited"))
    then = index.infer("t", b("h+u1", "a1", "u2-edited", "a2", "u3"))
    assert (then.kind, then.session_id) == ("append", forked.session_id)
    # the parent still continues on its own branch
    assert index.infer("t", b("h+u1", "a1", "u2", "a2x", "u3x")).session_id == new.session_id


def test_a_rerun_s_next_turns_append_to_its_fork_and_each_rerun_has_its_own() -> None:
    index = SessionIndex()
    run1 = chained("h+u1", "a1", "u2", "a2", "u3")
    index.register("t", "run1", run1)
    opening = run1[:1]
    # a re-run sends the opening alone: a fork of run 1 that owns none of its boundaries
    rerun = index.infer("t", opening)
    assert (rerun.kind, rerun.session_id, rerun.parent, rerun.shared_messages) == (
        "fork",
        fork_id("run1", opening[0]),
        "run1",
        1,
    )
    index.register("t", rerun.session_id, opening)
    assert index.infer("t", opening) == Inference(rerun.session_id, "append", rerun.session_id, 1)
    # its next turn (another reply) continues the fork, not run 1's history
    run2 = chained("h+u1", "b1", "v2")
    assert index.infer("t", run2) == Inference(rerun.session_id, "append", rerun.session_id, 1)
    index.register("t", rerun.session_id, run2)
    assert index.infer("t", chained("h+u1", "b1", "v2", "b2", "v3")).session_id == rerun.session_id
    # a third run of the opening forks again: neither run's session
    third = index.infer("t", opening)
    expected = fork_id(rerun.session_id, opening[0])
    assert (third.kind, third.session_id, third.parent, third.shared_messages) == ("fork", expected, "run1", 1)
    index.register("t", third.session_id, opening)
    assert index.infer("t", chained("h+u1", "c1", "w2")) == Inference(expected, "append", expected, 1)


def test_index_is_partitioned_by_tenant() -> None:
    index = SessionIndex()
    index.register("tenant-a", "s-a", b("m1", "m2"))
    assert index.infer("tenant-b", b("m1", "m2", "m3")).kind == "new"
    assert index.infer("tenant-a", b("m1", "m2", "m3")).session_id == "s-a"


def test_no_messages_no_session() -> None:
    assert SessionIndex().infer("t", []).session_id is None


def test_index_bounds_sessions_and_boundaries() -> None:
    index = SessionIndex(max_sessions=2, max_boundaries=5)
    index.register("t", "s1", b("a1", "a2"))
    index.register("t", "s2", b("b1", "b2"))
    index.register("t", "s3", b("c1", "c2"))  # evicts s1 (LRU, 2 sessions max)
    assert len(index) == 2 and index.boundaries_held == 4
    assert index.infer("t", b("a1", "a2", "a3")).kind == "new"
    index.register("t", "s2", b("b1", "b2", "b3", "b4"))  # 6 boundaries > 5: evicts s3
    assert index.boundaries_held == 4 and len(index) == 1
    assert index.infer("t", b("c1", "c2")).kind == "new"


def test_index_entries_expire() -> None:
    now = [1000.0]
    index = SessionIndex(ttl=60.0, clock=lambda: now[0])
    index.register("t", "s", b("m1"))
    now[0] += 59.9
    assert index.infer("t", b("m1", "m2")).session_id == "s"
    now[0] += 0.1
    assert index.infer("t", b("m1", "m2")).kind == "new"


def chained(*names: str) -> list[bytes]:
    """Boundaries as the message view makes them: each digest covers every message before it."""
    out, previous = [], b""
    for name in names:
        previous = xxhash.xxh3_128_digest(previous + name.encode())
        out.append(previous)
    return out


def test_an_appended_request_registers_its_new_boundaries_and_a_rewrite_all_of_them() -> None:
    index = SessionIndex()
    index.register("t", "s", chained("u1", "a1", "u2"))
    index.register("t", "s", chained("u1", "a1", "u2", "a2", "u3"))  # appended: two new ones
    assert index.boundaries_held == 5
    fork = index.infer("t", chained("u1", "a1", "u2", "a2", "u3-edited"))
    assert (fork.kind, fork.parent, fork.shared_messages) == ("fork", "s", 4)
    # a rewritten history: no boundary of it was offered before, every one is registered
    index.register("t", "s", chained("v1", "a1", "u2", "a2", "u3", "a3"))
    assert index.boundaries_held == 11
    again = index.infer("t", chained("v1", "a1", "x"))
    assert (again.kind, again.parent, again.shared_messages) == ("fork", "s", 2)


def test_a_long_request_forks_from_the_newest_live_boundary_it_shares() -> None:
    """Past the newest few boundaries (looked up one by one) the older ones are looked up at
    once; the newest one held by a live session still wins, an expired one is passed over."""
    now = [1000.0]
    index = SessionIndex(ttl=60.0, clock=lambda: now[0])
    names = [f"m{i}" for i in range(40)]
    index.register("t", "old", chained(*names[:3]))
    now[0] += 30.0
    index.register("t", "newer", chained(*names[:20], "other"))
    request = chained(*names)
    found = index.infer("t", request)
    assert (found.kind, found.parent, found.shared_messages) == ("fork", "newer", 20)
    now[0] += 30.0  # "old" expires, "newer" does not
    assert index.infer("t", chained(*names[:3], "x", *names[4:])).kind == "new"
    assert index.infer("t", request).parent == "newer"
    index.register("t", "again", request)  # claims the 20 boundaries no session held (m20 .. m39)
    assert index.boundaries_held == 3 + 18 + 20
