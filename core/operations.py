"""Reading the deferred-operation registry for ``sensorium.operation.*`` requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sensorium.poller.registry import open_registry
from sensorium.shared.clock import rfc3339
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.wire.deferred import DeferredOperationStatus, OperationList, OperationSummary


class OperationsView:
    """Answers status, cancel and list from the registry alone."""

    def __init__(self, path: Path) -> None:
        self._conn = open_registry(path)

    def list(self, limit: int) -> OperationList:
        rows: list[tuple[Any, ...]] = self._conn.execute(
            "SELECT operation_id, owner_module_id, capability_id, status, created_at, "
            "expires_at, next_poll_at, attempts, last_diagnostic FROM operations "
            "ORDER BY created_at DESC LIMIT ?",
            (limit,),
        ).fetchall()
        return OperationList(
            operations=[
                OperationSummary(
                    operation_id=r[0],
                    owner_module_id=r[1],
                    capability_id=r[2],
                    status=r[3],
                    created_at=rfc3339(r[4]),
                    expires_at=rfc3339(r[5]),
                    next_poll_at=rfc3339(r[6]) if r[6] is not None else None,
                    attempts=r[7],
                    last_diagnostic=r[8],
                )
                for r in rows
            ]
        )

    def status(self, operation_id: str) -> DeferredOperationStatus:
        row: tuple[Any, ...] | None = self._conn.execute(
            "SELECT operation_kind, status, expires_at, updated_at, attempts FROM operations "
            "WHERE operation_id = ?",
            (operation_id,),
        ).fetchone()
        if row is None:
            raise CodedError(
                RuntimeErrorCode.OPERATION_UNKNOWN,
                f"no deferred operation {operation_id!r} in this node's registry; "
                "`sensorium.operation.list` shows the ones it has",
                path="$.operation/id",
            )
        return DeferredOperationStatus(
            operation_id=operation_id,
            operation_kind=row[0],
            status=row[1],
            expires_at=rfc3339(row[2]),
            updated_at=rfc3339(row[3]),
            attempt_no=row[4],
        )

    def cancel(self, operation_id: str) -> DeferredOperationStatus:
        # No operation can be registered until deferred admission exists, so every
        # id is unknown; the lookup stays honest instead of pretending to cancel.
        return self.status(operation_id)

    def close(self) -> None:
        self._conn.close()
