"""One action in a kernel envelope: the zygote builds its sandbox from the plan (while
the connector's start journal syncs, behind a gate), and the connector follows it
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

import msgspec

from sensorium.connectors.os.run.sandbox.plan import Plan
from sensorium.connectors.os.run.sandbox.spawner import Sandboxed, SandboxError, Spawner
from sensorium.connectors.os.run.spawning import (
    DRAIN_AFTER_EXIT_S,
    CaptureProtocol,
    Killable,
    NotStarted,
    SpawnResult,
    SpawnSpec,
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
    out: tuple[int, asyncio.BaseTransport, CaptureProtocol],
    err: tuple[int, asyncio.BaseTransport, CaptureProtocol],
    started: float,
    t0: float,
) -> SpawnResult:
    """Hand ``sandbox``'s plan to the zygote with the capture pipes' write ends (closed
    here), open ``gate`` once it succeeded, and follow the sandbox to its end."""
    (out_w, out_t, out_p), (err_w, err_t, err_p) = out, err
    stdout, stderr = out_p.capture, err_p.capture
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
        out_t.close()
        err_t.close()
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
            out_t.close()
            err_t.close()
            raise
        finally:
            os.close(gate_w)
    return await _follow_sandboxed(spec, sb, running, (out_t, out_p), (err_t, err_p), started, t0)


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


async def _stop_sandboxed(sb: Sandboxed, grace_s: float) -> None:
    """SIGTERM reaches every process of the namespace; after the grace the namespace dies."""
    sb.signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(sb.wait(), grace_s)
    except TimeoutError:
        sb.signal(signal.SIGKILL)
        await sb.wait()


async def _follow_sandboxed(
    spec: SpawnSpec,
    sb: Sandboxed,
    running: set[Killable] | None,
    out: tuple[asyncio.BaseTransport, CaptureProtocol],
    err: tuple[asyncio.BaseTransport, CaptureProtocol],
    started: float,
    t0: float,
) -> SpawnResult:
    handle = _Envelope(sb)
    if running is not None:
        running.add(handle)
    timed_out = False
    stopping: asyncio.Task[None] | None = None
    try:
        try:
            # Building the sandbox counts against the action's wall clock too.
            await asyncio.wait_for(sb.started(), _left(spec, t0))
        except SandboxError as exc:
            await sb.wait()
            return failed(spec, out[1].capture, err[1].capture, started, t0, str(exc))
        except TimeoutError:
            pass
        try:
            await asyncio.wait_for(sb.wait(), _left(spec, t0))
        except TimeoutError:
            timed_out = True
            await _stop_sandboxed(sb, spec.grace_s)
        # Nothing of the action survives its init, so the pipes close promptly.
        await asyncio.wait([out[1].closed, err[1].closed], timeout=DRAIN_AFTER_EXIT_S)
    except asyncio.CancelledError:
        stopping = asyncio.ensure_future(_stop_sandboxed(sb, spec.grace_s))
        with contextlib.suppress(BaseException):
            await asyncio.shield(stopping)
        raise
    finally:
        if running is not None:
            running.discard(handle)
        out[0].close()
        err[0].close()
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
        stdout=out[1].capture,
        stderr=err[1].capture,
        started_at=started,
        duration_s=time.monotonic() - t0,
        usage=sb.usage,
        interrupted_by=None if timed_out else handle.sent,
    )
