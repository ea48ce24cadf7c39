"""Writes N bytes that are not UTF-8 to both stdout and stderr."""

import os
import sys

n = int(sys.argv[1])
os.write(1, b"\xff" * n)
os.write(2, b"\xfe" * n)
