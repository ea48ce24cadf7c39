"""The start journal (run/starts.py) on a real SQLite file: starts that arrive together
share a commit, yet each is fenced, refused or written on its own."""

from __future__ import annotations

import asyncio
from pathlib import Path

import apsw
import pytest

from sensorium.connectors.os.run import starts
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


def _synchronous(journal: StartJournal) -> int:
    return int(journal.conn.execute("PRAGMA synchronous").fetchone()[0])


def _started_in(path: Path, boot: str) -> None:
    """A journal created at 1000 in ``boot`` that started ``r1`` at 1001, then closed."""
    first = StartJournal(path, 1000.0, boot=boot)
    # Written, not fsynced: NORMAL (1), since the journal knows its boot.
    assert _synchronous(first) == 1
    asyncio.run(first.start("r1", "d1", None, "i1", 1001.0))
    first.close()


def test_a_start_written_in_this_boot_is_vouched_for_by_the_next_instance(
    tmp_path: Path,
) -> None:
    path = tmp_path / "starts.sqlite"
    _started_in(path, "boot-a")
    # The connector restarted, the host did not: the row and the horizon stand.
    second = StartJournal(path, 1002.0, boot="boot-a")
    try:
        assert second.covered_from() == 1000.0
        assert second.ask(["r1"], 1001.5, "i2", 1003.0) == "started"
        assert second.ask(["r2"], 1001.5, "i2", 1003.0) == "never-started"
    finally:
        second.close()


def test_after_a_reboot_nothing_sent_before_it_is_answered_never_started(
    tmp_path: Path,
) -> None:
    """A host crash may have lost rows written without an fsync: a dispatch sent in the
    earlier boot is ``unknown``, never ``never-started``; a row that did survive still
    says ``started``."""
    path = tmp_path / "starts.sqlite"
    _started_in(path, "boot-a")
    later = StartJournal(path, 2000.0, boot="boot-b")
    try:
        assert later.covered_from() == 2000.0
        assert later.ask(["r-lost"], 1001.0, "i2", 2001.0) == "unknown"
        assert later.ask(["r1"], 1001.0, "i2", 2001.0) == "started"
        # Dispatches of this boot are answered as before.
        assert later.ask(["r-new"], 2002.0, "i2", 2003.0) == "never-started"
    finally:
        later.close()
    # Nothing asked before the reboot was fenced by that answer.
    assert _rows(path) == {"r1": "started", "r-new": "fenced"}


def test_where_the_boot_cannot_be_read_every_start_is_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(starts, "BOOT_ID", tmp_path / "no-such-file")
    assert starts.boot_id() is None
    path = tmp_path / "starts.sqlite"
    journal = StartJournal(path, 1000.0)
    try:
        assert journal.boot is None
        assert _synchronous(journal) == 2  # FULL
    finally:
        journal.close()
    # Its rows were fsynced: reopened with the boot known, the horizon still moves,
    # since nothing records which boot wrote them.
    again = StartJournal(path, 1500.0, boot="boot-a")
    try:
        assert again.covered_from() == 1500.0
    finally:
        again.close()


@pytest.mark.skipif(not starts.BOOT_ID.exists(), reason="no Linux boot id on this host")
def test_the_kernel_boot_id_is_read_here() -> None:
    # Linux gives every boot an id; on this host the journal uses it (NORMAL commits).
    assert starts.boot_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_a_version_1_journal_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "starts.sqlite"
    conn = apsw.Connection(str(path))
    conn.execute(
        "CREATE TABLE starts (seam_request_id TEXT PRIMARY KEY, state TEXT NOT NULL,"
        " directive_id TEXT, idempotency_key TEXT, instance_id TEXT NOT NULL, at REAL NOT NULL);"
        "CREATE INDEX starts_at ON starts (at);"
        "CREATE TABLE horizon (one INTEGER PRIMARY KEY CHECK (one = 1),"
        " covered_from REAL NOT NULL);"
        "INSERT INTO horizon VALUES (1, 900.0);"
        "INSERT INTO starts VALUES ('r0', 'started', 'd0', NULL, 'i0', 950.0);"
        "PRAGMA user_version = 1;"
    )
    conn.close()
    journal = StartJournal(path, 1000.0, boot="boot-a")
    try:
        assert journal.ask(["r0"], 960.0, "i1", 1001.0) == "started"
        # Which boot wrote its rows is not known: nothing before this open is vouched for.
        assert journal.ask(["r-x"], 960.0, "i1", 1001.0) == "unknown"
    finally:
        journal.close()


def _horizon(path: Path) -> tuple[float, str | None, float | None]:
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        row = conn.execute("SELECT covered_from, boot_id, written_until FROM horizon").fetchone()
        return float(row[0]), row[1], row[2]
    finally:
        conn.close()


def test_start_times_are_bounded_on_disk_once_a_minute(tmp_path: Path) -> None:
    path = tmp_path / "starts.sqlite"
    journal = StartJournal(path, 1000.0, boot="boot-a")
    try:

        async def begin(*at: float) -> None:
            for i, t in enumerate(at):
                await journal.start(f"r{t}-{i}", "d", None, "i1", t)

        asyncio.run(begin(1001.0, 1002.0, 1050.0))
        # One raise covers the three: the first start's time, AHEAD_S ahead.
        assert _horizon(path)[2] == 1001.0 + starts.AHEAD_S
        asyncio.run(begin(1061.5))
        assert _horizon(path)[2] == 1061.5 + starts.AHEAD_S
    finally:
        journal.close()


def test_after_a_reboot_with_the_clock_behind_a_lost_start_is_still_unknown(
    tmp_path: Path,
) -> None:
    """A host whose clock comes back from the reboot behind the last boot's rows (no
    hardware clock, NTP not yet synced): the fsynced bound on start times, not the
    clock, places the horizon."""
    path = tmp_path / "starts.sqlite"
    first = StartJournal(path, 1000.0, boot="boot-a")
    asyncio.run(first.start("lost", "d1", None, "i1", 5000.0))
    first.close()
    # The crash took the row (it was written, not fsynced); the bound stayed.
    conn = apsw.Connection(str(path))
    conn.execute("DELETE FROM starts WHERE seam_request_id = 'lost'")
    conn.close()
    later = StartJournal(path, 3000.0, boot="boot-b")
    try:
        assert later.covered_from() >= 5000.0
        assert later.ask(["lost"], 4999.5, "i2", 3001.0) == "unknown"
    finally:
        later.close()
    assert _rows(path) == {}  # and nothing was fenced


def test_an_instance_that_cannot_read_the_boot_keeps_the_one_known(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Else a second instance of the same boot, still writing unsynced rows, would
    leave a journal that a later blind opener takes for fully fsynced."""
    path = tmp_path / "starts.sqlite"
    StartJournal(path, 1000.0, boot="boot-a").close()
    monkeypatch.setattr(starts, "BOOT_ID", tmp_path / "no-such-file")
    StartJournal(path, 1100.0).close()
    assert _horizon(path)[:2] == (1100.0, "boot-a")
    # Opened blind again: the boot is still not known to be the same, so it moves again.
    StartJournal(path, 1200.0).close()
    assert _horizon(path)[0] == 1200.0
