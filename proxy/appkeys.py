"""Typed application state keys (`aiohttp.web.AppKey`)."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from proxy.services import Services
from proxy.upstream_http import UpstreamPool

SERVICES = web.AppKey("services", Services)
UPSTREAMS = web.AppKey("upstreams", dict[str, str])
"""Provider name -> upstream base URL (no trailing slash)."""
CLIENT_SESSIONS = web.AppKey("client_sessions", dict[str, aiohttp.ClientSession])
"""Provider name -> the pooled `ClientSession` for that upstream."""
UPSTREAM_POOLS = web.AppKey("upstream_pools", dict[str, UpstreamPool])
"""Provider name -> the lean keep-alive pool for pipeline requests (`proxy.upstream_http`)."""
