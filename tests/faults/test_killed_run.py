"""A test run that is killed leaves no node process and no state dir behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _referencing(path: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if path.encode() in argv:
                found.append(int(entry))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_test_run_leaves_no_node_and_no_state_dir(
    tmp_path: Path, sig: signal.Signals
) -> None:
    marker = tmp_path / "state-dir"
    env = {**os.environ, "KILLED_RUN_MARKER": str(marker)}
    env.pop("SENSORIUM_TEST_RUN", None)  # the inner run gets its own janitor and token
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(HERE / "killed_run_target.py"),
        ],
        cwd=HERE.parent.parent,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        for _ in range(1200):  # until the inner run's node is up (bounded by count)
            if (marker.exists() and marker.read_text()) or run.poll() is not None:
                break
            time.sleep(0.1)
        assert marker.exists(), f"the inner run never started its node (exit {run.poll()})"
        state_dir = marker.read_text()
        assert _referencing(state_dir), "the inner node should be running now"
        os.kill(run.pid, sig)
        run.wait(timeout=60)
        for _ in range(600):
            if not _referencing(state_dir) and not os.path.exists(state_dir):
                break
            time.sleep(0.1)
        left = _referencing(state_dir)
        assert not left, f"processes left after {sig.name}: " + ", ".join(
            f"{p}: {Path(f'/proc/{p}/cmdline').read_bytes()!r}" for p in left
        )
        assert not os.path.exists(state_dir), f"{state_dir} left after {sig.name}"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
