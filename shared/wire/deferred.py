"""``deferred-operation-status.v1`` and the operator list of deferred operations (seed 055)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from sensorium.shared.wire.base import OpenMessage, Timestamp
from sensorium.shared.wire.outcome import Diagnostic

OperationStatus = Literal[
    "pending", "running", "completed", "failed", "timed-out", "cancelled", "expired", "unknown"
]


class DeferredOperationStatus(OpenMessage, frozen=True, kw_only=True):
    schema: Literal["deferred-operation-status.v1"] = "deferred-operation-status.v1"
    schema_v: Literal[1] = msgspec.field(name="schema/v", default=1)
    operation_id: str = msgspec.field(name="operation/id")
    operation_kind: str = msgspec.field(name="operation/kind")
    status: OperationStatus
    retry_after_seconds: int | None = None
    expires_at: Timestamp | None = None
    updated_at: Timestamp | None = None
    attempt_no: int | None = None
    result: Any = None
    diagnostics: list[Diagnostic] = msgspec.field(default_factory=list)


class OperationSummary(OpenMessage, frozen=True, kw_only=True):
    """One row of the operator view: read from the host registry alone."""

    operation_id: str = msgspec.field(name="operation/id")
    owner_module_id: str
    capability_id: str
    status: OperationStatus
    created_at: Timestamp
    expires_at: Timestamp
    next_poll_at: Timestamp | None = None
    attempts: int = 0
    last_diagnostic: str | None = None


class OperationList(OpenMessage, frozen=True, kw_only=True):
    operations: list[OperationSummary] = msgspec.field(default_factory=list)
