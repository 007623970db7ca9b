"""Attack pass, session 16 (atk1): explicit nulls read as absent (`proxy.nulls`) where the
reading is not the API's, or depends on what the process saw before."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.pipeline.replay import Masker
from proxy.providers import ANTHROPIC


def _masked(values: list[Any]) -> list[bytes]:
    """The masked digests of `values` examined in turn by one fresh `Masker` (Anthropic rules)."""
    masker = Masker()
    return [masker.examine_all([v], nulls=ANTHROPIC.identity_nulls)[1][0] for v in values]


def test_a_projected_digest_does_not_depend_on_what_the_memo_saw_first() -> None:
    """`{"role": null, "content": "hi"}` and its one-text-block form have one exact digest (the
    canonical form), so the projection memoised under it must be the same for both: it was made
    from the form seen first (the null dropped before `canonical_value`, which then no longer
    saw a `role`), so a process that had seen the other form gave another masked digest than a
    fresh one (session identity and replay depended on history)."""
    short = {"role": None, "content": "hi"}
    listed = {"role": None, "content": [{"type": "text", "text": "hi"}]}
    fresh_short, fresh_listed = _masked([short])[0], _masked([listed])[0]
    assert fresh_short == fresh_listed
    assert _masked([listed, short]) == [fresh_short, fresh_short]
    assert _masked([short, listed]) == [fresh_short, fresh_short]
    assert orjson.dumps(short) != orjson.dumps(listed)
