"""Store fixtures: one real redis-server per test session (flushed per test), stores per backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from proxy.store import open_store
from proxy.store.base import SessionStore
from tests.store.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    client = redis.Redis(host="127.0.0.1", port=redis_server.port)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    if request.param == "memory":
        url = "memory://"
    elif request.param == "sqlite":
        url = f"sqlite://{tmp_path / 'state' / 'sessions.db'}"
    else:
        url = request.getfixturevalue("redis_url")
    backend = open_store(url)
    yield backend
    await backend.close()
