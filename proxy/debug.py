"""`GET /debug/sessions/{id}`: a live session's state and its last request's measurement, as JSON.

Tenant-partitioned like every stored byte: the caller presents the same credential header the
client uses (`x-api-key` or `Authorization`), and only that tenant's session is visible; a
session of another tenant is indistinguishable from a missing one (404). `{id}` is the id the
client sends (`x-claude-code-session-id`, `metadata.user_id`'s session, `prompt_cache_key` ...)
or the stored id shown in logs. `?provider=anthropic|openai` picks the upstream (default
anthropic). Served on the admin listener when `admin_port` is set, else on the main one.

`LastMeasurements` keeps the newest `Measurement` per (tenant, session), bounded (LRU).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, is_dataclass
from typing import Any, Final

from aiohttp import web

from proxy.appkeys import SERVICES

MAX_SESSIONS: Final = 4096


class LastMeasurements:
    """Newest measurement per `(tenant, session_id)`; at most `cap` sessions (LRU)."""

    def __init__(self, cap: int = MAX_SESSIONS) -> None:
        self._items: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._cap = cap

    def put(self, tenant: str, session_id: str, measurement: Any) -> None:
        key = (tenant, session_id)
        self._items[key] = measurement
        self._items.move_to_end(key)
        while len(self._items) > self._cap:
            self._items.popitem(last=False)

    def get(self, tenant: str, session_id: str) -> Any:
        return self._items.get((tenant, session_id))


def _jsonable(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in asdict(value).items()}
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def record_summary(record: Any) -> dict[str, Any]:
    """The stored session record without message bytes (sizes only)."""
    return {
        "model": record.model,
        "turns": record.turns,
        "prompt_blocks": len(record.ends),
        "prompt_bytes": record.ends[-1] if record.ends else 0,
        "breakpoints": list(record.breakpoints),
        "ttls": list(record.ttls),
        "arrivals": list(record.arrivals),
        "last_response_id": record.last_response_id,
        "sidecars": len(record.sidecars),
        "sidecar_bytes": sum(len(s.exact) for s in record.sidecars),
        "pinned_segments": len(record.pins.get("pinned_segments") or ()),
        "tail_misses": record.tail_misses,
    }


async def session_handler(request: web.Request) -> web.Response:
    """See the module docstring."""
    services = request.app[SERVICES]
    state, store = services.sessions, services.store
    if state is None or store is None:
        return web.json_response({"error": "sessions are off"}, status=503)
    from proxy.sessions import explicit_id

    provider = request.query.get("provider", "anthropic")
    if provider not in ("anthropic", "openai"):
        return web.json_response({"error": "provider must be anthropic or openai"}, status=400)
    tenant = state.tenant_of(provider, request.headers)
    raw_id = request.match_info["session_id"]
    for session_id in (explicit_id(raw_id), raw_id):
        record = await store.load(tenant, session_id)
        measurement = services.last_measurements.get(tenant, session_id)
        if record is not None or measurement is not None:
            return web.json_response(
                {
                    "session_id": session_id,
                    "record": record_summary(record) if record is not None else None,
                    "last_request": _jsonable(measurement),
                }
            )
    return web.json_response({"error": "no such session for this credential"}, status=404)


def remember_measurement(exchange: Any, services: Any) -> None:
    """Keep `exchange.notes["measurement"]` as its session's newest (for the debug endpoint)."""
    measurement = exchange.notes.get("measurement")
    log = services.last_measurements
    if measurement is not None and log is not None and exchange.tenant and exchange.session_id:
        log.put(exchange.tenant, exchange.session_id, measurement)
