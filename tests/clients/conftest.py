"""Fixtures of the real-client suite: installs started once for every selected client, a table of
results printed at the end of the run (README-ready markdown)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.clients.harness import RESULTS, netns_available, start_installs, table
from tests.clients.recipes import RECIPES

COLUMNS = (
    "trace",
    "API",
    "requests",
    "hit ratio after 1st, straight",
    "hit ratio after 1st, promptcache",
    "optimum after 1st",
    "input cost straight",
    "input cost promptcache",
)


@pytest.fixture(scope="session", autouse=True)
def _start_client_installs(request: pytest.FixtureRequest) -> None:
    """Install every selected client concurrently from the start (each test waits for its own)."""
    wanted: set[str] = set()
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        name = callspec.params.get("client_run") if callspec is not None else None
        if name in RECIPES:
            wanted.add(RECIPES[name].install)
    if wanted:
        start_installs(sorted(wanted))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not RESULTS:
        return
    rows = sorted(RESULTS, key=lambda r: r["trace"])
    text = table(rows, COLUMNS)
    isolation = "private network namespace (unshare -n)" if netns_available() else "proxy variables only"
    terminalreporter.write_sep("-", "promptcache client suite")
    terminalreporter.write_line(f"client network isolation: {isolation}")
    terminalreporter.write_line(text)
    out = os.environ.get("PROMPTCACHE_CLIENT_TABLE")
    if out:
        Path(out).write_text(text + "\n")
