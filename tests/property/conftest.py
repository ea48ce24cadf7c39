"""The fuzz_* helpers beside the tests are plain modules; ``bench/fuzz_inputs.py`` imports
them the same way."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
