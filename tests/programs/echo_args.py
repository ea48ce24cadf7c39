"""Prints its argv (after the script name) as a JSON array."""

import json
import sys

print(json.dumps(sys.argv[1:]))
