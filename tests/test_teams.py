"""Teams: cost, tokens and hits by team with bounded cardinality; `/debug/tenants` for the
caller's own credential only."""

from __future__ import annotations

import hashlib
from pathlib import Path

import aiohttp
import pytest

from proxy.teams import OTHER, TeamFileError, TeamResolver, credential_hash, load_team_file
from tests.fakes.upstream import FakeUpstream

KEY_ML = "sk-ant-team-ml-key"
KEY_SEARCH = "sk-ant-team-search-key"
BODY = {"model": "claude-sonnet-4-6", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def _usage(none: int, read: int, write: int) -> dict[str, object]:
    return {
        "input_tokens": none,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": write,
        "cache_creation": {"ephemeral_5m_input_tokens": write, "ephemeral_1h_input_tokens": 0},
        "output_tokens": 10,
    }


def _cost(none: int, read: int, write: int) -> float:
    """claude-sonnet-4 list prices per million tokens: 3 input, 0.30 read, 3.75 5m write, 15 output."""
    return (none * 3 + read * 0.30 + write * 3.75 + 10 * 15) / 1e6


def _uncached(none: int, read: int, write: int) -> float:
    return ((none + read + write) * 3 + 10 * 15) / 1e6


def _team_file(tmp_path: Path) -> Path:
    path = tmp_path / "teams.yaml"
    path.write_text(f"version: 1\nteams:\n  {credential_hash(KEY_SEARCH)}: search\n")
    return path


def test_resolver_file_then_allowlisted_header_else_other(tmp_path: Path) -> None:
    resolver = TeamResolver.build("X-Team", ["ml"], load_team_file(_team_file(tmp_path)))
    assert resolver.labels == ("ml", "search", "other")
    assert resolver.team_of({"x-api-key": KEY_ML, "x-team": "ml"}) == "ml"
    assert resolver.team_of({"x-api-key": KEY_ML, "x-team": "not-listed"}) == OTHER
    assert resolver.team_of({"x-api-key": KEY_ML}) == OTHER
    assert resolver.team_of({"authorization": f"Bearer {KEY_SEARCH}", "x-team": "ml"}) == "search"
    assert credential_hash(KEY_SEARCH) == hashlib.sha256(KEY_SEARCH.encode()).hexdigest()
    assert TeamResolver().team_of({"x-team": "ml"}) == OTHER


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("teams: {}\n", "must be a mapping with version: 1 and teams: {<sha256 hex>: <team>}"),
        ("version: 1\nteams: {abc: ml}\n", "teams.abc: not a SHA-256 hex credential hash (64 hex digits)"),
        (f"version: 1\nteams: {{{'a' * 64}: 'a b'}}\n", f"teams.{'a' * 64}: team must match"),
    ],
)
def test_team_file_errors_name_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "teams.yaml"
    path.write_text(text)
    with pytest.raises(TeamFileError) as info:
        load_team_file(path)
    assert str(info.value).startswith(f"{path}: {message}")


async def test_team_metrics_and_tenant_summary(make_proxy, fake_upstream: FakeUpstream, tmp_path: Path) -> None:
    turns = [(KEY_ML, "ml", (100, 0, 2000)), (KEY_ML, "intruder", (50, 2000, 300)), (KEY_SEARCH, "ml", (10, 0, 500))]
    fake_upstream.anthropic_script = [{"id": f"msg_{i}", "usage": _usage(*u)} for i, (_, _, u) in enumerate(turns)]
    proxy = await make_proxy(
        upstream=fake_upstream.url, team_header="x-team", teams=("ml",), teams_file=_team_file(tmp_path)
    )
    # Every allowed team exists at start with 0 (and nothing else).
    assert proxy.sample("promptcache_team_requests_total", team="search") == 0
    async with aiohttp.ClientSession() as http:
        for i, (key, team, _) in enumerate(turns):
            headers = {"x-api-key": key, "anthropic-version": "2023-06-01", "x-team": team, "x-session-id": f"s{i}"}
            async with http.post(f"{proxy.url}/v1/messages", json=BODY, headers=headers) as r:
                assert r.status == 200
                await r.read()
        ml_headers = {"x-api-key": KEY_ML}
        async with http.get(f"{proxy.url}/debug/tenants", headers=ml_headers) as r:
            ml_summary = await r.json()
        async with http.get(f"{proxy.url}/debug/tenants", headers={"x-api-key": "sk-ant-nobody"}) as r:
            assert await r.json() == {"tenants": []}
    teams = {s.labels["team"] for m in proxy.registry.collect() for s in m.samples if "team" in s.labels}
    assert teams == {"ml", "search", "other"}
    assert proxy.sample("promptcache_team_requests_total", team="ml") == 1
    assert proxy.sample("promptcache_team_requests_total", team="other") == 1
    assert proxy.sample("promptcache_team_requests_total", team="search") == 1
    assert proxy.sample("promptcache_team_input_tokens_total", team="other", cache="read") == 2000
    assert proxy.sample("promptcache_team_input_tokens_total", team="ml", cache="write") == 2000
    assert proxy.sample("promptcache_team_input_tokens_total", team="search", cache="none") == 10
    assert proxy.sample("promptcache_team_cost_usd_total", team="ml") == pytest.approx(_cost(100, 0, 2000))
    assert proxy.sample("promptcache_team_uncached_cost_usd_total", team="other") == pytest.approx(
        _uncached(50, 2000, 300)
    )
    [entry] = ml_summary["tenants"]
    assert len(entry.pop("tenant")) == 32
    cost = _cost(100, 0, 2000) + _cost(50, 2000, 300)
    uncached = _uncached(100, 0, 2000) + _uncached(50, 2000, 300)
    assert entry == {
        "provider": "anthropic",
        "team": "other",  # the team of its newest request
        "requests": 2,
        "sessions": 2,
        "input_tokens": {"read": 2000, "write": 2300, "none": 150},
        "output_tokens": 20,
        "hit_ratio": round(2000 / 4450, 4),
        "cost_usd": round(cost, 6),
        "uncached_cost_usd": round(uncached, 6),
        "savings_usd": round(uncached - cost, 6),
        "over_budget": 0,
        "last_over_budget": None,
    }
    text = "".join(f"{s.labels}" for m in proxy.registry.collect() for s in m.samples)
    assert "intruder" not in text and KEY_ML not in text
