"""The committed client traces (workloads/clients/*.jsonl), replayed without any client installed:
straight to a fresh simulator and through a fresh promptcache, request by request.

These run in a second each, so a pipeline change that costs a real client its cache hits fails here
even where the clients themselves cannot be installed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clients.harness import (
    DUMMY_KEY,
    KNOWN_REGRESSIONS,
    PER_TURN_CLIENTS,
    RESULTS,
    TARGET,
    TRACES_DIR,
    costlier_turns,
    dropped_content,
    fmt_ratio,
    load_records,
    optimum_after_first,
    replay,
    result_row,
)
from tests.clients.recipes import RECIPES

pytestmark = pytest.mark.clients

TRACES = sorted(TRACES_DIR.glob("*.jsonl"))


def test_every_recipe_has_a_committed_trace() -> None:
    assert {p.stem for p in TRACES} == set(RECIPES)


@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_committed_trace(path: Path, request: pytest.FixtureRequest) -> None:
    header = path.read_text().splitlines()[0]
    assert '"trace"' in header and '"description"' in header
    records = load_records(path)
    assert records and DUMMY_KEY not in path.read_text()
    straight = replay(records, "none")
    through = replay(records, "promptcache")
    optimum = optimum_after_first(records, path.stem)
    RESULTS.append(result_row(f"{path.stem} (committed)", records, straight, through, optimum))
    if path.stem in KNOWN_REGRESSIONS:
        request.applymarker(pytest.mark.xfail(reason=KNOWN_REGRESSIONS[path.stem], strict=False))
    assert not dropped_content(straight, through)
    if path.stem in PER_TURN_CLIENTS:
        assert not costlier_turns(straight, through)
    assert through.hit_ratio_after_first() >= straight.hit_ratio_after_first() - 1e-9
    if optimum is not None and optimum >= TARGET:
        assert through.hit_ratio_after_first() >= TARGET, fmt_ratio(through.hit_ratio_after_first())
