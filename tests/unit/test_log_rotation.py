"""Log files: size rotation under concurrent writers, SIGHUP reopen (logrotate's move
then signal), and JSON with syslog priorities to the systemd journal."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import structlog
from log_writer import lines_of, start_writer, wait_for

from sensorium.shared import logs


def emit(sink: logs._LineSink, **event: Any) -> None:
    with contextlib.suppress(structlog.DropEvent):
        sink(None, "info", {"ts": "t", "process": "p", "event": "e", **event})


def test_threads_rotating_often_lose_tear_and_repeat_no_line(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    sink = logs._LineSink(path, console=False, max_bytes=3000, keep=100)
    threads, per = 8, 300

    def write(t: int) -> None:
        for i in range(per):
            emit(sink, t=t, i=i, pad="y" * (i % 40))

    workers = [threading.Thread(target=write, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    files = sorted(tmp_path.glob("p.jsonl*"))
    assert 20 < len(files) <= 101 and not (tmp_path / "p.jsonl.next").exists()
    assert all(f.stat().st_size <= 3000 for f in files)
    seen = [(e["t"], e["i"]) for e in lines_of(*files)]
    assert sorted(seen) == [(t, i) for t in range(threads) for i in range(per)]
    assert sink.dropped == 0


def test_rotation_keeps_at_most_keep_files_and_the_latest_lines(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    (tmp_path / "p.jsonl.7").write_text("{}\n")  # left over from a larger keep
    sink = logs._LineSink(path, console=False, max_bytes=1000, keep=2)
    threads, per = 4, 200

    def write(t: int) -> None:
        for i in range(per):
            emit(sink, t=t, i=i)

    workers = [threading.Thread(target=write, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    names = sorted(f.name for f in tmp_path.iterdir())
    assert names == ["p.jsonl", "p.jsonl.1", "p.jsonl.2"]
    # Oldest file first: each thread's surviving lines are its last ones, without a gap.
    events = lines_of(tmp_path / "p.jsonl.2", tmp_path / "p.jsonl.1", path)
    for t in range(threads):
        mine = [e["i"] for e in events if e.get("t") == t]
        assert mine == list(range(per - len(mine), per))


def test_max_bytes_zero_never_rotates(tmp_path: Path) -> None:
    sink = logs._LineSink(tmp_path / "p.jsonl", console=False, max_bytes=0)
    for i in range(200):
        emit(sink, i=i)
    assert [f.name for f in tmp_path.iterdir()] == ["p.jsonl"]


def test_reopen_follows_a_moved_file_and_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    sink = logs._LineSink(path, console=False)
    emit(sink, i=0)
    path.rename(tmp_path / "moved")
    emit(sink, i=1)  # not reopened yet: the moved file takes it
    logs.reopen()
    emit(sink, i=2)
    assert [e["i"] for e in lines_of(tmp_path / "moved")] == [0, 1]
    assert [e["i"] for e in lines_of(path)] == [2]


def test_a_service_survives_sighup_and_reopens_its_moved_log(tmp_path: Path) -> None:
    """logrotate without copytruncate: move the file, (maybe create a new one,) SIGHUP."""
    proc = start_writer(tmp_path, n=400, pause_s=0.004, node={"logs": {"max_bytes": 0}})
    log = tmp_path / "logs" / "writer.jsonl"
    try:
        wait_for(lambda: log.exists() and log.stat().st_size > 2000)
        log.rename(tmp_path / "logs" / "writer.jsonl.1")
        time.sleep(0.1)  # lines keep landing in the moved file until the signal
        os.kill(proc.pid, signal.SIGHUP)
        wait_for(lambda: log.exists() and log.stat().st_size > 2000)
        log.rename(tmp_path / "logs" / "writer.jsonl.2")
        log.touch()  # logrotate's `create`
        os.kill(proc.pid, signal.SIGHUP)
        assert proc.wait(timeout=20) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        proc.kill()
        proc.wait()
    parts = [tmp_path / "logs" / n for n in ("writer.jsonl.1", "writer.jsonl.2", "writer.jsonl")]
    ticks = [[e["i"] for e in lines_of(p) if e["event"] == "tick"] for p in parts]
    assert all(ticks), ticks  # each file got lines
    assert [i for part in ticks for i in part] == list(range(400))
    assert lines_of(parts[2])[-1]["event"] == "done"


def _journal_child(tmp_path: Path, stderr: Any, journal_stream: str) -> str:
    code = (
        "import structlog, sys; from pathlib import Path; from sensorium.shared import logs; "
        "logs.configure('j', Path(sys.argv[1])); log = structlog.get_logger(); "
        "log.info('hello', x=1); log.warning('careful'); log.error('bad'); log.debug('quiet')"
    )
    env = {**os.environ, "JOURNAL_STREAM": journal_stream, "SENSORIUM_LOG_LEVEL": "debug"}
    subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], stderr=stderr, env=env, check=True, timeout=30
    )
    return (tmp_path / "j.jsonl").read_text()


def test_json_with_priorities_goes_to_the_journal_stream(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair()  # what journald hands a service as stdout/stderr
    with ours, theirs:
        st = os.fstat(theirs.fileno())
        written = _journal_child(tmp_path, theirs, f"{st.st_dev}:{st.st_ino}")
        theirs.close()
        got = b""
        while chunk := ours.recv(65536):
            got += chunk
    lines = got.decode().splitlines()
    assert [line[:3] for line in lines] == ["<6>", "<4>", "<3>", "<7>"]
    events = [json.loads(line[3:]) for line in lines]
    assert [e["event"] for e in events] == ["hello", "careful", "bad", "quiet"]
    assert events[0]["x"] == 1 and events[0]["process"] == "j" and "ts" in events[0]
    assert len(written.splitlines()) == 4  # the file is still written, for `sensorium logs`


def test_a_redirected_stderr_is_not_the_journal(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        st = os.fstat(ours.fileno())  # another socket than the child's stderr
        written = _journal_child(tmp_path, theirs, f"{st.st_dev}:{st.st_ino}")
        theirs.close()
        assert ours.recv(65536) == b""  # not a TTY either: nothing on stderr
    assert len(written.splitlines()) == 4


def test_a_fragment_left_by_a_killed_writer_does_not_swallow_the_next_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"event": "whole"}\n{"event": "cut sh')
    emit(logs._LineSink(path, console=False), i=1)
    lines = path.read_bytes().split(b"\n")
    assert lines[1] == b'{"event": "cut sh' and json.loads(lines[2])["i"] == 1
