"""The registry's reads: one operation, the newest ones, counts, what is due or owed."""

from __future__ import annotations

from typing import Any

from sensorium.shared.deferred import notes
from sensorium.shared.deferred.base import RegistryBase
from sensorium.shared.deferred.notes import AttemptNote
from sensorium.shared.deferred.records import COLUMNS, OPEN_SQL, Operation, operation_of, unknown


class Queries(RegistryBase):
    """Reads: each under the lock, none in a write transaction."""

    def get(self, operation_id: str) -> Operation | None:
        with self._lock:
            return self._row(self.conn, operation_id)

    def get_many(self, operation_ids: list[str]) -> dict[str, Operation]:
        """The operations these ids name (unknown ones left out), in one query."""
        marks = ",".join("?" * len(operation_ids))
        with self._lock:
            rows = self.conn.execute(
                f"SELECT {COLUMNS} FROM operations WHERE operation_id IN ({marks})",
                tuple(operation_ids),
            ).fetchall()
        return {op.operation_id: op for op in map(operation_of, rows)}

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

    def owed_cancels(self, limit: int) -> list[Operation]:
        with self._lock:
            rows = self.conn.execute(
                f"SELECT {COLUMNS} FROM operations WHERE connector_cancel = 'owed' "
                "ORDER BY updated_at LIMIT ?",
                (limit,),
            ).fetchall()
        return [operation_of(r) for r in rows]
