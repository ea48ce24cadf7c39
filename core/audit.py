"""The audit store: every outcome, rejection and in-doubt directive.

Writes go through one thread that group-commits whatever has queued up in one
``BEGIN IMMEDIATE`` transaction, so ``synchronous=FULL`` costs one fsync per batch
rather than one per directive, and the event loop never blocks on disk. Outcomes are
on disk before their caller hears of them (``record``); rejections and in-doubt
records, which changed nothing a caller depends on, are queued (``enqueue``) and
written by the same batches — and by ``close``.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

import msgspec
import structlog

from sensorium.core.observations import INSERT as OBSERVATION_INSERT
from sensorium.core.observations import SCHEMA as OBSERVATION_SCHEMA
from sensorium.core.observations import Row as ObservationRow
from sensorium.shared.clock import rfc3339
from sensorium.shared.store import immediate, open_store
from sensorium.shared.wire.outcome import Outcome

_RECORDS = """
CREATE TABLE {name} (
    record_id       TEXT PRIMARY KEY,
    -- outcome: the action ran and this is what happened; rejection: nothing ran;
    -- unknown: dispatched, but its outcome was never heard (connector lost, timeout);
    -- deferral: accepted as a deferred operation (its handle is the body).
    kind            TEXT NOT NULL CHECK (kind IN ('outcome', 'rejection', 'unknown',
                        'deferral')),
    directive_id    TEXT NOT NULL,
    action_id       TEXT NOT NULL,
    status          TEXT NOT NULL,
    code            TEXT,
    request_id      TEXT,
    idempotency_key TEXT,
    recorded_at     TEXT NOT NULL,
    body            BLOB NOT NULL
);
"""
# Version 3 widened the kinds: SQLite cannot alter a CHECK, so the table is rebuilt
# (a fresh store runs the same steps on an empty table).
SCHEMA = (
    _RECORDS.format(name="IF NOT EXISTS records")
    + _RECORDS.format(name="records_v3")
    + """
INSERT INTO records_v3 SELECT * FROM records;
DROP TABLE records;
ALTER TABLE records_v3 RENAME TO records;
CREATE INDEX IF NOT EXISTS records_directive ON records (directive_id);
CREATE INDEX IF NOT EXISTS records_time ON records (recorded_at);
CREATE INDEX IF NOT EXISTS records_key ON records (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
"""
)
SCHEMA += OBSERVATION_SCHEMA
VERSION = 3
MAX_BATCH = 512
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
    # Written in the same transaction as the outcome they observe.
    observations: tuple[ObservationRow, ...] = ()


_Item = tuple[AuditRecord, "asyncio.Future[None] | None", "asyncio.AbstractEventLoop | None"]


class AuditStore:
    """Owns ``storage/audit.sqlite``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._conn = open_store(path, schema=SCHEMA, version=VERSION)
        self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
        self._thread.start()
        self.written = 0
        self.dropped = 0

    def __repr__(self) -> str:
        return f"<AuditStore {self.path} written={self.written} dropped={self.dropped}>"

    async def record(self, rec: AuditRecord) -> None:
        """Resolves once the row is on disk."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._queue.put((rec, fut, loop))
        await fut

    def enqueue(self, rec: AuditRecord) -> None:
        """Persist without waiting, for records no caller's answer depends on."""
        if self._queue.qsize() >= MAX_QUEUED:
            self.dropped += 1
            log.error(
                "audit.record.dropped",
                kind=rec.kind,
                dropped=self.dropped,
                **{"directive/id": rec.directive_id, "request/id": rec.request_id},
            )
            return
        self._queue.put((rec, None, None))

    def outcome_for_key(self, key: str, since: float) -> Outcome | None:
        """The first outcome recorded under ``idempotency/key`` since ``since`` (POSIX s)."""
        row = self._conn.execute(
            "SELECT body FROM records WHERE idempotency_key = ? AND kind = 'outcome' "
            "AND recorded_at >= ? ORDER BY recorded_at LIMIT 1",
            (key, rfc3339(since)),
        ).fetchone()
        return _outcome_decoder.decode(row[0]) if row else None

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            stop = False
            while len(batch) < MAX_BATCH:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            self._write(batch)
            if stop:
                return

    def _write(self, batch: list[_Item]) -> None:
        error: BaseException | None = None
        try:
            with immediate(self._conn):
                self._conn.executemany(
                    "INSERT OR IGNORE INTO records VALUES (?,?,?,?,?,?,?,?,?,?)",
                    [
                        (
                            r.record_id,
                            r.kind,
                            r.directive_id,
                            r.action_id,
                            r.status,
                            r.code,
                            r.request_id,
                            r.idempotency_key,
                            r.recorded_at,
                            r.body,
                        )
                        for r, _f, _l in batch
                    ],
                )
                obs_rows = [row for r, _f, _l in batch for row in r.observations]
                if obs_rows:
                    self._conn.executemany(OBSERVATION_INSERT, obs_rows)
            self.written += len(batch)
        except Exception as exc:  # handed to every waiter, not swallowed
            error = exc
            log.error(
                "audit.write.failed",
                records=len(batch),
                error=str(exc),
                request_ids=[r.request_id for r, _f, _l in batch[:20]],
            )
        for _rec, fut, loop in batch:
            if fut is not None and loop is not None:
                try:
                    loop.call_soon_threadsafe(_settle, fut, error)
                except RuntimeError:
                    pass  # that loop is closed: nobody is waiting any more

    def close(self) -> None:
        """Write everything queued, then close (the connection stays open if the writer is
        stuck, rather than being pulled out from under it)."""
        self._queue.put(None)
        self._thread.join(timeout=10)
        if self._thread.is_alive():
            log.error("audit.close.stuck", note="writer still busy; connection left open")
            return
        self._conn.close()


def _settle(fut: asyncio.Future[None], error: BaseException | None) -> None:
    if fut.done():
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)
