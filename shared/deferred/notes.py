"""Attempt notes: the history of polls that got no answer (core or connector busy,
down, or slow), kept beside an operation instead of in its status.

An operation's status says what the operation is; a poll that got no answer says
nothing about it, so such a poll leaves a note here (bounded per operation) and the
terminal status carries only the terminal answer's own diagnostic. ``sensorium ops
show`` lists the notes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import apsw

SCHEMA = """
CREATE TABLE IF NOT EXISTS attempt_notes (
    operation_id  TEXT NOT NULL,
    at            REAL NOT NULL,
    -- the operation's counted attempts when this poll went unanswered
    attempt       INTEGER NOT NULL,
    code          TEXT NOT NULL,
    message       TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS attempt_notes_operation ON attempt_notes (operation_id, at);
"""
# The latest notes kept per operation; older ones are dropped as new ones come.
KEEP = 20


@dataclass(frozen=True, slots=True)
class AttemptNote:
    at: float
    attempt: int
    code: str
    message: str


def add(
    conn: apsw.Connection, operation_id: str, attempt: int, code: str, message: str, at: float
) -> None:
    conn.execute(
        "INSERT INTO attempt_notes (operation_id, at, attempt, code, message) "
        "VALUES (?, ?, ?, ?, ?)",
        (operation_id, at, attempt, code, message),
    )
    conn.execute(
        "DELETE FROM attempt_notes WHERE operation_id = ? AND rowid NOT IN (SELECT rowid "
        "FROM attempt_notes WHERE operation_id = ? ORDER BY rowid DESC LIMIT ?)",
        (operation_id, operation_id, KEEP),
    )


def of(conn: apsw.Connection, operation_id: str) -> list[AttemptNote]:
    rows: list[Any] = conn.execute(
        "SELECT at, attempt, code, message FROM attempt_notes WHERE operation_id = ? "
        "ORDER BY rowid",
        (operation_id,),
    ).fetchall()
    return [AttemptNote(float(at), int(n), str(c), str(m)) for at, n, c, m in rows]


def collect(conn: apsw.Connection, collected_ops_sql: str, args: tuple[object, ...]) -> None:
    """Drop the notes of the operations ``collected_ops_sql`` selects (run just before
    those operations are deleted, in the same transaction)."""
    conn.execute(f"DELETE FROM attempt_notes WHERE operation_id IN ({collected_ops_sql})", args)
