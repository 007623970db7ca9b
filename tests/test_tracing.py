"""OpenTelemetry tracing (`tracing: true`, the `otel` extra): exact span names and parentage from
the SDK's in-memory exporter, W3C `traceparent` received by a fake upstream on loopback, and
nothing imported or sent when tracing is off."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from pathlib import Path

import aiohttp
import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra (in the test extra; scripts/install installs it)")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

from proxy import __version__
from proxy.app import start_proxy
from proxy.pipeline import REQUEST_STAGES
from proxy.settings import Settings, SettingsError, load_settings
from tests.fakes.upstream import FakeUpstream

ROOT = Path(__file__).resolve().parents[1]
BODY = {"model": "claude-sonnet-4-6", "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
HEADERS = {"x-api-key": "sk-ant-tracing-test", "anthropic-version": "2023-06-01"}
CLIENT_TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CLIENT_SPAN = 0x00F067AA0BA902B7
CLIENT_TRACEPARENT = f"00-{CLIENT_TRACE:032x}-{CLIENT_SPAN:016x}-01"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


async def _traced_requests(
    fake: FakeUpstream, exporter: InMemorySpanExporter, *requests: tuple[str, dict[str, str]], **settings: object
) -> list[ReadableSpan]:
    """Send `requests` (path, extra headers) through a traced proxy, stop it, return the spans."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    runner, url = await start_proxy(
        Settings(port=0, store="memory://", upstream=fake.url, tracing=True, **settings),  # type: ignore[arg-type]
        CollectorRegistry(),
        provider,
    )
    try:
        async with aiohttp.ClientSession() as http:
            for path, extra in requests:
                async with http.post(url + path, json=BODY, headers={**HEADERS, **extra}) as response:
                    assert response.status == 200
                    await response.read()
            async with http.get(url + "/healthz") as response:
                assert response.status == 200
    finally:
        await runner.cleanup()  # waits for the handlers: every span has ended
    return list(exporter.get_finished_spans())


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_spans_per_request_stage_and_upstream_with_traceparent(
    fake_upstream: FakeUpstream, exporter: InMemorySpanExporter
) -> None:
    spans = await _traced_requests(fake_upstream, exporter, ("/v1/messages", {}))
    stage_names = [f"promptcache.stage.{stage.name}" for stage in REQUEST_STAGES]
    assert [s.name for s in spans] == [*stage_names, "upstream POST", "POST /v1/messages"]
    *stages, upstream, request = spans
    assert request.parent is None and request.kind == SpanKind.SERVER
    assert [_parent(s) for s in (*stages, upstream)] == [request.context.span_id] * (len(stages) + 1)
    assert {s.context.trace_id for s in spans} == {request.context.trace_id}
    assert [s.kind for s in stages] == [SpanKind.INTERNAL] * len(stages)
    assert upstream.kind == SpanKind.CLIENT
    assert dict(request.attributes or {}) == {
        "http.request.method": "POST",
        "url.path": "/v1/messages",
        "promptcache.provider": "anthropic",
        "http.response.status_code": 200,
    }
    port = int(fake_upstream.url.rsplit(":", 1)[1])
    assert dict(upstream.attributes or {}) == {
        "http.request.method": "POST",
        "server.address": "127.0.0.1",
        "server.port": port,
        "url.path": "/v1/messages",
        "promptcache.provider": "anthropic",
        "http.response.status_code": 200,
        # the fake's streamed usage: 21 uncached + 3000 read + 1500 written, 7 out
        "gen_ai.usage.input_tokens": 21 + 3000 + 1500,
        "gen_ai.usage.output_tokens": 7,
        "gen_ai.usage.cache_read.input_tokens": 3000,
        "gen_ai.usage.cache_creation.input_tokens": 1500,
    }
    assert {s.status.status_code for s in spans} == {StatusCode.UNSET}
    [received] = fake_upstream.received
    assert received.headers.getall("traceparent") == [
        f"00-{request.context.trace_id:032x}-{upstream.context.span_id:016x}-03"
    ]  # flags: sampled, and random trace id (W3C Trace Context level 2)
    assert "tracestate" not in received.headers


async def test_client_traceparent_is_continued_and_replaced_upstream(
    fake_upstream: FakeUpstream, exporter: InMemorySpanExporter
) -> None:
    headers = {"traceparent": CLIENT_TRACEPARENT, "tracestate": "vendor=abc"}
    spans = await _traced_requests(fake_upstream, exporter, ("/anthropic/v1/messages", headers))
    request = spans[-1]
    upstream = spans[-2]
    assert (request.name, upstream.name) == ("POST /anthropic/v1/messages", "upstream POST")
    assert (request.context.trace_id, _parent(request)) == (CLIENT_TRACE, CLIENT_SPAN)
    assert {s.context.trace_id for s in spans} == {CLIENT_TRACE}
    [received] = fake_upstream.received
    assert received.headers.getall("traceparent") == [f"00-{CLIENT_TRACE:032x}-{upstream.context.span_id:016x}-01"]
    assert received.headers.getall("tracestate") == ["vendor=abc"]


async def test_observe_mode_traces_only_the_stages_that_run(
    fake_upstream: FakeUpstream, exporter: InMemorySpanExporter
) -> None:
    spans = await _traced_requests(fake_upstream, exporter, ("/v1/messages", {}), mode="observe")
    measuring = [f"promptcache.stage.{stage.name}" for stage in REQUEST_STAGES if not stage.rewrites]
    assert measuring == ["promptcache.stage.parse", "promptcache.stage.session"]
    assert [s.name for s in spans] == [*measuring, "upstream POST", "POST /v1/messages"]


async def test_unreachable_upstream_is_an_error_span(exporter: InMemorySpanExporter) -> None:
    dead = FakeUpstream()
    await dead.start()
    await dead.stop()  # the port is closed now: connect fails, the proxy answers 502
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    runner, url = await start_proxy(
        Settings(port=0, store="memory://", upstream=dead.url, tracing=True), CollectorRegistry(), provider
    )
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(url + "/v1/messages", json=BODY, headers=HEADERS) as response:
                assert response.status == 502
    finally:
        await runner.cleanup()
    upstream, request = exporter.get_finished_spans()[-2:]
    assert (upstream.name, upstream.attributes["http.response.status_code"]) == ("upstream POST", 502)
    assert (request.name, request.attributes["http.response.status_code"]) == ("POST /v1/messages", 502)
    assert (upstream.status.status_code, request.status.status_code) == (StatusCode.ERROR, StatusCode.ERROR)


OFF_SCRIPT = """
import asyncio, sys
import aiohttp
from prometheus_client import CollectorRegistry
from proxy import __version__
from proxy.app import start_proxy
from proxy.settings import Settings
from tests.fakes.upstream import FakeUpstream

async def main():
    fake = FakeUpstream()
    await fake.start()
    runner, url = await start_proxy(Settings(port=0, store="memory://", upstream=fake.url), CollectorRegistry())
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/messages", json={BODY!r}, headers={HEADERS!r}) as r:
            await r.read()
    await runner.cleanup()
    await fake.stop()
    print(fake.received[0].headers.getall("traceparent"))
    print(sorted(m for m in sys.modules if m.startswith(("opentelemetry", "proxy.otel"))))

asyncio.run(main())
"""


def test_tracing_off_imports_nothing_and_passes_the_client_traceparent_through() -> None:
    script = OFF_SCRIPT.replace("{BODY!r}", repr(BODY)).replace(
        "{HEADERS!r}", repr({**HEADERS, "traceparent": CLIENT_TRACEPARENT})
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [repr([CLIENT_TRACEPARENT]), "[]"]


def test_tracing_without_the_extra_is_a_settings_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk", None)  # as if the otel extra were absent
    with pytest.raises(SettingsError) as error:
        load_settings(environ={"PROMPTCACHE_TRACING": "true"})
    assert str(error.value) == (
        "invalid setting tracing (PROMPTCACHE_TRACING): "
        "Value error, needs the otel extra: pip install 'promptcache[otel]'"
    )
    assert load_settings(environ={"PROMPTCACHE_TRACING": "false"}).tracing is False


def test_tracing_without_opentelemetry_at_all_is_a_settings_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # no `opentelemetry` package at all: `find_spec("opentelemetry.sdk")` itself raises
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.delitem(sys.modules, "opentelemetry.sdk", raising=False)
    with pytest.raises(SettingsError) as error:
        load_settings(environ={"PROMPTCACHE_TRACING": "true"})
    assert str(error.value).endswith("needs the otel extra: pip install 'promptcache[otel]'")



class _Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP trace receiver (protobuf `ExportTraceServiceRequest` on POST /v1/traces)."""

    received: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's hook name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


async def test_default_provider_exports_otlp_http_to_the_configured_collector(
    fake_upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    _Collector.received = []
    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{collector.server_address[1]}/v1/traces"
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "promptcache-test")
        runner, url = await start_proxy(
            Settings(port=0, store="memory://", upstream=fake_upstream.url, tracing=True), CollectorRegistry()
        )
        try:
            async with aiohttp.ClientSession() as http_client:
                async with http_client.post(url + "/v1/messages", json=BODY, headers=HEADERS) as response:
                    assert response.status == 200
                    await response.read()
        finally:
            await runner.cleanup()  # shuts the provider down: the batch is exported now
    finally:
        collector.shutdown()
        collector.server_close()
    [(path, content_type, body)] = _Collector.received
    assert (path, content_type) == ("/v1/traces", "application/x-protobuf")
    export = ExportTraceServiceRequest.FromString(body)
    [resource_spans] = export.resource_spans
    service = [a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"]
    assert service == ["promptcache-test"]
    names = [span.name for scope in resource_spans.scope_spans for span in scope.spans]
    stage_names = [f"promptcache.stage.{stage.name}" for stage in REQUEST_STAGES]
    assert names == [*stage_names, "upstream POST", "POST /v1/messages"]
    [scope] = resource_spans.scope_spans
    assert (scope.scope.name, scope.scope.version) == ("promptcache", __version__)


async def test_a_key_in_the_path_is_redacted_in_both_spans(
    fake_upstream: FakeUpstream, exporter: InMemorySpanExporter
) -> None:
    key = "sk-ant-api03-" + "Z" * 40
    spans = await _traced_requests(fake_upstream, exporter, (f"/{key}/v1/messages", {}))
    upstream, request = spans[-2:]
    assert (request.attributes or {})["url.path"] == "/[redacted]/v1/messages"
    assert (upstream.attributes or {})["url.path"] == "/[redacted]/v1/messages"
    assert all(key not in str(s.to_json()) for s in spans)
