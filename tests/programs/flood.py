"""Writes N bytes to stdout as fast as it can, and a little to stderr."""

import os
import sys

total = int(sys.argv[1])
chunk = b"x" * (1 << 20)
left = total
while left > 0:
    n = os.write(1, chunk[: min(left, len(chunk))])
    left -= n
os.write(2, b"flood done\n")
