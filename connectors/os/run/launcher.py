"""Spawning one action under the universal baseline, and capturing it within its caps.

The baseline (DESIGN §6) as far as it needs no namespaces: stdin ``/dev/null``,
no TTY, only fds 0–2, a curated environment, a confined cwd, a new session and
process group, a wall-clock timeout that sends SIGTERM to the group, waits the
grace, then SIGKILLs it, and stdout/stderr read incrementally up to their caps
and drained beyond them so the connector's memory stays bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import msgspec
import psutil

from sensorium.connectors.os.run.accounting import Usage, from_rusage, zombie_io
from sensorium.connectors.os.run.sandbox.plan import Plan
from sensorium.connectors.os.run.sandbox.spawner import Sandboxed, SandboxError, Spawner

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


class _CaptureProtocol(asyncio.Protocol):
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


async def _open_capture(capture: Capture) -> tuple[int, asyncio.BaseTransport, _CaptureProtocol]:
    """A pipe whose write end goes to the child and whose read end we capture."""
    rfd, wfd = os.pipe2(os.O_CLOEXEC)
    loop = asyncio.get_running_loop()
    proto = _CaptureProtocol(capture)
    transport, _ = await loop.connect_read_pipe(lambda: proto, os.fdopen(rfd, "rb", buffering=0))
    return wfd, transport, proto


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _kill_all(pgid: int, extra: list[psutil.Process]) -> int:
    """SIGKILL the group and every known descendant (some may have left the group)."""
    killed = 0
    _signal_group(pgid, signal.SIGKILL)
    for proc in extra:
        with contextlib.suppress(psutil.Error):
            proc.kill()
            killed += 1
    return killed


class Running:
    """A spawned leader whose exit the event loop learns from a pidfd: no thread per child.

    Where the kernel has no pidfd (before 5.3) a worker thread waits instead.
    """

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.usage: Usage | None = None
        loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = loop.create_future()
        self._pidfd: int | None = None
        try:
            self._pidfd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):
            loop.run_in_executor(None, self._wait_blocking, loop)
        else:
            loop.add_reader(self._pidfd, self._on_exit)

    def _wait_blocking(self, loop: asyncio.AbstractEventLoop) -> None:
        rc = self._reap()
        _signal_group(self.pid, signal.SIGKILL)
        loop.call_soon_threadsafe(self._settle, rc)

    def _on_exit(self) -> None:
        assert self._pidfd is not None
        asyncio.get_running_loop().remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = None
        # The action ends with its leader; nothing it started may outlive it (ADR-007).
        # Killed while the unreaped leader still pins the group id, so no reused pid
        # can be hit.
        _signal_group(self.pid, signal.SIGKILL)
        self._settle(self._reap())

    def _reap(self) -> int:
        """Reap the leader with wait4, for its rusage (and its I/O, read as a zombie)."""
        io = zombie_io(self.pid)
        try:
            _pid, status, ru = os.wait4(self.pid, 0)
        except ChildProcessError:
            return self.popen.wait()
        self.usage = from_rusage(ru, io)
        self.popen.returncode = os.waitstatus_to_exitcode(status)
        return self.popen.returncode

    def _settle(self, rc: int) -> None:
        if not self._exited.done():
            self._exited.set_result(rc)

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


async def _terminate(proc: Running, grace_s: float) -> int:
    """SIGTERM the group (and every descendant seen), give the leader ``grace_s`` to exit,
    then SIGKILL what is left — including descendants that had left the group."""
    pgid = proc.pid
    known = _descendants(pgid)  # while the tree is still attached to its leader
    _signal_group(pgid, signal.SIGTERM)
    for p in known:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    try:
        await asyncio.wait_for(proc.wait(), grace_s)
    except TimeoutError:
        known += _descendants(pgid)
        _kill_all(pgid, known)
        await proc.wait()
    _kill_all(pgid, known)
    return len(known)


@dataclass(frozen=True)
class Sandbox:
    """Run the spec inside a kernel envelope: the zygote builds ``plan``."""

    spawner: Spawner
    plan: Plan
    extra_fds: list[int] = field(default_factory=list)
    # Called once the zygote holds its copies of the extra fds (or never will): the
    # connector drops its end of the control socket, so a dead sandbox reads as EOF.
    after_send: Callable[[], None] | None = None


class Killable(Protocol):
    def kill(self) -> None: ...

    def terminate(self) -> None: ...


# Not frozen: a handle remembers the last signal the connector sent through it.
@dataclass(eq=False)
class _Group:
    pgid: int
    sent: int | None = None

    def kill(self) -> None:
        self.sent = signal.SIGKILL
        _signal_group(self.pgid, signal.SIGKILL)

    def terminate(self) -> None:
        self.sent = signal.SIGTERM
        _signal_group(self.pgid, signal.SIGTERM)


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


def _result(
    spec: SpawnSpec, stdout: Capture, stderr: Capture, started: float, t0: float, error: str
) -> SpawnResult:
    return SpawnResult(
        None, None, None, False, stdout, stderr, started, time.monotonic() - t0, spawn_error=error
    )


class NotStarted(Exception):
    """The spawn's gate failed: nothing of the action ran. ``cause`` is why."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


async def spawn(
    spec: SpawnSpec,
    running: set[Killable] | None = None,
    sandbox: Sandbox | None = None,
    gate: Awaitable[None] | None = None,
) -> SpawnResult:
    """Run one action to completion or timeout; never raises for the program's behaviour.

    ``running`` holds a handle per live action, so a stopping connector can kill them
    all whatever state their coroutines are in. ``gate`` must succeed before anything
    of the action runs: a sandbox is built meanwhile (its target waits on a pipe before
    it applies the plan), any other spawn waits for it. If it fails, the sandbox is
    torn down and :class:`NotStarted` raised.
    """
    # Running from now on, beside the sandbox's build.
    task = asyncio.ensure_future(gate) if gate is not None else None
    try:
        return await _spawn(spec, running, sandbox, task)
    finally:
        if task is not None and not task.done():
            task.cancel()  # this spawn failed before it needed the gate
        elif task is not None and not task.cancelled():
            task.exception()  # seen: its failure was raised, or the spawn's came first


async def _spawn(
    spec: SpawnSpec,
    running: set[Killable] | None,
    sandbox: Sandbox | None,
    gate: asyncio.Future[None] | None,
) -> SpawnResult:
    if gate is not None and sandbox is None:
        try:
            await gate
        except Exception as exc:
            raise NotStarted(exc) from exc
        gate = None
    started = time.time()
    t0 = time.monotonic()
    stdout, stderr = Capture(spec.stdout_cap), Capture(spec.stderr_cap)
    out_w, out_t, out_p = await _open_capture(stdout)
    try:
        err_w, err_t, err_p = await _open_capture(stderr)
    except OSError:
        os.close(out_w)
        out_t.close()
        raise
    if sandbox is not None:
        plan, extra, gate_w = sandbox.plan, sandbox.extra_fds, -1
        try:
            try:
                if gate is not None:
                    gate_r, gate_w = os.pipe2(os.O_CLOEXEC)
                    extra = [*extra, gate_r]
                    plan = msgspec.structs.replace(
                        plan, gate_fd=len(extra) - 1, extra_fds=len(extra)
                    )
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
            if gate is not None:
                await _open_gate(gate, gate_w, sb)
        except SandboxError as exc:
            out_t.close()
            err_t.close()
            if gate is not None:  # nothing was built; the gate still says whether to start
                await _open_gate(gate, gate_w, None)
            return _result(spec, stdout, stderr, started, t0, str(exc))
        except BaseException:
            out_t.close()
            err_t.close()
            raise
        finally:
            if gate_w >= 0:
                os.close(gate_w)
        return await _follow_sandboxed(
            spec, sb, running, (out_t, out_p), (err_t, err_p), started, t0
        )
    try:
        try:
            # Popen takes the vfork path here (no preexec hook), so this costs well
            # under a millisecond of the event loop.
            popen = subprocess.Popen(
                spec.argv,
                executable=spec.executable,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                env=spec.env,
                cwd=spec.cwd,
                close_fds=True,
                start_new_session=True,
            )
        finally:
            # Only the child holds the write ends now: EOF means every writer is gone.
            os.close(out_w)
            os.close(err_w)
    except OSError as exc:
        out_t.close()
        err_t.close()
        return _result(spec, stdout, stderr, started, t0, f"{spec.executable}: {exc.strerror}")
    proc = Running(popen)
    handle = _Group(proc.pid)
    if running is not None:
        running.add(handle)
    timed_out = False
    stragglers = 0
    try:
        try:
            await asyncio.wait_for(proc.wait(), spec.timeout_s)
        except TimeoutError:
            timed_out = True
            stragglers = await _terminate(proc, spec.grace_s)
        await asyncio.wait([out_p.closed, err_p.closed], timeout=DRAIN_AFTER_EXIT_S)
    except asyncio.CancelledError:
        # The connector is stopping: the action goes with it, the group first.
        with contextlib.suppress(Exception):
            await asyncio.shield(_terminate(proc, spec.grace_s))
        raise
    finally:
        if running is not None:
            running.discard(handle)
        # A straggler that escaped the group may still hold a write end: close under it.
        out_t.close()
        err_t.close()
    rc = proc.returncode
    return SpawnResult(
        pid=proc.pid,
        exit_code=rc if rc is not None and rc >= 0 else None,
        signal=-rc if rc is not None and rc < 0 else None,
        timed_out=timed_out,
        stdout=stdout,
        stderr=stderr,
        started_at=started,
        duration_s=time.monotonic() - t0,
        stragglers_killed=stragglers,
        usage=proc.usage,
        interrupted_by=None if timed_out else handle.sent,
    )


async def _open_gate(gate: asyncio.Future[None], gate_w: int, sb: Sandboxed | None) -> None:
    """Let the sandbox's target go once ``gate`` succeeded; else tear it down (its
    target reads EOF and never execs) and raise NotStarted."""
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
    os.write(gate_w, b"g")


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
    out: tuple[asyncio.BaseTransport, _CaptureProtocol],
    err: tuple[asyncio.BaseTransport, _CaptureProtocol],
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
            return _result(spec, out[1].capture, err[1].capture, started, t0, str(exc))
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
