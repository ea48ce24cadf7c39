"""Test nodes die with the test run, however it ends.

A test run that is interrupted (SIGTERM, SIGKILL, a closed terminal) runs no
finalizer: the nodes it started and their state directories would stay behind. So
the run starts this janitor first, as a separate process that holds the read end of a
pipe. The run tells it, line by line, what it creates (``dir PATH``). When the pipe
closes — the run ended, any way at all — the janitor stops every process that carries
the run's token in its environment or names a created directory in its command line
(SIGTERM, a bounded wait, then SIGKILL), and removes the created directories that
remain (unless ``KEEP`` is set, which keeps them for a post-mortem).

    python tests/janitor.py TOKEN      # reads ``dir PATH`` lines on stdin until EOF
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path

TOKEN_VAR = "SENSORIUM_TEST_RUN"
GRACE_POLLS = 100  # × 0.1 s: a supervisor's orderly stop, before SIGKILL
POLL_S = 0.1


def _environ_has(pid: int, needle: bytes) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _cmdline_names(pid: int, dirs: list[str]) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    # A whole path or a path under it, never a longer name that starts the same.
    return any(f"{d}\0".encode() in argv or f"{d}/".encode() in argv for d in dirs)


def leftovers(token: str, dirs: list[str]) -> list[int]:
    """Live processes of the run: its token in their environment or a dir in argv."""
    needle = f"{TOKEN_VAR}={token}".encode()
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        if _environ_has(pid, needle) or (dirs and _cmdline_names(pid, dirs)):
            found.append(pid)
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def sweep(token: str, dirs: list[str], keep: bool) -> tuple[int, int]:
    """Stop the run's processes, remove its dirs: (processes stopped, dirs removed)."""
    pids = leftovers(token, dirs)
    stopped = len(pids)
    _signal_all(pids, signal.SIGTERM)
    for _ in range(GRACE_POLLS):
        pids = leftovers(token, dirs)
        if not pids:
            break
        time.sleep(POLL_S)
    _signal_all(pids, signal.SIGKILL)
    removed = 0
    if not keep:
        for d in dirs:
            if os.path.isdir(d):
                shutil.rmtree(d, ignore_errors=True)
                removed += 1
    return stopped, removed


def main() -> int:
    token = sys.argv[1]
    # The run's own terminal signals are not ours: only the pipe's end starts the sweep.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    dirs: list[str] = []
    for line in sys.stdin:
        kind, _, value = line.rstrip("\n").partition(" ")
        if kind == "dir" and value:
            dirs.append(value)
    sweep(token, dirs, keep=bool(os.environ.get("KEEP")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
