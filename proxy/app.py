"""Application assembly: `create_app(settings)` and `start_proxy(settings)`.

Lifecycle (`cleanup_ctx`): resolve the upstreams (starting the in-process simulator when asked
or when `upstream: auto` finds no real API reachable), open one pooled `ClientSession` per
upstream (`auto_decompress=False`, so bodies pass through byte for byte), close them on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator
from typing import Any, Final
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from proxy.admin import add_admin_routes, ui_token_for
from proxy.admission import BodyGate
from proxy.affinity import Affinity, base_urls
from proxy.aio import create_task
from proxy.appkeys import CLIENT_SESSIONS, SERVICES, UPSTREAM_POOLS, UPSTREAMS
from proxy.connections import LimitedRunner, limits_for
from proxy.debug import LastMeasurements
from proxy.handlers import expect_continue, healthz, not_found, proxy_handler, readyz
from proxy.keepwarm import KeepWarm, parse_setting
from proxy.ledger import TenantLedger
from proxy.memory_budget import MemoryBudget
from proxy.metrics import PROVIDERS, Metrics
from proxy.pacing import Pacing
from proxy.pricing import pricing_for
from proxy.profiles import load_profiles
from proxy.providers import Router
from proxy.rules import load_rules
from proxy.services import Services
from proxy.settings import Settings
from proxy.shutdown import close_when_draining
from proxy.store import store_ctx
from proxy.teams import TeamResolver, load_team_file
from proxy.tokenizer import TokenizerLoader
from proxy.upstream_http import UpstreamPool
from proxy.upstreams import resolve_upstreams

_log = logging.getLogger("promptcache.app")
_PROBE_TIMEOUT: Final = 2.0


async def _is_reachable(url: str) -> bool:
    """True when a TCP connection to `url`'s host and port opens within 2 s."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port), _PROBE_TIMEOUT)
    except (OSError, TimeoutError, socket.gaierror):
        return False
    writer.close()
    return True


async def _resolve_upstreams(app: web.Application) -> AsyncIterator[None]:
    services = app[SERVICES]
    settings = services.settings
    sim_runner = sim_url = None
    providers = settings.providers
    use_sim = settings.upstream == "sim"
    fallback = False
    if settings.upstream == "auto":
        use_sim = fallback = not await _is_reachable(base_urls(providers["anthropic"].upstream)[0])
        if use_sim:
            _log.warning(
                "no real API reachable at %s: serving the built-in upstream SIMULATOR (canned answers); "
                "set upstream: real to never do this",
                providers["anthropic"].upstream,
            )
    if use_sim:
        from proxy.sim.app import start_sim
        from proxy.sim.gateway import GATEWAYS
        from proxy.sim.platforms import PLATFORMS

        # the simulator judges with the configured platform's rules when it knows them
        platform = providers["anthropic"].profile
        platform = platform if platform in PLATFORMS else "direct"
        gateway = providers["openai"].profile
        gateway = gateway if gateway in GATEWAYS else "direct"
        sim_runner, sim_url = await start_sim("127.0.0.1", 0, anthropic_platform=platform, openai_platform=gateway)
        _log.info("built-in simulator upstream at %s", sim_url)
    active = resolve_upstreams(settings, sim_url, fallback=fallback)
    services.active_upstreams = active
    for item in active.values():
        services.metrics.upstream_info.labels(item.provider, item.mode, item.host).set(1)
    # an upstream may list several base URLs: sessions keep to one (proxy.affinity)
    pools = {name: Affinity(base_urls(item.url)) for name, item in active.items()}
    services.affinity = {name: pool for name, pool in pools.items() if len(pool.urls) > 1}
    upstreams = {name: pool.urls[0] for name, pool in pools.items()}
    app[UPSTREAMS] = upstreams
    timeout = aiohttp.ClientTimeout(
        total=None,
        connect=settings.connect_timeout,
        sock_connect=settings.connect_timeout,
        sock_read=settings.read_timeout,
    )
    sessions: dict[str, aiohttp.ClientSession] = {}
    for name in upstreams:
        sessions[name] = aiohttp.ClientSession(
            timeout=timeout,
            auto_decompress=False,
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        )
    app[CLIENT_SESSIONS] = sessions
    keep_alive = {  # an upstream URL with credentials keeps the ClientSession (Basic auth)
        name: UpstreamPool(settings.connect_timeout, settings.read_timeout)
        for name, pool in pools.items()
        if not any(urlsplit(url).username is not None for url in pool.urls)
    }
    app[UPSTREAM_POOLS] = keep_alive
    try:
        yield
    finally:
        for lean in keep_alive.values():
            lean.close()
        for client in sessions.values():
            await client.close()
        if sim_runner is not None:
            await sim_runner.cleanup()


async def _recorder_ctx(app: web.Application) -> AsyncIterator[None]:
    services = app[SERVICES]
    if services.settings.record is not None:
        from proxy.trace_recorder import TraceRecorder

        services.recorder = TraceRecorder(
            services.settings.record, services.settings.session_headers, services.metrics.record_errors
        )
    yield
    if services.recorder is not None:
        await services.recorder.close()


async def _keep_warm_ctx(app: web.Application) -> AsyncIterator[None]:
    """`keep_warm` on (or a cap): the process's `KeepWarm` and its live loop (`proxy/keepwarm.py`)."""
    services = app[SERVICES]
    enabled, cap = parse_setting(services.settings.keep_warm)
    task = None
    if enabled:
        sessions = services.sessions

        def now() -> float:
            return sessions.clock() if sessions is not None else time.time()

        def pacing(tenant: str) -> Pacing:
            return sessions.pacing.peek(tenant) if sessions is not None else Pacing()

        upstream_sessions = app[CLIENT_SESSIONS]
        services.keep_warm = KeepWarm(
            True, cap, services.metrics, now, upstream_sessions, services.store, pacing, services.pricing
        )
        task = services.keep_warm.task = create_task(services.keep_warm.run(), name="promptcache-keep-warm")
    yield
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if services.keep_warm is not None:
        for window in list(services.keep_warm.windows.values()):
            services.keep_warm._drop(window)
        services.keep_warm = None


def create_app(
    settings: Settings, registry: CollectorRegistry | None = None, tracer_provider: Any = None, worker: int = 0
) -> web.Application:
    """The proxy as an aiohttp application; `registry` defaults to a fresh one; `worker` is this
    process's index under `--workers` (`proxy.workers`), 0 alone.

    With `settings.tracing`, requests are traced to `tracer_provider` (an OpenTelemetry
    `TracerProvider`; default `proxy.otel.default_provider()`); otherwise nothing of
    OpenTelemetry is imported. Raises `proxy.rules.RuleError` (naming file, key path and line)
    when the rules are invalid, `proxy.teams.TeamFileError` when `teams_file` is,
    `proxy.profiles.ProfileError` for an invalid profiles file or an unknown profile name,
    `proxy.pricing.PricingError` for an invalid `pricing.yaml` in `settings.rules_dir`.
    """
    app = web.Application(client_max_size=settings.max_body_bytes)
    if settings.tracing:
        from proxy.otel import install_tracing

        install_tracing(app, tracer_provider)
    teams = TeamResolver.build(
        settings.team_header,
        settings.teams,
        load_team_file(settings.teams_file) if settings.teams_file is not None else {},
    )
    pricing = pricing_for(settings.rules_dir)
    budget = MemoryBudget.of_mb(settings.memory_budget_mb)
    metrics = Metrics(registry, {p: pricing.family_names(p) for p in PROVIDERS}, worker=worker)
    metrics.prepare_teams(teams.labels)
    app[SERVICES] = Services(
        settings=settings,
        metrics=metrics,
        rules=load_rules(settings.rules_dir),
        router=Router(
            load_profiles(settings.rules_dir),
            settings.providers["anthropic"].profile,
            settings.providers["openai"].profile,
        ),
        last_measurements=LastMeasurements(
            settings.history_sessions,
            settings.history_sessions_per_tenant,
            settings.history_requests,
            max_bytes=budget.history,
        ),
        teams=teams,
        ledger=TenantLedger(),
        pricing=pricing,
        ui_token=ui_token_for(settings),
        tokenizer=TokenizerLoader(budget.token_counts),
        gate=BodyGate(settings.pipeline_inflight_bytes, metrics.pipeline_admission_waits.inc),
    )
    app.on_response_prepare.append(close_when_draining)
    app.cleanup_ctx.append(_resolve_upstreams)
    app.cleanup_ctx.append(_recorder_ctx)
    app.cleanup_ctx.append(store_ctx)
    app.cleanup_ctx.append(_keep_warm_ctx)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if settings.admin_port is None:
        add_admin_routes(app.router)
    app.router.add_route("*", "/debug/{tail:.*}", not_found)
    app.router.add_route("*", "/ui{tail:(/.*)?}", not_found)
    app.router.add_route("*", "/{tail:.*}", proxy_handler, expect_handler=expect_continue)
    return app


def create_admin_app(proxy_app: web.Application) -> web.Application:
    """The separate admin listener (`admin_port`): `/metrics`, `/debug/sessions`, `/ui/` (behind
    `admin_token` when set: `proxy.admin`) and `/healthz` of `proxy_app`."""
    admin = web.Application()
    admin[SERVICES] = proxy_app[SERVICES]
    add_admin_routes(admin.router)
    admin.router.add_get("/healthz", healthz)
    admin.router.add_route("*", "/{tail:.*}", not_found)
    return admin


async def start_proxy(
    settings: Settings,
    registry: CollectorRegistry | None = None,
    tracer_provider: Any = None,
    worker: int = 0,
    reuse_port: bool = False,
) -> tuple[web.AppRunner, str]:
    """Start the proxy on the running loop at `settings.host:settings.port` (0 = any free port);
    `reuse_port` binds with `SO_REUSEPORT` (one of several `--workers` on one port).

    Returns the runner (call `cleanup()` to stop) and the base URL clients use.
    """
    app = create_app(settings, registry, tracer_provider, worker)
    runner = limited_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, reuse_port=reuse_port or None)
    await site.start()
    return runner, _base_url(runner)


def limited_runner(app: web.Application) -> LimitedRunner:
    """A runner for `app` (the proxy's or the admin listener's) with the connection limits of
    its settings (`proxy.connections`): header, body and idle timeouts, header size and count,
    connection caps; each listener counts its own connections."""
    services = app[SERVICES]
    settings = services.settings
    return LimitedRunner(
        app,
        limits=limits_for(settings, services.metrics, services.router),
        handler_cancellation=True,
        access_log=None,
        # request bodies are decoded by `read_body` (`proxy.body_encoding`), which refuses a
        # truncated stream; aiohttp's decoder forwards what it inflated of one (finding F2)
        auto_decompress=False,
        keepalive_timeout=settings.client_idle_timeout,
        # aiohttp's per-line limits at ours, so the whole-head limit answers first (431)
        max_line_size=settings.max_header_bytes,
        max_field_size=settings.max_header_bytes,
        max_headers=settings.max_header_count,
    )


async def start_admin(
    proxy_app: web.Application, host: str, port: int, reuse_port: bool = False
) -> tuple[web.AppRunner, str]:
    """Start the admin listener (`create_admin_app`) at `host:port` with the same connection
    limits as the proxy's; returns the runner and its base URL. Raises `OSError` when it cannot
    listen."""
    runner = limited_runner(create_admin_app(proxy_app))
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, reuse_port=reuse_port or None).start()
    except OSError:
        await runner.cleanup()
        raise
    return runner, _base_url(runner)


def _base_url(runner: web.AppRunner) -> str:
    host, port = runner.addresses[0][:2]
    return f"http://[{host}]:{port}" if ":" in str(host) else f"http://{host}:{port}"
