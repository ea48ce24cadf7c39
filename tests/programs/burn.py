"""Uses known amounts: CPU work, memory, bytes written and read (half of them by a
child it waits for), then prints what it measured of itself as JSON.

argv: rounds (of hashing), MiB to allocate and touch, bytes to write (and read back).
"""

import hashlib
import json
import os
import resource
import sys

rounds, mib, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
digest = b""
for _ in range(rounds):
    digest = hashlib.sha256(digest + b"x" * 64).digest()
block = bytearray(mib * 1024 * 1024)
for i in range(0, len(block), 4096):  # touched, so it is resident
    block[i] = 1
path = "/tmp/burn.bin"
half = size // 2
pid = os.fork()
if pid == 0:  # the child writes the first half: its parent's counters include it once reaped
    with open(path, "wb") as f:
        f.write(b"c" * half)
    os._exit(0)
os.waitpid(pid, 0)
with open(path, "ab") as f:
    f.write(b"p" * (size - half))
with open(path, "rb") as f:
    got = len(f.read())
me = resource.getrusage(resource.RUSAGE_SELF)
print(
    json.dumps(
        {
            "cpu_ms": (me.ru_utime + me.ru_stime) * 1000,
            "maxrss_bytes": me.ru_maxrss * 1024,
            "written": size,
            "read": got,
        }
    )
)
