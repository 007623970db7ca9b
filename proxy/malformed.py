"""Malformed parts: a part of a body whose structural field has the wrong type (a content
block's `type`, a message's `role`, a tool's `name`, a tool call's `name` that is a number, a
list or an object instead of a string) is skipped by the stage that meets it, block by block,
and counted; it never fails the stage (before, one such part cost the whole request its
optimisation: fail open).

"Skipped" means the part is treated as a part of no known kind: a block of unknown `type`
gets no marker and no nested scan, a message of non-string `role` is not a system message and
has no identity-optional fields, a tool without a string name is not pinned or ranked, a call
without a string name has no pinned input. The part itself still goes upstream as sent (the
upstream answers it as it would).

The cores report through `skipped(kind)`, a side channel that costs nothing on well-formed
bodies; a body nested deeper than orjson writes (`is_too_deep`) is forwarded as sent and
counted as `too_deep`. `run_request_stages` opens one `Tally` per request, labels each count
with the stage running, and adds them to `promptcache_malformed_parts_total{stage,kind}`.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Final

KINDS: Final = ("block_type", "role", "tool_name", "call_name", "too_deep")
"""Label values of `promptcache_malformed_parts_total{kind}`."""


class Tally:
    """Malformed parts met during one request, by `(stage, kind)`."""

    __slots__ = ("stage", "counts")

    def __init__(self) -> None:
        self.stage = "parse"
        self.counts: dict[tuple[str, str], int] = {}


CURRENT: ContextVar[Tally | None] = ContextVar("promptcache_malformed_tally", default=None)


def skipped(kind: str) -> None:
    """Count one malformed part of `kind` (one of `KINDS`) for the stage running now."""
    tally = CURRENT.get()
    if tally is not None:
        key = (tally.stage, kind)
        tally.counts[key] = tally.counts.get(key, 0) + 1


def is_too_deep(exc: BaseException) -> bool:
    """`exc` is orjson refusing a value nested deeper than it writes (254 levels): the body is
    valid JSON the pipeline cannot re-serialise, so it goes upstream as sent, counted as
    `too_deep` rather than as a stage error (the stage did nothing wrong)."""
    return isinstance(exc, TypeError) and "Recursion limit reached" in str(exc)
