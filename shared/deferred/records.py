"""The registry's rows: the SQL schema and the values read from it.

Kept apart from the state machine (``registry.py``) so the transitions read as one
piece; both are the host registry (``storage/deferred-operations.sqlite``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sensorium.shared.deferred import continuations, notes
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError

OPEN = ("pending", "running")
OPEN_SQL = "('pending', 'running')"

SCHEMA = (
    """
-- Version 1 had no admission path, so it never held a row: replace it whole.
DROP TABLE IF EXISTS operations;
CREATE TABLE operations (
    operation_id      TEXT PRIMARY KEY,
    operation_kind    TEXT NOT NULL,
    owner_module_id   TEXT NOT NULL,
    capability_id     TEXT NOT NULL,
    directive_id      TEXT NOT NULL,
    action_id         TEXT NOT NULL,
    correlation_id    TEXT,
    idempotency_key   TEXT,
    status            TEXT NOT NULL CHECK (status IN ('pending', 'running', 'completed',
                          'failed', 'timed-out', 'cancelled', 'expired', 'unknown')),
    -- 0 while reserved: core has not yet heard the connector accept it.
    admitted          INTEGER NOT NULL CHECK (admitted IN (0, 1)),
    created_at        REAL NOT NULL,
    updated_at        REAL NOT NULL,
    expires_at        REAL NOT NULL,
    deadline_at       REAL,
    preferred_ttl_s   REAL,
    retry_after_s     REAL NOT NULL,
    next_poll_at      REAL,
    attempts          INTEGER NOT NULL DEFAULT 0,
    max_attempts      INTEGER NOT NULL,
    lease_owner       TEXT,
    lease_until       REAL,
    cancel_href       TEXT,
    cancel_unavailable_reason TEXT,
    -- the connector's job still has to hear a cancel the host already decided
    connector_cancel  TEXT CHECK (connector_cancel IN ('owed', 'sent')),
    last_code         TEXT,
    last_diagnostic   TEXT,
    audit_outcome_ref TEXT,
    result            BLOB,
    -- exactly one cancellation surface (seed 055)
    CHECK ((cancel_href IS NULL) != (cancel_unavailable_reason IS NULL)),
    CHECK ((status IN ('pending', 'running')) = (next_poll_at IS NOT NULL))
);
CREATE INDEX operations_due ON operations (next_poll_at) WHERE next_poll_at IS NOT NULL;
CREATE INDEX operations_created ON operations (created_at);
CREATE INDEX operations_leased ON operations (lease_until) WHERE lease_until IS NOT NULL;
CREATE INDEX operations_collect ON operations (updated_at) WHERE next_poll_at IS NULL;
CREATE INDEX operations_cancel ON operations (connector_cancel)
    WHERE connector_cancel = 'owed';
CREATE UNIQUE INDEX operations_idempotency ON operations (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
"""
    + continuations.SCHEMA
    + notes.SCHEMA
)
# Version 4: who asked (the CURVE key that created an operation or started a flow;
# NULL for the local operator) and the digest of the directive's canonical
# parameters, which its idempotency key is bound to (core/access.py).
V4 = """
ALTER TABLE operations ADD COLUMN caller_key TEXT;
ALTER TABLE operations ADD COLUMN params_digest TEXT;
ALTER TABLE flows ADD COLUMN caller_key TEXT;
CREATE INDEX IF NOT EXISTS operations_caller ON operations (caller_key, created_at);
"""
SCHEMA += V4
VERSION = 4
# Version 3 added the attempt notes; nothing else changed.
UPGRADES = {3: notes.SCHEMA, 4: V4}

COLUMNS = (
    "operation_id, operation_kind, owner_module_id, capability_id, directive_id, action_id, "
    "correlation_id, idempotency_key, status, admitted, created_at, updated_at, expires_at, "
    "deadline_at, retry_after_s, next_poll_at, attempts, max_attempts, lease_owner, lease_until, "
    "cancel_href, cancel_unavailable_reason, connector_cancel, last_code, last_diagnostic, "
    "audit_outcome_ref, result, caller_key, params_digest"
)


@dataclass(frozen=True, slots=True)
class Operation:
    """One registry row."""

    operation_id: str
    operation_kind: str
    owner_module_id: str
    capability_id: str
    directive_id: str
    action_id: str
    correlation_id: str | None
    idempotency_key: str | None
    status: str
    admitted: bool
    created_at: float
    updated_at: float
    expires_at: float
    deadline_at: float | None
    retry_after_s: float
    next_poll_at: float | None
    attempts: int
    max_attempts: int
    lease_owner: str | None
    lease_until: float | None
    cancel_href: str | None
    cancel_unavailable_reason: str | None
    connector_cancel: str | None
    last_code: str | None
    last_diagnostic: str | None
    audit_outcome_ref: str | None
    result: bytes | None
    # The CURVE key that created it (None: the local operator), and the digest of its
    # canonical parameters (None in rows older than registry version 4).
    caller_key: str | None = None
    params_digest: str | None = None

    @property
    def open(self) -> bool:
        return self.status in OPEN


@dataclass(frozen=True, slots=True)
class Reservation:
    """What core knows of an async directive before the connector has answered."""

    operation_id: str
    operation_kind: str
    owner_module_id: str
    capability_id: str
    directive_id: str
    action_id: str
    correlation_id: str | None
    idempotency_key: str | None
    deadline_at: float | None
    preferred_ttl_s: float | None
    preferred_retry_s: float | None
    cancel_unavailable_reason: str | None
    audit_outcome_ref: str
    # When the poller should look at a reservation core never confirmed.
    confirm_within_s: float
    caller_key: str | None = None
    params_digest: str | None = None


@dataclass(frozen=True, slots=True)
class Settled:
    """A terminal transition: did this call make it, and which flow it made runnable."""

    changed: bool
    operation: Operation
    resumed_flow: str | None = None


def cancel_href(operation_id: str) -> str:
    """The host-owned control endpoint that cancels an operation (a client-API method)."""
    return f"sensorium.operation.cancel?operation/id={operation_id}"


def status_href(operation_id: str) -> str:
    return f"sensorium.operation.status?operation/id={operation_id}"


def operation_of(row: tuple[Any, ...]) -> Operation:
    values = list(row)
    values[9] = bool(values[9])
    return Operation(*values)


def unknown(operation_id: str) -> CodedError:
    return CodedError(
        RuntimeErrorCode.OPERATION_UNKNOWN,
        f"no deferred operation {operation_id[:140]!r} in this node's registry; "
        "`sensorium ops list` shows the ones it has",
        path="$.operation/id",
    )
