"""The registry's transitions after admission: leases and polls (poller, operator),
terminal statuses (settle, expire, cancel), owed cancels and retention."""

from __future__ import annotations

import math
from typing import Any

import apsw

from sensorium.shared.deferred import continuations, leases, notes
from sensorium.shared.deferred.base import RegistryBase
from sensorium.shared.deferred.records import COLUMNS, OPEN_SQL, Operation, Settled, operation_of
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError


class Transitions(RegistryBase):
    """Each one ``BEGIN IMMEDIATE`` transaction conditional on the state it expects."""

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
