"""What the real clients sent that promptcache (or the simulator) mishandles, one reproduction each.

Every case is a JSON file in tests/clients/data/ (what the client sent, what went wrong, what is
expected, the minimal request bodies). These modules belong to other owners, so each test asserts
the EXPECTED behaviour and is marked xfail until the fix lands: an XPASS means the finding is
fixed and its marker can go.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.clients.harness import DATA_DIR, Pricing, Stack, _headers_for, load_records, post, read_usage

pytestmark = pytest.mark.clients


def finding(name: str) -> dict[str, Any]:
    return orjson.loads((DATA_DIR / name).read_text())


def _known(case: dict[str, Any]) -> Any:
    return pytest.mark.xfail(reason=f"{case['id']}: {case['went_wrong'][:160]}", strict=False)


def _divergence_causes(stack: Stack) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in stack.samples("promptcache_prefix_divergences_total").items():
        cause = key.split("cause=", 1)[1].split(",", 1)[0].rstrip("}")
        out[cause] = out.get(cause, 0.0) + value
    return out


def test_every_finding_is_documented() -> None:
    for path in sorted(DATA_DIR.glob("*.json")):
        case = orjson.loads(path.read_text())
        for key in (
            "id",
            "component",
            "clients",
            "sent",
            "went_wrong",
            "expected",
            "check",
            "path",
            "requests",
        ):
            assert key in case, f"{path.name}: missing {key}"


P1 = finding("pipeline-responses-additional-tools-dropped.json")


def test_p1_responses_additional_tools_item_is_kept() -> None:
    body = P1["requests"][0]["body"]
    with Stack() as stack:
        status, data = post(
            stack.proxy_url, P1["path"], body, _headers_for({"path": P1["path"], "headers": {}})
        )
        assert status == 200, data[:300]
        sent = orjson.loads(stack.upstream_bodies[0])
    assert [i.get("type") for i in sent["input"]].count("additional_tools") == 1


P2 = finding("pipeline-content-string-vs-text-block.json")


@pytest.mark.parametrize("headers", [{"x-session-id": "s-1"}, {}], ids=["session-header", "inferred"])
def test_p2_string_content_equals_single_text_block(headers: dict[str, str]) -> None:
    with Stack() as stack:
        reads = []
        for request in P2["requests"]:
            status, data = post(
                stack.proxy_url,
                P2["path"],
                request["body"],
                _headers_for({"path": P2["path"], "headers": headers}),
            )
            assert status == 200
            reads.append(read_usage(P2["path"], data).read)
        sent = orjson.loads(stack.upstream_bodies[1])
    assert reads[1] > 0  # the simulator (the judge) sees B extend A
    assert _divergence_causes(stack) == {"first_request": 1.0, "none": 1.0}
    # replay sends the form sent before (a one-block list), not the client's string; the block
    # may carry this turn's marker (the anchor on the previous request's last marker, issue 13)
    blocks = [{k: v for k, v in b.items() if k != "cache_control"} for b in sent["messages"][0]["content"]]
    assert blocks == [{"type": "text", "text": "Say hello."}]


P3 = finding("pipeline-aider-turn-marker-never-read.json")


@_known(P3)
def test_p3_no_turn_marker_write_that_is_never_read() -> None:
    pricing = Pricing.load()
    costs = {}
    for strategy in ("none", "promptcache"):
        with Stack(with_proxy=strategy == "promptcache") as stack:
            base = stack.proxy_url if strategy == "promptcache" else stack.sim_url
            total = 0.0
            for request in P3["requests"]:
                status, data = post(
                    base, P3["path"], request["body"], _headers_for({"path": P3["path"], "headers": {}})
                )
                assert status == 200
                total += pricing.cost(P3["path"], request["body"]["model"], read_usage(P3["path"], data))
        costs[strategy] = total
    assert costs["promptcache"] <= costs["none"] * 1.001, costs


def test_p3_second_request_spends_no_write_on_the_rewritten_tail() -> None:
    """The part of P3 a session can know: A's newest message came back rewritten in B, so B
    marks no block of its own newest message (that write would never be read either) and
    reads what the client alone reads. A itself has no history to learn from (the xfail above:
    its tail write is the whole remaining cost gap on a two-request trace)."""
    reads = {}
    for strategy in ("none", "promptcache"):
        with Stack(with_proxy=strategy == "promptcache") as stack:
            base = stack.proxy_url if strategy == "promptcache" else stack.sim_url
            for request in P3["requests"]:
                status, data = post(
                    base, P3["path"], request["body"], _headers_for({"path": P3["path"], "headers": {}})
                )
                assert status == 200
            reads[strategy] = read_usage(P3["path"], data).read
            if strategy == "promptcache":
                sent = orjson.loads(stack.upstream_bodies[1])
    assert not any("cache_control" in block for block in sent["messages"][-1]["content"])
    assert reads["promptcache"] == reads["none"] > 0


P4 = finding("explain-system-role-message-detected-as-openai.json")


def test_p4_explain_detects_anthropic_with_a_system_role_message(tmp_path: Path) -> None:
    empty, body = tmp_path / "a.json", tmp_path / "b.json"
    empty.write_text("{}")
    body.write_text(orjson.dumps(P4["requests"][0]["body"]).decode())
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "explain", str(empty), str(body)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "(anthropic, /v1/messages)" in done.stdout, done.stdout[:300] + done.stderr[-300:]


P5 = finding("record-drops-anthropic-beta.json")


def test_p5_trace_keeps_anthropic_beta(tmp_path: Path) -> None:
    request = P5["requests"][0]
    record = tmp_path / "trace.jsonl"
    with Stack(record=record) as stack:
        status, _ = post(
            stack.proxy_url, P5["path"], request["body"], _headers_for({"path": P5["path"], **request})
        )
        assert status == 200
    (line,) = load_records(record)
    assert line["headers"].get("anthropic-beta") == request["headers"]["anthropic-beta"]


S1 = finding("sim-tool-marker-trailing-system-message.json")


def test_s1_sim_marker_fires_before_a_trailing_system_message() -> None:
    with Stack(with_proxy=False) as stack:
        status, data = post(
            stack.sim_url,
            S1["path"],
            S1["requests"][0]["body"],
            _headers_for({"path": S1["path"], "headers": {}}),
        )
    assert status == 200
    reply = orjson.loads(data)
    assert reply["stop_reason"] == "tool_use" and reply["content"][0]["name"] == "Bash"


S2 = finding("sim-responses-additional-tools.json")


def test_s2_sim_offers_additional_tools() -> None:
    with Stack(with_proxy=False) as stack:
        status, data = post(
            stack.sim_url,
            S2["path"],
            S2["requests"][0]["body"],
            _headers_for({"path": S2["path"], "headers": {}}),
        )
    assert status == 200
    output = orjson.loads(data).get("output") or []
    assert any(item.get("name") == "exec" for item in output), output


S3 = finding("sim-no-scripted-text-reply.json")


def test_s3_sim_scripts_a_reply_text() -> None:
    with Stack(with_proxy=False) as stack:
        status, data = post(
            stack.sim_url,
            S3["path"],
            S3["requests"][0]["body"],
            _headers_for({"path": S3["path"], "headers": {}}),
        )
    assert status == 200
    reply = orjson.loads(data)
    text = S3["requests"][0]["body"]["messages"][-1]["content"][0]["text"]
    assert reply["content"] == [{"type": "text", "text": text.split("[[reply:", 1)[1].removesuffix("]]")}]
