"""The ``outcomes`` table of ``storage/audit.sqlite``: one published
``sensorium-directive-outcome.v1`` per directive.

"Exactly one" is the table's primary key, ``directive_id``: every write is an upsert.
A later write for the same directive replaces the record only to move it forward —
``rejected`` (an availability refusal the caller retried) or ``admitted`` (an async
directive whose operation has ended) to what happened next, or one final state to a
reconciled one — never a final record back to ``rejected`` or ``admitted``. The
``records`` table beside it stays the node's journal (every attempt, refusal and
in-doubt end, which idempotency and the orphan desk read); an older receipt that
names one of its rows still finds the directive's outcome through it.
"""

from __future__ import annotations

from dataclasses import dataclass

import apsw

OUTCOMES_SCHEMA = """
CREATE TABLE IF NOT EXISTS outcomes (
    directive_id  TEXT PRIMARY KEY,
    outcome_id    TEXT NOT NULL UNIQUE,
    action_id     TEXT NOT NULL,
    -- the published spelling: admitted, completed, failed, timed_out, rejected
    status        TEXT NOT NULL,
    issuer        TEXT NOT NULL,
    operation_id  TEXT,
    recorded_at   TEXT NOT NULL,
    body          BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS outcomes_time ON outcomes (recorded_at, outcome_id);
CREATE INDEX IF NOT EXISTS outcomes_admitted ON outcomes (recorded_at)
    WHERE status = 'admitted';
"""

_UPSERT = """
INSERT INTO outcomes (directive_id, outcome_id, action_id, status, issuer, operation_id,
                      recorded_at, body)
VALUES (?,?,?,?,?,?,?,?)
ON CONFLICT (directive_id) DO UPDATE SET
    outcome_id = excluded.outcome_id,
    action_id = excluded.action_id,
    status = excluded.status,
    issuer = excluded.issuer,
    operation_id = coalesce(excluded.operation_id, outcomes.operation_id),
    recorded_at = excluded.recorded_at,
    body = excluded.body
WHERE outcomes.status = 'rejected'
   OR (outcomes.status = 'admitted' AND excluded.status <> 'rejected')
   OR excluded.status NOT IN ('rejected', 'admitted')
"""


@dataclass(frozen=True)
class OutcomeRow:
    """An encoded ``sensorium-directive-outcome.v1`` and the columns it is found by."""

    directive_id: str
    outcome_id: str
    action_id: str
    status: str
    issuer: str
    operation_id: str | None
    recorded_at: str
    body: bytes


def upsert(conn: apsw.Connection, row: OutcomeRow) -> None:
    conn.execute(
        _UPSERT,
        (
            row.directive_id,
            row.outcome_id,
            row.action_id,
            row.status,
            row.issuer,
            row.operation_id,
            row.recorded_at,
            row.body,
        ),
    )
