"""Forks a grandchild that ignores SIGTERM and keeps stdout open; prints its pid.

mode "hold": the parent sleeps too (the timeout path).
mode "exit": the parent exits at once, leaving the grandchild holding the pipe.
"""

import os
import signal
import sys
import time

mode = sys.argv[1]
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1)
print(pid, flush=True)
if mode == "hold":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(1)
