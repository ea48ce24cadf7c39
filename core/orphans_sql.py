"""The orphan queue's table in ``storage/audit.sqlite`` (kept apart from
``core/orphans.py`` so the audit store can create it without importing the desk)."""

ORPHAN_SCHEMA = """
CREATE TABLE IF NOT EXISTS orphans (
    orphan_id       TEXT PRIMARY KEY,
    kind            TEXT NOT NULL CHECK (kind IN ('outcome', 'job-update', 'error')),
    source          TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('queued', 'recovered', 'quarantined')),
    received_at     TEXT NOT NULL,
    expires_at      TEXT NOT NULL,
    resolved_at     TEXT,
    correlation_id  TEXT,
    directive_id    TEXT,
    operation_id    TEXT,
    request_id      TEXT,
    attached_to     TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    digest          TEXT NOT NULL,
    body            BLOB NOT NULL,
    receipt         BLOB,
    CHECK ((state = 'queued') = (resolved_at IS NULL)),
    CHECK ((state = 'recovered') = (attached_to IS NOT NULL)),
    CHECK ((state = 'quarantined') = (receipt IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS orphans_queued ON orphans (received_at) WHERE state = 'queued';
CREATE INDEX IF NOT EXISTS orphans_state ON orphans (state, received_at);
"""

COLUMNS = (
    "orphan_id, kind, source, state, received_at, resolved_at, correlation_id, "
    "directive_id, operation_id, request_id, attached_to, attempts, digest, receipt"
)
