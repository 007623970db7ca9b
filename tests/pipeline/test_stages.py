"""The rewriting stages on an `Exchange`: order, typed outputs, metrics, observe mode, failing open."""

from __future__ import annotations

from pathlib import Path

import orjson
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CollectorRegistry

from proxy.exchange import Exchange
from proxy.metrics import Metrics
from proxy.pipeline import REQUEST_STAGES, breakpoints, canonicalise, reorder, run_request_stages
from proxy.pipeline.breakpoints import Plan, PlanContext
from proxy.providers import ANTHROPIC
from proxy.services import Services
from proxy.settings import Settings
from tests.fakes.upstream import FakeUpstream

MINE = (canonicalise.STAGE, reorder.STAGE, breakpoints.STAGE)
PROMPT = "Follow the house style.\n" * 300


def _services(**settings: object) -> Services:
    return Services(settings=Settings(**settings), metrics=Metrics(CollectorRegistry()))


def _exchange(body: dict) -> Exchange:
    return Exchange(ANTHROPIC, "/v1/messages", "", CIMultiDictProxy(CIMultiDict()), orjson.dumps(body))


def _body() -> dict:
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 16,
        "system": "Current time: 2026-11-29T20:09:13Z\n" + PROMPT,
        "tools": [{"name": "b", "input_schema": {}}, {"name": "a", "input_schema": {}}],
        "messages": [{"role": "user", "content": "hi"}],
    }


def test_stage_order_is_written_once() -> None:
    names = [stage.name for stage in REQUEST_STAGES]
    assert names.index("parse") < names.index("canonicalise") < names.index("reorder")
    assert (
        names.index("reorder") < names.index("replay") < names.index("breakpoints") < names.index("serialise")
    )
    assert all(stage.rewrites for stage in MINE)


async def test_optimise_rewrites_counts_and_leaves_the_plan_on_the_exchange() -> None:
    services = _services()
    exchange = _exchange(_body())
    await run_request_stages(exchange, services)
    assert exchange.failed_stage is None
    sent = orjson.loads(exchange.outgoing)
    assert list(sent) == ["model", "max_tokens", "tools", "system", "messages"]
    assert sent["system"] == [{"type": "text", "text": PROMPT, "cache_control": {"type": "ephemeral"}}]
    assert sent["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Current time: 2026-11-29T20:09:13Z\n"},
                {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}},
            ],
        }
    ]
    plan = exchange.plan
    assert isinstance(plan, Plan) and plan.positions == (2, 4)
    assert exchange.system_tiers == ("stable",)
    assert exchange.system_moved_to_user == 1
    registry = services.metrics.registry
    assert (
        registry.get_sample_value(
            "promptcache_breakpoints_total", {"provider": "anthropic", "action": "injected"}
        )
        == 2
    )


async def test_session_pins_and_plan_context_from_the_session_are_used() -> None:
    exchange = _exchange(_body())
    exchange.body = orjson.loads(exchange.raw)
    exchange.session_pins = {
        "pinned_tool_order": ["a", "b"],
        "pinned_schemas": {},
        "pinned_inputs": {},
    }
    exchange.plan_context = PlanContext((), "1h", "5m")
    services = _services()
    for stage in MINE:
        await stage.run(exchange, services)
    assert [t["name"] for t in exchange.body["tools"]] == ["a", "b"]
    assert [m.ttl for m in exchange.plan.markers] == ["1h", "5m"]
    assert exchange.is_body_dirty is True


async def test_observe_mode_sends_the_client_bytes() -> None:
    exchange = _exchange(_body())
    await run_request_stages(exchange, _services(mode="observe"))
    assert exchange.upstream_body is None and exchange.outgoing == exchange.raw
    assert exchange.plan is None


async def test_a_failing_stage_forwards_the_original_bytes(tmp_path: Path) -> None:
    (tmp_path / "default.yaml").write_text("version: 1\nrules: [oops]\n", encoding="utf-8")
    services = _services(rules_dir=tmp_path)
    exchange = _exchange(_body())
    await run_request_stages(exchange, services)
    assert exchange.failed_stage == "reorder"
    assert exchange.outgoing == exchange.raw
    assert (
        services.metrics.registry.get_sample_value("promptcache_stage_errors_total", {"stage": "reorder"})
        == 1
    )


async def test_after_the_stages_the_client_bytes_go_only_when_a_rewritten_body_replaces_them(tmp_path: Path) -> None:
    rewritten = _exchange(_body())
    await run_request_stages(rewritten, _services())
    sent = rewritten.outgoing
    assert rewritten.release_raw() is True
    assert rewritten.raw == b"" and rewritten.outgoing is sent
    assert orjson.loads(sent)["system"][0]["cache_control"] == {"type": "ephemeral"}
    observed = _exchange(_body())
    await run_request_stages(observed, _services(mode="observe"))
    assert observed.release_raw() is False and observed.outgoing == observed.raw == orjson.dumps(_body())
    (tmp_path / "default.yaml").write_text("version: 1\nrules: [oops]\n", encoding="utf-8")
    failed = _exchange(_body())
    await run_request_stages(failed, _services(rules_dir=tmp_path))
    assert failed.release_raw() is False and failed.outgoing == failed.raw == orjson.dumps(_body())
    signed = _exchange(_body())
    await run_request_stages(signed, _services())
    signed.is_signed = True  # a SigV4 body goes as received: its bytes are kept
    assert signed.release_raw() is False and signed.raw == orjson.dumps(_body())


async def test_through_the_proxy_the_upstream_receives_the_optimised_body(
    fake_upstream: FakeUpstream, make_proxy
) -> None:
    import aiohttp

    proxy = await make_proxy(upstream=fake_upstream.url)
    headers = {"x-api-key": "sk-test", "anthropic-version": "2023-06-01", "content-type": "application/json"}
    async with aiohttp.ClientSession() as client:
        async with client.post(
            f"{proxy.url}/v1/messages", data=orjson.dumps(_body()), headers=headers
        ) as resp:
            assert resp.status == 200
            await resp.read()
    received = orjson.loads(fake_upstream.received[-1].body)
    assert received["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert received["messages"][0]["content"] == [
        {"type": "text", "text": "Current time: 2026-11-29T20:09:13Z\n"},
        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}},
    ]
