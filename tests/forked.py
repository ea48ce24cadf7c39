"""Run a probe in a forked child and get back what it reported: kernel restrictions
(Landlock, seccomp) are applied to the child only, never to the test process."""

from __future__ import annotations

import json
import os
import select
import signal
import time
from collections.abc import Callable
from typing import Any


def errno_of(fn: Callable[[], object]) -> int:
    try:
        fn()
    except OSError as exc:
        return exc.errno if exc.errno is not None else -1
    return 0


def in_child(probe: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run `probe` in a forked child and return what it reported."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            data = json.dumps(probe())
        except BaseException as exc:
            data = json.dumps({"child raised": repr(exc)})
        try:
            os.write(w, data.encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks: list[bytes] = []
    try:
        deadline = time.monotonic() + 5
        while True:
            ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, "the child did not report within 5 s"
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        os.kill(pid, signal.SIGKILL)  # a no-op for a child already exiting
        os.waitpid(pid, 0)
    report: dict[str, Any] = json.loads(b"".join(chunks))
    assert "child raised" not in report, report["child raised"]
    return report
