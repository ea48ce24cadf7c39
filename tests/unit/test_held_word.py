"""A process started with a hold fd (the supervisor's early start of a restart) does
nothing before its word: end of file ends it untouched, a word starts it, and a hold fd
that is no pipe is refused with EX_CONFIG and a message. Real processes, real pipes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from sensorium.shared.process import EXIT_CONFIG, HOLD_FD_ENV


def _held(state: Path, read_fd: int, **kw: object) -> subprocess.Popen[bytes]:
    env = {**os.environ, HOLD_FD_ENV: str(read_fd)}
    return subprocess.Popen(
        [sys.executable, "-m", "sensorium.poller", "--state-dir", str(state)],
        env=env,
        pass_fds=(read_fd,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        **kw,  # type: ignore[arg-type]
    )


def test_end_of_file_ends_a_held_process_before_it_touches_anything(tmp_path: Path) -> None:
    state = tmp_path / "state"
    read, write = os.pipe()
    proc = _held(state, read)
    os.close(read)
    os.close(write)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert not state.exists()  # no state directory made, no lock taken, no log opened


def test_a_word_starts_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    read, write = os.pipe()
    proc = _held(state, read)
    os.close(read)
    lock = state / "run" / "poller.lock"
    try:
        os.write(write, b"1")
        deadline = time.monotonic() + 120
        while not lock.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # until it has taken its role (or exited)
        assert lock.exists(), proc.returncode
    finally:
        os.close(write)
        proc.terminate()
        proc.wait(timeout=60)


def test_a_hold_fd_that_is_no_pipe_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with open(os.devnull, "rb") as devnull:
        proc = _held(state, devnull.fileno())
        _out, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_CONFIG
    assert HOLD_FD_ENV.encode() in err and b"not starting" in err
    assert not state.exists()
