"""A real service process that logs ticks, for the log rotation and `sensorium logs` tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# shared/process.py's run_service around a loop: ``n`` "tick" lines (``i`` = 0…n-1) with a
# pause between them, then "done"; it exits 0.
WRITER = r"""
import asyncio, sys
import structlog
from sensorium.shared.process import run_service

async def main(paths, cfg, stop):
    log = structlog.get_logger()
    for i in range(int(sys.argv[2])):
        log.info("tick", i=i, pad="x" * 80)
        await asyncio.sleep(float(sys.argv[3]))
        if stop.is_set():
            break
    log.info("done")

sys.exit(run_service("writer", sys.argv[1], main))
"""


def start_writer(
    root: Path, n: int, pause_s: float, node: dict[str, Any] | None = None
) -> subprocess.Popen[bytes]:
    """The writer on state directory ``root`` (``node``: its config/node.json)."""
    (root / "config").mkdir(parents=True, exist_ok=True)
    if node is not None:
        (root / "config" / "node.json").write_text(json.dumps(node))
    # Its tick lines are info: an inherited SENSORIUM_LOG_LEVEL must not hide them.
    env = {k: v for k, v in os.environ.items() if k != "SENSORIUM_LOG_LEVEL"}
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root), str(n), str(pause_s)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def lines_of(*files: Path) -> list[dict[str, Any]]:
    """Every line of ``files``, each of which must be one whole JSON object."""
    out = []
    for f in files:
        for line in f.read_bytes().split(b"\n")[:-1]:
            out.append(json.loads(line))
    return out


def wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
