"""Run only by test_killed_run.py: a test that starts a node and waits to be killed."""

from __future__ import annotations

import os
import time
from pathlib import Path

from harness import Stack


def test_a_node_waits_for_the_run_to_be_killed(stack: Stack) -> None:
    marker = os.environ.get("KILLED_RUN_MARKER")
    if not marker:
        return
    Path(marker).write_text(str(stack.paths.root))
    for _ in range(600):  # bounded: the outer test kills this run long before
        time.sleep(0.5)
