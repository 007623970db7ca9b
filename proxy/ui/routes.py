"""`/ui/` and `/ui/sessions/{id}` handlers (registered by `proxy.admin.add_admin_routes`, behind
`admin_token`). Both read the in-process index `Services.last_measurements`
(`proxy.history.SessionHistory`); every page is self-contained (`proxy.ui.page`) and sent with a
Content-Security-Policy that forbids any network fetch.

`/ui/` lists every tenant's recent sessions (the admin view: tenants appear as hash prefixes);
`/ui/sessions/{id}?tenant=<prefix>` opens one (without `tenant`, the newest session with that id;
`{id}` is the stored id or the id the client sent).
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from proxy.admin import token_query
from proxy.appkeys import SERVICES
from proxy.ui.page import CONTENT_SECURITY_POLICY, index_page, session_page, session_view

_HEADERS: Final = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8", headers=_HEADERS)


async def ui_redirect(request: web.Request) -> web.Response:
    """`/ui` -> `/ui/` (relative links need the slash); the query string is kept."""
    raise web.HTTPFound("/ui/" + (f"?{request.query_string}" if request.query_string else ""))


async def ui_index(request: web.Request) -> web.Response:
    """The recent sessions, newest first."""
    history = request.app[SERVICES].last_measurements
    entries = history.recent() if history is not None else []
    return _html(index_page(entries, token_query(request)))


async def ui_session(request: web.Request) -> web.Response:
    """One session's forensic map."""
    history = request.app[SERVICES].last_measurements
    session_id = request.match_info["session_id"]
    from proxy.session_identity import explicit_id

    entry = None
    if history is not None:
        tenant = request.query.get("tenant", "")
        entry = history.find(session_id, tenant) or history.find(explicit_id(session_id), tenant)
    if entry is None:
        return _html("<!doctype html><title>not found</title><p>No such session in the recent index.</p>", 404)
    query = token_query(request)
    back = "../" + (f"?{query}" if query else "")
    return _html(session_page(session_view(entry), back_link=back))
