"""SQLite through apsw with the pragmas every Sensorium store needs (DESIGN §2)."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import apsw

from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError

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


# What a full disk or a read-only state directory looks like from SQLite.
_STORAGE_ERRORS: tuple[type[BaseException], ...] = (
    apsw.FullError,
    apsw.ReadOnlyError,
    apsw.IOError,
    apsw.CantOpenError,
    apsw.PermissionsError,
)


def storage_error(exc: BaseException, path: Path) -> CodedError | None:
    """The coded ``storage-unavailable`` error a storage failure means, or ``None`` when
    ``exc`` is something else (a bug, a constraint): callers re-raise those."""
    if isinstance(exc, _STORAGE_ERRORS) or (
        isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT)
    ):
        what = type(exc).__name__
        return CodedError(
            RuntimeErrorCode.STORAGE_UNAVAILABLE,
            f"{path} cannot be written ({what}: {exc}); nothing was done. Free space on "
            "the state directory's file system or make it writable, then retry",
            retry_after_ms=5000,
            detail={"store": path.name},
        )
    return None
