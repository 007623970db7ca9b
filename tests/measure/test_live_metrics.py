"""A scripted four-turn conversation through a running proxy (observe mode) in front of the
recording fake upstream: exact metric values, then `/metrics` through `promtool check metrics`.

Turns (one explicit session, `x-session-id`): 1 `BASE` (first request, writes); 2 appends two
blocks and reads; 3 edits the system prompt; 4 appends again, but the upstream answers with a
write where the previous breakpoints predicted a read (`expired`). Usage is scripted per turn.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.prefix import chain_blocks
from proxy.providers import ANTHROPIC
from proxy.rules import PACKAGED_DIR
from tests.fakes.upstream import FakeUpstream
from tests.measure.bodies import BASE, variant

HEADERS = {"x-api-key": "sk-ant-live-test", "anthropic-version": "2023-06-01", "x-session-id": "conv-1"}


def _usage(none: int, read: int, w5: int, w1: int, out: int) -> dict[str, Any]:
    return {
        "input_tokens": none,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": w5 + w1,
        "cache_creation": {"ephemeral_5m_input_tokens": w5, "ephemeral_1h_input_tokens": w1},
        "output_tokens": out,
    }


def _turns() -> list[dict[str, Any]]:
    turn2 = variant("none")
    turn3 = copy.deepcopy(turn2)
    turn3["system"][1]["text"] = "cwd: /home/u/other"
    turn4 = copy.deepcopy(turn3)
    turn4["messages"][4]["content"][0].pop("cache_control")
    turn4["messages"] += [
        {"role": "assistant", "content": "You are welcome."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Bye", "cache_control": {"type": "ephemeral"}}],
        },
    ]
    return [BASE, turn2, turn3, turn4]


SCRIPT = [
    {"id": "msg_t1", "usage": _usage(10, 0, 2000, 0, 7)},
    {"id": "msg_t2", "usage": _usage(5, 2000, 300, 0, 8)},
    {"id": "msg_t3", "usage": _usage(5, 900, 1400, 0, 9)},
    {"id": "msg_t4", "usage": _usage(5, 0, 2500, 0, 10)},
]


def _bytes(body: dict[str, Any]) -> int:
    return chain_blocks(ANTHROPIC.prefix_blocks(body)).total_bytes


def _rules_without_minimum(folder: Path) -> Path:
    """The packaged rules with a model table of minimum 0, so the small bodies can be cached."""
    shutil.copytree(PACKAGED_DIR, folder, ignore=shutil.ignore_patterns("models.yaml"))
    (folder / "models.yaml").write_text("version: 1\ndefault_min_tokens: 0\nmin_tokens: {}\n")
    return folder


async def test_conversation_metrics_exact(fake_upstream: FakeUpstream, make_proxy, tmp_path: Path) -> None:
    fake_upstream.anthropic_script = copy.deepcopy(SCRIPT)
    rules_dir = _rules_without_minimum(tmp_path / "rules")
    proxy = await make_proxy(upstream=fake_upstream.url, mode="observe", rules_dir=rules_dir)
    turns = _turns()
    async with aiohttp.ClientSession() as client:
        for i, body in enumerate(turns):
            payload = {**body, "stream": True} if i % 2 else body
            async with client.post(
                proxy.url + "/v1/messages", data=orjson.dumps(payload), headers=HEADERS
            ) as r:
                assert r.status == 200
                await r.read()
        async with client.get(proxy.url + "/metrics") as r:
            exposition = await r.read()
    assert [orjson.loads(r.body) for r in fake_upstream.received] == [
        {**b, "stream": True} if i % 2 else b for i, b in enumerate(turns)
    ]
    s = proxy.sample
    a = {"provider": "anthropic"}
    assert s("promptcache_requests_total", outcome="ok", **a) == 4
    assert s("promptcache_input_tokens_total", cache="read", **a) == 2900
    assert s("promptcache_input_tokens_total", cache="write", **a) == 6200
    assert s("promptcache_input_tokens_total", cache="none", **a) == 25
    assert s("promptcache_output_tokens_total", **a) == 34
    for section, cause in (
        ("none", "first_request"),
        ("none", "none"),
        ("system", "system_changed"),
        ("none", "expired"),
    ):
        assert s("promptcache_prefix_divergences_total", section=section, cause=cause, **a) == 1, cause
    sizes = [_bytes(b) for b in turns]
    assert sizes == [320, 365, 363, 409]
    assert s("promptcache_prompt_bytes_total", **a) == sum(sizes)
    # Matched: 0 (first), 320 (append), 129 (system[1] changed), 363 (append).
    assert s("promptcache_prefix_matched_bytes_total", **a) == 320 + 129 + 363
    # Predicted reads: turn 2 reads turn 1's block 5 (320 bytes = 80 tokens); turn 3 keeps
    # nothing of turn 2's markers (system[1] changed); turn 4 should read turn 3's block 7.
    assert s("promptcache_predicted_cache_read_tokens_total", **a) == 80 + 0 + 91
    assert s("promptcache_prefix_divergence_position_tokens_count", **a) == 3
    assert s("promptcache_prefix_divergence_position_tokens_sum", **a) == 80 + 33 + 91
    fam = {"provider": "anthropic", "family": "claude-sonnet-4"}
    # claude-sonnet-4: input 3, 5m write 3.75, read 0.30, output 15 USD per million tokens.
    cost = (25 * 3 + 2900 * 0.30 + 6200 * 3.75 + 34 * 15) / 1e6
    uncached = ((25 + 2900 + 6200) * 3 + 34 * 15) / 1e6
    assert s("promptcache_cost_usd_total", **fam) == pytest.approx(cost, rel=1e-9)
    assert s("promptcache_uncached_cost_usd_total", **fam) == pytest.approx(uncached, rel=1e-9)
    assert s("promptcache_upstream_first_byte_seconds_count", **a) == 4
    assert s("promptcache_stage_errors_total", stage="observe") == 0
    assert b'promptcache_cost_usd_total{family="claude-sonnet-4",provider="anthropic"}' in exposition
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package `prometheus`); CI installs it")
    check = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout + check.stderr == b""
