"""The host-owned deferred-operation registry (``storage/deferred-operations.sqlite``).

Core reserves an operation here before the connector sees it and confirms it with
the connector's acknowledgement; the poller claims due operations with leases and
records what each poll found; the operator view reads it alone, so it works with
the poller or the connector down.

Every change is one ``BEGIN IMMEDIATE`` transaction whose ``UPDATE`` is conditional
on the state it expects, so two writers (two pollers, a poller and an operator) can
race without a lost or doubled transition. Times are POSIX seconds passed in by the
caller: the state machine runs on whatever clock the caller has. A transition the
disk cannot take (full, read-only) raises ``storage-unavailable`` and leaves nothing
of itself behind.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import apsw
import msgspec

from sensorium.poller import continuations, leases, notes
from sensorium.poller.notes import AttemptNote
from sensorium.poller.policy import DeferredHostPolicy
from sensorium.poller.records import (
    COLUMNS,
    OPEN,
    OPEN_SQL,
    SCHEMA,
    UPGRADES,
    VERSION,
    Operation,
    Reservation,
    Settled,
    cancel_href,
    operation_of,
    status_href,
    unknown,
)

# The rows' types travel with the state machine that hands them out.
__all__ = [
    "OPEN",
    "AttemptNote",
    "Operation",
    "Registry",
    "Reservation",
    "Settled",
    "cancel_href",
    "status_href",
    "unknown",
]
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.store import immediate, open_store
from sensorium.shared.wire.continuation import Continuation
from sensorium.shared.wire.deferred import ConnectorDeferred


class Registry:
    """The registry's state machine over one apsw connection (thread-safe)."""

    def __init__(self, path: Path, policy: DeferredHostPolicy) -> None:
        self.path = path
        self.conn = open_store(path, schema=SCHEMA, version=VERSION, upgrades=UPGRADES)
        self.policy = policy
        self.rng = random.Random()
        # One connection, many threads: a transaction must not interleave with another.
        # Reentrant, so `batch()` can hold it across many transitions.
        self._lock = threading.RLock()
        self._depth = threading.local()
        self.flows = continuations.FlowStore(self.conn, self._lock, self._tx)

    def __repr__(self) -> str:
        return f"<Registry {self.conn.filename}>"

    def close(self) -> None:
        self.conn.close()

    @contextmanager
    def _tx(self) -> Iterator[apsw.Connection]:
        with self._lock:
            depth = getattr(self._depth, "n", 0)
            if depth:  # inside batch(): a savepoint, so a failure undoes only itself
                self.conn.execute("SAVEPOINT transition")
                try:
                    yield self.conn
                except BaseException:
                    self.conn.execute("ROLLBACK TO transition")
                    self.conn.execute("RELEASE transition")
                    raise
                self.conn.execute("RELEASE transition")
                return
            self._depth.n = 1
            try:
                # Only the outermost transaction: a full disk fails the COMMIT (or a
                # spill mid-way, SQLite then rolling back all of it), never one transition.
                with immediate(self.conn) as conn:
                    yield conn
            finally:
                self._depth.n = 0

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Many transitions in one transaction (one fsync): the poller records a burst of
        answers this way. Each transition keeps its own conditional update."""
        with self._tx():
            self._depth.n = 2
            try:
                yield
            finally:
                self._depth.n = 1

    def _row(self, conn: apsw.Connection, operation_id: str) -> Operation | None:
        row = conn.execute(
            f"SELECT {COLUMNS} FROM operations WHERE operation_id = ?", (operation_id,)
        ).fetchone()
        return None if row is None else operation_of(row)

    # -- reads ----------------------------------------------------------------

    def get(self, operation_id: str) -> Operation | None:
        with self._lock:
            return self._row(self.conn, operation_id)

    def require(self, operation_id: str) -> Operation:
        op = self.get(operation_id)
        if op is None:
            raise unknown(operation_id)
        return op

    def notes(self, operation_id: str) -> list[AttemptNote]:
        """The polls of ``operation_id`` that got no answer, oldest first (bounded)."""
        with self._lock:
            return notes.of(self.conn, operation_id)

    def by_idempotency_key(self, key: str) -> Operation | None:
        with self._lock:
            row = self.conn.execute(
                f"SELECT {COLUMNS} FROM operations WHERE idempotency_key = ?", (key,)
            ).fetchone()
        return None if row is None else operation_of(row)

    def recent(
        self,
        limit: int,
        *,
        open_only: bool = False,
        visible_to: tuple[str, frozenset[str]] | None = None,
    ) -> list[Operation]:
        """The newest operations; ``visible_to`` (a caller key, the action ids granted
        to it) keeps only the ones it created or whose action it is granted."""
        clauses: list[str] = [f"status IN {OPEN_SQL}"] if open_only else []
        params: list[Any] = []
        if visible_to is not None:
            key, actions = visible_to
            marks = ", ".join("?" * len(actions))
            clauses.append(f"(caller_key = ? OR action_id IN ({marks}))")
            params += [key, *sorted(actions)]
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._lock:
            rows = self.conn.execute(
                f"SELECT {COLUMNS} FROM operations {where} "
                "ORDER BY created_at DESC, operation_id DESC LIMIT ?",
                (*params, limit),
            ).fetchall()
        return [operation_of(r) for r in rows]

    def counts(self) -> dict[str, int]:
        with self._lock:
            rows: list[Any] = self.conn.execute(
                "SELECT status, count(*) FROM operations GROUP BY status"
            ).fetchall()
        return {str(s): int(n) for s, n in rows}

    def next_due(self) -> float | None:
        """The earliest ``next_poll_at`` among open operations (leased or not)."""
        with self._lock:
            row = self.conn.execute(
                "SELECT min(max(next_poll_at, coalesce(lease_until, 0))) FROM operations "
                "WHERE next_poll_at IS NOT NULL"
            ).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    # -- admission (core) -----------------------------------------------------

    def reserve(
        self, r: Reservation, now: float, continuation: Continuation | None = None
    ) -> tuple[Operation, bool]:
        """Record an operation before the connector hears of it: if core dies before the
        connector answers, the poller still finds it and asks. Returns the row and
        whether it is new (an ``idempotency/key`` seen before returns the first one)."""
        expires = self.policy.expires_at(now, None, r.preferred_ttl_s, r.deadline_at)
        retry = self.policy.retry_after(r.preferred_retry_s)
        with self._tx() as conn:
            if r.idempotency_key is not None:
                row = conn.execute(
                    f"SELECT {COLUMNS} FROM operations WHERE idempotency_key = ?",
                    (r.idempotency_key,),
                ).fetchone()
                if row is not None:
                    return operation_of(row), False
            href = None if r.cancel_unavailable_reason else cancel_href(r.operation_id)
            conn.execute(
                "INSERT INTO operations (operation_id, operation_kind, owner_module_id, "
                "capability_id, directive_id, action_id, correlation_id, idempotency_key, "
                "status, admitted, created_at, updated_at, expires_at, deadline_at, "
                "preferred_ttl_s, retry_after_s, next_poll_at, max_attempts, cancel_href, "
                "cancel_unavailable_reason, audit_outcome_ref, caller_key, params_digest) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                "?, ?)",
                (
                    r.operation_id,
                    r.operation_kind,
                    r.owner_module_id,
                    r.capability_id,
                    r.directive_id,
                    r.action_id,
                    r.correlation_id,
                    r.idempotency_key,
                    now,
                    now,
                    expires,
                    r.deadline_at,
                    r.preferred_ttl_s,
                    retry,
                    min(now + r.confirm_within_s, expires),
                    self.policy.max_attempts,
                    href,
                    r.cancel_unavailable_reason,
                    r.audit_outcome_ref,
                    r.caller_key,
                    r.params_digest,
                ),
            )
            if continuation is not None:
                continuations.suspend(conn, continuation, now)
            op = self._row(conn, r.operation_id)
        assert op is not None
        return op, True

    def attach(self, c: Continuation, now: float) -> str | None:
        """Park a flow on an operation that already existed (a retried step found it by
        its idempotency key); one that already ended resumes the flow at once."""
        with self._tx() as conn:
            op = self._must(conn, c.deferred_operation_id)
            exists = conn.execute(
                "SELECT 1 FROM continuations WHERE operation_id = ?", (op.operation_id,)
            ).fetchone()
            if exists is None:
                continuations.suspend(conn, c, now)
            if op.open:
                return None
            return continuations.resume(
                conn, op.operation_id, op.status, op.result, op.last_code, op.last_diagnostic, now
            )

    def confirm(self, operation_id: str, ack: ConnectorDeferred, now: float) -> Operation:
        """The connector accepted the job: apply its hints through the host policy."""
        fail_after = _present(ack.fail_after_seconds)
        with self._tx() as conn:
            op = self._row(conn, operation_id)
            if op is None:
                raise unknown(operation_id)
            if not op.open and op.cancel_href is not None and op.status != "completed":
                # Ended on the host before the connector accepted it (cancelled, expired):
                # the job exists now, so it is owed a cancel again.
                conn.execute(
                    "UPDATE operations SET connector_cancel = 'owed' WHERE operation_id = ? "
                    "AND status IN ('cancelled', 'expired', 'timed-out')",
                    (operation_id,),
                )
                return self._must(conn, operation_id)
            if op.admitted or not op.open:
                return op  # a poll found the job first; it already holds the truth
            row: Any = conn.execute(
                "SELECT preferred_ttl_s FROM operations WHERE operation_id = ?", (operation_id,)
            ).fetchone()
            pref = row[0]
            expires = self.policy.expires_at(op.created_at, fail_after, pref, op.deadline_at)
            hint = _present(ack.retry_after_seconds)
            # No hint from the connector: the one the reservation took from the action.
            retry = op.retry_after_s if hint is None else self.policy.retry_after(hint)
            reason = (
                None
                if ack.cancel_unavailable_reason is msgspec.UNSET
                else ack.cancel_unavailable_reason
            )
            final = ack.status not in OPEN
            conn.execute(
                "UPDATE operations SET admitted = 1, status = ?, expires_at = ?, "
                "retry_after_s = ?, next_poll_at = ?, updated_at = ?, cancel_href = ?, "
                "cancel_unavailable_reason = ? WHERE operation_id = ? AND admitted = 0 "
                f"AND status IN {OPEN_SQL}",
                (
                    # A final answer is fetched by a poll right away, result and all.
                    "running" if final else ack.status,
                    expires,
                    retry,
                    now if final else self.policy.next_poll_at(now, retry, expires, self.rng),
                    now,
                    None if reason else cancel_href(operation_id),
                    reason,
                    operation_id,
                ),
            )
            confirmed = self._row(conn, operation_id)
        assert confirmed is not None
        return confirmed

    def withdraw(self, operation_id: str) -> bool:
        """Drop a reservation the connector refused before creating any job."""
        with self._tx() as conn:
            conn.execute(
                "DELETE FROM continuations WHERE operation_id = ? AND EXISTS (SELECT 1 FROM "
                "operations WHERE operation_id = ? AND admitted = 0)",
                (operation_id, operation_id),
            )
            conn.execute(
                "DELETE FROM operations WHERE operation_id = ? AND admitted = 0", (operation_id,)
            )
            return conn.changes() == 1

    # -- polling (poller, operator) -------------------------------------------

    def claim_due(
        self, owner: str, now: float, lease_s: float, limit: int, per_module_limit: int
    ) -> list[Operation]:
        """Lease up to ``limit`` due operations, the earliest due first, at most
        ``per_module_limit`` leased per owner module at once (counting leases other
        pollers hold): a module with a backlog never starves another."""
        if limit <= 0:
            return []
        with self._tx() as conn:
            held: list[Any] = conn.execute(
                "SELECT owner_module_id, count(*) FROM operations WHERE lease_until > ? "
                "AND next_poll_at IS NOT NULL GROUP BY owner_module_id",
                (now,),
            ).fetchall()
            leased: dict[str, int] = {str(m): int(n) for m, n in held}
            due: list[Any] = conn.execute(
                "SELECT DISTINCT owner_module_id FROM operations WHERE next_poll_at <= ? "
                "AND (lease_until IS NULL OR lease_until <= ?)",
                (now, now),
            ).fetchall()
            candidates: list[Operation] = []
            for (module,) in due:
                room = min(limit, per_module_limit - leased.get(str(module), 0))
                if room <= 0:
                    continue
                rows = conn.execute(
                    f"SELECT {COLUMNS} FROM operations WHERE owner_module_id = ? AND "
                    "next_poll_at <= ? AND (lease_until IS NULL OR lease_until <= ?) "
                    "ORDER BY next_poll_at LIMIT ?",
                    (module, now, now, room),
                ).fetchall()
                candidates.extend(operation_of(r) for r in rows)
            candidates.sort(key=lambda op: op.next_poll_at or 0.0)
            claimed = candidates[:limit]
            conn.executemany(
                "UPDATE operations SET lease_owner = ?, lease_until = ? WHERE operation_id = ?",
                [(owner, now + lease_s, op.operation_id) for op in claimed],
            )
        return claimed

    def release_dead_leases(self, me: str) -> list[str]:
        """Release the leases of pollers whose process is gone (killed mid-poll), at
        once rather than when ``lease_s`` runs out; the owners released."""
        with self._lock:
            return leases.release_dead(self.conn, self._tx, me)

    def record_open(
        self,
        operation_id: str,
        owner: str | None,
        status: str,
        connector_retry_after: float | None,
        now: float,
    ) -> Settled:
        """A poll found the job still pending or running: count the attempt, schedule
        the next one, or give up when the attempts are spent."""
        with self._tx() as conn:
            op = self._held(conn, operation_id, owner)
            if op is None:
                return Settled(False, self._must(conn, operation_id))
            attempts = op.attempts + 1
            if attempts >= op.max_attempts:
                return self._settle(
                    conn,
                    op,
                    "timed-out",
                    None,
                    RuntimeErrorCode.POLL_ATTEMPTS_EXHAUSTED,
                    f"still {status} after {attempts} polls, the host's limit",
                    now,
                    attempts=attempts,
                )
            retry = self.policy.retry_after(connector_retry_after)
            # An answer: a note of an earlier unanswered poll is history now (kept in the
            # attempt notes), no longer the operation's current diagnostic.
            conn.execute(
                "UPDATE operations SET status = ?, admitted = 1, attempts = ?, retry_after_s = ?, "
                "next_poll_at = ?, updated_at = ?, lease_owner = NULL, lease_until = NULL, "
                "last_code = NULL, last_diagnostic = NULL WHERE operation_id = ?",
                (
                    status,
                    attempts,
                    retry,
                    self.policy.next_poll_at(now, retry, op.expires_at, self.rng),
                    now,
                    operation_id,
                ),
            )
            return Settled(True, self._must(conn, operation_id))

    def record_busy(
        self,
        operation_id: str,
        owner: str | None,
        code: str,
        message: str,
        retry_after: float | None,
        now: float,
    ) -> Settled:
        """Nobody could answer (core or connector busy or down): not an attempt. The
        note shows while the operation is open and stays in its attempt notes; its
        final status never carries it. Past expiry (a final poll that got no answer)
        the next try waits the retry interval, not the expiry already gone."""
        with self._tx() as conn:
            op = self._held(conn, operation_id, owner)
            if op is None:
                return Settled(False, self._must(conn, operation_id))
            retry = self.policy.retry_after(retry_after)
            horizon = op.expires_at if now < op.expires_at else math.inf
            conn.execute(
                "UPDATE operations SET next_poll_at = ?, last_code = ?, last_diagnostic = ?, "
                "lease_owner = NULL, lease_until = NULL WHERE operation_id = ?",
                (
                    self.policy.next_poll_at(now, retry, horizon, self.rng),
                    code,
                    message,
                    operation_id,
                ),
            )
            notes.add(conn, operation_id, op.attempts, code, message, now)
            return Settled(True, self._must(conn, operation_id))

    def settle(
        self,
        operation_id: str,
        status: str,
        result: bytes | None,
        code: str | None,
        message: str | None,
        now: float,
    ) -> Settled:
        """A terminal status, recorded once: the first completer wins, every later one
        sees ``changed=False``. A continuation waiting on the operation is resumed in
        this same transaction, so it is resumed exactly once."""
        with self._tx() as conn:
            op = self._must(conn, operation_id)
            if not op.open:
                return Settled(False, op)
            return self._settle(conn, op, status, result, code, message, now)

    def expire(
        self,
        operation_id: str,
        now: float,
        message: str = "no terminal result before the operation's expiry",
    ) -> Settled:
        """End an open operation past its expiry. Callers first make a final poll of
        the connector (``polling.apply``): an operation whose job holds a terminal
        result gets that result, never ``expired``."""
        with self._tx() as conn:
            op = self._must(conn, operation_id)
            if not op.open or now < op.expires_at:
                return Settled(False, op)
            return self._settle(
                conn, op, "expired", None, RuntimeErrorCode.OPERATION_EXPIRED, message, now
            )

    def cancel(self, operation_id: str, now: float) -> Settled:
        """Host-side cancel: the operation is cancelled now; the connector's job is owed
        a cancel until someone delivers it. Refused for non-cancelable work."""
        with self._tx() as conn:
            op = self._must(conn, operation_id)
            if op.cancel_unavailable_reason is not None:
                raise CodedError(
                    RuntimeErrorCode.OPERATION_NOT_CANCELABLE,
                    f"{operation_id} cannot be cancelled: {op.cancel_unavailable_reason}",
                    path="$.operation/id",
                )
            if not op.open:
                return Settled(False, op)
            return self._settle(
                conn, op, "cancelled", None, None, "cancelled by the host's operator or caller", now
            )

    def poke(self, operation_id: str, now: float) -> Operation:
        """Make an open operation due now (operator ``poll``), leaving attempts alone."""
        with self._tx() as conn:
            conn.execute(
                "UPDATE operations SET next_poll_at = ? WHERE operation_id = ? "
                "AND next_poll_at IS NOT NULL",
                (now, operation_id),
            )
            return self._must(conn, operation_id)

    def owed_cancels(self, limit: int) -> list[Operation]:
        with self._lock:
            rows = self.conn.execute(
                f"SELECT {COLUMNS} FROM operations WHERE connector_cancel = 'owed' "
                "ORDER BY updated_at LIMIT ?",
                (limit,),
            ).fetchall()
        return [operation_of(r) for r in rows]

    def cancel_delivered(self, operation_id: str, note: str | None = None) -> None:
        with self._tx() as conn:
            conn.execute(
                "UPDATE operations SET connector_cancel = 'sent', "
                "last_diagnostic = coalesce(?, last_diagnostic) "
                "WHERE operation_id = ? AND connector_cancel = 'owed'",
                (note, operation_id),
            )

    # -- retention ------------------------------------------------------------

    def collect(self, now: float, retention_s: float, batch: int) -> int:
        """Delete one bounded batch of terminal records older than the retention."""
        with self._tx() as conn:
            cutoff = now - retention_s
            old = (
                "SELECT operation_id FROM operations WHERE next_poll_at IS NULL AND "
                "updated_at < ? AND coalesce(connector_cancel, '') != 'owed' "
                "ORDER BY updated_at LIMIT ?"
            )
            notes.collect(conn, old, (cutoff, batch))
            conn.execute(f"DELETE FROM operations WHERE operation_id IN ({old})", (cutoff, batch))
            deleted = conn.changes()
            deleted += continuations.collect(conn, cutoff, batch)
        return deleted

    # -- internals ------------------------------------------------------------

    def _must(self, conn: apsw.Connection, operation_id: str) -> Operation:
        op = self._row(conn, operation_id)
        if op is None:
            raise unknown(operation_id)
        return op

    def _held(
        self, conn: apsw.Connection, operation_id: str, owner: str | None
    ) -> Operation | None:
        """The open operation if ``owner`` holds its lease (or no lease is required)."""
        op = self._must(conn, operation_id)
        if not op.open or (owner is not None and op.lease_owner != owner):
            return None
        return op

    def _settle(
        self,
        conn: apsw.Connection,
        op: Operation,
        status: str,
        result: bytes | None,
        code: str | None,
        message: str | None,
        now: float,
        *,
        attempts: int | None = None,
    ) -> Settled:
        # The connector's job outlives a host-side end only where it can be cancelled.
        owed = status in ("cancelled", "expired", "timed-out") and op.cancel_href is not None
        # The terminal answer's own diagnostic, never a note left by an unanswered poll.
        conn.execute(
            "UPDATE operations SET status = ?, result = ?, last_code = ?, "
            "last_diagnostic = ?, updated_at = ?, admitted = 1, "
            "next_poll_at = NULL, lease_owner = NULL, lease_until = NULL, attempts = ?, "
            "connector_cancel = ? "
            f"WHERE operation_id = ? AND status IN {OPEN_SQL}",
            (
                status,
                result,
                code,
                message,
                now,
                op.attempts if attempts is None else attempts,
                "owed" if owed else None,
                op.operation_id,
            ),
        )
        changed = conn.changes() == 1
        resumed = (
            continuations.resume(conn, op.operation_id, status, result, code, message, now)
            if changed
            else None
        )
        return Settled(changed, self._must(conn, op.operation_id), resumed)


def _present(value: Any) -> float | None:
    return None if value is msgspec.UNSET or value is None else float(value)
