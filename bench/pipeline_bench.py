"""Pipeline cost against JSON cost on a ~600 KB Anthropic body (~500 blocks).

Builds a deterministic Claude-Code-like request (20 tools, a billing header, a long system
prompt with env / date / memory sections and a per-request timestamp, ~240 messages of an agent
tool loop, client markers on the system and the last message), then times, per request:

- baseline: `orjson.loads` + `orjson.dumps` of the body;
- pipeline: every request stage (`proxy.pipeline.REQUEST_STAGES`, mode optimise, no session
  store) from the raw bytes to the upstream bytes.

Each timed request gets a different timestamp line (as a real session does), so classification
caches only help with the lines that repeat. Prints the per-stage median and the ratio
pipeline / baseline (target: <= 2.0). Not a test: numbers depend on the machine.

    python bench/pipeline_bench.py [--requests 300]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import orjson
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CollectorRegistry

from proxy.exchange import Exchange
from proxy.metrics import Metrics
from proxy.pipeline import REQUEST_STAGES
from proxy.providers import ANTHROPIC
from proxy.services import Services
from proxy.settings import Settings

HEADERS = CIMultiDictProxy(CIMultiDict())
PARAGRAPH = (
    "When you change code, read the surrounding module first, keep the existing style, and run the "
    "narrowest test that covers the change. Explain what you did in one or two sentences. "
)


def _schema(i: int) -> dict[str, Any]:
    props = {
        f"arg_{j}": {"type": "string", "description": f"Argument {j} of tool {i}. " * 6} for j in range(8)
    }
    return {"type": "object", "properties": props, "required": ["arg_0"]}


def build_body(request: int) -> dict[str, Any]:
    """The benchmark body of request number `request` (only the timestamp differs)."""
    tools = [
        {"name": f"tool_{i}", "description": PARAGRAPH * 4, "input_schema": _schema(i)} for i in range(20)
    ]
    main = "\n\n".join(
        [
            "You are an interactive coding agent.",
            f"Current time: 2026-11-29T20:{request // 60 % 60:02d}:{request % 60:02d}Z",
            *(PARAGRAPH * 3 for _ in range(40)),
            "<env>\nWorking directory: /home/dev/project\nPlatform: linux\nToday's date: 2026-11-29\n</env>",
            "# Memory\n- prefers small commits\n- uses pytest",
        ]
    )
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.3; cch=0a1b2;"},
        {"type": "text", "text": main, "cache_control": {"type": "ephemeral"}},
    ]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the failing tests in the repo."}]
    for turn in range(160):
        call = {
            "type": "tool_use",
            "id": f"toolu_{turn:04d}",
            "name": f"tool_{turn % 20}",
            "input": {"arg_0": f"src/module_{turn}.py", "arg_1": "read"},
        }
        messages.append({"role": "assistant", "content": [{"type": "text", "text": PARAGRAPH * 2}, call]})
        result = {"type": "tool_result", "tool_use_id": call["id"], "content": PARAGRAPH * 15}
        messages.append({"role": "user", "content": [result]})
    messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 8192,
        "tools": tools,
        "system": system,
        "messages": messages,
        "stream": True,
    }


async def _pipeline(raw: bytes, services: Services, per_stage: dict[str, list[float]]) -> float:
    exchange = Exchange(ANTHROPIC, "/v1/messages", "", HEADERS, raw)
    started = time.perf_counter()
    for stage in REQUEST_STAGES:
        t0 = time.perf_counter()
        await stage.run(exchange, services)
        per_stage[stage.name].append(time.perf_counter() - t0)
    total = time.perf_counter() - started
    assert exchange.upstream_body is not None and exchange.failed_stage is None
    return total


def _json(raw: bytes) -> float:
    t0 = time.perf_counter()
    orjson.dumps(orjson.loads(raw))
    return time.perf_counter() - t0


async def _measure(
    raws: list[bytes], services: Services
) -> tuple[list[float], list[float], dict[str, list[float]]]:
    """Per request, interleaved (baseline and pipeline take turns going first), so machine load
    and warm caches favour neither."""
    baseline: list[float] = []
    totals: list[float] = []
    per_stage: dict[str, list[float]] = {stage.name: [] for stage in REQUEST_STAGES}
    for i, raw in enumerate(raws):
        if i % 2:
            baseline.append(_json(raw))
            totals.append(await _pipeline(raw, services, per_stage))
        else:
            totals.append(await _pipeline(raw, services, per_stage))
            baseline.append(_json(raw))
    return baseline, totals, per_stage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    raws = [orjson.dumps(build_body(i)) for i in range(args.requests + 20)]
    blocks = len(ANTHROPIC.prefix_blocks(orjson.loads(raws[0])))
    services = Services(settings=Settings(), metrics=Metrics(CollectorRegistry()))
    baseline, totals, per_stage = asyncio.run(_measure(raws, services))
    warm = slice(20, None)  # first requests fill the rule caches
    base = statistics.median(baseline[warm])
    total = statistics.median(totals[warm])
    print(f"body: {len(raws[0]) / 1024:.0f} KiB, {blocks} blocks, {args.requests} requests (medians)")
    print(f"  orjson.loads + orjson.dumps   {base * 1000:7.3f} ms")
    for name, samples in per_stage.items():
        print(f"  stage {name:<22}  {statistics.median(samples[warm]) * 1000:7.3f} ms")
    print(f"  pipeline total                {total * 1000:7.3f} ms")
    print(f"ratio pipeline / (loads + dumps): {total / base:.2f} (target <= 2.0)")


if __name__ == "__main__":
    main()
