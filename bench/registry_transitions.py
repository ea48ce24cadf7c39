"""State transitions per second of the host deferred-operation registry.

Measured in one process, with the product's own ``Registry`` (apsw, WAL,
``synchronous=FULL`` — its default — so every committed transaction is an fsync) on a
fresh file under /tmp: admission (``reserve`` + ``confirm``, two transactions, what
core does per async directive), ``record_open`` (what the poller records per
pending/running answer) and ``settle`` (a terminal status). Each one transition per
transaction, then grouped 100 to a ``batch()`` (one transaction), as the poller records
a burst of answers.

Peer: the stdlib ``sqlite3`` module on its own file with the same schema and pragmas
(WAL, ``synchronous=FULL``, busy timeout, foreign keys), doing the plain SQL of each
transition — ``INSERT`` then ``UPDATE`` for an admission, one ``UPDATE`` for the others —
one ``BEGIN IMMEDIATE … COMMIT`` per row (and 100 rows per transaction for the batched
rows). So each ratio is what the registry's reads, conditional updates, policy and
bookkeeping cost on top of the bare writes at the same durability. Three rounds,
alternating registry and peer; the median rate is reported.
"""

from __future__ import annotations

import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _harness import emit, machine, parse_args, row

from sensorium.shared.config import DeferredConfig
from sensorium.shared.deferred.policy import DeferredHostPolicy
from sensorium.shared.deferred.records import SCHEMA
from sensorium.shared.deferred.registry import Registry, Reservation
from sensorium.shared.wire.deferred import ConnectorDeferred

BENCH = "registry transitions"
PEER = "sqlite3 module, same schema+pragmas"
N_SINGLE = 300
N_BATCHED = 2000
BATCH = 100
ROUNDS = 3
T0 = 1_700_000_000.0
UNIT = "ops/s"


def _reservation(i: int) -> Reservation:
    return Reservation(
        operation_id=f"deferred:sensorium.directive.invoke:bench-{i:06d}",
        operation_kind="sensorium.directive.invoke",
        owner_module_id="sensorium-os",
        capability_id="sensorium.directive.invoke",
        directive_id=f"directive-{i:06d}",
        action_id="bench.slow",
        correlation_id=None,
        idempotency_key=None,
        deadline_at=None,
        preferred_ttl_s=None,
        preferred_retry_s=None,
        cancel_unavailable_reason=None,
        audit_outcome_ref=f"outcome:{i}",
        confirm_within_s=15.0,
    )


def _ack(op_id: str) -> ConnectorDeferred:
    return ConnectorDeferred(
        operation_id=op_id,
        status="running",
        retry_after_seconds=1,
        created_at="2023-11-14T22:13:20Z",
        cancel_href=f"sensorium.connector.cancel?operation/id={op_id}",
    )


def _chunks(n: int, size: int) -> list[range]:
    return [range(i, min(n, i + size)) for i in range(0, n, size)]


def _timed(fn: Callable[[], None], n: int) -> float:
    t0 = time.perf_counter_ns()
    fn()
    return n / ((time.perf_counter_ns() - t0) / 1e9)


# -- the registry ----------------------------------------------------------------------


def registry_rates(root: Path, n: int, batch: int | None) -> dict[str, float]:
    reg = Registry(
        root / "storage" / "deferred-operations.sqlite",
        DeferredHostPolicy.from_config(DeferredConfig()),
    )
    ids = [_reservation(i).operation_id for i in range(n)]
    groups = _chunks(n, batch or 1)

    def each(step: Callable[[int], object]) -> Callable[[], None]:
        def run() -> None:
            for group in groups:
                if batch is None:
                    for i in group:
                        step(i)
                else:
                    with reg.batch():
                        for i in group:
                            step(i)

        return run

    def admit(i: int) -> None:
        op, _ = reg.reserve(_reservation(i), T0)
        reg.confirm(op.operation_id, _ack(op.operation_id), T0)

    rates = {
        "admission": _timed(each(admit), n),
        "record_open": _timed(
            each(lambda i: reg.record_open(ids[i], None, "running", 1.0, T0 + 1)), n
        ),
        "settle": _timed(
            each(lambda i: reg.settle(ids[i], "completed", b"\x80", None, None, T0 + 2)), n
        ),
    }
    counts = reg.counts()
    reg.close()
    assert counts == {"completed": n}, counts
    return rates


# -- the peer --------------------------------------------------------------------------

_INSERT = (
    "INSERT INTO operations (operation_id, operation_kind, owner_module_id, capability_id, "
    "directive_id, action_id, status, admitted, created_at, updated_at, expires_at, "
    "retry_after_s, next_poll_at, max_attempts, cancel_href, audit_outcome_ref) "
    "VALUES (?, 'sensorium.directive.invoke', 'sensorium-os', 'sensorium.directive.invoke', "
    "?, 'bench.slow', 'pending', 0, ?, ?, ?, 1.0, ?, 600, ?, ?)"
)
_CONFIRM = (
    "UPDATE operations SET admitted = 1, status = 'running', expires_at = ?, retry_after_s = 1.0, "
    "next_poll_at = ?, updated_at = ?, cancel_href = ? WHERE operation_id = ?"
)
_OPEN = (
    "UPDATE operations SET status = 'running', attempts = attempts + 1, retry_after_s = 1.0, "
    "next_poll_at = ?, updated_at = ?, lease_owner = NULL, lease_until = NULL "
    "WHERE operation_id = ?"
)
_SETTLE = (
    "UPDATE operations SET status = 'completed', result = ?, updated_at = ?, admitted = 1, "
    "next_poll_at = NULL, lease_owner = NULL, lease_until = NULL WHERE operation_id = ?"
)


def _peer_conn(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA busy_timeout=5000")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.executescript(SCHEMA)  # the registry's own tables and indexes
    return conn


def peer_rates(root: Path, n: int, batch: int | None) -> dict[str, float]:
    conn = _peer_conn(root / "peer" / "plain.sqlite")
    ids = [_reservation(i).operation_id for i in range(n)]
    groups = _chunks(n, batch or 1)

    def each(*statements: Callable[[int], None]) -> Callable[[], None]:
        def run() -> None:
            for group in groups:
                if batch is None:
                    for i in group:
                        for stmt in statements:  # one transaction per statement
                            conn.execute("BEGIN IMMEDIATE")
                            stmt(i)
                            conn.execute("COMMIT")
                else:
                    conn.execute("BEGIN IMMEDIATE")
                    for i in group:
                        for stmt in statements:
                            stmt(i)
                    conn.execute("COMMIT")

        return run

    def insert(i: int) -> None:
        href = f"sensorium.operation.cancel?operation/id={ids[i]}"
        conn.execute(_INSERT, (ids[i], f"directive-{i:06d}", T0, T0, T0 + 900, T0 + 15, href, "o"))

    def confirm(i: int) -> None:
        href = f"sensorium.operation.cancel?operation/id={ids[i]}"
        conn.execute(_CONFIRM, (T0 + 900, T0 + 1.1, T0, href, ids[i]))

    def record_open(i: int) -> None:
        conn.execute(_OPEN, (T0 + 2.1, T0 + 1, ids[i]))

    def settle(i: int) -> None:
        conn.execute(_SETTLE, (b"\x80", T0 + 2, ids[i]))

    rates = {
        "admission": _timed(each(insert, confirm), n),
        "record_open": _timed(each(record_open), n),
        "settle": _timed(each(settle), n),
    }
    done = conn.execute("SELECT count(*) FROM operations WHERE status = 'completed'").fetchone()
    conn.close()
    assert done == (n,), done
    return rates


# -- the run ---------------------------------------------------------------------------

LABELS = {
    "admission": "reserve+confirm (2 tx)",
    "record_open": "record_open",
    "settle": "settle",
}


def run() -> dict[str, Any]:
    m = machine()
    samples: dict[tuple[str, str, str], list[float]] = {}
    for round_no in range(ROUNDS):
        for mode, n, batch in (("single", N_SINGLE, None), ("batch", N_BATCHED, BATCH)):
            for who, measure in (("registry", registry_rates), ("peer", peer_rates)):
                root = Path(tempfile.mkdtemp(prefix=f"sr{round_no}-", dir="/tmp"))
                try:
                    for kind, rate in measure(root, n, batch).items():
                        samples.setdefault((who, mode, kind), []).append(rate)
                finally:
                    shutil.rmtree(root, ignore_errors=True)
    median = {key: statistics.median(v) for key, v in samples.items()}
    rows = []
    for mode, label in (("single", "1 per tx"), ("batch", f"batch() of {BATCH}")):
        for kind in LABELS:
            rows.append(
                row(
                    BENCH,
                    f"{LABELS[kind]}, {label}",
                    median[("registry", mode, kind)],
                    median[("peer", mode, kind)],
                    unit=UNIT,
                    peer_name=PEER + (", 1 row/tx" if mode == "single" else f", {BATCH} rows/tx"),
                    higher_is_better=True,
                )
            )
    speedup = {
        kind: median[("registry", "batch", kind)] / median[("registry", "single", kind)]
        for kind in LABELS
    }
    return {
        "name": "registry_transitions",
        "machine": m,
        "rows": rows,
        "samples": {"/".join(k): v for k, v in samples.items()},
        "notes": [
            f"registry transitions: synchronous=FULL on {m['state_dir_fs']}; {N_SINGLE} ops "
            f"single, {N_BATCHED} ops batched, median of {ROUNDS} rounds; batch() speed-up "
            "over one transition per transaction: "
            + ", ".join(f"{LABELS[k]} {v:.0f}×" for k, v in speedup.items())
        ],
    }


def main() -> None:
    args = parse_args(__doc__)
    emit(run(), args.json)


if __name__ == "__main__":
    main()
