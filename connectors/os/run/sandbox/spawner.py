"""The connector's side of the zygote: start it, hand it plans, follow each sandbox.

A :class:`Sandboxed` is one action in flight. Its exit is learnt from the report
pipe (``exit <status>`` then EOF), never by waiting on a pid; it is signalled
through its init's pidfd, so a reused pid can never be hit.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys

import msgspec

from sensorium.connectors.os.run import accounting
from sensorium.connectors.os.run.sandbox.plan import ENCODER, Plan

REPLY_TIMEOUT_S = 10.0


class SandboxError(Exception):
    """The sandbox could not be built or the program could not be started in it."""


class _ReportProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = b""
        self.lines: list[str] = []
        self.changed = asyncio.Event()
        self.closed = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        *complete, self.buffer = self.buffer.split(b"\n")
        self.lines += [c.decode(errors="replace") for c in complete]
        self.changed.set()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        self.changed.set()


class Sandboxed:
    """One sandboxed action: its init's pid, its exit status, a way to signal it."""

    def __init__(
        self,
        pidfd: int,
        init: int,
        report: _ReportProtocol,
        transport: asyncio.BaseTransport,
        pooled: bool = False,
    ) -> None:
        self.pidfd = pidfd
        # A parked init (run/sandbox/pool.py) took the plan: its namespace was ready.
        self.pooled = pooled
        # Its init says so once the compiled exec stage (execstage.py) started the program.
        self.staged = False
        self._report = report
        self._transport = transport
        # The init's pidfd turns readable only once the kernel has killed every other
        # process of its PID namespace (or, without one, the init killed its whole
        # tree): its exit, not the report's EOF, says nothing is left running.
        loop = asyncio.get_running_loop()
        self._init_gone: asyncio.Future[None] = loop.create_future()
        loop.add_reader(pidfd, self._on_init_exit)
        # The init's pid in the connector's PID namespace.
        self.pid: int | None = init
        self.returncode: int | None = None
        self.error: str | None = None
        # What the action used, as its init measured it (None: it never said).
        self.usage: accounting.Usage | None = None

    def __repr__(self) -> str:
        return f"<Sandboxed init={self.pid} rc={self.returncode} error={self.error}>"

    async def started(self) -> None:
        """Returns once the program was exec'd; raises SandboxError if it never was."""
        while True:
            for line in self._report.lines:
                self._absorb(line)
            if self.error is not None:
                raise SandboxError(self.error)
            if "started" in self._report.lines or self.returncode is not None:
                return
            if self._report.closed.done():
                raise SandboxError("the sandbox ended before the program started")
            self._report.changed.clear()
            await self._report.changed.wait()

    def _on_init_exit(self) -> None:
        asyncio.get_running_loop().remove_reader(self.pidfd)
        if not self._init_gone.done():
            self._init_gone.set_result(None)

    def _absorb(self, line: str) -> None:
        word, _, rest = line.partition(" ")
        if word == "error":
            self.error = rest
        elif word == "usage":
            self.usage = accounting.parse_line(rest)
        elif word == "exit":
            status = int(rest)
            self.returncode = os.waitstatus_to_exitcode(status)
        elif word == "staged":
            self.staged = True

    async def wait(self) -> int:
        """The program's exit code, or ``-signal``; -9 when the sandbox was killed."""
        await asyncio.shield(self._report.closed)
        await asyncio.shield(self._init_gone)
        for line in self._report.lines:
            self._absorb(line)
        if self.returncode is None:
            self.returncode = -signal.SIGKILL
        return self.returncode

    def signal(self, signum: int) -> None:
        """SIGTERM reaches every process of the action; SIGKILL tears the sandbox down."""
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(self.pidfd, signum)

    def close(self) -> None:
        self._transport.close()
        if self.pidfd >= 0:
            if not self._init_gone.done():
                asyncio.get_running_loop().remove_reader(self.pidfd)
                self._init_gone.cancel()
            os.close(self.pidfd)
            self.pidfd = -1


class Spawner:
    """Owns the zygote process; restarts it if it died."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = asyncio.Lock()
        self._ids = itertools.count(1)

    def __repr__(self) -> str:
        pid = self._proc.pid if self._proc else None
        return f"<Spawner zygote={pid}>"

    def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # A plan is one datagram: room for the largest argv and environment it may
        # carry, escaped (the zygote reads up to 1 MiB).
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        try:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "sensorium.connectors.os.run.sandbox.zygote",
                    str(theirs.fileno()),
                ],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                close_fds=True,
            )
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(2)
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    async def spawn(self, plan: Plan, stdout: int, stderr: int, extra: list[int]) -> Sandboxed:
        """Start ``plan``; the fds passed stay ours to close. Raises SandboxError only."""
        request = next(self._ids)
        report_r, report_w = os.pipe2(os.O_CLOEXEC)
        loop = asyncio.get_running_loop()
        try:
            try:
                async with self._lock:
                    if self._sock is None or (
                        self._proc is not None and self._proc.poll() is not None
                    ):
                        self.close()
                        self.start()
                    assert self._sock is not None
                    fds = [stdout, stderr, report_w, *extra]
                    socket.send_fds(
                        self._sock,
                        [ENCODER.encode(msgspec.structs.replace(plan, request=request))],
                        fds,
                    )
                    reply, pidfds = await _recv_reply(loop, self._sock, request)
            finally:
                os.close(report_w)
            if not pidfds:
                reason = reply.split(" ", 2)[-1]
                if reason.startswith("error "):  # no init could be started
                    raise SandboxError(reason.removeprefix("error "))
                raise SandboxError(f"the zygote refused the plan: {reply}")
            proto = _ReportProtocol()
            transport, _ = await loop.connect_read_pipe(
                lambda: proto, os.fdopen(report_r, "rb", buffering=0)
            )
        except SandboxError:
            os.close(report_r)
            raise
        except (OSError, TimeoutError) as exc:
            os.close(report_r)
            raise SandboxError(f"the zygote did not answer: {exc}") from exc
        except BaseException:
            os.close(report_r)
            raise
        words = reply.split()
        return Sandboxed(pidfds[0], int(words[0]), proto, transport, pooled="pooled" in words[2:])


async def _recv_reply(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, request: int
) -> tuple[str, list[int]]:
    """The zygote's reply to ``request``; replies to abandoned requests are killed."""
    deadline = loop.time() + REPLY_TIMEOUT_S
    while True:
        msg, fds = await _recv_one(loop, sock, deadline)
        words = msg.split()
        if len(words) >= 2 and words[1] == str(request):
            return msg, fds
        for fd in fds:  # a sandbox nobody waits for any more
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)


async def _recv_one(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, deadline: float
) -> tuple[str, list[int]]:
    fut: asyncio.Future[tuple[str, list[int]]] = loop.create_future()

    def readable() -> None:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, 4096, 1)
        except BlockingIOError:
            return
        except OSError as exc:
            loop.remove_reader(sock.fileno())
            if not fut.done():
                fut.set_exception(SandboxError(f"the zygote is gone: {exc}"))
            return
        loop.remove_reader(sock.fileno())
        if fut.done():
            for fd in fds:
                os.close(fd)
        elif not msg:
            fut.set_exception(SandboxError("the zygote is gone"))
        else:
            fut.set_result((msg.decode(errors="replace"), list(fds)))

    loop.add_reader(sock.fileno(), readable)
    try:
        return await asyncio.wait_for(fut, max(0.0, deadline - loop.time()))
    finally:
        loop.remove_reader(sock.fileno())
