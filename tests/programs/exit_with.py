"""Writes to stderr and exits with the given code."""

import sys

sys.stderr.write("exiting\n")
sys.exit(int(sys.argv[1]))
