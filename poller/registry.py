"""The host-owned deferred-operation registry (``storage/deferred-operations.sqlite``).

Core registers operations here on admission; the poller claims due ones with
leases; the operator view reads it alone, so it works with the poller or the
connector down.
"""

from __future__ import annotations

from pathlib import Path

import apsw

from sensorium.shared.store import open_store

SCHEMA = """
CREATE TABLE IF NOT EXISTS operations (
    operation_id      TEXT PRIMARY KEY,
    operation_kind    TEXT NOT NULL,
    owner_module_id   TEXT NOT NULL,
    capability_id     TEXT NOT NULL,
    directive_id      TEXT NOT NULL,
    action_id         TEXT NOT NULL,
    connector_op_id   TEXT NOT NULL,
    status            TEXT NOT NULL CHECK (status IN ('pending', 'running', 'completed',
                          'failed', 'timed-out', 'cancelled', 'expired', 'unknown')),
    created_at        REAL NOT NULL,
    updated_at        REAL NOT NULL,
    expires_at        REAL NOT NULL,
    next_poll_at      REAL,
    attempts          INTEGER NOT NULL DEFAULT 0,
    max_attempts      INTEGER NOT NULL,
    lease_owner       TEXT,
    lease_until       REAL,
    cancelable        INTEGER NOT NULL CHECK (cancelable IN (0, 1)),
    cancel_unavailable_reason TEXT,
    last_diagnostic   TEXT,
    audit_outcome_ref TEXT,
    result            BLOB,
    continuation      BLOB,
    resumed_at        REAL,
    -- exactly one cancellation surface (seed 055)
    CHECK ((cancelable = 1) = (cancel_unavailable_reason IS NULL))
);
CREATE INDEX IF NOT EXISTS operations_due ON operations (status, next_poll_at);
CREATE INDEX IF NOT EXISTS operations_created ON operations (created_at);
"""
VERSION = 1


def open_registry(path: Path) -> apsw.Connection:
    return open_store(path, schema=SCHEMA, version=VERSION)
