"""Prints its pid, then sleeps."""

import os
import sys
import time

print(os.getpid(), flush=True)
time.sleep(float(sys.argv[1]))
print("woke", flush=True)
