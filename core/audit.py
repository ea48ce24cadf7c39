"""The audit store: every outcome and every rejection, durable before the caller hears of it.

Writes go through one thread that group-commits whatever has queued up in one
``BEGIN IMMEDIATE`` transaction, so ``synchronous=FULL`` costs one fsync per
batch rather than one per directive, and the event loop never blocks on disk.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

import structlog

from sensorium.shared.store import immediate, open_store

SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    record_id    TEXT PRIMARY KEY,
    kind         TEXT NOT NULL CHECK (kind IN ('outcome', 'rejection')),
    directive_id TEXT NOT NULL,
    action_id    TEXT NOT NULL,
    status       TEXT NOT NULL,
    code         TEXT,
    request_id   TEXT,
    recorded_at  TEXT NOT NULL,
    body         BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS records_directive ON records (directive_id);
CREATE INDEX IF NOT EXISTS records_time ON records (recorded_at);
"""
VERSION = 1
MAX_BATCH = 512
log = structlog.get_logger("sensorium.audit")


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


_Item = tuple[AuditRecord, "asyncio.Future[None] | None", "asyncio.AbstractEventLoop | None"]


class AuditStore:
    """Owns ``storage/audit.sqlite``; ``record`` resolves once the row is on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._conn = open_store(path, schema=SCHEMA, version=VERSION)
        self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
        self._thread.start()
        self.written = 0

    def __repr__(self) -> str:
        return f"<AuditStore {self.path} written={self.written}>"

    async def record(self, rec: AuditRecord) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._queue.put((rec, fut, loop))
        await fut

    def enqueue(self, rec: AuditRecord) -> None:
        """Persist without waiting: for records whose caller's answer does not depend on them
        (a rejection changed nothing in the world). ``close`` still writes whatever is queued.
        """
        self._queue.put((rec, None, None))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < MAX_BATCH:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                batch.append(nxt)
            error: BaseException | None = None
            try:
                with immediate(self._conn):
                    self._conn.executemany(
                        "INSERT OR IGNORE INTO records VALUES (?,?,?,?,?,?,?,?,?)",
                        [
                            (
                                r.record_id,
                                r.kind,
                                r.directive_id,
                                r.action_id,
                                r.status,
                                r.code,
                                r.request_id,
                                r.recorded_at,
                                r.body,
                            )
                            for r, _f, _l in batch
                        ],
                    )
                self.written += len(batch)
            except BaseException as exc:  # handed to every waiter, not swallowed
                error = exc
                log.error("audit.write.failed", records=len(batch), error=str(exc))
            for _rec, fut, loop in batch:
                if fut is not None and loop is not None:
                    loop.call_soon_threadsafe(_settle, fut, error)

    def count(self) -> int:
        row = self._conn.execute("SELECT count(*) FROM records").fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)
        self._conn.close()


def _settle(fut: asyncio.Future[None], error: BaseException | None) -> None:
    if fut.done():
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)
