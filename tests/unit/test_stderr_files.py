"""What a process writes outside its log stays bounded (issue 16, item 12).

``logs/<process>.stderr`` is rotated by the supervisor by size (``logs.max_bytes``,
``logs.keep``), while the child holds it open; and the event loop's reports become
one structured log line each instead of tracebacks on stderr. Real processes, real
files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sensorium.shared.config import LogConfig
from sensorium.supervisor.stderrfiles import rotate, stderr_path

_WRITER = """
import sys
for line in sys.stdin:
    ch, n = line.split()
    sys.stderr.write(ch * int(n)); sys.stderr.flush()
    print("ok", flush=True)
"""


class Writer:
    """A child whose fd 2 is the file opened as the supervisor opens it (O_APPEND)."""

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _WRITER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=fd,
                text=True,
            )
        finally:
            os.close(fd)

    def write(self, ch: str, n: int) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{ch} {n}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline() == "ok\n"

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[tuple[Writer, Path]]:
    path = stderr_path(tmp_path, "connector")
    w = Writer(path)
    yield w, path
    w.close()


def test_a_live_stderr_file_is_copied_truncated_and_kept_within_keep(
    writer: tuple[Writer, Path],
) -> None:
    w, path = writer
    cfg = LogConfig(max_bytes=1000, keep=2)
    w.write("a", 900)
    assert not rotate(path, cfg, live=True)  # within its size: left alone
    w.write("b", 3000)
    assert rotate(path, cfg, live=True)
    one = path.with_name("connector.stderr.1")
    assert one.read_bytes() == b"b" * 1000  # its last max_bytes, whatever it grew to
    assert path.stat().st_size == 0
    w.write("c", 10)  # the child appends at the new end: no hole, nothing lost after
    assert path.read_bytes() == b"c" * 10
    for ch in "de":
        w.write(ch, 1500)
        assert rotate(path, cfg, live=True)
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "connector.stderr",
        "connector.stderr.1",
        "connector.stderr.2",
    ]
    assert one.read_bytes() == b"e" * 1000
    assert path.with_name("connector.stderr.2").read_bytes() == b"d" * 1000


def test_a_closed_stderr_file_is_renamed_and_zero_never_rotates(tmp_path: Path) -> None:
    path = stderr_path(tmp_path, "core")
    path.write_bytes(b"x" * 5000)
    assert not rotate(path, LogConfig(max_bytes=0), live=False)
    assert rotate(path, LogConfig(max_bytes=1000, keep=3), live=False)
    assert not path.exists() and path.with_name("core.stderr.1").stat().st_size == 5000
    assert not rotate(path, LogConfig(max_bytes=1000), live=False)  # nothing there


_LOOP = """
import asyncio, logging, sys
from pathlib import Path
from sensorium.shared import logs
from sensorium.shared.process import install_loop_logging

logs.configure("probe", Path(sys.argv[1]), console=False)

async def main() -> None:
    loop = asyncio.get_running_loop()
    install_loop_logging(loop)
    for _ in range(50):
        loop.call_soon(lambda: 1 / 0)
    async def boom() -> None:
        raise ValueError("never awaited")
    task = loop.create_task(boom())
    await asyncio.sleep(0.01)
    del task
    logging.getLogger("asyncio").warning("socket.send() raised exception.")

asyncio.run(main())
"""


def test_the_loop_reports_in_one_structured_line_each_never_a_traceback(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-c", _LOOP, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""  # before: 50 tracebacks, one per failing callback
    lines = [json.loads(x) for x in (tmp_path / "probe.jsonl").read_text().splitlines()]
    unhandled = [x for x in lines if x["event"] == "asyncio.unhandled"]
    assert len(unhandled) == 51
    assert unhandled[0]["error"] == "ZeroDivisionError: division by zero"
    assert unhandled[0]["level"] == "error" and "Exception in callback" in unhandled[0]["message"]
    assert (unhandled[50]["message"], unhandled[50]["error"]) == (
        "Task exception was never retrieved",
        "ValueError: never awaited",
    )
    [warning] = [x for x in lines if x["event"] == "python.log"]
    assert (warning["level"], warning["logger"]) == ("warning", "asyncio")
    assert warning["message"] == "socket.send() raised exception."
