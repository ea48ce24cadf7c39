"""Ignores SIGTERM, prints its pid, sleeps."""

import os
import signal
import sys
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(os.getpid(), flush=True)
time.sleep(float(sys.argv[1]))
