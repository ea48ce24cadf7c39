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


class CaptureProtocol(asyncio.Protocol):
    """Keeps the first ``cap`` bytes of a pipe, counts the rest, and notes EOF."""

    def __init__(self, capture: Capture) -> None:
        self.capture = capture
        self.closed = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        cap = self.capture
        cap.total += len(data)
        room = cap.cap - len(cap.data)
        if room > 0:
            cap.data += data[:room]

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def open_capture(capture: Capture) -> tuple[int, asyncio.BaseTransport, CaptureProtocol]:
    """A pipe whose write end goes to the child and whose read end we capture."""
    rfd, wfd = os.pipe2(os.O_CLOEXEC)
    loop = asyncio.get_running_loop()
    proto = CaptureProtocol(capture)
    transport, _ = await loop.connect_read_pipe(lambda: proto, os.fdopen(rfd, "rb", buffering=0))
    return wfd, transport, proto


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
