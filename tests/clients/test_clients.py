"""Real agent clients end to end through promptcache, offline, against the upstream simulator.

Each client (tests/clients/recipes.py) is installed from its registry into `.clients/`, run headless
for a multi-turn session with a simulator-scripted tool call, through a proxy that records the
request bodies. The recorded trace is then replayed straight to a fresh simulator (what the client
gets on its own) and through a fresh proxy, and the hit ratios compared.

`PROMPTCACHE_UPDATE_CLIENT_TRACES=1` also writes each recorded trace to workloads/clients/<name>.jsonl.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.clients.harness import (
    DUMMY_KEY,
    KNOWN_REGRESSIONS,
    PER_TURN_CLIENTS,
    RESULTS,
    TARGET,
    TRACES_DIR,
    InstallError,
    Replay,
    conversation_text,
    costlier_turns,
    dropped_content,
    ensure_installed,
    fmt_ratio,
    optimum_after_first,
    replay,
    result_row,
    tool_exchanges,
    write_trace,
)
from tests.clients.recipes import (
    EDIT_REPLY,
    EDITED_FILE,
    RECIPES,
    SIM_REPLY,
    TOOL_MARK,
    ClientRun,
    codex_commands,
)

pytestmark = pytest.mark.clients


@pytest.fixture(scope="module", params=list(RECIPES))
def client_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ClientRun:
    recipe = RECIPES[request.param]
    try:
        ensure_installed(recipe.install)
    except InstallError as exc:
        pytest.skip(f"{recipe.name}: could not install from its registry into .clients/: {exc}")
    tmp = tmp_path_factory.mktemp(recipe.name)
    record = tmp / "trace.jsonl"
    run = recipe.run(tmp, record)
    if os.environ.get("PROMPTCACHE_UPDATE_CLIENT_TRACES") and not run.problems and run.records:
        write_trace(TRACES_DIR / f"{recipe.name}.jsonl", recipe.name, recipe.description, run.records)
    return run


def test_every_turn_completes(client_run: ClientRun) -> None:
    recipe = RECIPES[client_run.name]
    assert not client_run.problems, "\n".join(client_run.problems)
    assert client_run.records, "the proxy recorded no request: the client did not go through promptcache"
    assert {r["path"] for r in client_run.records} == {recipe.api}
    assert len(client_run.records) >= recipe.llm_turns + len(recipe.fresh_prompts)
    assert client_run.upstream_statuses, "no request reached the simulator"
    assert set(client_run.upstream_statuses) == {200}, client_run.upstream_statuses


def test_tool_round_trip(client_run: ClientRun) -> None:
    recipe = RECIPES[client_run.name]
    if recipe.name == "aider":
        _aider_edit_round_trip(client_run)
        return
    if recipe.tool is None:
        pytest.skip(recipe.no_tool_reason)
    exchanges = [x for r in client_run.records for x in tool_exchanges(r["body"])]
    done = [
        x for x in exchanges if x.name == recipe.tool and TOOL_MARK in x.arguments and TOOL_MARK in x.result
    ]
    assert done, f"no {recipe.tool} call with its result in the trace: {exchanges}"
    # The client really ran the command: its result carries the command's output, not only the input.
    assert any(TOOL_MARK in x.result.replace(f"echo {TOOL_MARK}", "") for x in done), (
        f"the tool result carries no command output: {done}"
    )
    # ... and sent it back, and the simulator then answered with text (the next request or turn).
    tool_turn = client_run.turns[1]
    if recipe.name == "codex":
        commands = codex_commands(tool_turn.stdout)
        assert any(TOOL_MARK in c.get("aggregated_output", "") and c.get("exit_code") == 0 for c in commands)


def _aider_edit_round_trip(run: ClientRun) -> None:
    """aider offers no tools: the simulator scripts an edit block (`[[reply:...]]`), aider applies it
    to hello.py, and the next request carries the edited file as the chat's file contents."""
    assert run.home is not None
    assert (run.home.parent / "work" / "hello.py").read_text() == EDITED_FILE
    assert "Applied edit to hello.py" in run.turns[0].stdout, run.turns[0].stdout[-2000:]
    listing = f"hello.py\n```\n{EDITED_FILE}```"
    replied = [
        i
        for i, r in enumerate(run.records)
        if any(m.get("role") == "assistant" and EDIT_REPLY in _text(m) for m in r["body"]["messages"])
    ]
    assert replied, "no request carries the scripted edit reply"
    later = run.records[replied[0]]["body"]["messages"]
    assert any(m.get("role") == "user" and listing in _text(m) for m in later), "edited file not sent back"


def _text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content or [] if isinstance(b, dict))


def test_session_continuity(client_run: ClientRun) -> None:
    recipe = RECIPES[client_run.name]
    ids = [i for i in client_run.session_ids if i is not None]
    assert len(set(ids)) <= 1, f"the turns ran in different sessions: {client_run.session_ids}"
    if recipe.name != "aider":
        assert len(ids) == len(recipe.prompts), f"a turn reported no session id: {client_run.session_ids}"
    main = client_run.main_records()
    text = conversation_text(main[-1]["body"])
    scripted = ("[[tool:", "[[reply:")
    wanted = [
        TOOL_MARK if any(m in p for m in scripted) or p.startswith("/run") else p for p in recipe.prompts
    ]
    positions = [text.find(w) for w in wanted]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), (wanted, positions)
    # Earlier replies are kept in the history the client resends.
    assert text.count(SIM_REPLY) >= recipe.llm_turns - 1
    if recipe.name == "claude-code":
        assert len(main) == len(client_run.records) - len(recipe.fresh_prompts)
        headers = {r["headers"].get("x-claude-code-session-id") for r in client_run.records}
        assert headers == {ids[0], *client_run.fresh_session_ids}
        assert ids[0] not in client_run.fresh_session_ids
    if recipe.name.startswith("codex"):
        assert {r["body"].get("prompt_cache_key") for r in client_run.records} == {ids[0]}


def test_trace_holds_no_credentials(client_run: ClientRun) -> None:
    for record in client_run.records:
        assert DUMMY_KEY not in str(record)
        allowed = {"x-claude-code-session-id", "x-session-id", "anthropic-beta", "anthropic-version"}
        assert set(record["headers"]) <= allowed


def _replays(run: ClientRun) -> tuple[Replay, Replay]:
    if not hasattr(run, "_replays"):
        run._replays = (replay(run.records, "none"), replay(run.records, "promptcache"))  # type: ignore[attr-defined]
    return run._replays  # type: ignore[attr-defined]


def _known_regression(name: str, request: pytest.FixtureRequest) -> None:
    if name in KNOWN_REGRESSIONS:
        request.applymarker(pytest.mark.xfail(reason=KNOWN_REGRESSIONS[name], strict=False))


def test_promptcache_forwards_the_whole_prompt(client_run: ClientRun, request: pytest.FixtureRequest) -> None:
    _known_regression(client_run.name, request)
    straight, through = _replays(client_run)
    assert not dropped_content(straight, through)


def test_hit_ratio_not_lower_through_promptcache(
    client_run: ClientRun, request: pytest.FixtureRequest
) -> None:
    recipe = RECIPES[client_run.name]
    straight, through = _replays(client_run)
    optimum = optimum_after_first(client_run.records, recipe.name)
    RESULTS.append(result_row(f"{recipe.name} (this run)", client_run.records, straight, through, optimum))
    _known_regression(recipe.name, request)
    assert through.hit_ratio_after_first() >= straight.hit_ratio_after_first() - 1e-9, (
        [(u.read, u.total) for u in straight.usages],
        [(u.read, u.total) for u in through.usages],
    )


def test_no_request_reads_less_or_writes_more_through_promptcache(client_run: ClientRun) -> None:
    if client_run.name not in PER_TURN_CLIENTS:
        pytest.skip(f"{client_run.name}: compared over the whole session only (PER_TURN_CLIENTS)")
    straight, through = _replays(client_run)
    assert len(straight.usages) >= 4
    assert not costlier_turns(straight, through)


def test_reads_target_where_the_optimum_allows(client_run: ClientRun) -> None:
    """>= 98.7% of input tokens after the first request read from cache, where the optimum allows."""
    optimum = optimum_after_first(client_run.records, client_run.name)
    if optimum is None:
        pytest.skip("proxy.workloads.oracle (the optimum) is not importable in this tree")
    _, through = _replays(client_run)
    if optimum < TARGET:
        pytest.skip(
            f"the optimum after the first request is {fmt_ratio(optimum)} < {fmt_ratio(TARGET)} "
            f"(promptcache reads {fmt_ratio(through.hit_ratio_after_first())})"
        )
    assert through.hit_ratio_after_first() >= TARGET


def test_install_is_reused(client_run: ClientRun) -> None:
    path = ensure_installed(RECIPES[client_run.name].install)
    assert isinstance(path, Path) and any(path.glob(".installed-*"))
