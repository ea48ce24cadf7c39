"""Admission (core): reserve an operation before the connector hears of it, confirm
it with the connector's acknowledgement, park a flow on it, or withdraw it."""

from __future__ import annotations

from typing import Any

import msgspec

from sensorium.shared.deferred import continuations
from sensorium.shared.deferred.base import RegistryBase
from sensorium.shared.deferred.records import (
    COLUMNS,
    OPEN,
    OPEN_SQL,
    Operation,
    Reservation,
    cancel_href,
    operation_of,
    unknown,
)
from sensorium.shared.wire.continuation import Continuation
from sensorium.shared.wire.deferred import ConnectorDeferred


class Reservations(RegistryBase):
    """Core's side of the registry, at admission."""

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


def _present(value: Any) -> float | None:
    return None if value is msgspec.UNSET or value is None else float(value)
