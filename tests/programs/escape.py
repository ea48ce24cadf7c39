"""Double-forks a grandchild into a new session (leaving the action's group), prints its
pid, and exits at once."""

import os
import sys
import time

r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.close(r)
        os.write(w, str(os.getpid()).encode())
        os.close(w)
        for fd in (0, 1, 2):
            os.close(fd)
        time.sleep(300)
        os._exit(0)
    os._exit(0)
os.close(w)
print(os.read(r, 32).decode(), flush=True)
sys.exit(0)
