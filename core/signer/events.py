"""The signer's audit: every grant issued and ended, every signature given, every refusal.

Rows of ``signer_events`` in ``storage/audit.sqlite``, written through the audit store's
one writer (an ``Apply`` in its batch). Payloads are never written: only their SHA-256.
"""

from __future__ import annotations

from dataclasses import dataclass

import apsw

from sensorium.shared.clock import rfc3339
from sensorium.shared.ids import new_id

SCHEMA = """
CREATE TABLE IF NOT EXISTS signer_events (
    event_id        TEXT PRIMARY KEY,
    at              TEXT NOT NULL,
    -- issued, signed, refused, ended; closed (a channel, for its refusals)
    kind            TEXT NOT NULL,
    code            TEXT,
    directive_id    TEXT,
    action_id       TEXT,
    domain          TEXT,
    payload_sha256  TEXT,
    key_id          TEXT,
    message         TEXT
);
CREATE INDEX IF NOT EXISTS signer_events_directive ON signer_events (directive_id);
"""
_INSERT = "INSERT INTO signer_events VALUES (?,?,?,?,?,?,?,?,?,?)"
COLUMNS = (
    "event_id",
    "at",
    "kind",
    "code",
    "directive_id",
    "action_id",
    "domain",
    "payload_sha256",
    "key_id",
    "message",
)


def create(conn: apsw.Connection) -> None:
    conn.execute(SCHEMA)


@dataclass(frozen=True)
class SignerEvent:
    kind: str
    directive_id: str | None = None
    action_id: str | None = None
    code: str | None = None
    domain: str | None = None
    payload_sha256: str | None = None
    key_id: str | None = None
    message: str | None = None

    def __call__(self, conn: apsw.Connection) -> None:
        conn.execute(
            _INSERT,
            (
                new_id(),
                rfc3339(),
                self.kind,
                self.code,
                self.directive_id,
                self.action_id,
                # What the request named, cut short: it may be anything.
                None if self.domain is None else str(self.domain)[:128],
                None if self.payload_sha256 is None else str(self.payload_sha256)[:64],
                self.key_id,
                None if self.message is None else self.message[:500],
            ),
        )
