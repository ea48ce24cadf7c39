"""Prints its argument verbatim (to test JSON result contracts)."""

import sys

sys.stdout.write(sys.argv[1])
