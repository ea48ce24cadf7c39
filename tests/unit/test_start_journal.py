"""The start journal (run/starts.py) on a real SQLite file: starts that arrive together
share a commit, yet each is fenced, refused or written on its own."""

from __future__ import annotations

import asyncio
from pathlib import Path

import apsw
import pytest

from sensorium.connectors.os.run.starts import StartJournal
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError


def _rows(path: Path) -> dict[str, str]:
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return dict(conn.execute("SELECT seam_request_id, state FROM starts").fetchall())
    finally:
        conn.close()


def test_starts_handed_in_together_each_meet_their_own_fence(tmp_path: Path) -> None:
    path = tmp_path / "starts.sqlite"
    journal = StartJournal(path, 1000.0)
    try:
        # Fenced before it ever arrived: the lost dispatch's late delivery.
        assert journal.ask(["r-fenced"], 1005.0, "i1", 1006.0) == "never-started"

        async def burst() -> list[object]:
            starts = [
                journal.start(rid, f"d-{rid}", None, "i2", 1010.0)
                for rid in ("r1", "r-fenced", "r2", "r1", "r3")
            ]
            return await asyncio.gather(*starts, return_exceptions=True)

        commits = journal.group.commits
        got = asyncio.run(burst())
        # Five starts in fewer commits than five (one, unless the committer woke early).
        assert journal.group.commits - commits < 5
        assert got[0] is None and got[2] is None and got[4] is None
        assert isinstance(got[1], CodedError)
        assert got[1].code == RuntimeErrorCode.CONNECTOR_UNAVAILABLE
        # The same dispatch twice: the second is in doubt, never a second run.
        assert isinstance(got[3], CodedError) and got[3].code == RuntimeErrorCode.OUTCOME_IN_DOUBT
        assert journal.ask(["r2"], 1005.0, "i1", 1011.0) == "started"
    finally:
        journal.close()
    assert _rows(path) == {"r1": "started", "r2": "started", "r3": "started", "r-fenced": "fenced"}


def test_a_start_the_disk_cannot_take_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    path = tmp_path / "starts.sqlite"
    journal = StartJournal(path, 1000.0)
    try:
        # A full disk, as SQLite sees it: no page past the current ones.
        pages = journal.conn.execute("PRAGMA page_count").fetchone()[0]
        journal.conn.execute(f"PRAGMA max_page_count={pages}")
        big = "x" * 200_000
        with pytest.raises(CodedError) as refused:
            asyncio.run(journal.start("r1", big, None, "i1", 1001.0))
        assert refused.value.code == RuntimeErrorCode.STORAGE_UNAVAILABLE
    finally:
        journal.close()
    assert _rows(path) == {}
