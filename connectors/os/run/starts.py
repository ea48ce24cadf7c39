"""The OS connector's start journal (``connectors/os/starts.sqlite``).

A sync directive's row is written before its process is spawned: which seam
request (core's dispatch), directive, ``idempotency/key`` and connector instance, and
when. It outlives the instance that wrote it, so a core that lost its connector
mid-flight can ask the next instance whether the lost dispatch ever started
(``sensorium.connector.starts``) instead of leaving it in doubt.

The answer is a fence, not a guess: asking writes a ``fenced`` row for every asked
dispatch that has no ``started`` row, in the same ``BEGIN IMMEDIATE`` transaction, and
a start checks for a fence in the transaction that writes its own row. So whichever
comes first wins: a dispatch answered ``never-started`` can never start afterwards —
not through a late delivery of the lost message to a newer instance, nor through an
old instance that was only paused. Every instance shares this file.

Horizon: rows are kept ``KEEP_S`` (24 h) and at most ``KEEP_ROWS``; collecting one
moves ``covered_from`` (the earliest time the journal still answers for) past it, as
does the journal's creation. A dispatch sent before ``covered_from`` (less a margin
for the two clocks) is ``unknown``: its row may have been collected. A lost message
older than the horizon that still arrives would not meet its fence; nothing in
Sensorium holds a dispatch that long (core's reply wait is bounded by the
directive's timeout, far below 24 h).

Durable for this boot: a start's commit is written (``synchronous=NORMAL``), not
fsynced, so the action is not held ~0.7 ms for a disk flush before it may run. A
written row survives the death of any process, the writer's included, which is what a
lost dispatch is asked about; only a crash of the host can lose it (or a write-back
error the kernel reports to no one), and a host crash also ends every action and
every message in flight. So the journal keeps the boot it was written in
(``/proc/sys/kernel/random/boot_id``) and, fsynced, a time no start row's exceeds
(``written_until``, raised ``AHEAD_S`` at a time: one fsync a minute). Opened in
another boot, it moves its horizon past both that time and the present, and answers
``unknown`` for every dispatch sent before, never a ``never-started`` that a lost row
could have made untrue, even where the clock came back from the reboot behind. The
fences an answer writes are fsynced before it is given. Where the boot cannot be
read, every commit is fsynced (``FULL``) instead.

Starts are group-committed (``shared/deferred/group.py``): the starts of directives
that arrive together share one transaction, each in its own savepoint; each spawn
waits for the commit that holds its row. The commit runs on the committer's thread, so
the connector's event loop goes on with other directives meanwhile (inline with an
fsync, it held the loop ~0.6 ms per directive). One lock serialises the connection's
transactions. Times are POSIX seconds. A write the disk cannot take raises
``storage-unavailable`` (the directive is then refused before anything ran).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import apsw

from sensorium.shared.deferred.group import GroupCommit
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.store import immediate, open_store, storage_error

KEEP_S = 24 * 3600.0
KEEP_ROWS = 100_000
# Core and the connector read the same host clock; this is room for millisecond
# timestamps and a small step of that clock.
MARGIN_S = 1.0
# Collect once per this many writes (and on open), not on every start.
COLLECT_EVERY = 256

SCHEMA = """
CREATE TABLE starts (
    seam_request_id  TEXT PRIMARY KEY,
    -- started: written before the spawn; fenced: answered never-started, may not start
    state            TEXT NOT NULL CHECK (state IN ('started', 'fenced')),
    directive_id     TEXT,
    idempotency_key  TEXT,
    instance_id      TEXT NOT NULL,
    at               REAL NOT NULL
);
CREATE INDEX starts_at ON starts (at);
CREATE TABLE horizon (
    one           INTEGER PRIMARY KEY CHECK (one = 1),
    -- the journal answers for dispatches sent at or after this time
    covered_from  REAL NOT NULL,
    -- the boot its rows were written in (NULL: unknown; they were fsynced)
    boot_id       TEXT,
    -- fsynced: no start row's time exceeds it (rows themselves are not fsynced)
    written_until REAL
);
"""
VERSION = 2
UPGRADES = {
    2: "ALTER TABLE horizon ADD COLUMN boot_id TEXT; "
    "ALTER TABLE horizon ADD COLUMN written_until REAL"
}
# How far ahead of a start ``written_until`` is raised (with an fsync) when one passes it.
AHEAD_S = 60.0
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

Answer = Literal["started", "never-started", "unknown"]


class StartJournal:
    def __init__(self, path: Path, now: float, boot: str | None = None) -> None:
        """``boot``: this boot's id; read from the kernel unless given (tests)."""
        self.path = path
        self.boot = boot if boot is not None else boot_id()
        self.conn = open_store(
            path,
            schema=SCHEMA,
            version=VERSION,
            upgrades=UPGRADES,
            synchronous="NORMAL" if self.boot is not None else "FULL",
        )
        # Fences and the bound on start times: fsynced whatever the boot (the event
        # loop's, or a worker's for the bound; one at a time).
        self._synced = open_store(path, schema=SCHEMA, version=VERSION, upgrades=UPGRADES)
        self._synced_lock = threading.Lock()
        self._raising = asyncio.Lock()
        # The committer's thread and the event loop's share the connection.
        self._lock = threading.Lock()
        self.group = GroupCommit(self._batch, self._each, path.name)
        with self._lock, immediate(self.conn) as c:
            c.execute(
                "INSERT OR IGNORE INTO horizon (one, covered_from, boot_id) VALUES (1, ?, ?)",
                (now, self.boot),
            )
            row = c.execute("SELECT boot_id, written_until FROM horizon").fetchone()
            if row is None or row[0] != self.boot:
                # Rows of another boot (or of one not known) may have been lost to the
                # crash that ended it, and the clock may have come back behind them:
                # answer for nothing sent before now, nor before any of them. A boot
                # known is never forgotten for one not known.
                c.execute(
                    "UPDATE horizon SET covered_from = max(covered_from, ?, "
                    "coalesce(written_until, 0)), boot_id = coalesce(?, boot_id)",
                    (now, self.boot),
                )
        # Start rows up to this time are covered by the fsynced bound.
        self._until = float(row[1]) if row is not None and row[1] is not None else 0.0
        self._writes = 0
        self.collect(now)

    def __repr__(self) -> str:
        return f"<StartJournal {self.path}>"

    def close(self) -> None:
        self.group.close()
        self.conn.close()
        self._synced.close()

    def covered_from(self) -> float:
        with self._lock:
            row = self.conn.execute("SELECT covered_from FROM horizon").fetchone()
        return float(row[0]) if row else float("inf")

    @contextmanager
    def _batch(self) -> Iterator[None]:
        with self._lock, immediate(self.conn):
            yield

    @contextmanager
    def _each(self) -> Iterator[None]:
        """One start inside the batch: a refused one undoes only itself."""
        self.conn.execute("SAVEPOINT start")
        try:
            yield
        except BaseException as exc:
            # A full disk may have rolled the whole transaction back already: the
            # batch fails as one, coded, and no savepoint is left to undo.
            coded = storage_error(exc, self.path)
            if coded is exc:
                raise
            if coded is not None:
                raise coded from exc
            self.conn.execute("ROLLBACK TO start")
            self.conn.execute("RELEASE start")
            raise
        self.conn.execute("RELEASE start")

    async def start(
        self,
        seam_request_id: str,
        directive_id: str,
        idempotency_key: str | None,
        instance_id: str,
        now: float,
    ) -> None:
        """Written before the spawn. Refused (``connector-unavailable``, nothing ran) if
        this dispatch was answered never-started; in doubt if it already started once."""
        if self.boot is not None and now >= self._until:
            await self._raise_until(now + AHEAD_S)
        row = (seam_request_id, directive_id, idempotency_key, instance_id, now)
        await self.group.submit_async(functools.partial(_start_row, self.conn, row))
        self._tick(now)

    async def _raise_until(self, until: float) -> None:
        """``written_until`` to ``until``, fsynced before a start row passes the old one."""
        async with self._raising:
            if until - AHEAD_S < self._until:
                return  # raised meanwhile, by a start of the same moment
            await asyncio.to_thread(self._write_until, until)
            self._until = until

    def _write_until(self, until: float) -> None:
        with self._synced_lock, immediate(self._synced) as c:
            c.execute(
                "UPDATE horizon SET written_until = max(coalesce(written_until, 0), ?)", (until,)
            )

    def ask(
        self, seam_request_ids: Sequence[str], sent_from: float, instance_id: str, now: float
    ) -> Answer:
        """Did any of these dispatches (the earliest sent at ``sent_from``) start?
        ``never-started`` fences them all, in the same transaction, fsynced before the
        answer."""
        with self._synced_lock, immediate(self._synced) as c:
            for rid in seam_request_ids:
                row = c.execute(
                    "SELECT state FROM starts WHERE seam_request_id = ?", (rid,)
                ).fetchone()
                if row is not None and row[0] == "started":
                    return "started"
            cover = c.execute("SELECT covered_from FROM horizon").fetchone()
            if cover is None or sent_from - MARGIN_S < float(cover[0]) or not seam_request_ids:
                return "unknown"
            c.executemany(
                "INSERT OR IGNORE INTO starts VALUES (?, 'fenced', NULL, NULL, ?, ?)",
                [(rid, instance_id, now) for rid in seam_request_ids],
            )
        self._tick(now)
        return "never-started"

    def _tick(self, now: float) -> None:
        self._writes += 1
        if self._writes % COLLECT_EVERY == 0:
            # In the committer's next batch: never the event loop waiting on its lock.
            self.group.submit(functools.partial(_collect_rows, self.conn, now))

    def collect(self, now: float) -> int:
        """Drop rows older than ``KEEP_S`` and beyond the newest ``KEEP_ROWS``; the
        horizon moves past every row dropped. Returns how many were dropped."""
        with self._lock, immediate(self.conn) as c:
            return _collect_rows(c, now)


def _collect_rows(c: apsw.Connection, now: float) -> int:
    """collect's work, inside a transaction."""
    cut = now - KEEP_S
    nth = c.execute(
        "SELECT at FROM starts ORDER BY at DESC LIMIT 1 OFFSET ?", (KEEP_ROWS,)
    ).fetchone()
    if nth is not None:
        cut = max(cut, float(nth[0]))
    dropped = c.execute("SELECT count(*), max(at) FROM starts WHERE at <= ?", (cut,)).fetchone()
    if dropped is None or not dropped[0]:
        return 0
    c.execute("DELETE FROM starts WHERE at <= ?", (cut,))
    c.execute("UPDATE horizon SET covered_from = max(covered_from, ?)", (float(dropped[1]),))
    return int(dropped[0])


def _start_row(conn: apsw.Connection, row: tuple[str, str, str | None, str, float]) -> None:
    """In the committer's transaction: the start's row, unless a fence or an earlier
    start of the same dispatch says it may not start."""
    seam_request_id = row[0]
    found = conn.execute(
        "SELECT state FROM starts WHERE seam_request_id = ?", (seam_request_id,)
    ).fetchone()
    if found is not None and found[0] == "fenced":
        raise CodedError(
            RuntimeErrorCode.CONNECTOR_UNAVAILABLE,
            "this dispatch was already answered as never started; nothing ran",
            detail={"start": "fenced"},
        )
    if found is not None:
        raise CodedError(
            RuntimeErrorCode.OUTCOME_IN_DOUBT,
            "this dispatch already started once; it is not started again",
            detail={"in_flight": "true"},
        )
    conn.execute("INSERT INTO starts VALUES (?, 'started', ?, ?, ?, ?)", row)


def boot_id() -> str | None:
    """The kernel's id of this boot, or None where it cannot be read."""
    try:
        return BOOT_ID.read_text().strip() or None
    except OSError:
        return None
