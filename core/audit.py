"""The audit store: every outcome, rejection and in-doubt directive.

Writes go through one thread that group-commits whatever has queued up in one
``BEGIN IMMEDIATE`` transaction, so ``synchronous=FULL`` costs one fsync per batch
rather than one per directive, and the event loop never blocks on disk. Outcomes are
on disk before their caller hears of them (``record``); rejections and in-doubt
records, which changed nothing a caller depends on, are queued (``enqueue``) and
written by the same batches — at most ``LINGER_S`` later, and by ``close``; a read
that must see them waits for them (``settled``).

Beside the records sit the dispatch intents (``dispatches``): a row per sync directive
sent to the connector, settled by the record that ends it. A keyed intent is on disk
before its directive leaves core, which is what lets a retry after a crash know that
an earlier attempt may have run. The same writer applies the orphan queue's
operations (``core/orphans.py``), so every write to this file has one author.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
import msgspec
import structlog

from sensorium.core.audit_sql import INSERT_RECORD, SCHEMA, SETTLE, UPGRADES, VERSION
from sensorium.core.observations import INSERT as OBSERVATION_INSERT
from sensorium.core.observations import Row as ObservationRow
from sensorium.core.outcomes_sql import OutcomeRow, upsert
from sensorium.shared.batching import take_batch
from sensorium.shared.clock import rfc3339
from sensorium.shared.store import BUSY_TIMEOUT_MS, immediate, open_store, storage_error
from sensorium.shared.wire.outcome import Accounting, Outcome

MAX_BATCH = 512
# How long an unawaited write waits for company before its batch is committed.
LINGER_S = 0.02
# Queued, unawaited records beyond this are dropped (and counted in the log) rather than
# letting a flood of bad directives grow memory without bound.
MAX_QUEUED = 10_000
log = structlog.get_logger("sensorium.audit")
_outcome_decoder = msgspec.msgpack.Decoder(Outcome)


@dataclass(frozen=True)
class AuditRecord:
    record_id: str
    kind: str
    directive_id: str
    action_id: str
    status: str
    code: str | None
    request_id: str | None
    recorded_at: str
    body: bytes
    idempotency_key: str | None = None
    # Ends the directive's dispatch intent (an outcome always does; a refusal only when
    # it answers that dispatch).
    settles: bool = False
    # Written in the same transaction as the outcome they observe.
    observations: tuple[ObservationRow, ...] = ()
    # The directive's published outcome record, upserted in the same transaction.
    outcome: OutcomeRow | None = None
    # An outcome's accounting, kept in columns of its own.
    accounting: Accounting | None = None


@dataclass(frozen=True)
class Dispatch:
    """A sync directive about to be sent to the connector."""

    directive_id: str
    idempotency_key: str | None
    action_id: str
    correlation_id: str | None
    seam_request_id: str
    core_instance: str
    dispatched_at: str
    # The connector instance core's latest report named when it sent the directive to
    # be run; REJOIN_ONLY for an attempt that only asked to rejoin an earlier one.
    connector_instance: str | None = None
    # sha256 of the canonical (RFC 8785) parameters: what the key is bound to.
    params_digest: str | None = None


REJOIN_ONLY = "-"


@dataclass(frozen=True)
class PriorDispatch:
    directive_id: str
    core_instance: str
    settled: str | None


# Anything else the writer can apply: a function of the connection, run inside the
# batch's transaction (the orphan queue's reconcile steps).
Apply = Callable[[apsw.Connection], None]
Write = AuditRecord | Dispatch | OutcomeRow | Apply
_Item = tuple[Write, "asyncio.Future[None] | None", "asyncio.AbstractEventLoop | None"]


class AuditStore:
    """Owns ``storage/audit.sqlite``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._conn = open_store(path, schema=SCHEMA, version=VERSION, upgrades=UPGRADES)
        # Reads get a connection of their own: apsw refuses a connection that another
        # thread is using (ThreadingViolationError), and the writer's would also show
        # a batch before its commit. One reader at a time on it.
        self._reader = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
        self._reader.set_busy_timeout(BUSY_TIMEOUT_MS)
        self._reading = threading.Lock()
        # And one for the event loop's own point lookups (lookup()): never shared, so it
        # never waits behind another reader's long query.
        self._lookup = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
        self._lookup.set_busy_timeout(BUSY_TIMEOUT_MS)
        self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
        self.written = 0
        self.dropped = 0
        # Unawaited writes queued, and how many of them the writer has finished (written
        # or failed): ``settled`` waits only while the second trails the first.
        self._queued = 0
        self._finished = 0
        self._urgent = threading.Event()
        self._thread.start()

    def __repr__(self) -> str:
        return f"<AuditStore {self.path} written={self.written} dropped={self.dropped}>"

    def read(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """Rows of one query on the read connection (committed data only)."""
        with self._reading:
            return self._reader.execute(sql, params).fetchall()

    def lookup(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """Rows of a lookup by key of what was just written (its pages are in the cache),
        run on the calling thread: the event loop's, without a thread hop. Only from
        that one thread; anything that scans goes through ``read`` in a worker."""
        return self._lookup.execute(sql, params).fetchall()

    async def record(self, rec: Write) -> None:
        """Resolves once the write is on disk; a full disk or read-only state directory
        raises ``storage-unavailable``."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._queue.put((rec, fut, loop))
        self._urgent.set()
        await fut

    def enqueue(self, rec: Write, *, past_full: bool = False) -> bool:
        """Persist without waiting, for writes no caller's answer depends on; False when
        the queue is full and it was dropped (counted and logged). ``past_full``: queued
        even then, for a record whose receipt was given out already (the bound then
        holds within the few a loop turn can add)."""
        if self.full and not past_full:
            self.dropped += 1
            log.error("audit.record.dropped", what=_describe(rec), dropped=self.dropped)
            return False
        self._queued += 1
        self._queue.put((rec, None, None))
        return True

    @property
    def full(self) -> bool:
        """``enqueue`` would drop a write now."""
        return self._queue.qsize() >= MAX_QUEUED

    async def settled(self) -> None:
        """Resolves once every write queued so far is finished: a read after it sees a
        record whose receipt a caller was already given (``enqueue``)."""
        if self._finished < self._queued:
            with contextlib.suppress(Exception):  # a failed batch was logged by the writer
                await self.record(_nothing)

    def prior_dispatch(self, key: str, since: float) -> PriorDispatch | None:
        """The latest dispatch under ``key`` since ``since`` that may have run without
        its outcome being heard: never settled, or settled in doubt."""
        rows = self.read(
            "SELECT directive_id, core_instance, settled FROM dispatches "
            "WHERE idempotency_key = ? AND dispatched_at >= ? "
            "AND (settled IS NULL OR settled = 'unknown') "
            "ORDER BY dispatched_at DESC LIMIT 1",
            (key, rfc3339(since)),
        )
        return PriorDispatch(*rows[0]) if rows else None

    def unsettled_dispatches(self, key: str, since: float) -> list[tuple[str | None, str]]:
        """(connector instance, dispatched_at) of every attempt under ``key`` since
        ``since`` that may have run without its outcome being heard."""
        rows = self.read(
            "SELECT connector_instance, dispatched_at FROM dispatches "
            "WHERE idempotency_key = ? AND dispatched_at >= ? "
            "AND (settled IS NULL OR settled = 'unknown')",
            (key, rfc3339(since)),
        )
        return [(None if i is None else str(i), str(at)) for i, at in rows]

    def unsettled_spawns(self, key: str, since: float) -> list[tuple[str, str | None, str]]:
        """(directive id, seam request that sent it to be run or None if not known,
        dispatched_at) of every attempt under ``key`` since ``since`` that may have run
        without its outcome being heard; attempts that only rejoined are left out."""
        rows = self.read(
            "SELECT directive_id, spawn_request_id, dispatched_at FROM dispatches "
            "WHERE idempotency_key = ? AND dispatched_at >= ? "
            "AND (settled IS NULL OR settled = 'unknown') "
            "AND connector_instance IS NOT '-'",
            (key, rfc3339(since)),
        )
        return [(str(d), None if r is None else str(r), str(at)) for d, r, at in rows]

    def keyed_dispatches_since(self, dispatched_at: str) -> int:
        """Keyed dispatches sent after ``dispatched_at`` (by any core instance)."""
        rows = self.read(
            "SELECT count(*) FROM dispatches WHERE dispatched_at > ? "
            "AND idempotency_key IS NOT NULL",
            (dispatched_at,),
        )
        return int(rows[0][0]) if rows else 0

    def key_binding(self, key: str, since: float) -> tuple[str, str | None] | None:
        """(action, parameters digest) of the first attempt dispatched under ``key`` since
        ``since``: what a reuse of the key must match (None: the key is unused)."""
        rows = self.read(
            "SELECT action_id, params_digest FROM dispatches "
            "WHERE idempotency_key = ? AND dispatched_at >= ? "
            "ORDER BY dispatched_at LIMIT 1",
            (key, rfc3339(since)),
        )
        return (str(rows[0][0]), None if rows[0][1] is None else str(rows[0][1])) if rows else None

    def outcome_for_key(self, key: str, since: float) -> Outcome | None:
        """The first outcome recorded under ``idempotency/key`` since ``since`` (POSIX s)."""
        rows = self.read(
            "SELECT body FROM records WHERE idempotency_key = ? AND kind = 'outcome' "
            "AND recorded_at >= ? ORDER BY recorded_at LIMIT 1",
            (key, rfc3339(since)),
        )
        return _outcome_decoder.decode(rows[0][0]) if rows else None

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if item[1] is None:
                # Nobody waits on this one: give others a moment to join its batch
                # (a flood of refusals is then one commit per LINGER_S, not one each,
                # and puts meanwhile wake nobody). An awaited write cuts it short.
                self._urgent.wait(LINGER_S)
            self._urgent.clear()
            batch, stop = take_batch(self._queue, item, MAX_BATCH)
            self._write(batch)
            if stop:
                return

    def _write(self, batch: list[_Item]) -> None:
        errors: list[BaseException | None] = [None] * len(batch)
        try:
            with immediate(self._conn):
                for i, (item, _f, _l) in enumerate(batch):
                    errors[i] = self._apply_one(item)
            self.written += errors.count(None)
        except Exception as exc:  # the whole batch: handed to every waiter
            failed: BaseException = storage_error(exc, self.path) or exc
            errors = [failed] * len(batch)
            log.error(
                "audit.write.failed",
                writes=len(batch),
                error=str(exc),
                code=getattr(failed, "code", None),
                what=[_describe(w) for w, _f, _l in batch[:20]],
            )
        self._finished += sum(1 for _w, fut, _l in batch if fut is None)
        for (_rec, fut, loop), error in zip(batch, errors, strict=True):
            if fut is not None and loop is not None:
                try:
                    loop.call_soon_threadsafe(_settle, fut, error)
                except RuntimeError:
                    pass  # that loop is closed: nobody is waiting any more

    def _apply_one(self, w: Write) -> BaseException | None:
        """One write under its own savepoint: a bad one fails alone, not its batch. A
        storage failure fails the batch (its commit could not succeed anyway)."""
        self._conn.execute("SAVEPOINT one")
        try:
            self._apply(w)
        except Exception as exc:
            if storage_error(exc, self.path) is not None:
                raise
            self._conn.execute("ROLLBACK TO one")
            self._conn.execute("RELEASE one")
            log.exception("audit.write.refused", what=_describe(w))
            return exc
        self._conn.execute("RELEASE one")
        return None

    def _apply(self, w: Write) -> None:
        c = self._conn
        if isinstance(w, AuditRecord):
            a = w.accounting
            c.execute(
                INSERT_RECORD,
                (
                    w.record_id,
                    w.kind,
                    w.directive_id,
                    w.action_id,
                    w.status,
                    w.code,
                    w.request_id,
                    w.idempotency_key,
                    w.recorded_at,
                    w.body,
                    *(
                        (
                            a.cpu_user_ms,
                            a.cpu_system_ms,
                            a.peak_memory_bytes,
                            a.io_read_bytes,
                            a.io_write_bytes,
                            a.source,
                        )
                        if a is not None
                        else (None,) * 6
                    ),
                ),
            )
            if w.observations:
                c.executemany(OBSERVATION_INSERT, list(w.observations))
            if w.kind == "outcome" or w.settles:
                c.execute(SETTLE, (w.kind, w.recorded_at, w.directive_id, w.kind))
            if w.outcome is not None:
                self._upsert(w.outcome)
        elif isinstance(w, OutcomeRow):
            self._upsert(w)
        elif isinstance(w, Dispatch):
            c.execute(
                # A retry that reuses the directive reopens its intent: this attempt
                # is unanswered until a record settles it, whatever ended the last one.
                "INSERT INTO dispatches (directive_id, idempotency_key, action_id, "
                "correlation_id, seam_request_id, core_instance, dispatched_at, "
                "connector_instance, params_digest, spawn_request_id) "
                "VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT (directive_id) DO UPDATE SET "
                "seam_request_id = excluded.seam_request_id, "
                "core_instance = excluded.core_instance, "
                # A rejoin spawns nothing: it keeps where the attempt was sent to spawn.
                "connector_instance = CASE WHEN excluded.connector_instance = '-' "
                "THEN dispatches.connector_instance ELSE excluded.connector_instance END, "
                "spawn_request_id = CASE WHEN excluded.connector_instance = '-' "
                "THEN dispatches.spawn_request_id ELSE excluded.spawn_request_id END, "
                "dispatched_at = excluded.dispatched_at, settled = NULL, settled_at = NULL "
                "WHERE settled IS NOT 'outcome'",
                (
                    w.directive_id,
                    w.idempotency_key,
                    w.action_id,
                    w.correlation_id,
                    w.seam_request_id,
                    w.core_instance,
                    w.dispatched_at,
                    w.connector_instance,
                    w.params_digest,
                    None if w.connector_instance == REJOIN_ONLY else w.seam_request_id,
                ),
            )
        else:
            w(c)

    def _upsert(self, row: OutcomeRow) -> None:
        """The directive's outcome record; a clash of ids (never expected) costs the
        record, not the journal row written with it."""
        self._conn.execute("SAVEPOINT outcome")
        try:
            upsert(self._conn, row)
        except apsw.ConstraintError:
            self._conn.execute("ROLLBACK TO outcome")
            log.exception("audit.outcome.refused", outcome=row.outcome_id)
        self._conn.execute("RELEASE outcome")

    def close(self) -> None:
        """Write everything queued, then close (the connection stays open if the writer is
        stuck, rather than being pulled out from under it)."""
        self._queue.put(None)
        self._urgent.set()
        self._thread.join(timeout=10)
        if self._thread.is_alive():
            log.error("audit.close.stuck", note="writer still busy; connection left open")
            return
        with self._reading:
            self._reader.close()
        self._lookup.close()
        self._conn.close()


def _describe(w: Write) -> str:
    if isinstance(w, AuditRecord):
        return f"{w.kind}:{w.record_id}"
    if isinstance(w, Dispatch):
        return f"dispatch:{w.directive_id}"
    if isinstance(w, OutcomeRow):
        return f"outcome-record:{w.outcome_id}"
    return getattr(w, "__qualname__", "apply")


def _nothing(_conn: apsw.Connection) -> None:
    """A write that writes nothing: waited on, it marks everything queued before it."""


def _settle(fut: asyncio.Future[None], error: BaseException | None) -> None:
    if fut.done():
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)


def settle_as_never_run(directive_ids: list[str]) -> Apply:
    """Close these dispatch intents as "nothing ran" (``rejection``): the connector's
    start journal proved, and fenced, that none of them started."""
    at = rfc3339()

    def apply(conn: apsw.Connection) -> None:
        conn.executemany(
            "UPDATE dispatches SET settled = 'rejection', settled_at = ? "
            "WHERE directive_id = ? AND (settled IS NULL OR settled = 'unknown')",
            [(at, d) for d in directive_ids],
        )

    return apply
