"""The disk's floor for one durable write, where the state directories live (``/tmp``).

Not a benchmark of Sensorium and not in ``run_all.py``: the yardstick for its two
durable writes on a sync directive's path (the connector's start row, core's outcome
record). Measured here, alone: a one-row SQLite commit in WAL mode with
``synchronous=FULL`` (as ``shared/store.py`` opens every store), and a bare
``os.write`` + ``fdatasync``. ``python bench/commit_floor.py --iterations 300``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import apsw
from _harness import parse_args


def _median_us(samples: list[int]) -> float:
    return sorted(samples)[len(samples) // 2] / 1000


def sqlite_commit(where: Path, n: int) -> float:
    conn = apsw.Connection(str(where / "floor.sqlite"))
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, at REAL)")
    took = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t VALUES (?, ?)", (f"{i:026d}", time.time()))
        conn.execute("COMMIT")
        took.append(time.perf_counter_ns() - t0)
    conn.close()
    return _median_us(took)


def write_fdatasync(where: Path, n: int) -> float:
    fd = os.open(where / "floor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    took = []
    try:
        for _ in range(n):
            t0 = time.perf_counter_ns()
            os.write(fd, b"x" * 100)
            os.fdatasync(fd)
            took.append(time.perf_counter_ns() - t0)
    finally:
        os.close(fd)
    return _median_us(took)


def main() -> None:
    args = parse_args(
        __doc__,
        lambda p: p.add_argument("--iterations", type=int, default=300),
    )
    where = Path(tempfile.mkdtemp(prefix="floor-", dir="/tmp"))
    try:
        n = args.iterations
        print(f"SQLite WAL commit, synchronous=FULL: median {sqlite_commit(where, n):.0f} µs")
        print(f"os.write + fdatasync: median {write_fdatasync(where, n):.0f} µs")
    finally:
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
