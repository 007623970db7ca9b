"""`SqliteStore`: the embedded default `SessionStore`, one file, survives restarts.

- Writes (put, delete, purge, checkpoints, health checks) run on ONE dedicated writer thread
  that owns the read-write connection (measured: aiosqlite was no faster). Small record writes
  are paced: a write transaction starts at most once per `WRITE_INTERVAL` (a write after a quiet
  spell, or one of `PACED_BYTES` or more, starts at once), and the writes queued meanwhile go
  in it, so a steady stream of requests costs one thread wake-up and one commit per interval,
  not per request; reads run on a
  second thread with its own read-only connection, so a read never queues behind a write,
  a purge or a WAL checkpoint (WAL readers and the writer do not block each other). The
  event loop only awaits futures. Reads queued while the reader thread is busy are answered
  together, up to `READ_ROWS[0]` reads and about `READ_STATEMENT_BYTES` per statement, each
  statement ONE step of SQLite (heads and parts as one row: `_read_statement`). `get_within`
  bounds a read by the store's own time (its statement's, or the reader stuck that long in the
  statement ahead), not by its place in the queue nor by when the busy event loop gets round
  to looking.
- New files get `page_size=PAGE_SIZE` (4 KiB: every page a transaction changes is written whole
  to the WAL, and a small record's write changes the table's and each index's leaf page, so
  the page size is most of its cost: measured here, one 1.7 KB record per transaction 85 us of
  writer CPU at 4 KiB against 210 us at 16 KiB, 30 against 55 us per record in batches of 4;
  the larger pages read a 600 KB value faster, 0.35 against 0.7 ms, which matters little once
  a long record is written in parts), WAL,
  `synchronous=NORMAL`, `secure_delete=FAST` (`SECURE_DELETE`: an eviction writes the pages it
  changes, not zeros over each page it frees), mode 0600 (the WAL and SHM files inherit it); the WAL is checkpointed
  and truncated at a quarter of the data size (4-64 MiB, `_size_wal`, re-sized at each purge).
  Schema version in `PRAGMA user_version` (`SCHEMA_VERSION`).
- In parts (`put_parts`, `proxy.store.base`): the head is the `sessions` row's value (its
  `parts` column counts the parts, its `size` is head and parts together, so the caps and the
  `usage` figures count them), the parts it names are rows of `parts` keyed by `(tenant,
  session, key)`, and their bytes rows of `part_values` keyed by `(tenant, key)`: once per
  tenant, whichever of its sessions name them (a part's name is the xxh3-128 of its bytes, so
  one name is one content). A new session re-sending a recent conversation (a fork, a subagent,
  a resume) writes its new parts' bytes only: `bench/store_writer_bench.py --shared`, 1.7 ->
  0.6 ms of writer CPU per 600 KB session below the cap, 2.4-2.9 -> 1.2-1.3 ms at it; with no
  part shared the two indexes ordered by name cost 1.7 -> 2.0-2.2 and 2.4 -> 3.1-3.3 ms. One
  write checks the parts it keeps against the rows held (a missing one: nothing written,
  `False`), deletes the ones no longer named, inserts the new ones and upserts the head, in the
  batch's transaction: a crash leaves the old value or the new one, never a mix. Triggers
  delete a row's parts when the row goes (delete, expiry purge, eviction) or is overwritten by
  a plain value, and a part's bytes when no session of its tenant names it any more.
  `get_parts` reads the head and its parts in one statement (one snapshot of the WAL), but for
  the parts the caller says it holds (`known`), which stay in the file.
- Expiry is wall-clock (`expires`, epoch seconds) so it holds across restarts; expired rows are
  invisible to `get` and purged at most once a minute during `put` (after the batch's commit).
- Bounded in bytes: at most `max_bytes` of values in the file and `max_tenant_bytes` per tenant
  (settings `store_max_bytes`, `store_max_bytes_per_tenant`). Each row keeps its value's size and
  a write sequence number (`written`); triggers keep the bytes per tenant (and the total, under
  the tenant `''`, which no key can name) in the `usage` table, so every worker process sharing
  the file sees the same figures. A transaction of writes (`put` batches the writes queued
  meanwhile, `MAX_BATCH`) that takes a tenant (then the file) over its cap evicts that tenant's
  (then anyone's) least recently written rows, in the same transaction, at most
  `MAX_EVICTIONS_PER_PUT` rows per tenant and transaction (a lowered cap is reached over the
  next writes). A
  value over the per-tenant cap is not stored (and the key's older value is removed). Each eviction
  and each skipped value is reported through `on_evict(cap, rows)` (`tenant`, `total`,
  `too_large`). The per-tenant cap is what keeps one tenant's flood from evicting the others.
- Several processes on one file (`serve --workers N`): each has its own writer and reader.
  The writer waits for the file's write lock while another process holds it
  (`WRITE_LOCK_WAIT_MS`, 500 ms, SQLite's busy handler with the GIL released: the event loop
  and the reader go on, and the writes queued meanwhile go in its next transaction); the lock
  is held for one transaction of a few statements, and readers never wait for it (WAL). A
  lock held past that fails the batch with `sqlite3.OperationalError` (`locked`, within
  `proxy.store.PUT_TIMEOUT`); the caller counts it and the request goes on without replay.
  The reader fails fast (`busy_timeout` 20 ms: only the file's recovery locks a WAL reader
  out). The write sequence numbers, the `usage` figures and the evictions are worked out
  inside each write transaction, so they hold across the processes; each process's
  connection checkpoints when its commit finds the WAL past the limit (PASSIVE, after the
  commit, so it holds no write lock; the other's attempt meanwhile skips, without error), and
  a WAL the others' appends kept those from restarting is restarted (`_catch_up_wal`). The
  expiry purge runs in its own transaction after a batch's commit: one that finds the file
  locked fails no write and is tried again with the next write. A file that is not a database (corrupt) is
  moved aside to `<name>.corrupt-<epoch>` (a valid file of a newer schema, a rollback: to
  `<name>.schema-<version>-<epoch>`) when the connection is (re)opened, and a fresh file is
  started: losing state costs one cache write, never a wrong byte. Every failed operation drops
  the connection, so the next one reopens it.
- Health (`check`, `fault_kind`; `proxy.store.RecordStore` counts and reports it): before each
  operation the device and inode of the path, its `-wal` and its `-shm` are compared with the
  open files'. A file (any of the three) deleted or
  replaced mid-run (writes would go on to the unlinked file, lost at restart and invisible to
  every other reader) is reported (`on_fault("file_gone")`) and a fresh file is created at the
  path at once: what was deleted stays deleted (someone removing the file may mean to purge the
  prompt text it held); the sessions go without replay for one turn. `check()` also needs
  `MIN_FREE_BYTES` free on the file's filesystem and writes the schema version (a real write
  transaction), so a full disk or a read-only mount is seen without waiting for a request.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import functools
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import quote

from proxy.store.base import Part, StoreFault, check_key

SCHEMA_VERSION: Final = 4
"""1: `sessions(tenant, session, expires, value)`; 2 adds `size`, `written` and `usage`; 3 the
`parts` column and table; 4 keeps a part's bytes once per tenant (`part_values`; `parts` names
them per session) (migrated in place when an older file is opened)."""
PAGE_SIZE: Final = 4096
"""Page size of a new file (module docstring: a page, and its WAL frame, is written whole)."""
SECURE_DELETE: Final = "FAST"
"""The writer's `secure_delete` (sqlite.org/pragma.html#pragma_secure_delete): deleted content is
zeroed where the page is written anyway (a b-tree leaf), not in the pages a delete frees, which
SQLite's `ON` (Debian's build defaults to it) zeroes and appends to the WAL, one page each. A
600 KB record evicted for a new one then cost the writer 600 KB of writes more (measured:
323 WAL frames for a 38-part record written over an evicted one, against 171 with `FAST`;
new 600 KB sessions written back to back at the tenant cap, 1.38-1.54x a second with `FAST`:
`bench/store_writer_bench.py`). Freed pages keep their old bytes until reused, as the WAL keeps
every page's older frames until it restarts: the file (mode 0600) is what guards the prompt
text, not the zeroing. Set on the writer's connection, so the file behaves the same whatever
the library's default."""
BUSY_TIMEOUT_MS: Final = 20
"""Milliseconds the reader's connection waits on a lock (a WAL reader waits on none but the
file's recovery): a read fails fast, well within `proxy.store.GET_TIMEOUT`."""
WRITE_LOCK_WAIT_MS: Final = 500
"""Milliseconds the writer's connection waits for the file's write lock (`BEGIN IMMEDIATE`, a
checkpoint, the schema at open) while another process holds it: SQLite's busy handler, which
sleeps in steps of 1 to 100 ms with the GIL released, so neither the event loop nor the reader
waits. Another worker of `serve --workers N` holds the lock for its own transaction, a few
statements, each a GIL handoff of up to 5 ms in its busy process (measured here, the gateway
bench's two 64-connection cells with `--workers 2`, three rounds on a loaded machine: 514-610
writes a round found the lock held past the former 20 ms and were lost, none once the writer
waited; CPU per request the same within the noise). Below `proxy.store.PUT_TIMEOUT` (1 s, the write's own bound, from
the start of its transaction), so a lock held that long fails the batch as `locked`, not as a
timeout, and the writer goes on with the writes queued behind it."""
CLOSE_READER_TIMEOUT: Final = 1.0
"""Seconds the writer waits for the reader thread to close its connection (file replaced)."""
PURGE_INTERVAL: Final = 60.0
"""Seconds between purges of expired rows."""
MIN_FREE_BYTES: Final = 1024 * 1024
"""Free space `check()` wants on the file's filesystem (16 pages of 64 KiB): below it the
next record write may fail, so the store reports `disk_full`."""

_CODE_KINDS: Final = {
    13: "disk_full",  # SQLITE_FULL
    8: "read_only",  # SQLITE_READONLY
    5: "locked",  # SQLITE_BUSY
    6: "locked",  # SQLITE_LOCKED
    14: "cannot_open",  # SQLITE_CANTOPEN
    11: "corrupt",  # SQLITE_CORRUPT
    26: "corrupt",  # SQLITE_NOTADB
}
"""Primary SQLite result codes (sqlite.org/rescode.html) by fault kind."""
_ERRNO_KINDS: Final = {
    errno.ENOSPC: "disk_full",
    errno.EDQUOT: "disk_full",
    errno.EROFS: "read_only",
    errno.EACCES: "read_only",
    errno.EPERM: "read_only",
    errno.ENOENT: "cannot_open",
}

_log = logging.getLogger("promptcache.store.sqlite")
_T = TypeVar("_T")

DEFAULT_MAX_BYTES: Final = 1024 * 1024 * 1024
"""Value bytes the file may hold (setting `store_max_bytes`)."""
DEFAULT_MAX_TENANT_BYTES: Final = 256 * 1024 * 1024
"""Value bytes one tenant may hold (setting `store_max_bytes_per_tenant`)."""
MAX_BATCH: Final = 256
"""Writes one transaction takes at most: the writes queued while the writer thread was busy go
in one transaction, one wake-up of the thread (`put`)."""
WRITE_INTERVAL: Final = 0.05
"""Seconds between the starts of two write transactions at least (`put`). Measured here (1 KB
first requests, one connection, ~1,000 requests/s): one transaction per request cost the process
about 0.5 ms of CPU and of added p50 per request (a wake-up of the writer thread, a GIL handoff
at each of its statements, a wake-up of the loop), against a `memory://` store. Each
transaction's fixed statements (the file's identity, `BEGIN`, the sequence number, the usage
lookup, `COMMIT`) are GIL handoffs with a busy event loop, and each costs both threads CPU (and
the loop's C calls that release the GIL, such as the replay prefilter's search, wait behind
them): at 0.01 s (about ten writes a transaction) the writer thread took 190-215 us of CPU per
write and the process 1.47-1.76 ms per request, at 0.05 s 108-126 us and 1.38-1.43 ms
(`bench/small_cpu.py --peers bare,observe`, three runs each, load 1-3). The record of a request
under `PACED_BYTES` is written at most this much later (the writing process reads its own
pending writes at once: `proxy.store.RecordStore`; another process sharing the file reads the
previous record meanwhile, which costs that turn its replay, never a wrong byte)."""
PACED_BYTES: Final = 64 * 1024
"""A write sending this many bytes or more (value, or head and the parts' data) is not paced: it
starts its transaction at once, with the writes queued before it. Its cost is its bytes, not the
transaction's, and waiting would hold its memory longer (a new 600 KB session's first record is
counted twice against `proxy.store.MAX_PENDING_BYTES` while it waits)."""
MAX_EVICTIONS_PER_PUT: Final = 1024
"""Rows one write may evict (keeps a write's time bounded whatever the caps were before)."""
TOTAL: Final = ""
"""The `usage` row of the whole file (no tenant key can be empty)."""

_SCHEMA_V1: Final = (
    "CREATE TABLE IF NOT EXISTS sessions ("
    " tenant TEXT NOT NULL, session TEXT NOT NULL, expires REAL NOT NULL, value BLOB NOT NULL,"
    " PRIMARY KEY (tenant, session))",
    "CREATE INDEX IF NOT EXISTS sessions_expires ON sessions (expires)",
)
_SCHEMA_V2: Final = (
    "ALTER TABLE sessions ADD COLUMN size INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE sessions ADD COLUMN written INTEGER NOT NULL DEFAULT 0",
    "UPDATE sessions SET size = length(value), written = rowid",
    "CREATE INDEX sessions_written ON sessions (written)",
    "CREATE INDEX sessions_tenant_written ON sessions (tenant, written)",
    "CREATE TABLE usage (tenant TEXT PRIMARY KEY, bytes INTEGER NOT NULL) WITHOUT ROWID",
    "INSERT INTO usage SELECT tenant, sum(size) FROM sessions GROUP BY tenant",
    "INSERT INTO usage SELECT '', ifnull(sum(size), 0) FROM sessions",
    "CREATE TRIGGER sessions_added AFTER INSERT ON sessions BEGIN"
    " INSERT INTO usage VALUES (new.tenant, new.size), ('', new.size)"
    " ON CONFLICT (tenant) DO UPDATE SET bytes = bytes + excluded.bytes; END",
    "CREATE TRIGGER sessions_removed AFTER DELETE ON sessions BEGIN"
    " UPDATE usage SET bytes = bytes - old.size WHERE tenant IN (old.tenant, ''); END",
    "CREATE TRIGGER sessions_changed AFTER UPDATE OF size ON sessions BEGIN"
    " UPDATE usage SET bytes = bytes - old.size + new.size WHERE tenant IN (new.tenant, ''); END",
)
"""Version 1 to 2, run in one transaction (a new file runs both)."""
_SCHEMA_V3: Final = (
    "ALTER TABLE sessions ADD COLUMN parts INTEGER NOT NULL DEFAULT 0",
    "CREATE TABLE parts (tenant TEXT NOT NULL, session TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL)",
    "CREATE UNIQUE INDEX parts_key ON parts (tenant, session, key)",
    "CREATE TRIGGER sessions_parts_removed AFTER DELETE ON sessions WHEN old.parts > 0 BEGIN"
    " DELETE FROM parts WHERE tenant = old.tenant AND session = old.session; END",
    "CREATE TRIGGER sessions_parts_replaced AFTER UPDATE OF parts ON sessions"
    " WHEN old.parts > 0 AND new.parts = 0 BEGIN"
    " DELETE FROM parts WHERE tenant = new.tenant AND session = new.session; END",
)
"""Version 2 to 3."""
_SCHEMA_V4: Final = (
    "CREATE TABLE part_values (tenant TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL)",
    "CREATE UNIQUE INDEX part_values_key ON part_values (tenant, key)",
    "INSERT OR IGNORE INTO part_values (tenant, key, value) SELECT tenant, key, value FROM parts",
    "UPDATE parts SET value = x''",
    "CREATE INDEX parts_named ON parts (tenant, key)",
    "CREATE TRIGGER parts_unnamed AFTER DELETE ON parts BEGIN"
    " DELETE FROM part_values WHERE tenant = old.tenant AND key = old.key"
    " AND NOT EXISTS (SELECT 1 FROM parts WHERE tenant = old.tenant AND key = old.key); END",
)
"""Version 3 to 4: a part's bytes once per tenant (`part_values`, keyed by its name: the same
name is the same bytes, `proxy.store.base.Part`), each session's parts as names (`parts`, whose
version 3 `value` column is emptied and left empty, not dropped: `ALTER TABLE ... DROP COLUMN`
needs SQLite 3.35, and RHEL 9's Python links 3.34; attack pass, session 17); the bytes go with
the last session naming them (`parts_unnamed`). A write in parts inserts the new
bytes (those the tenant holds already are left as they are: a new session re-sending a recent
conversation writes its new parts only), then the names, in one statement each: no trigger runs
per inserted row (measured here, one a row cost a 600 KB session of distinct parts 0.3 ms more
of writer CPU than the plain insert of version 3; two statements cost what that did)."""
_MIGRATIONS: Final = {
    0: (*_SCHEMA_V1, *_SCHEMA_V2, *_SCHEMA_V3, *_SCHEMA_V4),
    1: (*_SCHEMA_V1, *_SCHEMA_V2, *_SCHEMA_V3, *_SCHEMA_V4),
    2: (*_SCHEMA_V3, *_SCHEMA_V4),
    3: _SCHEMA_V4,
}
"""The statements that bring a file of each older version to `SCHEMA_VERSION`."""
_PUT_ROW: Final = "(?, ?, ?, ?, ?, ?, ?)"
_PUT_HEAD: Final = "INSERT INTO sessions (tenant, session, expires, value, size, parts, written) VALUES "
_PUT_TAIL: Final = (
    " ON CONFLICT (tenant, session) DO UPDATE SET expires = excluded.expires, value = excluded.value,"
    " size = excluded.size, parts = excluded.parts, written = excluded.written"
)
_LAST_WRITTEN: Final = "SELECT ifnull(max(written), 0) FROM sessions"
STATEMENT_ROWS: Final = (64, 16, 4, 1)
"""Rows one statement carries (a run of writes is cut greedily into these sizes, a lookup padded
up to one of them): each statement is ONE step of SQLite, so ONE release of the GIL, whatever
its rows (sqlite3 releases it around every step, and every row a query returns is a step too;
re-taking it from a busy event loop costs up to the switch interval, 5 ms: measured here, 0.006
ms per one-row insert with the loop idle, 3.3 ms with it busy); four sizes keep the statement
cache small. So a transaction takes a few steps whatever its writes: `_put_many`."""


def _statement_sizes(rows: int) -> list[int]:
    """`rows` cut greedily into `STATEMENT_ROWS` sizes (`37 -> [16, 16, 4, 1]`)."""
    sizes = []
    for size in STATEMENT_ROWS:
        while rows >= size:
            sizes.append(size)
            rows -= size
    return sizes


def _padded_sizes(rows: int, allowed: Sequence[int] = STATEMENT_ROWS) -> list[int]:
    """`rows` covered by as few `allowed` sizes (largest first) as possible, the last padded up
    (`2 -> [4]`, `70 -> [64, 16]`): for lookups, where a padding row matches nothing."""
    sizes = []
    while rows > 0:
        size = next(s for s in reversed(allowed) if s >= min(rows, allowed[0]))
        sizes.append(size)
        rows -= size
    return sizes


READ_ROWS: Final = (16, 4, 1)
"""Reads one read statement takes at most (`_read_statement`): the reads queued while the
reader thread was busy are cut into these sizes, the last padded up. Each statement is ONE
step, so ONE release of the GIL, whatever its records and parts (session 7: a 600 KB record
read as a head and ~37 part rows, one step each, took up to 5 ms per step from a busy loop,
and after a restart 97 of 140 reads timed out)."""
READ_STATEMENT_BYTES: Final = 1024 * 1024
"""Bytes one read statement answers with, about: its reads are taken in order while the bytes
of those before stay below this (the first always), the others wait for the next statement.
So a statement's time stays short whatever the records (measured here, loaded machine, 4 x 600
KB in one statement 10-30 ms, 16 x 600 KB 40-150 ms: past `GET_TIMEOUT` for the reads in it
and behind it), and the moment its answer is held twice (SQLite's copy and Python's) is small."""


@functools.cache
def _read_statement(rows: int) -> str:
    """The heads of `rows` keys (and, for a read in parts, their parts) as ONE row: an index
    `'<i> <part key hex, or - for the head, or + for a read left for later> <bytes>,...'` (`i`
    the read's position) and every value back to back in the index's order (both aggregates
    see the rows in one pass, so in the same order). A read is left for later when the bytes
    of the reads found before it (`sessions.size`, head and parts; a plain read counts its
    value) reach `READ_STATEMENT_BYTES`. Arguments: `(i, tenant, session, is_parted, known)`
    per read (a padding row `(-1, '', '', 0, x'')` matches nothing; `known`: the 16-byte names
    of the parts the caller holds, back to back, which are left out: a name found at a
    multiple of 16 in it, so a match across two names' boundary leaves nothing out), the
    clock, then the byte bound three times. One statement reads one snapshot."""
    return (
        "WITH w(i, t, s, p, k) AS (VALUES " + ", ".join(["(?, ?, ?, ?, ?)"] * rows) + "),"
        " f AS (SELECT w.i AS i, w.t AS t, w.s AS s, w.p AS p, w.k AS k, se.value AS v, se.parts AS n,"
        " CASE WHEN w.p = 1 THEN se.size ELSE length(se.value) END AS z"
        " FROM w JOIN sessions AS se ON se.tenant = w.t AND se.session = w.s WHERE se.expires > ?),"
        " h AS (SELECT *, sum(z) OVER (ORDER BY i ROWS UNBOUNDED PRECEDING) - z AS before FROM f)"
        " SELECT group_concat(r.i || ' ' || r.k || ' ' || length(r.v)), CAST(group_concat(r.v, '') AS BLOB)"
        " FROM (SELECT i, '-' AS k, v FROM h WHERE before < ?"
        " UNION ALL SELECT i, '+', x'' FROM h WHERE before >= ?"
        " UNION ALL SELECT h.i, hex(pa.key), pv.value FROM h JOIN parts AS pa ON pa.tenant = h.t AND pa.session = h.s"
        " JOIN part_values AS pv ON pv.tenant = pa.tenant AND pv.key = pa.key"
        " WHERE h.p = 1 AND h.n > 0 AND h.before < ? AND (instr(h.k, pa.key) - 1) % 16 != 0) AS r"
    )


def _known_names(known: Collection[bytes]) -> bytes:
    """The names of `known` parts as `_read_statement` takes them: the 16-byte ones back to back
    (a part name is an xxh3-128, `proxy.store.base.Part`; another length is never left out)."""
    return b"".join(name for name in known if len(name) == 16)


_Read = tuple[str, str, bool, bytes]
"""One read: `(tenant, session, is_parted, known)` (`known`: `_known_names`, `b""` for none)."""


READER_STUCK: Final = 0.25
"""Seconds without the reader thread beginning or ending a statement after which the reads
queued behind it give up (`get_within`; at least its `timeout`): a statement that slow means a
frozen or locked file, not a busy one (a statement takes 2-30 ms here, loaded machine). While
the thread is in one statement that long, a new read gives up at once."""


_Found = tuple[bytes, dict[bytes, bytes]]
"""A read's answer: the value (a head, for a read in parts) and the parts (empty for `get`)."""


def _read_rows(
    conn: sqlite3.Connection,
    reads: Sequence[_Read],
    size: int,
    now: float,
    max_bytes: int = READ_STATEMENT_BYTES,
) -> tuple[list[_Found | None], list[int]]:
    """`_Read`s (at most `size`) in ONE statement of `size` rows
    (`_read_statement`, padded): per read its answer (`None` for a key absent or expired),
    and the positions of the reads left for a later statement (`max_bytes` reached before
    them; never the first one found)."""
    args: list[Any] = []
    for i in range(size):
        if i < len(reads):
            tenant, session, is_parted, known = reads[i]
            args.extend((i, tenant, session, int(is_parted), known))
        else:
            args.extend((-1, "", "", 0, b""))
    args.extend((now, max_bytes, max_bytes, max_bytes))
    listing, blob = conn.execute(_read_statement(size), args).fetchone()
    found: list[_Found | None] = [None] * len(reads)
    later: list[int] = []
    if listing is None:
        return found, later
    parts: dict[int, dict[bytes, bytes]] = {}
    heads: dict[int, bytes] = {}
    at = 0
    for item in listing.split(","):
        i, key, length = item.split(" ")
        end = at + int(length)
        if key == "-":
            heads[int(i)] = blob[at:end]
        elif key == "+":
            later.append(int(i))
        else:
            parts.setdefault(int(i), {})[bytes.fromhex(key)] = blob[at:end]
        at = end
    for i, head in heads.items():
        found[i] = (head, parts.get(i, {}))
    return found, sorted(later)


@functools.cache
def _put_statement(rows: int) -> str:
    return _PUT_HEAD + ", ".join([_PUT_ROW] * rows) + _PUT_TAIL


@functools.cache
def _delete_statement(rows: int) -> str:
    # the OR form searches the primary key per row; `(tenant, session) IN (VALUES ...)` scans the table
    return "DELETE FROM sessions WHERE " + " OR ".join(["(tenant = ? AND session = ?)"] * rows)


@functools.cache
def _held_statement(rows: int) -> str:
    """The parts held by `rows` sessions as ONE row: `'<i> <rowid> <hex key>,...'` (`i` the
    session's position in the run; a padding row `(-1, '', '')` matches nothing)."""
    return (
        "WITH w(i, t, s) AS (VALUES " + ", ".join(["(?, ?, ?)"] * rows) + ")"
        " SELECT group_concat(w.i || ' ' || p.rowid || ' ' || hex(p.key))"
        " FROM w JOIN parts AS p ON p.tenant = w.t AND p.session = w.s"
    )


@functools.cache
def _drop_parts_statement(rows: int) -> str:
    return "DELETE FROM parts WHERE rowid IN (" + ", ".join(["?"] * rows) + ")"


@functools.cache
def _add_values_statement(rows: int) -> str:
    """New parts' bytes, `(tenant, key, value)` each: a name the tenant holds already keeps its
    row (the same bytes)."""
    return "INSERT OR IGNORE INTO part_values (tenant, key, value) VALUES " + ", ".join(["(?, ?, ?)"] * rows)


@functools.cache
def _rewrite_values_statement(rows: int) -> str:
    """Parts' bytes sent again by a session that names them already, `(tenant, key, value)` each:
    written over the row when they differ (its writer did not know what the file holds for the
    session: after a read that found a part not the bytes it names, a failed write, or its index
    of them dropped), so a damaged part (a flipped bit: SQLite keeps no page checksum) is
    repaired for every session of the tenant naming it, as version 3's per-session copy was,
    instead of missing on every turn (attack pass, session 17). Equal bytes are compared, not
    written again."""
    return (
        "INSERT INTO part_values (tenant, key, value) VALUES "
        + ", ".join(["(?, ?, ?)"] * rows)
        + " ON CONFLICT (tenant, key) DO UPDATE SET value = excluded.value WHERE value != excluded.value"
    )


@functools.cache
def _add_parts_statement(rows: int) -> str:
    """New parts' names, `(tenant, session, key)` each (their bytes inserted first; the row's
    `value` column, version 3's bytes, stays empty: `_SCHEMA_V4`)."""
    return "INSERT OR IGNORE INTO parts (tenant, session, key, value) VALUES " + ", ".join(["(?, ?, ?, x'')"] * rows)


@functools.cache
def _usage_statement(rows: int) -> str:
    """The bytes of `rows` tenants as ONE row: `'<tenant> <bytes>,...'` (padded with `TOTAL`)."""
    return "SELECT group_concat(tenant || ' ' || bytes) FROM usage WHERE tenant IN (" + ", ".join(["?"] * rows) + ")"


def _write_rows(
    conn: sqlite3.Connection, statement: Callable[[int], str], rows: Sequence[Sequence[Any]], written: int = -1
) -> int:
    """`rows` written in `STATEMENT_ROWS`-sized statements; with `written >= 0` each row gets the
    next write sequence number appended (`_put_statement`). Returns the last number given."""
    at = 0
    for size in _statement_sizes(len(rows)):
        args: list[Any] = []
        for row in rows[at : at + size]:
            args.extend(row)
            if written >= 0:
                written += 1
                args.append(written)
        conn.execute(statement(size), args)
        at += size
    return written


KEYS_PER_STATEMENT: Final = 8192
"""Keys one listing statement returns (`_list_keys`), as ONE row: a listing of the whole file
row by row took one step, one GIL handoff, per key (up to 5 ms each from a busy loop)."""
_KEYS: Final = (
    "SELECT max(id), count(*), group_concat(tenant || ' ' || session) FROM ("
    " SELECT rowid AS id, tenant, session FROM sessions WHERE rowid > ? AND expires > ? ORDER BY rowid LIMIT ?)"
)


def _list_keys(conn: sqlite3.Connection, now: float) -> list[tuple[str, str]]:
    """Every `(tenant, session)` key unexpired at `now`, `KEYS_PER_STATEMENT` per statement in
    rowid order (key parts hold neither ` ` nor `,`: `proxy.store.base.check_key`)."""
    keys: list[tuple[str, str]] = []
    after = 0
    while True:
        last, count, listing = conn.execute(_KEYS, (after, now, KEYS_PER_STATEMENT)).fetchone()
        if listing:
            for item in listing.split(","):
                tenant, session = item.split(" ")
                keys.append((tenant, session))
        if count < KEYS_PER_STATEMENT:
            return keys
        after = last


_EVICT: Final = (
    "DELETE FROM sessions WHERE rowid IN (SELECT id FROM ("
    " SELECT id, size, sum(size) OVER (ORDER BY written ROWS UNBOUNDED PRECEDING) AS upto FROM ("
    " SELECT rowid AS id, size, written FROM sessions {where} ORDER BY written LIMIT ?))"
    " WHERE upto - size < ?)"
)
"""One statement (one step) deleting the least recently written rows (at most `LIMIT`) until
their sizes reach the excess: a row goes when the rows written before it sum to less."""
_EVICT_OF_TENANT: Final = _EVICT.format(where="WHERE tenant = ?")
_EVICT_ANY: Final = _EVICT.format(where="")
_PURGE: Final = "DELETE FROM sessions WHERE expires <= ?"


WAL_MIN_BYTES: Final = 4 * 1024 * 1024
WAL_MAX_BYTES: Final = 64 * 1024 * 1024


WAL_BEHIND: Final = 2
"""A WAL this many times its limit (`_size_wal`) means the passive checkpoints are not catching
up: another process kept appending while each ran, so none reached the WAL's end and SQLite
never restarted it (measured here, two processes writing 23 MiB: the WAL grew to 26 MB, one
process alone kept it at 4.5 MB; with this, 9 MB at most). The writer then runs one `wal_checkpoint(RESTART)`
(`SqliteStore._catch_up_wal`)."""


CATCH_UP_WAIT_MS: Final = 20
"""Milliseconds the restart of a WAL that fell behind (`SqliteStore._catch_up_wal`) waits for the
write lock and then for the readers to leave the WAL: it holds the write lock meanwhile, so the
other processes' writes wait that long (at most), never their whole `WRITE_LOCK_WAIT_MS`. A
reader that keeps its snapshot (an operator's `sqlite3` shell, a backup) made every batch's
restart hold the lock 500 ms and the other worker's writes fail as `locked` (attack pass,
session 9: 64 of 300 writes lost per worker, every put 505 ms)."""
CATCH_UP_TRIES: Final = 4
"""Restarts in a row that could not finish (a reader still in the WAL, the lock held, or another
process's checkpoint running) before the writer waits `CATCH_UP_BACKOFF`: with two writers about
every other try meets the other's checkpoint (and the next one gets through); a reader keeping
its snapshot fails every one."""
CATCH_UP_BACKOFF: Final = 1.0
"""Seconds the writer waits after `CATCH_UP_TRIES` unfinished restarts before it tries again."""


def _size_wal(conn: sqlite3.Connection) -> int:
    """Checkpoint policy sized to the data: the WAL is checkpointed once it holds a quarter of
    the database (at least 4 MiB, at most 64 MiB) and truncated back to that size afterwards
    (SQLite's default, 1,000 pages, is 64 MiB with 64 KiB pages whatever the data size).
    Returns that size in bytes."""
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    limit = max(WAL_MIN_BYTES, min(WAL_MAX_BYTES, pages * page_size // 4))
    conn.execute(f"PRAGMA wal_autocheckpoint = {max(1, limit // page_size)}")
    conn.execute(f"PRAGMA journal_size_limit = {limit}")
    return limit


def _until_unlocked(run: Callable[[], _T], wait: float = WRITE_LOCK_WAIT_MS / 1000) -> _T:
    """`run()`, tried again while it finds the file locked (`SQLITE_BUSY`) for up to `wait`
    seconds, after 1 ms, then twice as long each time up to 50 ms (`time.sleep`, the GIL
    released): for a statement SQLite runs without its busy handler. On the writer thread only
    (`SqliteStore._connect`), never the event loop. The one here is the switch of a new file
    into WAL (it wants the exclusive lock once): two worker processes opening a new file at the
    same moment, one of them failed at start about once in 80 tries here."""
    deadline = time.monotonic() + wait
    pause = 0.001
    while True:
        try:
            return run()
        except sqlite3.OperationalError as exc:
            code = getattr(exc, "sqlite_errorcode", None)
            if not isinstance(code, int) or code & 0xFF != 5 or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(2 * pause, 0.05)


_Identity = tuple[tuple[int, int], ...]
"""`(st_dev, st_ino)` of the database file, its `-wal` and its `-shm` (`SqliteStore._stat`)."""


def _dev_ino(path: str) -> tuple[int, int]:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return (-1, -1)
    return (found.st_dev, found.st_ino)


_Write = tuple[str, str, bytes, float, "Sequence[Part] | None"]
"""`(tenant, session, value or head, ttl, parts)` of one queued write (`parts` `None`: `put`)."""
_PartedWrite = tuple[int, tuple[Any, ...], Sequence[Part]]
"""`(index in the batch, sessions row, parts)` of a write in parts (`SqliteStore._put_parted`)."""


class NewerSchema(sqlite3.DatabaseError):
    """A session store file whose `user_version` is above `SCHEMA_VERSION`: written by a newer
    promptcache (this build is a rollback). Not corrupt: moved aside under its own name."""

    def __init__(self, version: int) -> None:
        super().__init__(f"schema version {version} is newer than this build's {SCHEMA_VERSION}")
        self.version = version


class _Queued:
    """One write waiting for, or taken by, the writer thread (`SqliteStore._queue`)."""

    __slots__ = ("write", "done", "taken", "finished", "watch")

    def __init__(self, write: _Write, done: asyncio.Future[bool]) -> None:
        self.write = write
        self.done = done
        """Settled on the event loop with the write's result."""
        self.watch: asyncio.TimerHandle | None = None
        """The event loop's next look at a bounded write (`SqliteStore._watch_write`)."""
        self.taken: float | None = None
        """`SqliteStore.timer` when the writer thread began the write's transaction."""
        self.finished: float | None = None
        """`SqliteStore.timer` when that transaction was over (committed or failed)."""


def _log_thread_failure(done: Future[None]) -> None:
    """On the store's thread: log what escaped a batch of reads or writes (each settles its
    callers' futures with its own errors, so nothing should; an asyncio future wrapping the
    batch's would have logged it when collected)."""
    if not done.cancelled() and done.exception() is not None:
        _log.error("session store thread failed: %r", done.exception())


def _settle(
    futures: list[asyncio.Future[bool]], error: BaseException | None, results: list[bool] | None = None
) -> None:
    """On the event loop: finish the futures of one written batch with each write's result
    (those whose caller stopped waiting are already done and left alone)."""
    for i, future in enumerate(futures):
        if not future.done():
            if error is None:
                future.set_result(results[i] if results is not None else True)
            else:
                future.set_exception(error)


class _Reading:
    """One read waiting for, or taken by, the reader thread (`SqliteStore._read`)."""

    __slots__ = ("read", "done", "queued", "taken", "finished", "is_dropped")

    def __init__(self, read: _Read, done: asyncio.Future[_Found | None], queued: float) -> None:
        self.read = read
        self.done = done
        """Settled on the event loop with the answer."""
        self.queued = queued
        """`SqliteStore.timer` when the read was queued."""
        self.taken: float | None = None
        """`SqliteStore.timer` when the reader thread began the read's statement."""
        self.finished: float | None = None
        """`SqliteStore.timer` when that statement was over (answered or failed)."""
        self.is_dropped = False
        """Set on the loop when the caller stopped waiting: the reader skips it if not begun."""


def _settle_reads(
    futures: list[asyncio.Future[_Found | None]], error: BaseException | None, found: list[_Found | None]
) -> None:
    """On the event loop: finish the futures of one read statement (those whose caller stopped
    waiting are already done and left alone)."""
    for i, future in enumerate(futures):
        if not future.done():
            if error is None:
                future.set_result(found[i])
            else:
                future.set_exception(error)


class SqliteStore:
    """See the module docstring. `path` may be `:memory:` (benchmarks)."""

    backend: Final = "sqlite"

    def __init__(
        self,
        path: str | Path,
        clock: Callable[[], float] = time.time,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_tenant_bytes: int = DEFAULT_MAX_TENANT_BYTES,
        write_interval: float = WRITE_INTERVAL,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        """`clock`: epoch seconds for expiry (tests pass a manual one); `max_bytes`,
        `max_tenant_bytes`: the caps on value bytes (module docstring); `write_interval`:
        seconds between the starts of two write transactions at least (`WRITE_INTERVAL`);
        `timer`: monotonic seconds the bounds of `get_within` / `put_within` are measured in
        (read from both threads; tests pass a manual one, so a statement's bound does not
        depend on how loaded the machine is)."""
        self.path = str(path)
        self._clock = clock
        self.timer = timer
        self.max_bytes = max_bytes
        self.max_tenant_bytes = min(max_tenant_bytes, max_bytes)
        self.on_evict: Callable[[str, int], None] | None = None
        """Called on the writer thread with `(cap, rows)`: `rows` records evicted by the
        `tenant` or `total` cap, or a value not stored (`too_large`); set by `RecordStore`."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="promptcache-sqlite")
        self._batch: list[_Queued] = []
        """Writes waiting for the writer thread (`put`), in call order."""
        self._batch_lock = threading.Lock()
        self._is_batch_queued = False
        self.write_interval = write_interval
        self._batch_started = -write_interval
        """`loop.time()` when the last write transaction was handed to the writer thread."""
        self._batch_timer: asyncio.TimerHandle | None = None
        """The pending start of the next write transaction (`write_interval` not yet over)."""
        self._reads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="promptcache-sqlite-read")
        self._read_queue: list[_Reading] = []
        """Reads waiting for the reader thread (`_read`), in call order."""
        self._read_lock = threading.Lock()
        self._is_read_queued = False
        self._reader_moved = 0.0
        """`timer` when the reader thread last began or ended a read statement
        (a queued read waits while it moves: `_read`)."""
        self._reader_began: float | None = None
        """When the statement the reader thread is in began; `None` between statements."""
        self._conn: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        """The read-only connection (reader thread only)."""
        self._reader_identity: _Identity | None = None
        self._next_purge = 0.0
        self._wal_limit = WAL_MIN_BYTES
        """The WAL's size limit in bytes (`_size_wal`, at open and at each purge)."""
        self._catch_up_after = 0.0
        """`time.monotonic()` before which `_catch_up_wal` does not try (`CATCH_UP_BACKOFF`)."""
        self._catch_up_failed = 0
        """Unfinished restarts in a row (`CATCH_UP_TRIES`)."""
        self._closed = False
        self._has_opened = False
        """Whether the writer has opened the file once (`_ready_to_read`)."""
        self._identity: _Identity | None = None
        """`(st_dev, st_ino)` of the files the connection has open (`_stat`)."""
        self.on_fault: Callable[[str, str], None] | None = None
        """Called on the worker thread with `(kind, message)` for a fault the store repaired
        itself (the file recreated); set by `RecordStore`."""

    async def open(self) -> None:
        """Open the file now (else on first use); raises what sqlite3 raises."""
        await self._call(self._connection)

    async def get(self, tenant: str, session: str) -> bytes | None:
        found = await self._read((tenant, session, False, b""), None)
        return None if found is None else found[0]

    async def get_parts(
        self, tenant: str, session: str, known: Collection[bytes] = ()
    ) -> tuple[bytes, dict[bytes, bytes]] | None:
        return await self._read((tenant, session, True, _known_names(known)), None)

    async def get_parts_within(
        self, tenant: str, session: str, timeout: float, known: Collection[bytes] = ()
    ) -> tuple[bytes, dict[bytes, bytes]] | None:
        """`get_parts` bounded by the store's own time, as `get_within` bounds `get`."""
        return await self._read((tenant, session, True, _known_names(known)), timeout)

    async def get_within(self, tenant: str, session: str, timeout: float) -> bytes | None:
        """`get` bounded by the store's own time: raises `TimeoutError` when the read's
        statement ran more than `timeout` seconds, or the read waited `READER_STUCK` seconds
        (at least `timeout`) while the reader thread began and ended nothing (stuck in the
        statement ahead: a frozen or locked file; while it stays stuck, a read gives up at once).
        Time queued behind reads the thread is working through does not count, nor does the
        time the event loop then takes to resume this coroutine (a busy loop is not a slow
        store). Reads queued meanwhile go in few statements (`_read_batch`)."""
        found = await self._read((tenant, session, False, b""), timeout)
        return None if found is None else found[0]

    async def _read(self, read: _Read, timeout: float | None) -> _Found | None:
        """Queue `read` for the reader thread (`:memory:`: run it on the writer thread, which
        holds the only connection) and wait for its answer (`get_within`'s bound)."""
        check_key(read[0], read[1])
        if self.path == ":memory:":
            call = asyncio.ensure_future(self._call(self._get_rows, [read]))  # noqa: TID251
            done, _ = await asyncio.wait((call,), timeout=timeout)
            if not done:
                call.cancel()
                raise TimeoutError(f"no answer within {timeout:g} s")
            return call.result()[0]
        await self._ready_to_read()
        stuck = None if timeout is None else max(timeout, READER_STUCK)
        began = self._reader_began
        if stuck is not None and began is not None and self.timer() - began >= stuck:
            raise TimeoutError(f"the reader thread has been in one statement over {stuck:g} s")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Found | None] = loop.create_future()
        reading = _Reading(read, future, self.timer())
        with self._read_lock:
            self._read_queue.append(reading)
            is_queued, self._is_read_queued = self._is_read_queued, True
        if not is_queued:
            try:
                # the answers come back by `_settle_reads`: no asyncio future wraps the batch's
                # (`run_in_executor` added one, and a second wake-up of the loop per batch)
                self._reads.submit(self._read_batch, loop).add_done_callback(_log_thread_failure)
            except RuntimeError:  # the executor shut down meanwhile (close)
                with self._read_lock:
                    dropped, self._read_queue, self._is_read_queued = self._read_queue, [], False
                _settle_reads([r.done for r in dropped], RuntimeError("store closed"), [])
        if timeout is None or stuck is None:
            return await future
        try:
            while reading.finished is None and not future.done():
                taken = reading.taken
                if taken is None:  # queued: bounded by the reader's progress
                    left = max(reading.queued, self._reader_moved) + stuck - self.timer()
                else:  # in its statement: bounded by the statement's time
                    left = taken + timeout - self.timer()
                if left <= 0:
                    raise TimeoutError(f"no answer within {timeout:g} s")
                await asyncio.wait((future,), timeout=left)
            taken, finished = reading.taken, reading.finished
            if taken is not None and finished is not None and finished - taken > timeout:
                raise TimeoutError(f"answered after {finished - taken:.3f} s, bound {timeout:g} s")
            return await future  # over: the answer is on its way to the loop
        finally:
            reading.is_dropped = True
            future.cancel()  # a no-op when settled; else the reader leaves it alone

    async def _ready_to_read(self) -> None:
        """The file opened once by the writer (created, its schema, a corrupt file moved aside)
        before the first read; after that a read never waits for the writer thread (one that
        failed and dropped its connection reopens it with its next write)."""
        if self._closed:
            raise RuntimeError("store closed")
        if not self._has_opened:
            await self._call(self._connection)

    async def keys(self) -> list[tuple[str, str]]:
        """Every unexpired `(tenant, session)` key (`RecordStore.learn_keys`): listed on the
        reader thread (`_list_keys`, a few statements), so writes never wait behind it."""
        if self.path == ":memory:":
            return await self._call(self._keys)
        await self._ready_to_read()
        return await asyncio.get_running_loop().run_in_executor(self._reads, self._read_keys)

    async def put(self, tenant: str, session: str, value: bytes, ttl: float) -> None:
        """Store `value` for `ttl` seconds (`ttl <= 0` removes the key). Writes arriving while
        the writer thread is busy, or within `write_interval` of the last transaction's start
        (unless one of `PACED_BYTES` or more arrives), are queued and then written together in
        one transaction (at most `MAX_BATCH`), in call order: one thread wake-up and one commit
        for many requests (a wake-up costs the event loop and the thread a GIL handoff each; one
        per write fell behind at ~600 writes/s). A failed transaction fails every write in it."""
        await self._queue((tenant, session, value, ttl, None))

    async def put_within(self, tenant: str, session: str, value: bytes, ttl: float, timeout: float) -> None:
        """`put` bounded by the store's own time: raises `TimeoutError` when the write's
        transaction has run `timeout` seconds without being over. Time queued behind other
        transactions does not count (the writer is working through them; the caller bounds how
        much it queues: `RecordStore`'s pending writes), nor does the time the busy event loop
        takes to look once the transaction is over (as `get_within`). A write that timed out
        may still land."""
        await self._queue((tenant, session, value, ttl, None), timeout)

    async def put_parts(self, tenant: str, session: str, head: bytes, parts: Sequence[Part], ttl: float) -> bool:
        """Store `head` and `parts` (module docstring), queued and batched with `put`'s writes;
        `False` when a part given without data is not held (nothing written)."""
        return await self._queue((tenant, session, head, ttl, tuple(parts)))

    async def put_parts_within(
        self, tenant: str, session: str, head: bytes, parts: Sequence[Part], ttl: float, timeout: float
    ) -> bool:
        """`put_parts` bounded by the store's own time, as `put_within` bounds `put`."""
        return await self._queue((tenant, session, head, ttl, tuple(parts)), timeout)

    async def _queue(self, write: _Write, timeout: float | None = None) -> bool:
        check_key(write[0], write[1])
        if self._closed:
            raise RuntimeError("store closed")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()
        queued = _Queued(write, done)
        parts = write[4]
        sent = len(write[2]) + (sum(len(p.data) for p in parts if p.data is not None) if parts else 0)
        is_large = sent >= PACED_BYTES
        with self._batch_lock:
            self._batch.append(queued)
            is_queued, self._is_batch_queued = self._is_batch_queued, True
        if not is_queued:
            wait = min(self.write_interval, self._batch_started + self.write_interval - loop.time())
            if wait > 0 and not is_large:
                self._batch_timer = loop.call_later(wait, self._start_batch, loop)
            else:
                self._start_batch(loop)
        elif is_large and self._batch_timer is not None:  # the paced writes go with it, now
            self._batch_timer.cancel()
            self._start_batch(loop)
        if timeout is None:
            return await done
        # one timer looks at the write's transaction while it waits (`asyncio.wait` per look
        # cost a waiter future, its callbacks and a timer: 8.5 against 2.6 us a write)
        self._arm_watch(queued, timeout)
        try:
            return await done  # a transaction run over `timeout` fails it (`_watch_write`)
        finally:
            if queued.watch is not None:
                queued.watch.cancel()
            done.cancel()  # a no-op when settled; else the writer leaves it alone

    def _arm_watch(self, queued: _Queued, timeout: float) -> None:
        """Arm `_watch_write` for `queued`: `timeout` seconds from now while it is queued,
        else when its transaction will have run `timeout` seconds (at once when it has)."""
        taken = queued.taken
        left = timeout if taken is None else taken + timeout - self.timer()
        queued.watch = asyncio.get_running_loop().call_later(max(0.0, left), self._watch_write, queued, timeout)

    def _watch_write(self, queued: _Queued, timeout: float) -> None:
        """On the event loop, `_queue`'s look at a write it waits for: once the write's
        transaction has run `timeout` seconds without being over, its future fails with
        `TimeoutError`; while it is queued, or in a transaction begun less than `timeout` ago,
        the next look is armed (`_arm_watch`). A write that is over (its result on its way to
        the loop) or settled is left alone."""
        done = queued.done
        if done.done() or queued.finished is not None:
            return
        taken = queued.taken
        if taken is not None and self.timer() - taken >= timeout:
            done.set_exception(TimeoutError(f"the write's transaction ran over {timeout:g} s"))
            return
        self._arm_watch(queued, timeout)

    def _start_batch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hand the queued writes to the writer thread (on the event loop)."""
        self._batch_timer = None
        self._batch_started = loop.time()
        try:
            # settled by `_settle` (no asyncio future wraps the batch's: one wake-up of the loop)
            self._executor.submit(self._write_batch, loop).add_done_callback(_log_thread_failure)
        except RuntimeError:  # the executor shut down meanwhile (close): nobody will write
            with self._batch_lock:
                dropped, self._batch, self._is_batch_queued = self._batch, [], False
            _settle([w.done for w in dropped], RuntimeError("store closed"))

    async def delete(self, tenant: str, session: str) -> None:
        """Remove the key; queued with the writes (`put`), so it keeps their order."""
        await self.put(tenant, session, b"", 0.0)

    async def usage(self) -> dict[str, int]:
        """Value bytes held now per tenant with any, and in total under `TOTAL` (`''`)."""
        return dict(await self._call(self._usage))

    async def check(self) -> None:
        """Raise what the next write would: the file gone and not recreatable, less than
        `MIN_FREE_BYTES` free (`StoreFault("disk_full")`), a read-only file or mount. Then the
        reader thread opens its connection, if it has none, so that the first reads after a
        start do not pay for it (a connect and its pragmas are several GIL handoffs)."""
        await self._call(self._check)
        if self.path != ":memory:" and self._reader is None:
            with contextlib.suppress(sqlite3.Error, OSError):  # a read opens it again, or fails then
                await asyncio.get_running_loop().run_in_executor(self._reads, self._read_connection)

    @staticmethod
    def fault_kind(exc: BaseException) -> str:
        """The `FAULT_KINDS` cause of an exception this store raised."""
        if isinstance(exc, StoreFault):
            return exc.kind
        if isinstance(exc, sqlite3.Error):
            code = getattr(exc, "sqlite_errorcode", None)
            return _CODE_KINDS.get(code & 0xFF, "other") if isinstance(code, int) else "other"
        if isinstance(exc, OSError) and exc.errno is not None:
            return _ERRNO_KINDS.get(exc.errno, "other")
        return "other"

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        if self._batch_timer is not None:  # the paced writes go before the connection closes
            self._batch_timer.cancel()
            self._start_batch(loop)
        try:
            await loop.run_in_executor(self._reads, self._close_reader)
            await self._call(self._disconnect, allow_closed=True)
        finally:
            self._reads.shutdown(wait=False)
            self._executor.shutdown(wait=False)

    async def _call(self, fn: Any, *args: Any, allow_closed: bool = False) -> Any:
        if self._closed and not allow_closed:
            raise RuntimeError("store closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._guarded, fn, args)

    # Everything below runs on the worker thread.

    def _guarded(self, fn: Any, args: tuple[Any, ...]) -> Any:
        try:
            return fn(*args)
        except sqlite3.Error:
            self._disconnect()
            raise

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None:
            if self._is_same_file(self._identity):
                return self._conn
            self._disconnect()
            # SQLite shares one `-shm` mapping among a process's connections to a file: the
            # reader's must close too, or the new connection goes on in the unlinked `-shm`
            self._reads.submit(self._close_reader).result(timeout=CLOSE_READER_TIMEOUT)
            message = f"session store file {self.path} was deleted or replaced; created a new one"
            _log.warning("%s", message)
            if self.on_fault is not None:
                self.on_fault("file_gone", message)
        try:
            self._conn = self._connect()
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) or self.path == ":memory:":
                raise
            self._move_aside(exc.version if isinstance(exc, NewerSchema) else None)
            self._conn = self._connect()
        self._identity = self._stat()
        self._has_opened = True
        return self._conn

    def _stat(self) -> _Identity | None:
        """`(st_dev, st_ino)` of the path and of its `-wal` and `-shm` files now (`(-1, -1)` for a
        missing one), `None` for `:memory:`. In WAL mode rows live in `-wal` until a checkpoint:
        a deleted `-wal` or `-shm` loses them as surely as a deleted main file (adversarial review,
        session 4)."""
        if self.path == ":memory:":
            return None
        return tuple(_dev_ino(self.path + suffix) for suffix in ("", "-wal", "-shm"))

    def _is_same_file(self, known: _Identity | None) -> bool:
        """Whether the files the connection opened (`known`) are still the ones at the path; a
        `-wal`/`-shm` missing when `known` was taken may appear since (SQLite creates them)."""
        if known is None:
            return True
        now = self._stat()
        assert now is not None
        return all(was == (-1, -1) or was == seen for was, seen in zip(known, now, strict=True))

    def _check(self) -> None:
        conn = self._connection()
        if self.path != ":memory:":
            fs = os.statvfs(Path(self.path).parent)
            free = fs.f_bavail * fs.f_frsize
            if free < MIN_FREE_BYTES:
                raise StoreFault("disk_full", f"{free} bytes free on the filesystem of {self.path}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _connect(self) -> sqlite3.Connection:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            # 0600 before SQLite opens it: the file holds prompt text, and SQLite creates the
            # WAL and SHM files with the database file's permissions.
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(self.path + suffix):
                    os.chmod(self.path + suffix, 0o600)
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=WRITE_LOCK_WAIT_MS / 1000)
        try:
            conn.execute(f"PRAGMA busy_timeout = {WRITE_LOCK_WAIT_MS}")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
            _until_unlocked(lambda: conn.execute("PRAGMA journal_mode = WAL"))
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(f"PRAGMA secure_delete = {SECURE_DELETE}")
            self._wal_limit = _size_wal(conn)
            if version > SCHEMA_VERSION:
                raise NewerSchema(version)
            if version not in _MIGRATIONS and version != SCHEMA_VERSION:
                raise sqlite3.DatabaseError(f"unknown schema version {version}")
            if version != SCHEMA_VERSION:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    # another process may have migrated the file meanwhile
                    found = conn.execute("PRAGMA user_version").fetchone()[0]
                    if found != SCHEMA_VERSION:
                        for statement in _MIGRATIONS[found]:
                            conn.execute(statement)
                        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                    conn.execute("COMMIT")
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
        except BaseException:
            conn.close()
            raise
        return conn

    def _move_aside(self, newer: int | None = None) -> None:
        """Move the file (and its `-wal`, `-shm`) aside and start empty: as
        `<name>.corrupt-<epoch>` when it is not a database this build reads, as
        `<name>.schema-<newer>-<epoch>` when it is a valid file of a newer promptcache's schema
        (`newer`: its `user_version`; a rollback), which that build reads again when the file is
        moved back. Either keeps prompt text until someone deletes it."""
        stamp = int(time.time())
        tag = f"schema-{newer}" if newer is not None else "corrupt"
        for suffix in ("", "-wal", "-shm"):
            source = self.path + suffix
            if os.path.exists(source):
                os.replace(source, f"{self.path}.{tag}-{stamp}{suffix}")
        why, hint = "is not a readable database", ""
        if newer is not None:
            why = f"has schema version {newer}, from a newer promptcache than this one (schema {SCHEMA_VERSION})"
            hint = f" (move it back under a build of schema {newer} or newer to use it)"
        _log.warning(
            "session store %s %s; moved aside to %s.%s-%d, starting empty%s",
            self.path,
            why,
            self.path,
            tag,
            stamp,
            hint,
        )

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        self._identity = None
        if conn is not None:
            conn.close()

    # The reader thread.

    def _read_batch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Take every queued read (but those whose caller stopped waiting) and answer them in
        statements of at most `READ_ROWS[0]` reads and about `READ_STATEMENT_BYTES`
        (`_read_rows`: one step each; the reads a statement leaves for later go first in the
        next); settle each statement's futures on the event loop as soon as it is over."""
        with self._read_lock:
            queued, self._read_queue = self._read_queue, []
            self._is_read_queued = False
        waiting = collections.deque(queued)
        conn: sqlite3.Connection | None = None
        """Opened (or its file's identity checked: three `stat` calls, each a GIL handoff)
        once per batch, not per statement."""
        while waiting:
            chunk: list[_Reading] = []
            while waiting and len(chunk) < READ_ROWS[0]:
                reading = waiting.popleft()
                if not reading.is_dropped:  # its caller stopped waiting: not read
                    chunk.append(reading)
            if not chunk:
                return
            (size,) = _padded_sizes(len(chunk), READ_ROWS)
            error: BaseException | None = None
            found: list[_Found | None] = []
            later: list[int] = []
            try:
                # opening the connection is not the reads' own time: READER_STUCK bounds it
                conn = conn or self._read_connection()
                taken = self._reader_moved = self.timer()
                self._reader_began = taken
                for reading in chunk:
                    reading.taken = taken
                found, later = _read_rows(conn, [r.read for r in chunk], size, self._clock())
            except Exception as exc:  # noqa: BLE001 - handed to every caller of the statement
                error = exc
                if isinstance(exc, sqlite3.Error):
                    conn = None
                    self._close_reader()
            finished = self._reader_moved = self.timer()
            self._reader_began = None
            if later:
                waiting.extendleft(chunk[i] for i in reversed(later))
                is_later = set(later)
                found = [f for i, f in enumerate(found) if i not in is_later]
                chunk = [r for i, r in enumerate(chunk) if i not in is_later]
            for reading in chunk:
                reading.finished = finished
            try:
                loop.call_soon_threadsafe(_settle_reads, [r.done for r in chunk], error, found)
            except RuntimeError:  # the loop is closed: nobody waits any more
                return

    def _read_keys(self) -> list[tuple[str, str]]:
        try:
            return _list_keys(self._read_connection(), self._clock())
        except sqlite3.Error:
            self._close_reader()
            raise

    def _read_connection(self) -> sqlite3.Connection:
        """The read-only connection, reopened when the path names another file than the one it
        has open (the writer counts and repairs that); never creates the file."""
        if self._reader is not None and self._is_same_file(self._reader_identity):
            return self._reader
        self._close_reader()
        uri = f"file:{quote(os.path.abspath(self.path))}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA query_only = 1")
        except BaseException:
            conn.close()
            raise
        self._reader, self._reader_identity = conn, self._stat()
        return conn

    def _close_reader(self) -> None:
        conn, self._reader = self._reader, None
        self._reader_identity = None
        if conn is not None:
            conn.close()

    # Back on the writer thread.

    def _get_rows(self, reads: list[_Read]) -> list[_Found | None]:
        """`reads` on the read-write connection (`:memory:`, whose one connection holds it all)."""
        found, later = _read_rows(self._connection(), reads, len(reads), self._clock(), max_bytes=2**62)
        assert not later
        return found

    def _keys(self) -> list[tuple[str, str]]:
        return _list_keys(self._connection(), self._clock())

    def _write_batch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Take every queued write and run them in transactions of at most `MAX_BATCH`; settle
        their futures on the event loop."""
        with self._batch_lock:
            writes, self._batch = self._batch, []
            self._is_batch_queued = False
        for start in range(0, len(writes), MAX_BATCH):
            part = writes[start : start + MAX_BATCH]
            error: BaseException | None = None
            results: list[bool] | None = None
            taken = self.timer()
            for queued in part:
                queued.taken = taken
            try:
                results = self._guarded(self._put_many, ([w.write for w in part],))
            except Exception as exc:  # noqa: BLE001 - handed to every caller of the batch
                error = exc
            finished = self.timer()
            for queued in part:
                queued.finished = finished
            try:
                loop.call_soon_threadsafe(_settle, [w.done for w in part], error, results)
            except RuntimeError:  # the loop is closed: nobody waits any more
                return
        self._catch_up_wal()

    def _catch_up_wal(self) -> None:
        """After a batch is settled: a WAL past `WAL_BEHIND` times its limit (other processes'
        writes kept the passive checkpoints from reaching its end) is checkpointed whole and
        restarted (`wal_checkpoint(RESTART)`: it takes the write lock, waiting for it as a write
        does, at most `CATCH_UP_WAIT_MS`, so the other processes' writes wait that long at most,
        then waits as long for the readers to leave the WAL; the next write starts it again from
        the top, truncated to its limit). A single process's WAL gets there only with a batch
        over twice the limit (its checkpoints run between its own writes); one restart then costs
        what its checkpoint would. A restart that did not finish (the lock or a reader's
        snapshot held past the wait, or another process's checkpoint running: SQLite then
        answers busy at once, in the row, without waiting, seen here about every other try with
        two writers) is tried again after the next batch; after `CATCH_UP_TRIES` of them in a
        row, `CATCH_UP_BACKOFF` seconds later."""
        if self._conn is None or self.path == ":memory:" or time.monotonic() < self._catch_up_after:
            return
        try:
            size = os.stat(self.path + "-wal").st_size
        except OSError:
            return
        if size <= WAL_BEHIND * self._wal_limit:
            return
        conn = self._conn
        busy = 1
        try:
            conn.execute(f"PRAGMA busy_timeout = {CATCH_UP_WAIT_MS}")
            try:
                busy = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()[0]
            finally:
                conn.execute(f"PRAGMA busy_timeout = {WRITE_LOCK_WAIT_MS}")
        except sqlite3.Error as exc:
            _log.debug("session store checkpoint left to a later write: %s", exc)
        self._catch_up_failed = self._catch_up_failed + 1 if busy else 0
        if self._catch_up_failed >= CATCH_UP_TRIES:
            self._catch_up_failed = 0
            self._catch_up_after = time.monotonic() + CATCH_UP_BACKOFF

    def _put(self, tenant: str, session: str, value: bytes, ttl: float) -> None:
        self._put_many([(tenant, session, value, ttl, None)])

    def _put_many(self, writes: Sequence[_Write]) -> list[bool]:
        """`(tenant, session, value, ttl, parts)` writes in one transaction, in order, in a few
        steps whatever their number (`STATEMENT_ROWS`): each run of plain stores (a write in
        parts with no parts is one: its head is the whole value), of removals, or of writes in
        parts of distinct sessions goes in as few statements as `STATEMENT_ROWS` allows
        (`_put_parted`); the write sequence numbers (`written`) are counted on from the file's
        newest in the same transaction (another process may share the file). Then each tenant
        written to (then the file) is taken back within its cap (`_evict`). Returns each
        write's result (`False`: a write in parts that kept a part not held, not written)."""
        conn = self._connection()
        now = self._clock()
        counts = {"too_large": 0, "tenant": 0, "total": 0}
        runs: list[tuple[str, list[Any]]] = []
        in_run: set[tuple[str, str]] = set()
        """The sessions of the current run of writes in parts (one session once per run)."""
        tenants: dict[str, None] = {}
        for index, (tenant, session, value, ttl, parts) in enumerate(writes):
            size = len(value) + (sum(p.size for p in parts) if parts else 0)
            is_store = ttl > 0 and size <= self.max_tenant_bytes
            counts["too_large"] += ttl > 0 and not is_store
            kind = "remove" if not is_store else "parts" if parts else "put"
            if is_store:
                tenants[tenant] = None
            if not runs or runs[-1][0] != kind or (kind == "parts" and (tenant, session) in in_run):
                runs.append((kind, []))
                in_run = set()
            if kind == "remove":
                runs[-1][1].append((tenant, session))
                continue
            row = (tenant, session, now + ttl, value, size, len(parts) if parts else 0)
            if kind == "put":
                runs[-1][1].append(row)
            else:
                assert parts is not None
                runs[-1][1].append((index, row, parts))
                in_run.add((tenant, session))
        results = [True] * len(writes)
        conn.execute("BEGIN IMMEDIATE")
        try:
            written = conn.execute(_LAST_WRITTEN).fetchone()[0] if tenants else 0
            for kind, rows in runs:
                if kind == "parts":
                    written = self._put_parted(conn, rows, written, results)
                elif kind == "put":
                    written = _write_rows(conn, _put_statement, rows, written)
                else:
                    _write_rows(conn, _delete_statement, rows)
            counts["tenant"], counts["total"] = self._evict(conn, list(tenants))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        for cap, evicted in counts.items():
            self._evicted(cap, evicted)
        if now >= self._next_purge:
            try:
                conn.execute(_PURGE, (now,))
                self._wal_limit = _size_wal(conn)
            except sqlite3.OperationalError as exc:  # the writes are committed: theirs is True
                _log.debug("session store purge deferred to the next write: %s", exc)
            else:
                self._next_purge = now + PURGE_INTERVAL
        return results

    @staticmethod
    def _put_parted(conn: sqlite3.Connection, run: Sequence[_PartedWrite], written: int, results: list[bool]) -> int:
        """A run of writes in parts of distinct sessions (inside the batch's transaction), each
        `(index, row, parts)`: the parts the sessions hold are listed by one lookup; a write
        that keeps a part not held changes nothing and its `results[index]` is `False`; for the
        others the parts no longer named are deleted, the new ones' bytes (those the tenant does
        not hold) and names inserted and the heads upserted, each in as few statements as
        `STATEMENT_ROWS` allows. Returns the last write sequence number given."""
        held: dict[int, dict[bytes, int]] = {}
        """Per position in the run: the parts its session holds, key -> rowid."""
        at = 0
        for size in _padded_sizes(len(run)):
            args: list[Any] = []
            for i in range(at, at + size):
                args.extend((i, run[i][1][0], run[i][1][1]) if i < len(run) else (-1, "", ""))
            (listing,) = conn.execute(_held_statement(size), args).fetchone()
            for item in listing.split(",") if listing else ():
                i, rowid, key = item.split(" ")
                held.setdefault(int(i), {})[bytes.fromhex(key)] = int(rowid)
            at += size
        stale: list[tuple[int]] = []
        new: list[tuple[str, str, bytes]] = []
        values: list[tuple[str, bytes, bytes]] = []
        rewrites: list[tuple[str, bytes, bytes]] = []
        """Bytes of parts the session names already, sent again (`_rewrite_values_statement`)."""
        heads: list[tuple[Any, ...]] = []
        for position, (index, row, parts) in enumerate(run):
            have = held.get(position, {})
            if any(part.data is None and part.key not in have for part in parts):
                results[index] = False
                continue
            named = {part.key for part in parts}
            stale.extend((rowid,) for key, rowid in have.items() if key not in named)
            for part in parts:
                if part.data is not None:
                    (rewrites if part.key in have else values).append((row[0], part.key, part.data))
            new.extend((row[0], row[1], part.key) for part in parts if part.data is not None)
            heads.append(row)
        _write_rows(conn, _drop_parts_statement, stale)
        _write_rows(conn, _add_values_statement, values)
        _write_rows(conn, _rewrite_values_statement, rewrites)
        _write_rows(conn, _add_parts_statement, new)
        return _write_rows(conn, _put_statement, heads, written)

    def _evict(self, conn: sqlite3.Connection, tenants: list[str]) -> tuple[int, int]:
        """Take each of `tenants` (then the file) back within its cap: the least recently
        written rows deleted until the usage is within it (at most `MAX_EVICTIONS_PER_PUT` per
        cap and tenant); one lookup of the usage and one statement per cap exceeded. Returns
        the rows evicted by the tenant caps and by the total cap."""
        usage = self._usages(conn, [*tenants, TOTAL])
        by_tenant = 0
        for tenant in tenants:
            excess = usage.get(tenant, 0) - self.max_tenant_bytes
            if excess > 0:
                by_tenant += conn.execute(_EVICT_OF_TENANT, (tenant, MAX_EVICTIONS_PER_PUT, excess)).rowcount
        total = self._usages(conn, [TOTAL]).get(TOTAL, 0) if by_tenant else usage.get(TOTAL, 0)
        excess = total - self.max_bytes
        by_total = conn.execute(_EVICT_ANY, (MAX_EVICTIONS_PER_PUT, excess)).rowcount if excess > 0 else 0
        return by_tenant, by_total

    @staticmethod
    def _usages(conn: sqlite3.Connection, tenants: list[str]) -> dict[str, int]:
        """The `usage` bytes of `tenants` (absent: none held), in one step per 64 tenants."""
        found: dict[str, int] = {}
        at = 0
        for size in _padded_sizes(len(tenants)):
            chunk = tenants[at : at + size]
            (listing,) = conn.execute(_usage_statement(size), chunk + [TOTAL] * (size - len(chunk))).fetchone()
            for item in listing.split(",") if listing else ():
                tenant, held = item.split(" ")
                found[tenant] = int(held)
            at += size
        return found

    def _evicted(self, cap: str, rows: int) -> None:
        if rows and self.on_evict is not None:
            self.on_evict(cap, rows)

    def _usage(self) -> dict[str, int]:
        return dict(self._connection().execute("SELECT tenant, bytes FROM usage WHERE bytes > 0 OR tenant = ''"))
