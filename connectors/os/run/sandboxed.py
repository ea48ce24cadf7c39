"""One action in a kernel envelope: the zygote builds its sandbox from the plan (while
the connector's start journal writes, behind a gate), and the connector follows it
to its end through the init's report pipe and pidfd.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from sensorium.connectors.os.run.pipes import PipeReader
from sensorium.connectors.os.run.sandbox.plan import Plan
from sensorium.connectors.os.run.sandbox.spawner import Sandboxed, SandboxError, Spawner
from sensorium.connectors.os.run.spawning import (
    Capture,
    Killable,
    NotStarted,
    SpawnResult,
    SpawnSpec,
    drained,
    failed,
)


@dataclass(frozen=True)
class Sandbox:
    """Run the spec inside a kernel envelope: the zygote builds ``plan``."""

    spawner: Spawner
    plan: Plan
    extra_fds: list[int] = field(default_factory=list)
    # Called once the zygote holds its copies of the extra fds (or never will): the
    # connector drops its end of the control socket, so a dead sandbox reads as EOF.
    after_send: Callable[[], None] | None = None


@dataclass(eq=False)
class _Envelope:
    sandboxed: Sandboxed
    sent: int | None = None

    def kill(self) -> None:
        self.sent = signal.SIGKILL
        self.sandboxed.signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.sent = signal.SIGTERM
        self.sandboxed.signal(signal.SIGTERM)


async def run(
    spec: SpawnSpec,
    sandbox: Sandbox,
    running: set[Killable] | None,
    gate: asyncio.Future[None] | None,
    out: tuple[int, PipeReader],
    err: tuple[int, PipeReader],
    stdout: Capture,
    stderr: Capture,
    started: float,
    t0: float,
) -> SpawnResult:
    """Hand ``sandbox``'s plan to the zygote with the capture pipes' write ends (closed
    here), open ``gate`` once it succeeded, and follow the sandbox to its end."""
    (out_w, out_r), (err_w, err_r) = out, err
    plan, extra, gate_w = sandbox.plan, sandbox.extra_fds, -1
    try:
        try:
            if gate is not None:
                gate_r, gate_w = os.pipe2(os.O_CLOEXEC)
                extra = [*extra, gate_r]
                plan = msgspec.structs.replace(plan, gate_fd=len(extra) - 1, extra_fds=len(extra))
            try:
                sb = await sandbox.spawner.spawn(plan, out_w, err_w, extra)
            finally:
                if gate is not None:
                    os.close(extra[-1])
        finally:
            os.close(out_w)
            os.close(err_w)
            if sandbox.after_send is not None:
                sandbox.after_send()
    except BaseException as exc:
        out_r.close()
        err_r.close()
        if gate_w >= 0:
            os.close(gate_w)
        if not isinstance(exc, SandboxError):
            raise
        if gate is not None:  # nothing was built; a refused start still says so
            await _passed(gate)
        return failed(spec, stdout, stderr, started, t0, str(exc))
    if gate is not None:
        try:
            await _passed(gate, sb)
            # A sandbox that died already (a mount it could not make) has no reader
            # left: its report says why, and _follow_sandboxed reads it. (Any other
            # failure to write leaves the target reading EOF: it never execs.)
            with contextlib.suppress(OSError):
                os.write(gate_w, b"g")
        except BaseException:
            out_r.close()
            err_r.close()
            raise
        finally:
            os.close(gate_w)
    return await _follow_sandboxed(spec, sb, running, (out_r, err_r), (stdout, stderr), started, t0)


async def _passed(gate: asyncio.Future[None], sb: Sandboxed | None = None) -> None:
    """Returns once ``gate`` succeeded. Else ``sb`` (built for nothing) is torn down,
    its target reading EOF on the gate and never exec'ing, and NotStarted is raised."""
    try:
        await gate
    except BaseException as exc:
        if sb is not None:
            sb.signal(signal.SIGKILL)
            with contextlib.suppress(BaseException):
                await asyncio.shield(sb.wait())
            sb.close()
        if isinstance(exc, Exception):
            raise NotStarted(exc) from exc
        raise


def _left(spec: SpawnSpec, t0: float) -> float:
    return max(0.0, spec.timeout_s - (time.monotonic() - t0))


async def _within(fut: asyncio.Future[Any], timeout_s: float) -> bool:
    """Is ``fut`` done within ``timeout_s``? Never cancels it (``wait_for`` would), and
    costs nothing when it is done already."""
    if not fut.done():
        await asyncio.wait((fut,), timeout=timeout_s)
    return fut.done()


async def _stop_sandboxed(sb: Sandboxed, grace_s: float) -> None:
    """SIGTERM reaches every process of the namespace; after the grace the namespace dies."""
    sb.signal(signal.SIGTERM)
    if not await _within(sb.ended, grace_s):
        sb.signal(signal.SIGKILL)
        await sb.wait()


async def _follow_sandboxed(
    spec: SpawnSpec,
    sb: Sandboxed,
    running: set[Killable] | None,
    readers: tuple[PipeReader, PipeReader],
    captures: tuple[Capture, Capture],
    started: float,
    t0: float,
) -> SpawnResult:
    handle = _Envelope(sb)
    if running is not None:
        running.add(handle)
    timed_out = False
    stopping: asyncio.Task[None] | None = None
    try:
        # Building the sandbox counts against the action's wall clock too.
        if await _within(sb.start_seen, _left(spec, t0)):
            error = sb.start_seen.result()
            if error is not None:
                await sb.wait()
                return failed(spec, *captures, started, t0, error)
        if not await _within(sb.ended, _left(spec, t0)):
            timed_out = True
            await _stop_sandboxed(sb, spec.grace_s)
        # Nothing of the action survives its init, so the pipes close promptly.
        await drained(*readers)
    except asyncio.CancelledError:
        stopping = asyncio.ensure_future(_stop_sandboxed(sb, spec.grace_s))
        with contextlib.suppress(BaseException):
            await asyncio.shield(stopping)
        raise
    finally:
        if running is not None:
            running.discard(handle)
        readers[0].close()
        readers[1].close()
        if stopping is not None and not stopping.done():
            # Cancelled again while stopping: kill now, while the pidfd is still open.
            sb.signal(signal.SIGKILL)
            stopping.cancel()
        sb.close()
    rc = sb.returncode
    return SpawnResult(
        pid=sb.pid,
        exit_code=rc if rc is not None and rc >= 0 else None,
        signal=-rc if rc is not None and rc < 0 else None,
        timed_out=timed_out,
        stdout=captures[0],
        stderr=captures[1],
        started_at=started,
        duration_s=time.monotonic() - t0,
        usage=sb.usage,
        interrupted_by=None if timed_out else handle.sent,
    )
