"""Errors promptcache and its simulator answer themselves are clear and in the provider's shape:
a non-UTF-8 body, unknown paths (JSON 404, never plain text)."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from proxy.app import create_admin_app
from proxy.sim.app import start_sim
from tests.fakes.upstream import FakeUpstream

ANTHROPIC_HEADERS = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01", "content-type": "application/json"}
OPENAI_HEADERS = {"authorization": "Bearer sk-test", "content-type": "application/json"}
NOT_UTF8 = b'{"model": "claude-sonnet-4-6", "max_tokens": 5, "messages": [{"role": "user", "content": "caf\xe9"}]}'


async def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, object]:
    async with aiohttp.ClientSession() as client, client.post(url, data=body, headers=headers) as response:
        assert response.content_type == "application/json"
        return response.status, await response.json()


async def test_proxy_answers_a_non_utf8_body_in_the_provider_shape(make_proxy, fake_upstream: FakeUpstream) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url)
    offset = NOT_UTF8.index(b"\xe9")
    message = (
        f"request body is not valid UTF-8 (byte 0xe9 at offset {offset}); JSON request bodies must be encoded as UTF-8"
    )
    assert await _post(f"{proxy.url}/v1/messages", NOT_UTF8, ANTHROPIC_HEADERS) == (
        400,
        {"type": "error", "error": {"type": "invalid_request_error", "message": message}},
    )
    assert await _post(f"{proxy.url}/v1/chat/completions", NOT_UTF8, OPENAI_HEADERS) == (
        400,
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}},
    )
    assert fake_upstream.received == []
    assert proxy.sample("promptcache_requests_total", provider="anthropic", outcome="client_error") == 1


async def test_simulator_words_a_non_utf8_body() -> None:
    runner, url = await start_sim()
    try:
        offset = NOT_UTF8.index(b"\xe9")
        status, body = await _post(f"{url}/v1/messages", NOT_UTF8, ANTHROPIC_HEADERS)
        assert (status, body) == (
            400,
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": f"The request body is not valid UTF-8 (byte 0xe9 at offset {offset})",
                },
            },
        )
    finally:
        await runner.cleanup()


async def test_simulator_unknown_paths_are_json_404() -> None:
    runner, url = await start_sim()
    try:
        async with aiohttp.ClientSession() as client:
            async with client.post(f"{url}/v1/messages/nope", headers=ANTHROPIC_HEADERS, data=b"{}") as r:
                assert (r.status, await r.json()) == (
                    404,
                    {"type": "error", "error": {"type": "not_found_error", "message": "Not Found"}},
                )
            async with client.get(f"{url}/v1/chat/nope", headers=OPENAI_HEADERS) as r:
                assert (r.status, await r.json()) == (
                    404,
                    {
                        "error": {
                            "message": "Invalid URL (GET /v1/chat/nope)",
                            "type": "invalid_request_error",
                            "param": None,
                            "code": None,
                        }
                    },
                )
    finally:
        await runner.cleanup()


async def test_simulator_unknown_paths_under_the_anthropic_api_are_in_its_shape() -> None:
    """Leftover of session 9's attack pass: an unknown path outside `/v1/messages` (a legacy
    or admin path, or a shared name such as `/v1/files` asked with Anthropic's headers) was
    answered in OpenAI's shape. OpenAI's own paths keep theirs whatever the headers."""
    anthropic = {"type": "error", "error": {"type": "not_found_error", "message": "Not Found"}}

    def openai(method: str, path: str) -> object:
        message = f"Invalid URL ({method} {path})"
        return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}

    no_version = {"x-api-key": "sk-ant-test"}
    cases = [
        ("POST", "/v1/complete", ANTHROPIC_HEADERS, anthropic),
        ("GET", "/v1/organizations/usage_report/messages", no_version, anthropic),
        ("GET", "/v1/files", ANTHROPIC_HEADERS, anthropic),
        ("DELETE", "/v1/models/claude-opus-4-6", ANTHROPIC_HEADERS, anthropic),
        ("GET", "/v1/skills", {"anthropic-version": "2023-06-01"}, anthropic),
        ("GET", "/v1/files", OPENAI_HEADERS, openai("GET", "/v1/files")),
        ("POST", "/v1/completions", OPENAI_HEADERS, openai("POST", "/v1/completions")),
        ("POST", "/v1/embeddings", ANTHROPIC_HEADERS, openai("POST", "/v1/embeddings")),
        ("GET", "/v1/chat/completions", ANTHROPIC_HEADERS, openai("GET", "/v1/chat/completions")),
    ]
    runner, url = await start_sim()
    try:
        async with aiohttp.ClientSession() as client:
            answers = []
            for method, path, headers, _ in cases:
                async with client.request(method, url + path, headers=headers, data=b"{}") as r:
                    answers.append((r.status, await r.json()))
        assert answers == [(404, expected) for *_, expected in cases]
    finally:
        await runner.cleanup()


async def test_proxy_own_paths_are_json_404(make_proxy, fake_upstream: FakeUpstream) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url)
    async with aiohttp.ClientSession() as client:
        async with client.get(f"{proxy.url}/debug/nothing", headers=ANTHROPIC_HEADERS) as r:
            assert (r.status, await r.json()) == (
                404,
                {
                    "type": "error",
                    "error": {"type": "not_found_error", "message": "promptcache serves no GET /debug/nothing"},
                },
            )
        async with client.get(f"{proxy.url}/debug/nothing", headers=OPENAI_HEADERS) as r:
            assert (r.status, (await r.json())["error"]["type"]) == (404, "invalid_request_error")
    assert fake_upstream.received == []


async def test_admin_listener_unknown_path_is_json_404(make_proxy, fake_upstream: FakeUpstream) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url, admin_port=0)
    admin = web.AppRunner(create_admin_app(proxy.runner.app), access_log=None)
    await admin.setup()
    site = web.TCPSite(admin, "127.0.0.1", 0)
    await site.start()
    try:
        port = admin.addresses[0][1]
        async with aiohttp.ClientSession() as client, client.get(f"http://127.0.0.1:{port}/nope") as r:
            assert (r.status, await r.json()) == (
                404,
                {"type": "error", "error": {"type": "not_found_error", "message": "promptcache serves no GET /nope"}},
            )
    finally:
        await admin.cleanup()
