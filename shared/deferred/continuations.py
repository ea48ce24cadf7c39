"""Flows and their continuations, stored beside the operations they wait on.

A flow suspended on a deferred operation keeps an ``orbiplex-continuation.v1``
value here. The registry's terminal transition for that operation calls
:func:`resume` inside its own transaction: the continuation is consumed by a
conditional update, so however many completers race, the flow is resumed once.

:class:`FlowStore` is the flow runner's side (core): start, claim, advance, finish.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import apsw
import msgspec

from sensorium.shared.canonical import canonical_json
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.wire.continuation import Continuation

SCHEMA = """
CREATE TABLE IF NOT EXISTS flows (
    flow_id           TEXT PRIMARY KEY,
    template_id       TEXT NOT NULL,
    definition        BLOB NOT NULL,
    context           BLOB NOT NULL,
    step_index        INTEGER NOT NULL,
    state             TEXT NOT NULL CHECK (state IN ('runnable', 'running', 'suspended',
                          'completed', 'failed')),
    deferred_response_mode TEXT NOT NULL CHECK (deferred_response_mode IN
                          ('surface-to-caller', 'reject-as-failure')),
    operation_id      TEXT,
    created_at        REAL NOT NULL,
    updated_at        REAL NOT NULL,
    lease_owner       TEXT,
    lease_until       REAL,
    last_code         TEXT,
    last_diagnostic   TEXT
);
CREATE INDEX IF NOT EXISTS flows_runnable ON flows (state, updated_at);
CREATE TABLE IF NOT EXISTS continuations (
    continuation_id   TEXT PRIMARY KEY,
    operation_id      TEXT NOT NULL UNIQUE,
    flow_id           TEXT NOT NULL REFERENCES flows (flow_id) ON DELETE CASCADE,
    body              BLOB NOT NULL,
    digest            TEXT NOT NULL,
    created_at        REAL NOT NULL,
    resumed_at        REAL
);
"""

_json = msgspec.json.Encoder()


def digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def encode(c: Continuation) -> bytes:
    """The continuation's canonical JSON (RFC 8785), so its digest is stable."""
    return canonical_json(msgspec.to_builtins(c))


def suspend(conn: apsw.Connection, c: Continuation, now: float) -> None:
    """Persist a continuation and park its flow on the operation (inside the caller's
    transaction: the one that reserves the operation)."""
    body = encode(c)
    conn.execute(
        "INSERT INTO continuations (continuation_id, operation_id, flow_id, body, digest, "
        "created_at) VALUES (?, ?, ?, ?, ?, ?)",
        (c.continuation_id, c.deferred_operation_id, c.workflow_run_id, body, digest(body), now),
    )
    conn.execute(
        "UPDATE flows SET state = 'suspended', operation_id = ?, context = ?, updated_at = ? "
        "WHERE flow_id = ?",
        (c.deferred_operation_id, _json.encode(c.context), now, c.workflow_run_id),
    )


def resume(
    conn: apsw.Connection,
    operation_id: str,
    status: str,
    result: bytes | None,
    code: str | None,
    message: str | None,
    now: float,
) -> str | None:
    """Consume the operation's continuation, if any, exactly once; returns its flow."""
    row = conn.execute(
        "SELECT continuation_id, body FROM continuations "
        "WHERE operation_id = ? AND resumed_at IS NULL",
        (operation_id,),
    ).fetchone()
    if row is None:
        return None
    conn.execute(
        "UPDATE continuations SET resumed_at = ? WHERE continuation_id = ? AND resumed_at IS NULL",
        (now, row[0]),
    )
    if conn.changes() != 1:
        return None
    c = msgspec.json.decode(row[1], type=Continuation)
    outcome = None if result is None else msgspec.msgpack.decode(result)
    if status == "completed":
        context = {**c.context, c.resume_point.output_binding: outcome}
        conn.execute(
            "UPDATE flows SET state = 'runnable', context = ?, step_index = ?, "
            "operation_id = NULL, updated_at = ? WHERE flow_id = ? AND state = 'suspended'",
            (_json.encode(context), c.resume_point.step_index + 1, now, c.workflow_run_id),
        )
        return c.workflow_run_id if conn.changes() == 1 else None
    else:
        conn.execute(
            "UPDATE flows SET state = 'failed', last_code = ?, last_diagnostic = ?, "
            "updated_at = ? WHERE flow_id = ? AND state = 'suspended'",
            (
                code or RuntimeErrorCode.FLOW_STEP_FAILED,
                f"step {c.step_id!r} ended {status}" + (f": {message}" if message else ""),
                now,
                c.workflow_run_id,
            ),
        )
    # The flow may have ended meanwhile (failed by its runner): nothing was resumed.
    return c.workflow_run_id if conn.changes() == 1 else None


def collect(conn: apsw.Connection, cutoff: float, batch: int) -> int:
    conn.execute(
        "DELETE FROM flows WHERE rowid IN (SELECT rowid FROM flows WHERE state IN "
        "('completed', 'failed') AND updated_at < ? ORDER BY updated_at LIMIT ?)",
        (cutoff, batch),
    )
    return conn.changes()


@dataclass(frozen=True, slots=True)
class Flow:
    flow_id: str
    template_id: str
    definition: bytes
    context: dict[str, Any]
    step_index: int
    state: str
    deferred_response_mode: str
    operation_id: str | None
    created_at: float
    updated_at: float
    last_code: str | None
    last_diagnostic: str | None
    # The CURVE key that started it (None: the local operator); its steps run as it.
    caller_key: str | None = None


_FLOW_COLUMNS = (
    "flow_id, template_id, definition, context, step_index, state, deferred_response_mode, "
    "operation_id, created_at, updated_at, last_code, last_diagnostic, caller_key"
)


def _flow(row: tuple[Any, ...]) -> Flow:
    values = list(row)
    values[3] = msgspec.json.decode(values[3])
    return Flow(*values)


class FlowStore:
    """The flow runner's view of the flows table, on the registry's database."""

    def __init__(
        self,
        conn: apsw.Connection,
        lock: threading.RLock,
        tx: Callable[[], AbstractContextManager[apsw.Connection]],
    ) -> None:
        self.conn = conn
        self._lock = lock
        # The registry's transactions, so flow writes join a batch() like any other.
        self._tx = tx

    def start(
        self,
        flow_id: str,
        template_id: str,
        definition: bytes,
        context: dict[str, Any],
        mode: str,
        owner: str,
        now: float,
        lease_s: float,
        caller_key: str | None = None,
    ) -> None:
        """A new flow, already claimed by the runner that starts it."""
        with self._tx() as conn:
            conn.execute(
                "INSERT INTO flows (flow_id, template_id, definition, context, step_index, "
                "state, deferred_response_mode, created_at, updated_at, lease_owner, "
                "lease_until, caller_key) VALUES (?, ?, ?, ?, 0, 'running', ?, ?, ?, ?, ?, ?)",
                (
                    flow_id,
                    template_id,
                    definition,
                    _json.encode(context),
                    mode,
                    now,
                    now,
                    owner,
                    now + lease_s,
                    caller_key,
                ),
            )

    def retry_later(self, flow_id: str, at: float) -> None:
        """A step refused for a passing reason (overload): run the flow again at ``at``.
        Parked as a lapsed-lease flow, which ``claim`` takes back once ``at`` is past."""
        with self._tx() as conn:
            conn.execute(
                "UPDATE flows SET lease_owner = 'retry', lease_until = ?, updated_at = ? "
                "WHERE flow_id = ? AND state = 'running'",
                (at, at, flow_id),
            )

    def recover(self, owner: str) -> int:
        """Flows a dead runner was driving become runnable again (one core per node)."""
        with self._tx() as conn:
            conn.execute(
                "UPDATE flows SET state = 'runnable', lease_owner = NULL, lease_until = NULL "
                "WHERE state = 'running' AND lease_owner IS NOT ? AND lease_owner != 'retry'",
                (owner,),
            )
            return conn.changes()

    def get(self, flow_id: str) -> Flow | None:
        with self._lock:
            row = self.conn.execute(
                f"SELECT {_FLOW_COLUMNS} FROM flows WHERE flow_id = ?", (flow_id,)
            ).fetchone()
        return None if row is None else _flow(row)

    def claim(self, owner: str, now: float, lease_s: float, limit: int) -> list[Flow]:
        """Runnable flows, and running ones whose runner's lease ran out (it died)."""
        with self._tx() as conn:
            rows = conn.execute(
                f"SELECT {_FLOW_COLUMNS} FROM flows WHERE state = 'runnable' OR "
                "(state = 'running' AND lease_until <= ?) ORDER BY updated_at LIMIT ?",
                (now, limit),
            ).fetchall()
            for row in rows:
                conn.execute(
                    "UPDATE flows SET state = 'running', lease_owner = ?, lease_until = ? "
                    "WHERE flow_id = ?",
                    (owner, now + lease_s, row[0]),
                )
        return [_flow(r) for r in rows]

    def advance(
        self,
        flow_id: str,
        owner: str,
        context: dict[str, Any],
        step_index: int,
        now: float,
        lease_s: float,
    ) -> bool:
        """Record a finished synchronous step and renew the runner's lease."""
        with self._tx() as conn:
            conn.execute(
                "UPDATE flows SET context = ?, step_index = ?, updated_at = ?, lease_until = ? "
                "WHERE flow_id = ? AND state = 'running' AND lease_owner = ?",
                (_json.encode(context), step_index, now, now + lease_s, flow_id, owner),
            )
            return conn.changes() == 1

    def finish(
        self,
        flow_id: str,
        state: str,
        code: str | None,
        message: str | None,
        now: float,
        context: dict[str, Any] | None = None,
    ) -> bool:
        with self._tx() as conn:
            conn.execute(
                "UPDATE flows SET state = ?, last_code = ?, last_diagnostic = ?, updated_at = ?, "
                "context = coalesce(?, context), lease_owner = NULL, lease_until = NULL "
                "WHERE flow_id = ? AND state IN ('running', 'suspended')",
                (
                    state,
                    code,
                    message,
                    now,
                    None if context is None else _json.encode(context),
                    flow_id,
                ),
            )
            return conn.changes() == 1

    def continuation_of(self, operation_id: str) -> tuple[bytes, str, float | None] | None:
        """A continuation's body, digest and resume time (operator detail view)."""
        with self._lock:
            row = self.conn.execute(
                "SELECT body, digest, resumed_at FROM continuations WHERE operation_id = ?",
                (operation_id,),
            ).fetchone()
        return None if row is None else (bytes(row[0]), str(row[1]), row[2])
