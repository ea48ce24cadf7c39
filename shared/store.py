"""SQLite through apsw with the pragmas every Sensorium store needs (DESIGN §2)."""

from __future__ import annotations

import errno
import time
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import apsw

from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError

# ~6 s in all, as long as the busy timeout would have waited.
WAL_ATTEMPTS = 50
BUSY_TIMEOUT_MS = 5000
# Each store connection's file, for the storage-unavailable message.
_PATHS: weakref.WeakKeyDictionary[apsw.Connection, Path] = weakref.WeakKeyDictionary()


def open_store(
    path: Path,
    *,
    schema: str,
    version: int,
    synchronous: str = "FULL",
    upgrades: Mapping[int, str] | None = None,
) -> apsw.Connection:
    """Open (creating if needed) a store and bring it to ``version``.

    A fresh store runs ``schema``. An older one runs ``upgrades[v]`` for each version
    past its own when every step is there (so an upgrade never rebuilds what it
    need not), else ``schema``, which must then be safe to run over an older store.
    Busy timeout first, so the pragmas themselves wait for a busy peer instead of
    failing. A state directory that cannot be written raises ``storage-unavailable``.
    """
    with _coded(path):
        return _open(path, schema, version, synchronous, upgrades)


def _open(
    path: Path, schema: str, version: int, synchronous: str, upgrades: Mapping[int, str] | None
) -> apsw.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = apsw.Connection(str(path))
    _PATHS[conn] = path
    conn.set_busy_timeout(BUSY_TIMEOUT_MS)
    _wal(conn)
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA foreign_keys=ON")
    if _version(conn) < version:
        with immediate(conn):
            # Read again under the write lock: core and the poller open the same store
            # at start, and the one that waited must not run the upgrade a second time
            # (an ALTER TABLE twice fails: "duplicate column name").
            have = _version(conn)
            if have >= version:
                return conn
            steps = range(have + 1, version + 1)
            stepwise = have > 0 and upgrades is not None and all(v in upgrades for v in steps)
            if stepwise:
                assert upgrades is not None
                for v in steps:
                    conn.execute(upgrades[v])
            else:
                conn.execute(schema)
            conn.execute(f"PRAGMA user_version={int(version)}")
    return conn


def _wal(conn: apsw.Connection) -> None:
    """Switch to WAL. On a brand-new file opened by two processes at once (core and the
    poller at a node's first start) SQLite may answer BUSY here without calling the
    busy handler: try again, a bounded number of times."""
    for attempt in range(WAL_ATTEMPTS):
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except apsw.BusyError:
            if attempt == WAL_ATTEMPTS - 1:
                raise
            time.sleep(0.005 * (attempt + 1))


def _version(conn: apsw.Connection) -> int:
    current = conn.execute("PRAGMA user_version").fetchone()
    return int(current[0]) if current is not None else 0


@contextmanager
def immediate(conn: apsw.Connection) -> Iterator[apsw.Connection]:
    """One write transaction, taken with ``BEGIN IMMEDIATE`` so it never upgrades mid-way.

    One the disk cannot take (full, read-only) raises ``storage-unavailable`` and
    changed nothing; every other error passes through as it was.
    """
    # The path is remembered, not asked of the connection: asking takes the
    # connection's mutex, which a reader in another thread may hold.
    with _coded(_PATHS.get(conn, Path("the store"))):
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            # SQLite may have rolled back already (a full disk mid-transaction): a
            # second ROLLBACK would fail and hide the error that matters.
            if not conn.getautocommit():
                conn.execute("ROLLBACK")
            raise


@contextmanager
def _coded(path: Path) -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        coded = storage_error(exc, path)
        if coded is None or coded is exc:
            raise
        raise coded from exc


# What a full disk or a read-only state directory looks like from SQLite.
_STORAGE_ERRORS: tuple[type[BaseException], ...] = (
    apsw.FullError,
    apsw.ReadOnlyError,
    apsw.IOError,
    apsw.CantOpenError,
    apsw.PermissionsError,
)
_STORAGE_ERRNOS = (errno.ENOSPC, errno.EROFS, errno.EDQUOT)


def storage_error(exc: BaseException, path: Path) -> CodedError | None:
    """The coded ``storage-unavailable`` error a storage failure means, or ``None`` when
    ``exc`` is something else (a bug, a constraint): callers re-raise those.

    A ``storage-unavailable`` ``CodedError`` is returned as it is, so layers may each
    map what they catch. An SQLite error raised while cleaning up after a storage
    failure (a ``ROLLBACK`` of a transaction SQLite had already rolled back itself)
    means that failure."""
    if isinstance(exc, CodedError):
        return exc if exc.code == RuntimeErrorCode.STORAGE_UNAVAILABLE else None
    cause = _storage_cause(exc)
    if cause is None:
        return None
    what = type(cause).__name__
    return CodedError(
        RuntimeErrorCode.STORAGE_UNAVAILABLE,
        f"{path} cannot be written ({what}: {cause}); nothing was done. Free space on "
        "the state directory's file system or make it writable, then retry",
        retry_after_ms=5000,
        detail={"store": path.name},
    )


def _storage_cause(exc: BaseException) -> BaseException | None:
    seen: BaseException | None = exc
    for _ in range(4):  # a masked failure is one or two cleanups deep, never a long chain
        if seen is None:
            return None
        if isinstance(seen, _STORAGE_ERRORS) or (
            isinstance(seen, OSError) and seen.errno in _STORAGE_ERRNOS
        ):
            return seen
        if not isinstance(seen, apsw.Error):
            return None
        seen = seen.__context__
    return None
