"""The connector's side of the zygote: start it, hand it plans, follow each sandbox.

A :class:`Sandboxed` is one action in flight. Its exit is learnt from the report
pipe (``exit <status>`` then EOF), never by waiting on a pid; it is signalled
through its init's pidfd, so a reused pid can never be hit.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys

import msgspec

from sensorium.connectors.os.run import accounting
from sensorium.connectors.os.run.pipes import PipeReader
from sensorium.connectors.os.run.sandbox.plan import ENCODER, Plan

REPLY_TIMEOUT_S = 10.0


class SandboxError(Exception):
    """The sandbox could not be built or the program could not be started in it."""


class Sandboxed:
    """One sandboxed action: its init's pid, its exit status, a way to signal it.

    Everything is learnt from callbacks, without a task: the report's lines as they are
    read, the init's exit when its pidfd turns readable. ``start_seen`` is done once the
    program was exec'd (None) or can no longer be (why, in words); ``ended`` once the
    report reached EOF and the init is gone.
    """

    def __init__(self, pidfd: int, init: int, report: int, pooled: bool = False) -> None:
        loop = asyncio.get_running_loop()
        self.pidfd = pidfd
        # A parked init (run/sandbox/pool.py) took the plan: its namespace was ready.
        self.pooled = pooled
        # Its init says so once the compiled exec stage (execstage.py) started the program.
        self.staged = False
        # The init's pid in the connector's PID namespace.
        self.pid: int | None = init
        self.returncode: int | None = None
        self.error: str | None = None
        # What the action used, as its init measured it (None: it never said).
        self.usage: accounting.Usage | None = None
        self.start_seen: asyncio.Future[str | None] = loop.create_future()
        self.ended: asyncio.Future[None] = loop.create_future()
        self._buffer = b""
        self._report_done = False
        # The init's pidfd turns readable only once the kernel has killed every other
        # process of its PID namespace (or, without one, the init killed its whole
        # tree): its exit, not the report's EOF, says nothing is left running.
        self._init_done = False
        loop.add_reader(pidfd, self._on_init_exit)
        try:
            self._report = PipeReader(report, self._on_report, self._on_report_eof)
        except BaseException:
            loop.remove_reader(pidfd)  # the caller closes it: never watch a closed fd
            raise

    def __repr__(self) -> str:
        return f"<Sandboxed init={self.pid} rc={self.returncode} error={self.error}>"

    def _on_report(self, data: bytes) -> None:
        *complete, self._buffer = (self._buffer + data).split(b"\n")
        started = False
        for line in complete:
            started = self._absorb(line.decode(errors="replace")) or started
        # A whole read is absorbed before deciding: an error beside "started" wins.
        if started or self.error is not None or self.returncode is not None:
            self._settle_start()

    def _on_report_eof(self) -> None:
        self._report_done = True
        self._settle_start()
        self._settle_end()

    def _on_init_exit(self) -> None:
        asyncio.get_running_loop().remove_reader(self.pidfd)
        self._init_done = True
        self._settle_end()

    def _settle_start(self) -> None:
        if self.start_seen.done():
            return
        if self.error is not None:
            self.start_seen.set_result(self.error)
        elif self.returncode is None and self._report_done:
            self.start_seen.set_result("the sandbox ended before the program started")
        else:
            self.start_seen.set_result(None)

    def _settle_end(self) -> None:
        if self._report_done and self._init_done and not self.ended.done():
            if self.returncode is None:
                self.returncode = -signal.SIGKILL
            self.ended.set_result(None)

    def _absorb(self, line: str) -> bool:
        """Takes one report line; True when it says the program started."""
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
        return line == "started"

    async def wait(self) -> int:
        """The program's exit code, or ``-signal``; -9 when the sandbox was killed."""
        await asyncio.shield(self.ended)
        assert self.returncode is not None
        return self.returncode

    def signal(self, signum: int) -> None:
        """SIGTERM reaches every process of the action; SIGKILL tears the sandbox down."""
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(self.pidfd, signum)

    def close(self) -> None:
        """Stop following it; whatever still waits on ``ended`` is released."""
        if self.pidfd >= 0:
            if not self._init_done:
                asyncio.get_running_loop().remove_reader(self.pidfd)
                self._init_done = True
            os.close(self.pidfd)
            self.pidfd = -1
        self._report.close()
        self._report_done = True
        self._settle_start()
        self._settle_end()


class Spawner:
    """Owns the zygote process; restarts it if it died.

    Plans are pipelined: each is sent at once and its reply awaited on a future, the
    zygote's socket watched by one reader for as long as it lives. The zygote answers
    every plan exactly once, in order, so a reply is matched by its request number, or
    (a plan too broken to say its number) to the oldest one still waiting.
    """

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: dict[int, asyncio.Future[tuple[str, list[int]]]] = {}
        # Done when the socket has room again (plans wait on it while it is full).
        self._room: asyncio.Future[None] | None = None
        # The request numbers sent and not yet answered, in the order they were sent.
        self._sent: collections.deque[int] = collections.deque()
        self._ids = itertools.count(1)

    def __repr__(self) -> str:
        pid = self._proc.pid if self._proc else None
        return f"<Spawner zygote={pid} waiting={len(self._waiting)}>"

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
                # Out of the connector's process group, with every sandbox it starts: a
                # signal to that group (a supervisor stopping the connector) must leave
                # the actions to the connector, which ends them with their grace and
                # records why. The zygote and each init still die with their parent.
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours

    def close(self) -> None:
        self._unwatch("the zygote was stopped")
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
        try:
            try:
                reply, pidfds = await self._ask(
                    request,
                    ENCODER.encode(msgspec.structs.replace(plan, request=request)),
                    [stdout, stderr, report_w, *extra],
                )
            finally:
                os.close(report_w)
            if not pidfds:
                reason = reply.split(" ", 2)[-1]
                if reason.startswith("error "):  # no init could be started
                    raise SandboxError(reason.removeprefix("error "))
                raise SandboxError(f"the zygote refused the plan: {reply}")
            words = reply.split()
            try:
                return Sandboxed(pidfds[0], int(words[0]), report_r, pooled="pooled" in words[2:])
            except BaseException:
                _kill(pidfds)
                raise
        except SandboxError:
            os.close(report_r)
            raise
        except (OSError, TimeoutError) as exc:
            os.close(report_r)
            raise SandboxError(f"the zygote did not answer: {exc}") from exc
        except BaseException:
            os.close(report_r)
            raise

    async def _ask(self, request: int, data: bytes, fds: list[int]) -> tuple[str, list[int]]:
        """Send one plan; its reply. Abandoned (timed out, cancelled): its sandbox, should
        it come, is killed on arrival, or here if it came already."""
        if self._sock is None or (self._proc is not None and self._proc.poll() is not None):
            self.close()
            self.start()
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._unwatch("the zygote's socket moved to another event loop")
            loop.add_reader(self._sock.fileno(), self._readable)
            self._loop = loop
        reply: asyncio.Future[tuple[str, list[int]]] = loop.create_future()
        self._waiting[request] = reply
        try:
            await self._send(loop, request, data, fds, reply)
            # Counted from the send: the plans queued before it are not its wait.
            await asyncio.wait((reply,), timeout=REPLY_TIMEOUT_S)
            if not reply.done():
                raise TimeoutError(f"no reply in {REPLY_TIMEOUT_S:g} s")
            return reply.result()
        except BaseException:
            if reply.done() and not reply.cancelled() and reply.exception() is None:
                _kill(reply.result()[1])  # it came as we gave up: nobody follows it
            raise
        finally:
            self._waiting.pop(request, None)

    async def _send(
        self,
        loop: asyncio.AbstractEventLoop,
        request: int,
        data: bytes,
        fds: list[int],
        reply: asyncio.Future[tuple[str, list[int]]],
    ) -> None:
        """One plan into the socket, waiting while plans queued before it fill it."""
        sock = self._sock
        assert sock is not None
        deadline = loop.time() + REPLY_TIMEOUT_S
        while True:
            if reply.done():  # failed meanwhile: the zygote is gone
                reply.result()
            if self._sock is not sock:
                raise SandboxError("the zygote is gone")
            try:
                socket.send_fds(sock, [data], fds)
            except BlockingIOError:
                pass
            else:
                self._sent.append(request)
                return
            if self._room is None or self._room.done():
                # One writer callback per fd: every plan waiting for room shares it.
                self._room = loop.create_future()
                loop.add_writer(sock.fileno(), self._writable, sock.fileno())
            room = self._room
            await asyncio.wait((room,), timeout=max(0.0, deadline - loop.time()))
            if not room.done():
                raise TimeoutError(f"the zygote took no plan in {REPLY_TIMEOUT_S:g} s")

    def _writable(self, fd: int) -> None:
        if self._loop is not None:
            self._loop.remove_writer(fd)
        if self._room is not None and not self._room.done():
            self._room.set_result(None)

    def _readable(self) -> None:
        sock = self._sock
        while sock is not None:
            try:
                msg, fds, _flags, _addr = socket.recv_fds(sock, 4096, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._lost(f"the zygote is gone: {exc.strerror or exc}")
                return
            if not msg:
                self._lost("the zygote is gone")
                return
            self._answer(msg.decode(errors="replace"), list(fds))

    def _answer(self, msg: str, fds: list[int]) -> None:
        # Every plan sent is answered once, in order: the head of ``_sent`` is the plan
        # this reply answers (one abandoned meanwhile stays there, so that a reply
        # without a number, to a plan the zygote could not read, is never misplaced).
        words = msg.split()
        number = words[1] if len(words) >= 2 else "?"
        if number.isdigit():
            request = int(number)
            with contextlib.suppress(ValueError):
                self._sent.remove(request)
        else:
            request = self._sent.popleft() if self._sent else -1
        reply = self._waiting.pop(request, None)
        if reply is not None and not reply.done():
            reply.set_result((msg, fds))
            return
        _kill(fds)  # a sandbox nobody waits for any more

    def _lost(self, why: str) -> None:
        """The zygote hung up: the next plan starts another."""
        self._unwatch(why)
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _unwatch(self, why: str) -> None:
        """Stop reading the zygote's socket; every plan still waiting fails with ``why``."""
        if self._loop is not None and self._sock is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._sock.fileno())
            self._writable(self._sock.fileno())  # a plan waiting for room tries, and fails
        self._loop = None
        self._room = None
        self._sent.clear()
        waiting, self._waiting = self._waiting, {}
        for reply in waiting.values():
            if not reply.done():
                reply.set_exception(SandboxError(why))


def _kill(pidfds: list[int]) -> None:
    """Sandboxes nobody will follow: killed, their pidfds closed."""
    for fd in pidfds:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        os.close(fd)
