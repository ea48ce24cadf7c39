"""SQLite through apsw with the pragmas every Sensorium store needs (DESIGN §2)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import apsw

BUSY_TIMEOUT_MS = 5000


def open_store(
    path: Path, *, schema: str, version: int, synchronous: str = "FULL"
) -> apsw.Connection:
    """Open (creating if needed) a store and bring it to ``version`` with ``schema``.

    Busy timeout first, so the pragmas themselves wait for a busy peer instead of
    failing.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = apsw.Connection(str(path))
    conn.set_busy_timeout(BUSY_TIMEOUT_MS)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA foreign_keys=ON")
    current = conn.execute("PRAGMA user_version").fetchone()
    if current is None or current[0] < version:
        with immediate(conn):
            conn.execute(schema)
            conn.execute(f"PRAGMA user_version={int(version)}")
    return conn


@contextmanager
def immediate(conn: apsw.Connection) -> Iterator[apsw.Connection]:
    """One write transaction, taken with ``BEGIN IMMEDIATE`` so it never upgrades mid-way."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
