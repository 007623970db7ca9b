"""State on disk (issue 11, item 7): the SQLite file, WAL and SHM are 0600, an existing state
dir is tightened to 0700, and the WAL is bounded by a checkpoint policy sized to the data."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import aiohttp

from tests.fakes.upstream import FakeUpstream

HEADERS = {"x-api-key": "key-d", "anthropic-version": "2023-06-01", "x-session-id": "s-1"}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_state_files_are_private_and_the_wal_is_bounded(
    fake_upstream: FakeUpstream, make_proxy: Any, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)
    proxy = await make_proxy(upstream=fake_upstream.url, store="", state_dir=state)
    async with aiohttp.ClientSession() as http:
        for n in range(40):
            body = {
                "model": "claude-sonnet-4-6",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": f"turn {n} " + "x" * 20_000}],
            }
            async with http.post(proxy.url + "/v1/messages", json=body, headers=HEADERS) as r:
                assert r.status == 200
    await proxy.runner.cleanup()
    assert mode(state) == 0o700
    db = state / "sessions.db"
    for path in (db, state / "sessions.db-wal", state / "sessions.db-shm"):
        if path.exists():
            assert mode(path) == 0o600, path
    wal = state / "sessions.db-wal"
    assert not wal.exists() or wal.stat().st_size <= 4 * 1024 * 1024 + 65536 * 2
