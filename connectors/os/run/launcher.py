"""Spawning one action under the universal baseline, and capturing it within its caps.

``spawn`` is the connector's one way to run an action; one that runs in a kernel
envelope goes on in ``sandboxed.py``. The baseline (DESIGN §6) as far as it needs no
namespaces: stdin ``/dev/null``,
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
from collections.abc import Awaitable
from dataclasses import dataclass

import psutil

from sensorium.connectors.os.run import sandboxed
from sensorium.connectors.os.run.accounting import Usage, from_rusage, zombie_io
from sensorium.connectors.os.run.sandboxed import Sandbox
from sensorium.connectors.os.run.spawning import (
    Capture,
    Killable,
    NotStarted,
    SpawnResult,
    SpawnSpec,
    drained,
    failed,
    open_capture,
)


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
    out_w, out_r = open_capture(stdout)
    try:
        err_w, err_r = open_capture(stderr)
    except OSError:
        os.close(out_w)
        out_r.close()
        raise
    if sandbox is not None:
        return await sandboxed.run(
            spec,
            sandbox,
            running,
            gate,
            (out_w, out_r),
            (err_w, err_r),
            stdout,
            stderr,
            started,
            t0,
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
        out_r.close()
        err_r.close()
        return failed(spec, stdout, stderr, started, t0, f"{spec.executable}: {exc.strerror}")
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
        await drained(out_r, err_r)
    except asyncio.CancelledError:
        # The connector is stopping: the action goes with it, the group first.
        with contextlib.suppress(Exception):
            await asyncio.shield(_terminate(proc, spec.grace_s))
        raise
    finally:
        if running is not None:
            running.discard(handle)
        # A straggler that escaped the group may still hold a write end: close under it.
        out_r.close()
        err_r.close()
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
