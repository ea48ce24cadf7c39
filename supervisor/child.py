"""One supervised process: how it is started and what the supervisor knows of it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field

import psutil

from sensorium.shared.paths import StatePaths
from sensorium.shared.process import HOLD_FD_ENV
from sensorium.shared.wire.supervisor_api import ChildState, ChildStatus
from sensorium.supervisor.policy import RestartPolicy
from sensorium.supervisor.stderrfiles import stderr_path


@dataclass
class Child:
    name: str
    module: str
    policy: RestartPolicy
    state: ChildState = "stopped"
    pid: int | None = None
    started_at: float | None = None
    restarts: int = 0
    last_exit: str | None = None
    # Why the supervisor itself killed the current incarnation, if it did.
    kill_reason: str | None = None
    restart_requested: bool = False
    status_text: str | None = None
    rss_bytes: int | None = None
    cpu_percent: float | None = None
    fds: int | None = None
    proc: psutil.Process | None = None
    timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    # A restart's process spawned early, waiting for the word on ``held_fd``.
    held_pid: int | None = None
    held_fd: int | None = None

    def __repr__(self) -> str:
        return (
            f"<Child {self.name} state={self.state} pid={self.pid} "
            f"restarts={self.restarts} {self.policy!r}>"
        )

    def launch(self, paths: StatePaths, env: dict[str, str], hold: int | None = None) -> int:
        """Start the process in its own process group with stdio away from any terminal.
        With ``hold`` (a pipe's read end), it imports its code, then waits for its word
        there (``wait_for_word``). The fd is inheritable only for this spawn: the
        supervisor's loop spawns one process at a time, and the caller closes it after."""
        stderr_file = stderr_path(paths.logs, self.name)
        argv = [sys.executable, "-m", self.module, "--state-dir", str(paths.root)]
        if hold is not None:
            os.set_inheritable(hold, True)
            env = {**env, HOLD_FD_ENV: str(hold)}
        return os.posix_spawn(
            sys.executable,
            argv,
            env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
                (
                    os.POSIX_SPAWN_OPEN,
                    2,
                    str(stderr_file),
                    os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                    0o640,
                ),
            ],
            setpgroup=0,
        )

    def adopt(self, pid: int) -> int:
        """``pid`` is this child's incarnation from now on."""
        self.pid = pid
        self.started_at = time.monotonic()
        self.state = "starting"
        self.kill_reason = None
        self.status_text = None
        try:
            self.proc = psutil.Process(pid)
        except psutil.Error:
            self.proc = None
        return pid

    def release(self) -> int | None:
        """Give the held process its word: its pid, or None if none is left to take it."""
        pid, fd = self.held_pid, self.held_fd
        self.held_pid = self.held_fd = None
        if pid is None or fd is None:
            return None
        try:
            os.write(fd, b"1")
        except OSError:  # it died before its word; its SIGCHLD reaps it
            return None
        finally:
            os.close(fd)
        return pid

    def drop_held(self, kill: bool = False) -> None:
        """Forget the held process: without its word it exits when it reads end of file."""
        if kill and self.held_pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.held_pid, signal.SIGKILL)
        if self.held_fd is not None:
            os.close(self.held_fd)
        self.held_pid = self.held_fd = None

    def cancel_timer(self, name: str) -> None:
        handle = self.timers.pop(name, None)
        if handle is not None:
            handle.cancel()

    def cancel_timers(self) -> None:
        for name in list(self.timers):
            self.cancel_timer(name)

    def uptime(self) -> float | None:
        return time.monotonic() - self.started_at if self.started_at and self.pid else None

    def sample(self) -> None:
        if self.proc is None:
            return
        try:
            with self.proc.oneshot():
                self.rss_bytes = self.proc.memory_info().rss
                self.cpu_percent = self.proc.cpu_percent()
                self.fds = self.proc.num_fds()
        except psutil.Error:
            pass

    def status(self) -> ChildStatus:
        up = self.uptime()
        return ChildStatus(
            name=self.name,
            state=self.state,
            pid=self.pid,
            uptime_s=round(up, 1) if up is not None else None,
            restarts=self.restarts,
            rss_bytes=self.rss_bytes,
            cpu_percent=self.cpu_percent,
            fds=self.fds,
            last_exit=self.last_exit,
            status_text=self.status_text,
        )


def describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            return f"killed by {signal.Signals(sig).name}"
        except ValueError:
            return f"killed by signal {sig}"
    return f"exited with code {os.WEXITSTATUS(status)}"
