"""The registry's connection: one apsw connection, its lock and its transactions.

The queries, the reservations and the transitions (``queries.py``,
``reservations.py``, ``transitions.py``) all run through :meth:`RegistryBase._tx`;
``registry.py`` puts them together as :class:`Registry`.
"""

from __future__ import annotations

import asyncio
import functools
import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import apsw

from sensorium.shared.deferred import continuations
from sensorium.shared.deferred.group import GroupCommit
from sensorium.shared.deferred.policy import DeferredHostPolicy
from sensorium.shared.deferred.records import (
    COLUMNS,
    SCHEMA,
    UPGRADES,
    VERSION,
    Operation,
    operation_of,
    unknown,
)
from sensorium.shared.store import immediate, open_store

T = TypeVar("T")


class RegistryBase:
    """The registry's state machine over one apsw connection (thread-safe)."""

    def __init__(self, path: Path, policy: DeferredHostPolicy) -> None:
        self.path = path
        self.conn = open_store(path, schema=SCHEMA, version=VERSION, upgrades=UPGRADES)
        self.policy = policy
        self.rng = random.Random()
        # One connection, many threads: a transaction must not interleave with another.
        # Reentrant, so `batch()` can hold it across many transitions.
        self._lock = threading.RLock()
        self._depth = threading.local()
        self.flows = continuations.FlowStore(self.conn, self._lock, self._tx)
        self.group = GroupCommit(self.batch, self._tx, path.name)

    def __repr__(self) -> str:
        return f"<Registry {self.conn.filename}>"

    def close(self) -> None:
        self.group.close()
        self.conn.close()

    async def grouped(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` (a transition of this registry) committed together with the
        others handed in at the same moment (``group.py``); on disk when it returns."""
        result: T = await self.group.submit_async(functools.partial(fn, *args))
        return result

    def grouped_early(
        self, fn: Callable[..., T], *args: Any
    ) -> tuple[asyncio.Future[T], asyncio.Future[T]]:
        """``grouped``, as two futures: ``fn``'s answer as soon as it ran (before the
        fsync), and the same once it is on disk. Nothing may be told before the second."""
        return self.group.submit_early_async(functools.partial(fn, *args))

    @contextmanager
    def _tx(self) -> Iterator[apsw.Connection]:
        with self._lock:
            depth = getattr(self._depth, "n", 0)
            if depth:  # inside batch(): a savepoint, so a failure undoes only itself
                self.conn.execute("SAVEPOINT transition")
                try:
                    yield self.conn
                except BaseException:
                    self.conn.execute("ROLLBACK TO transition")
                    self.conn.execute("RELEASE transition")
                    raise
                self.conn.execute("RELEASE transition")
                return
            self._depth.n = 1
            try:
                # Only the outermost transaction: a full disk fails the COMMIT (or a
                # spill mid-way, SQLite then rolling back all of it), never one transition.
                with immediate(self.conn) as conn:
                    yield conn
            finally:
                self._depth.n = 0

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Many transitions in one transaction (one fsync): the poller records a burst of
        answers this way. Each transition keeps its own conditional update."""
        with self._tx():
            self._depth.n = 2
            try:
                yield
            finally:
                self._depth.n = 1

    def _row(self, conn: apsw.Connection, operation_id: str) -> Operation | None:
        row = conn.execute(
            f"SELECT {COLUMNS} FROM operations WHERE operation_id = ?", (operation_id,)
        ).fetchone()
        return None if row is None else operation_of(row)

    def _must(self, conn: apsw.Connection, operation_id: str) -> Operation:
        op = self._row(conn, operation_id)
        if op is None:
            raise unknown(operation_id)
        return op

    def _held(
        self, conn: apsw.Connection, operation_id: str, owner: str | None
    ) -> Operation | None:
        """The open operation if ``owner`` holds its lease (or no lease is required)."""
        op = self._must(conn, operation_id)
        if not op.open or (owner is not None and op.lease_owner != owner):
            return None
        return op
