"""delivered: a note moved onto the newest user message is sent once per value, not every turn.

Reorder's `move_to_user` segments (a timestamp, a counter, Codex's `<current_time>`) and the
pin stage's `pin_changes_to_user` values (Claude Code's billing header when it changes) travel
as leading text blocks of the newest user message. Replay then keeps each earlier message with
the bytes it was sent with, so a value once delivered stays in the history the model reads.
Delivering the same value again on the next user message only adds tokens (Hermes emits its
voice-state note only on change for the same reason): a moved note is dropped while its value
equals the one last delivered in the session and the message that carried it is still in the
history as sent. The model still sees every new value once, on the turn it changes.

Pure core:
- `carried(delivered, digests, sidecars, skip)`: of the session's delivered notes
  (`SessionRecord.delivered`: `(slot, text, position)`), those still in the history: every
  message up to `position` (the last message of the request that delivered it, so the carrier
  is included) is unchanged, by the session's sidecars (`digests[i] == sidecar.digest`, the
  very test replay splices by), and `position` is not this request's newest message. Replay
  then sends those messages with their stored bytes, the note among them.
- `next_delivered(carried, fresh, position)`: the record's new entries: the carried ones, and
  this request's deliveries at `position` (the last index of its message array). A note no
  longer carried is forgotten (it is delivered again when it next moves). At most
  `MAX_DELIVERED` entries, each text at most `MAX_NOTE_CHARS` (a longer one is not recorded: it
  is delivered on every turn, as before).

A slot names a note across turns: `move` + the rules of the moved segments + their ordinal
(reorder), `pin` + the pin key (`proxy.pipeline.pins`).

Stage glue (`carried_notes(exchange)`): computed once per request from the session stage's
`Exchange.previous` and `Exchange.message_view`; the reorder and pin stages drop the notes it
holds and add what they deliver to `Exchange.delivered_notes`, which the session record keeps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from proxy.exchange import Exchange
from proxy.store.codec import Sidecar

MAX_DELIVERED: Final = 64
MAX_NOTE_CHARS: Final = 8192

Entry = tuple[str, str, int]
"""`(slot, text, position)` of one delivered note."""


def carried(
    delivered: Iterable[Entry],
    digests: Sequence[bytes],
    sidecars: Sequence[Sidecar],
    skip: frozenset[int] = frozenset(),
) -> dict[str, Entry]:
    """slot -> entry, for the delivered notes whose carrier is still in the history (module
    docstring). `digests` are the client's masked message digests of this request (one per
    element of the message array), `skip` its system-section positions."""
    entries = [e for e in delivered if isinstance(e, tuple) and len(e) == 3]
    if not entries:
        return {}
    stored = {s.position: s.digest for s in sidecars}
    newest = len(digests) - 1
    unchanged = -1
    """Last position up to which every message matches its sidecar."""
    for i in range(newest):
        if i not in skip and stored.get(i) != digests[i]:
            break
        unchanged = i
    return {slot: (slot, text, p) for slot, text, p in entries if 0 <= p <= unchanged}


def next_delivered(
    carried_now: Mapping[str, Entry], fresh: Iterable[tuple[str, str]], position: int
) -> tuple[Entry, ...]:
    """The session's entries after this request (module docstring); `fresh` = `(slot, text)` of
    the notes delivered by this request, `position` the last index of its message array."""
    out = dict(carried_now)
    for slot, text in fresh:
        if len(text) <= MAX_NOTE_CHARS:
            out[slot] = (slot, text, position)
        else:
            out.pop(slot, None)
    return tuple(sorted(out.values()))[:MAX_DELIVERED]


def carried_notes(exchange: Exchange) -> dict[str, Entry]:
    """`carried` for this request's session (empty without a previous record), once
    (`Exchange.carried_notes`)."""
    if exchange.carried_notes is not None:
        return exchange.carried_notes
    previous, view = exchange.previous, exchange.message_view
    out: dict[str, Entry] = {}
    if previous is not None and view is not None and previous.delivered:
        out = carried(previous.delivered, view.digests, previous.sidecars, view.system_positions)
    exchange.carried_notes = out
    return out


def last_position(exchange: Exchange) -> int:
    """Index of the last element of the request's message array (`-1` without a view)."""
    view = exchange.message_view
    return len(view.digests) - 1 if view is not None else -1


def texts_of(entries: Mapping[str, Entry]) -> dict[str, str]:
    """slot -> text of `carried` entries (what the pure cores compare with)."""
    return {slot: text for slot, (_, text, _) in entries.items()}


def record_delivery(exchange: Exchange, fresh: Sequence[tuple[str, str]], position: int) -> None:
    """Add this stage's deliveries to `Exchange.delivered_notes` (the carried ones first)."""
    current = exchange.delivered_notes
    base = {e[0]: e for e in current} if current is not None else carried_notes(exchange)
    exchange.delivered_notes = next_delivered(base, fresh, position)
