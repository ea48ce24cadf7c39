"""What one spawn is given and gives back: its spec, its captured output, its result,
and the handle a stopping connector kills it by. Shared by both ways an action runs:
plain (``launcher.py``) and in a kernel envelope (``sandboxed.py``).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Protocol

from sensorium.connectors.os.run.accounting import Usage
from sensorium.connectors.os.run.pipes import PipeReader

# After the action's leader exits, how long a straggler holding the pipes open
# may keep us waiting before the pipes are closed under it.
DRAIN_AFTER_EXIT_S = 1.0


@dataclass(frozen=True)
class SpawnSpec:
    executable: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    timeout_s: float
    stdout_cap: int
    stderr_cap: int
    grace_s: float = 5.0


@dataclass
class Capture:
    cap: int
    data: bytearray = field(default_factory=bytearray)
    total: int = 0

    @property
    def truncated(self) -> bool:
        return self.total > len(self.data)

    def take(self, data: bytes) -> None:
        """Keep what fits under the cap; count all of it."""
        self.total += len(data)
        room = self.cap - len(self.data)
        if room > 0:
            self.data += data if len(data) <= room else data[:room]


@dataclass
class SpawnResult:
    pid: int | None
    exit_code: int | None
    signal: int | None
    timed_out: bool
    stdout: Capture
    stderr: Capture
    started_at: float
    duration_s: float
    spawn_error: str | None = None
    # Descendants seen and killed at a timeout (the group itself dies with its leader).
    stragglers_killed: int = 0
    # What it used (run/accounting.py); None when nothing could be measured.
    usage: Usage | None = None
    # The last signal the connector sent it to end it early (a stop, an interrupt),
    # not at its deadline; its stderr says so.
    interrupted_by: int | None = None


def open_capture(capture: Capture) -> tuple[int, PipeReader]:
    """A pipe whose write end goes to the child and whose read end fills ``capture``."""
    rfd, wfd = os.pipe2(os.O_CLOEXEC)
    try:
        return wfd, PipeReader(rfd, capture.take)
    except BaseException:
        os.close(rfd)
        os.close(wfd)
        raise


async def drained(*readers: PipeReader) -> None:
    """Returns once every reader saw EOF, or ``DRAIN_AFTER_EXIT_S`` after it was asked."""
    waiting = [r.closed for r in readers if not r.closed.done()]
    if waiting:
        await asyncio.wait(waiting, timeout=DRAIN_AFTER_EXIT_S)


class Killable(Protocol):
    def kill(self) -> None: ...

    def terminate(self) -> None: ...


class NotStarted(Exception):
    """The spawn's gate failed: nothing of the action ran. ``cause`` is why."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def failed(
    spec: SpawnSpec, stdout: Capture, stderr: Capture, started: float, t0: float, error: str
) -> SpawnResult:
    return SpawnResult(
        None, None, None, False, stdout, stderr, started, time.monotonic() - t0, spawn_error=error
    )
