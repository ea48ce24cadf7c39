"""A test-only hook: imported by every Python process started with this directory first
on PYTHONPATH (tests/faults/test_supervision.py does that for one stack). SIGUSR2 then
wedges the receiving process's event loop for real: the handler runs on the loop's own
thread, between two of its callbacks, and never returns. The process stays alive and
keeps its sockets, but nothing it serves is answered any more."""

import signal
import time


def _wedge(_sig: int, _frame: object) -> None:
    while True:
        time.sleep(3600)


signal.signal(signal.SIGUSR2, _wedge)
