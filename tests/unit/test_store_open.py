"""Processes that open one store at once upgrade it once: core and the poller both open
the registry at start, and the second must not run an ALTER TABLE again."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

from sensorium.shared.store import open_store

# Not idempotent on purpose: run twice, the ALTER fails ("duplicate column name").
SCHEMA = "CREATE TABLE t (a INTEGER); ALTER TABLE t ADD COLUMN b INTEGER;"
UPGRADES = {2: "ALTER TABLE t ADD COLUMN c INTEGER;"}


def _open(path: str, version: int, go: multiprocessing.synchronize.Event) -> None:
    go.wait()
    try:
        open_store(Path(path), schema=SCHEMA, version=version, upgrades=UPGRADES).close()
    except Exception as exc:  # the child's verdict is its exit status
        print(f"{os.getpid()}: {exc!r}", flush=True)
        os._exit(1)
    os._exit(0)


def _race(path: Path, version: int, n: int = 8) -> list[int | None]:
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    procs = [ctx.Process(target=_open, args=(str(path), version, go)) for _ in range(n)]
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(60)
    return [p.exitcode for p in procs]


def test_a_fresh_store_opened_by_many_at_once_is_made_once(tmp_path: Path) -> None:
    for i in range(5):  # a race: a few rounds, each from a fresh file
        assert _race(tmp_path / f"fresh{i}.sqlite", 1) == [0] * 8


def test_an_old_store_opened_by_many_at_once_is_upgraded_once(tmp_path: Path) -> None:
    for i in range(5):
        db = tmp_path / f"old{i}.sqlite"
        open_store(db, schema=SCHEMA, version=1).close()
        assert _race(db, 2) == [0] * 8
