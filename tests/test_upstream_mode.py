"""The active upstream is said out loud: `/readyz`, `promptcache_upstream_info`, the banner."""

from __future__ import annotations

import socket
from pathlib import Path

import aiohttp

from proxy.cli import banner_lines
from proxy.settings import Settings
from proxy.upstreams import ActiveUpstream, host_of, redact_url, resolve_upstreams
from tests.fakes.upstream import FakeUpstream


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed: connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _readyz(url: str) -> dict:
    async with aiohttp.ClientSession() as client, client.get(f"{url}/readyz") as response:
        assert response.status == 200
        return await response.json()


async def test_auto_fallback_is_loud_in_readyz_and_metric(make_proxy) -> None:
    dead = f"http://127.0.0.1:{_closed_port()}"
    proxy = await make_proxy(upstream="auto", anthropic_upstream=dead)
    body = await _readyz(proxy.url)
    sim = body["upstreams"]["anthropic"]["url"]
    assert sim.startswith("http://127.0.0.1:")
    assert body == {
        "status": "ready",
        "upstreams": {
            name: {"mode": "sim", "host": sim.removeprefix("http://"), "url": sim, "fallback": True}
            for name in ("anthropic", "openai")
        },
        "warning": "no real API was reachable at start (upstream: auto): the built-in simulator "
        "answers with canned replies; set upstream: real in production",
        "store": {"backend": "memory", "healthy": True},
    }
    host = sim.removeprefix("http://")
    for provider in ("anthropic", "openai"):
        assert proxy.sample("promptcache_upstream_info", provider=provider, mode="sim", host=host) == 1.0
        assert (
            proxy.registry.get_sample_value(
                "promptcache_upstream_info", {"provider": provider, "mode": "real", "host": "api.anthropic.com"}
            )
            is None
        )


async def test_custom_upstream_in_readyz_and_metric(make_proxy, fake_upstream: FakeUpstream) -> None:
    proxy = await make_proxy(upstream=fake_upstream.url)
    body = await _readyz(proxy.url)
    host = fake_upstream.url.removeprefix("http://")
    entry = {"mode": "custom", "host": host, "url": fake_upstream.url, "fallback": False}
    assert body == {
        "status": "ready",
        "upstreams": {"anthropic": entry, "openai": entry},
        "store": {"backend": "memory", "healthy": True},
    }
    assert proxy.sample("promptcache_upstream_info", provider="openai", mode="custom", host=host) == 1.0


def test_real_mode_resolves_configured_hosts() -> None:
    settings = Settings(upstream="real", openai_upstream="https://openai.example:8443/")
    active = resolve_upstreams(settings, None)
    assert active == {
        "anthropic": ActiveUpstream("anthropic", "real", "https://api.anthropic.com"),
        "openai": ActiveUpstream("openai", "real", "https://openai.example:8443"),
    }
    assert [a.host for a in active.values()] == ["api.anthropic.com", "openai.example:8443"]
    assert host_of("http://127.0.0.1:80/x") == "127.0.0.1"


def test_banner_names_mode_host_store_and_state_dir(tmp_path: Path) -> None:
    settings = Settings(store="redis://:hunter2@redis:6379/0", state_dir=tmp_path)
    sim = {p: ActiveUpstream(p, "sim", "http://127.0.0.1:4242", True) for p in ("anthropic", "openai")}
    lines = banner_lines(settings, "http://127.0.0.1:8080", sim)
    assert lines[2:] == [
        "  upstream anthropic: sim http://127.0.0.1:4242",
        "  upstream openai: sim http://127.0.0.1:4242",
        "  WARNING: no real API was reachable at start (upstream: auto): the built-in SIMULATOR "
        "answers every request; set upstream: real in production",
        "  store: redis://:***@redis:6379/0",
        f"  state dir: {tmp_path.resolve()}",
    ]
    real = resolve_upstreams(Settings(upstream="real"), None)
    lines = banner_lines(Settings(state_dir=tmp_path), "http://127.0.0.1:8080", real)
    assert lines[2:] == [
        "  upstream anthropic: real https://api.anthropic.com",
        "  upstream openai: real https://api.openai.com",
        f"  store: sqlite://{tmp_path.resolve() / 'sessions.db'}",
        f"  state dir: {tmp_path.resolve()}",
    ]
    assert "hunter2" not in redact_url("rediss://user:hunter2@h:1/0")
