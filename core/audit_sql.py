"""The audit store's SQL: its tables and their versions (records, dispatch intents,
observations, the orphan queue, the published outcomes), and the writer's statements."""

from __future__ import annotations

from sensorium.core.observations import SCHEMA as OBSERVATION_SCHEMA
from sensorium.core.orphans_sql import ORPHAN_SCHEMA
from sensorium.core.outcomes_sql import OUTCOMES_SCHEMA

_RECORDS = """
CREATE TABLE {name} (
    record_id       TEXT PRIMARY KEY,
    -- outcome: the action ran and this is what happened; rejection: nothing ran;
    -- unknown: dispatched, but its outcome was never heard (connector lost, timeout);
    -- deferral: accepted as a deferred operation (its handle is the body).
    kind            TEXT NOT NULL CHECK (kind IN ('outcome', 'rejection', 'unknown',
                        'deferral')),
    directive_id    TEXT NOT NULL,
    action_id       TEXT NOT NULL,
    status          TEXT NOT NULL,
    code            TEXT,
    request_id      TEXT,
    idempotency_key TEXT,
    recorded_at     TEXT NOT NULL,
    body            BLOB NOT NULL
);
"""
# Version 3 widened the kinds: SQLite cannot alter a CHECK, so the table is rebuilt
# (a fresh store runs the same steps on an empty table).
SCHEMA = (
    _RECORDS.format(name="IF NOT EXISTS records")
    + _RECORDS.format(name="records_v3")
    + """
INSERT INTO records_v3 SELECT * FROM records;
DROP TABLE records;
ALTER TABLE records_v3 RENAME TO records;
CREATE INDEX IF NOT EXISTS records_directive ON records (directive_id);
CREATE INDEX IF NOT EXISTS records_time ON records (recorded_at);
CREATE INDEX IF NOT EXISTS records_key ON records (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
"""
)
SCHEMA += OBSERVATION_SCHEMA
# Version 4: dispatch intents and the orphan queue.
DISPATCHES = """
CREATE TABLE IF NOT EXISTS dispatches (
    directive_id     TEXT PRIMARY KEY,
    idempotency_key  TEXT,
    action_id        TEXT NOT NULL,
    correlation_id   TEXT,
    seam_request_id  TEXT NOT NULL,
    core_instance    TEXT NOT NULL,
    dispatched_at    TEXT NOT NULL,
    -- the kind of the record that ended it: outcome, rejection (nothing ran), unknown
    settled          TEXT,
    settled_at       TEXT
);
CREATE INDEX IF NOT EXISTS dispatches_key ON dispatches (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS dispatches_seam ON dispatches (seam_request_id);
CREATE INDEX IF NOT EXISTS dispatches_correlation ON dispatches (correlation_id)
    WHERE correlation_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS dispatches_time ON dispatches (dispatched_at);
"""
SCHEMA += DISPATCHES + ORPHAN_SCHEMA
# Version 5: the connector instance a dispatch was sent to (as core last saw it), so a
# retry can prove that an attempt never reached a connector that is still alive.
DISPATCHES_V5 = "ALTER TABLE dispatches ADD COLUMN connector_instance TEXT;"
SCHEMA += DISPATCHES_V5
# Version 6: the digest of the directive's canonical parameters, which its
# idempotency key is bound to (with its action and, in the key itself, its caller).
DISPATCHES_V6 = "ALTER TABLE dispatches ADD COLUMN params_digest TEXT;"
SCHEMA += DISPATCHES_V6
# Version 7: the seam request that sent the attempt to be run (a later rejoin of it
# replaces seam_request_id, not this), which the connector's start journal answers for.
DISPATCHES_V7 = "ALTER TABLE dispatches ADD COLUMN spawn_request_id TEXT;"
SCHEMA += DISPATCHES_V7
# Version 8: the published outcome records, one per directive (core/outcomes_sql.py).
SCHEMA += OUTCOMES_SCHEMA
# Version 9: what an outcome's action used (its ``accounting``), queryable; null for
# other records and for what could not be measured.
RECORDS_V9 = """
ALTER TABLE records ADD COLUMN cpu_user_ms REAL;
ALTER TABLE records ADD COLUMN cpu_system_ms REAL;
ALTER TABLE records ADD COLUMN peak_memory_bytes INTEGER;
ALTER TABLE records ADD COLUMN io_read_bytes INTEGER;
ALTER TABLE records ADD COLUMN io_write_bytes INTEGER;
ALTER TABLE records ADD COLUMN accounting_source TEXT;
"""
SCHEMA += RECORDS_V9
VERSION = 9
UPGRADES = {
    4: DISPATCHES + ORPHAN_SCHEMA,
    5: DISPATCHES_V5,
    6: DISPATCHES_V6,
    7: DISPATCHES_V7,
    8: OUTCOMES_SCHEMA,
    9: RECORDS_V9,
}
INSERT_RECORD = """
INSERT OR IGNORE INTO records (record_id, kind, directive_id, action_id, status, code,
    request_id, idempotency_key, recorded_at, body, cpu_user_ms, cpu_system_ms,
    peak_memory_bytes, io_read_bytes, io_write_bytes, accounting_source)
VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
"""
# A record of one of these kinds ends its dispatch; an outcome also ends one that
# was in doubt (its late reply was reconciled).
SETTLE = """
UPDATE dispatches SET settled = ?, settled_at = ?
WHERE directive_id = ? AND (settled IS NULL OR (settled = 'unknown' AND ? = 'outcome'))
"""
