"""The OS connector's deferred jobs (``connectors/os/jobs.sqlite``, DESIGN §7).

A job is an async directive the connector has accepted: persisted ``pending`` before
the acknowledgement leaves, marked ``running`` (with the instance that runs it)
before its process is spawned, and ended in one transaction with its outcome. Every
write is one ``BEGIN IMMEDIATE`` transaction whose ``UPDATE`` is conditional on the
state it expects, so a transition that lost a race changes nothing.

Used from the connector's event loop only: one connection, no lock. Times are POSIX
seconds passed in by the caller. A transition the disk cannot take (full, read-only)
raises ``storage-unavailable`` and changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import apsw
import msgspec

from sensorium.shared.clock import rfc3339
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.store import immediate, open_store
from sensorium.shared.wire.declaration import DeferredProfile
from sensorium.shared.wire.deferred import (
    ConnectorDeferred,
    DeferredOperationStatus,
    OperationStatus,
)
from sensorium.shared.wire.outcome import Diagnostic, Outcome

OPEN = ("pending", "running")
ENDS = ("completed", "failed", "timed-out", "cancelled")
_OPEN_SQL = "('pending', 'running')"

SCHEMA = """
CREATE TABLE jobs (
    -- insertion order is the order jobs start in
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    operation_id   TEXT NOT NULL UNIQUE,
    action_id      TEXT NOT NULL,
    directive_id   TEXT NOT NULL,
    directive      BLOB NOT NULL,
    timeout_ms     INTEGER NOT NULL CHECK (timeout_ms >= 1),
    config_hash    TEXT NOT NULL,
    status         TEXT NOT NULL CHECK (status IN ('pending', 'running', 'completed',
                       'failed', 'timed-out', 'cancelled')),
    created_at     REAL NOT NULL,
    updated_at     REAL NOT NULL,
    started_at     REAL,
    -- the connector instance that accepted the job, and the one that ran it
    accepted_by    TEXT NOT NULL,
    instance_id    TEXT,
    outcome        BLOB,
    error_code     TEXT,
    error_message  TEXT,
    CHECK (status != 'running' OR (started_at IS NOT NULL AND instance_id IS NOT NULL))
);
CREATE INDEX jobs_status ON jobs (status, seq);
CREATE INDEX jobs_collect ON jobs (updated_at) WHERE status NOT IN ('pending', 'running');
"""
VERSION = 1

COLUMNS = (
    "operation_id, action_id, directive_id, directive, timeout_ms, config_hash, status, "
    "created_at, updated_at, started_at, accepted_by, instance_id, outcome, error_code, "
    "error_message"
)

CANCEL_HREF = "sensorium.connector.cancel"
# Slack on fail_after_seconds beyond the timeout and the SIGTERM grace.
FAIL_AFTER_SLACK_S = 5
MAX_RETRY_AFTER_S = 3600  # the published bound of retry_after_seconds
LOST_MESSAGE = (
    "the connector restarted while this job ran; whether its effects happened is not known"
)


@dataclass(frozen=True, slots=True)
class Job:
    """One row of the store."""

    operation_id: str
    action_id: str
    directive_id: str
    directive: bytes
    timeout_ms: int
    config_hash: str
    status: str
    created_at: float
    updated_at: float
    started_at: float | None
    accepted_by: str
    instance_id: str | None
    outcome: bytes | None
    error_code: str | None
    error_message: str | None

    def __repr__(self) -> str:
        return f"<Job {self.operation_id} {self.action_id} {self.status}>"

    @property
    def open(self) -> bool:
        return self.status in OPEN


@dataclass(frozen=True, slots=True)
class NewJob:
    """What an accepted async directive persists."""

    operation_id: str
    action_id: str
    directive_id: str
    directive: bytes
    timeout_ms: int
    config_hash: str
    accepted_by: str


@dataclass(frozen=True, slots=True)
class Recovered:
    """What a start found: jobs lost with their instance, and pending ones kept or dropped."""

    lost: list[str]
    requeued: list[str]
    stale: list[str]


class QueueFull(Exception):
    """``connector_max_pending_jobs`` jobs already wait for a slot; nothing was stored."""

    def __init__(self, pending: int) -> None:
        super().__init__(f"{pending} jobs are waiting")
        self.pending = pending


def _job(row: Any) -> Job:
    return Job(*row)


class JobStore:
    """The jobs' state machine over one apsw connection."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = open_store(path, schema=SCHEMA, version=VERSION)

    def __repr__(self) -> str:
        return f"<JobStore {self.path}>"

    def close(self) -> None:
        self.conn.close()

    def _get(self, conn: apsw.Connection, operation_id: str) -> Job | None:
        row = conn.execute(
            f"SELECT {COLUMNS} FROM jobs WHERE operation_id = ?", (operation_id,)
        ).fetchone()
        return None if row is None else _job(row)

    # -- reads (never write, never delete) --------------------------------------

    def get(self, operation_id: str) -> Job | None:
        return self._get(self.conn, operation_id)

    def get_many(self, operation_ids: list[str]) -> dict[str, Job]:
        """The jobs these ids name (missing ones left out), in one query."""
        marks = ",".join("?" * len(operation_ids))
        rows = self.conn.execute(
            f"SELECT {COLUMNS} FROM jobs WHERE operation_id IN ({marks})", tuple(operation_ids)
        ).fetchall()
        return {job.operation_id: job for job in map(_job, rows)}

    def count(self, status: str) -> int:
        return self._count(self.conn, status)

    @staticmethod
    def _count(conn: apsw.Connection, status: str) -> int:
        row = conn.execute("SELECT count(*) FROM jobs WHERE status = ?", (status,)).fetchone()
        return int(row[0]) if row else 0

    def list_open(self) -> list[Job]:
        rows = self.conn.execute(
            f"SELECT {COLUMNS} FROM jobs WHERE status IN {_OPEN_SQL} ORDER BY seq"
        ).fetchall()
        return [_job(r) for r in rows]

    # -- transitions -----------------------------------------------------------

    def submit(self, new: NewJob, now: float, max_pending: int) -> tuple[Job, bool]:
        """Persist ``new`` as ``pending``, or return the job its id already names (and
        ``False``). Raises :class:`QueueFull` when ``max_pending`` jobs already wait."""
        (got,), _claimed = self.submit_many([new], now, max_pending)
        if isinstance(got, QueueFull):
            raise got
        return got

    def submit_many(
        self,
        news: list[NewJob],
        now: float,
        max_pending: int,
        claim: tuple[str, int] | None = None,
    ) -> tuple[list[tuple[Job, bool] | QueueFull], list[Job]]:
        """``submit`` for each of ``news`` in one transaction (group commit: one fsync for
        all the acceptances that arrived together), each answered on its own; with
        ``claim`` (instance, free slots), the oldest pending jobs are also marked
        ``running`` for that instance in the same transaction (``claim_next``'s rule),
        so that starting them costs no commit of its own."""
        with immediate(self.conn) as conn:
            got = [self._submit(conn, new, now, max_pending) for new in news]
            claimed: list[Job] = []
            if claim is not None:
                instance_id, slots = claim
                while len(claimed) < slots and (job := self._claim(conn, instance_id, now)):
                    claimed.append(job)
            return got, claimed

    def _submit(
        self, conn: apsw.Connection, new: NewJob, now: float, max_pending: int
    ) -> tuple[Job, bool] | QueueFull:
        first = self._get(conn, new.operation_id)
        if first is not None:
            return first, False
        waiting = self._count(conn, "pending")
        if waiting >= max_pending:
            return QueueFull(waiting)
        conn.execute(
            "INSERT INTO jobs (operation_id, action_id, directive_id, directive, timeout_ms, "
            "config_hash, status, created_at, updated_at, accepted_by) "
            "VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?)",
            (
                new.operation_id,
                new.action_id,
                new.directive_id,
                new.directive,
                new.timeout_ms,
                new.config_hash,
                now,
                now,
                new.accepted_by,
            ),
        )
        job = self._get(conn, new.operation_id)
        assert job is not None
        return job, True

    def claim_next(self, instance_id: str, now: float) -> Job | None:
        """Mark the oldest pending job ``running`` for ``instance_id``: before its spawn."""
        with immediate(self.conn) as conn:
            return self._claim(conn, instance_id, now)

    @staticmethod
    def _claim(conn: apsw.Connection, instance_id: str, now: float) -> Job | None:
        row = conn.execute(
            "SELECT seq FROM jobs WHERE status = 'pending' ORDER BY seq LIMIT 1"
        ).fetchone()
        if row is None:
            return None
        conn.execute(
            "UPDATE jobs SET status = 'running', started_at = ?, instance_id = ?, "
            "updated_at = ? WHERE seq = ? AND status = 'pending'",
            (now, instance_id, now, row[0]),
        )
        claimed = conn.execute(f"SELECT {COLUMNS} FROM jobs WHERE seq = ?", (row[0],))
        return _job(claimed.fetchone())

    def finish(
        self,
        operation_id: str,
        instance_id: str,
        status: str,
        now: float,
        *,
        outcome: bytes | None = None,
        code: str | None = None,
        message: str | None = None,
    ) -> bool:
        """End a job this instance runs, outcome and status together."""
        if status not in ENDS:
            raise ValueError(f"{status!r} is not a final job status")
        with immediate(self.conn) as conn:
            conn.execute(
                "UPDATE jobs SET status = ?, outcome = ?, error_code = ?, error_message = ?, "
                "updated_at = ? WHERE operation_id = ? AND status = 'running' "
                "AND instance_id = ?",
                (status, outcome, code, message, now, operation_id, instance_id),
            )
            return conn.changes() == 1

    def requeue(self, operation_id: str, instance_id: str, now: float) -> bool:
        """Give back a job this instance claimed but never spawned (it is stopping)."""
        with immediate(self.conn) as conn:
            conn.execute(
                "UPDATE jobs SET status = 'pending', started_at = NULL, instance_id = NULL, "
                "updated_at = ? WHERE operation_id = ? AND status = 'running' "
                "AND instance_id = ?",
                (now, operation_id, instance_id),
            )
            return conn.changes() == 1

    def cancel_pending(self, operation_id: str, now: float) -> bool:
        """A job that never started is cancelled outright; ``False`` if it has started."""
        with immediate(self.conn) as conn:
            conn.execute(
                "UPDATE jobs SET status = 'cancelled', updated_at = ? "
                "WHERE operation_id = ? AND status = 'pending'",
                (now, operation_id),
            )
            return conn.changes() == 1

    def fail_running(self, instance_id: str, now: float, code: str, message: str) -> list[str]:
        """End every job still ``running`` for ``instance_id`` as ``failed`` with ``code``."""
        with immediate(self.conn) as conn:
            ids = [
                str(r[0])
                for r in conn.execute(
                    "SELECT operation_id FROM jobs WHERE status = 'running' AND instance_id = ?",
                    (instance_id,),
                ).fetchall()
            ]
            conn.execute(
                "UPDATE jobs SET status = 'failed', error_code = ?, error_message = ?, "
                "updated_at = ? WHERE status = 'running' AND instance_id = ?",
                (code, message, now, instance_id),
            )
        return ids

    def recover(
        self, instance_id: str, now: float, still_valid: Callable[[Job], bool]
    ) -> Recovered:
        """At start: a job ``running`` for another instance lost its process with that
        instance (``job-lost``); a ``pending`` one is kept when ``still_valid`` says its
        action is still the one it was accepted for, else ``catalog-stale``."""
        lost: list[str] = []
        requeued: list[str] = []
        stale: list[str] = []
        with immediate(self.conn) as conn:
            rows = conn.execute(
                f"SELECT {COLUMNS} FROM jobs WHERE status IN {_OPEN_SQL} ORDER BY seq"
            ).fetchall()
            for job in map(_job, rows):
                if job.status == "running":
                    if job.instance_id == instance_id:
                        continue
                    code, message = RuntimeErrorCode.JOB_LOST, LOST_MESSAGE
                    lost.append(job.operation_id)
                elif still_valid(job):
                    requeued.append(job.operation_id)
                    continue
                else:
                    code = RuntimeErrorCode.CATALOG_STALE
                    message = (
                        f"the catalog changed before this job started; {job.action_id} is not "
                        "the action it was accepted for"
                    )
                    stale.append(job.operation_id)
                conn.execute(
                    "UPDATE jobs SET status = 'failed', error_code = ?, error_message = ?, "
                    "updated_at = ? WHERE operation_id = ? AND status = ?",
                    (code, message, now, job.operation_id, job.status),
                )
        return Recovered(lost=lost, requeued=requeued, stale=stale)

    def collect(self, before: float, batch: int) -> int:
        """Delete up to ``batch`` final jobs last changed before ``before`` (one transaction)."""
        with immediate(self.conn) as conn:
            conn.execute(
                "DELETE FROM jobs WHERE seq IN (SELECT seq FROM jobs WHERE status NOT IN "
                f"{_OPEN_SQL} AND updated_at < ? ORDER BY updated_at LIMIT ?)",
                (before, batch),
            )
            return int(conn.changes())


# -- what the seam says about a job ----------------------------------------------


def ack_of(
    job: Job, profile: DeferredProfile | None, grace_s: float, now: float
) -> ConnectorDeferred:
    """``sensorium-connector-deferred.v1`` for ``job`` as it is at ``now``."""
    reason = profile.cancel_unavailable_reason if profile else None
    retry = profile.preferred_retry_after_seconds if profile else None
    fail_after: int | msgspec.UnsetType = msgspec.UNSET
    # Only a started job has a knowable end: a waiting one may wait for any slot.
    if job.status == "running" and job.started_at is not None:
        end = job.started_at + job.timeout_ms / 1000 + grace_s
        fail_after = max(1, math.ceil(end - now) + FAIL_AFTER_SLACK_S)
    return ConnectorDeferred(
        operation_id=job.operation_id,
        status=cast(OperationStatus, job.status),
        retry_after_seconds=msgspec.UNSET if retry is None else retry,
        fail_after_seconds=fail_after,
        created_at=rfc3339(job.created_at),
        cancel_href=CANCEL_HREF if reason is None else msgspec.UNSET,
        cancel_unavailable_reason=msgspec.UNSET if reason is None else reason,
    )


def status_of(job: Job, profile: DeferredProfile | None) -> DeferredOperationStatus:
    """``deferred-operation-status.v1`` for ``job``: its outcome once it has one, its
    coded reason when it ended without one (or was ended for a reason of ours)."""
    hint = profile.preferred_retry_after_seconds if profile and job.open else None
    result: Any = msgspec.UNSET
    if job.outcome is not None:
        result = msgspec.to_builtins(msgspec.msgpack.decode(job.outcome, type=Outcome))
    diagnostics = []
    if job.error_code is not None:
        diagnostics.append(Diagnostic(code=job.error_code, message=job.error_message or ""))
    return DeferredOperationStatus(
        operation_id=job.operation_id,
        status=cast(OperationStatus, job.status),
        updated_at=rfc3339(job.updated_at),
        retry_after_seconds=msgspec.UNSET if hint is None else min(hint, MAX_RETRY_AFTER_S),
        result=result,
        diagnostics=diagnostics,
    )
