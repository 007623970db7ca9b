"""The admin surface: `/metrics`, `/debug/sessions[/{id}]`, `/debug/tenants`, `/ui/` and
`/ui/sessions/{id}`.

Served on the admin listener (`admin_port`), or on the main one when no admin port is set.

Access (`admin_token`): when set, every admin route answers 401 unless the request carries
`Authorization: Bearer <admin_token>` or `?token=<admin_token>` (compared in constant time);
`/healthz` and `/readyz` stay open for probes. `serve` refuses to start when the admin routes
would listen on a non-loopback address without a token (`admin_exposure_error`, checked by
`proxy.settings.load_settings`).

Cross-tenant pages (`/ui/`, `/ui/sessions/{id}`: every tenant's sessions and their excerpts)
always need a credential, `admin_token` or, when none is set, a token generated at start
(`ui_token_for`: 32 random bytes, URL-safe, in memory only; `serve` prints it once in its
start-up banner as the URL to open, as Jupyter does; the workers of `--workers N` share the
supervisor's through `UI_TOKEN_ENV`). `/debug` answers only the caller's own tenant (found from
its credential header) and `/metrics` no tenant at all, so they stay open on loopback without a
configured token.

A bearer header that is the admin token is not a tenant credential: `/debug/sessions` then reads
the caller's tenant from `x-api-key` (or `?token=` carries the admin token and `Authorization`
the caller's key).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from aiohttp import web
from multidict import CIMultiDict

from proxy.appkeys import SERVICES

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
LOOPBACK_NAMES: Final = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
UI_TOKEN_ENV: Final = "_PROMPTCACHE_UI_TOKEN"
"""Environment variable a `--workers` supervisor hands its generated UI token to its workers in
(not a `PROMPTCACHE_` setting; never written anywhere else)."""


def ui_token_for(settings: Any) -> str:
    """The credential of the cross-tenant pages: `admin_token`, else the supervisor's (workers),
    else a new random one (module docstring)."""
    return str(settings.admin_token) or os.environ.get(UI_TOKEN_ENV) or secrets.token_urlsafe(32)


def is_loopback(host: str) -> bool:
    """Whether a listen address only accepts local connections (`127.0.0.0/8`, `::1`, `localhost`).

    The empty host and `0.0.0.0` / `::` (every interface) are not loopback."""
    name = host.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def admin_host(settings: Any) -> str:
    """The address the admin routes listen on: `admin_host` with an admin port, else `host`."""
    if settings.admin_port is not None and settings.admin_host:
        return str(settings.admin_host)
    return str(settings.host)


def admin_exposure_error(settings: Any) -> str | None:
    """Why `settings` must not start (admin routes reachable from other machines without a
    token), or `None`."""
    host = admin_host(settings)
    if settings.admin_token or is_loopback(host):
        return None
    where = "admin_host" if settings.admin_port is not None and settings.admin_host else "host"
    return (
        f"admin_token: required when the admin routes (/metrics, /debug, /ui) listen on the "
        f"non-loopback address {host!r} ({where}); set admin_token, or listen on 127.0.0.1"
    )


def _matches(presented: str | None, token: str) -> bool:
    return presented is not None and hmac.compare_digest(presented.encode(), token.encode())


def is_authorised(request: web.Request, *, is_cross_tenant: bool = False) -> bool:
    """Whether the request carries the admin credential: `admin_token` (every admin route
    when set), or for a cross-tenant page the generated UI token."""
    services = request.app[SERVICES]
    token = services.ui_token if is_cross_tenant else services.settings.admin_token
    if not token:
        return True
    header = request.headers.get("Authorization", "")
    bearer = header[7:].strip() if header[:7].lower() == "bearer " else None
    return _matches(request.query.get("token"), token) or _matches(bearer, token)


def guarded(handler: Handler, *, is_cross_tenant: bool = False) -> Handler:
    """`handler` behind the admin token; a cross-tenant one behind the UI token too (module
    docstring)."""

    async def check(request: web.Request) -> web.StreamResponse:
        if not is_authorised(request, is_cross_tenant=is_cross_tenant):
            headers = {"WWW-Authenticate": 'Bearer realm="promptcache admin"'}
            if request.path.startswith("/ui"):
                return web.Response(
                    status=401, text="promptcache: admin token required\n", content_type="text/plain", headers=headers
                )
            return web.json_response({"error": "admin token required"}, status=401, headers=headers)
        return await handler(request)

    check.__name__ = getattr(handler, "__name__", "guarded")
    check.__doc__ = handler.__doc__
    return check


def caller_headers(request: web.Request) -> Mapping[str, str]:
    """The request's headers without an `Authorization` that is the admin token (module docstring)."""
    token = request.app[SERVICES].ui_token
    headers = request.headers
    value = headers.get("Authorization", "")
    if token and value[:7].lower() == "bearer " and _matches(value[7:].strip(), token):
        kept: CIMultiDict[str] = CIMultiDict(headers)
        kept.popall("Authorization")
        return kept
    return headers


def token_query(request: web.Request) -> str:
    """`token=...` when the token came in the URL (links carry it over), else ``."""
    from urllib.parse import urlencode

    token = request.query.get("token")
    return urlencode({"token": token}) if token else ""


def add_admin_routes(router: web.UrlDispatcher) -> None:
    """`/metrics`, `/debug/sessions`, `/debug/sessions/{id}`, `/debug/tenants`, `/ui/`,
    `/ui/sessions/{id}`."""
    from proxy.debug import session_handler, sessions_handler
    from proxy.handlers import metrics_handler
    from proxy.ledger import tenants_handler
    from proxy.ui.routes import ui_index, ui_redirect, ui_session

    router.add_get("/metrics", guarded(metrics_handler))
    router.add_get("/debug/sessions", guarded(sessions_handler))
    router.add_get("/debug/sessions/{session_id}", guarded(session_handler))
    router.add_get("/debug/tenants", guarded(tenants_handler))
    router.add_get("/ui", ui_redirect)
    router.add_get("/ui/", guarded(ui_index, is_cross_tenant=True))
    router.add_get("/ui/sessions/{session_id}", guarded(ui_session, is_cross_tenant=True))
