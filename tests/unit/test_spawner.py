"""The connector's side of the zygote (run/sandbox/spawner.py) and its pipe reader
(run/pipes.py): plans pipelined to one zygote, each reply to its own plan; a plan the
zygote cannot read refused at once; a zygote that dies fails what waits on it and is
started again for the next plan. Through a real zygote and real sandboxes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import AsyncIterator

import msgspec
import pytest

from sensorium.connectors.os.run.launcher import spawn
from sensorium.connectors.os.run.pipes import PipeReader
from sensorium.connectors.os.run.sandbox import namespaces as ns
from sensorium.connectors.os.run.sandbox import seccomp
from sensorium.connectors.os.run.sandbox.plan import Mount, Plan
from sensorium.connectors.os.run.sandbox.spawner import Sandboxed, SandboxError, Spawner
from sensorium.connectors.os.run.sandboxed import Sandbox
from sensorium.connectors.os.run.spawning import Capture, SpawnSpec, open_capture

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not seccomp.available(), reason="namespaces and seccomp need root here"
)
NAMESPACES = ns.CLONE_NEWNS | ns.CLONE_NEWPID | ns.CLONE_NEWNET | ns.CLONE_NEWIPC | ns.CLONE_NEWUTS


def _plan(word: str) -> Plan:
    return Plan(
        executable="/bin/sh",
        argv=["sh", "-c", f"echo {word}"],
        env={"PATH": "/usr/bin:/bin"},
        cwd="/tmp",
        namespaces=NAMESPACES,
        uid=65534,
        gid=65534,
        mounts=[Mount(kind="tmpfs", target="/tmp", size_bytes=1 << 20, uid=65534, gid=65534)],
    )


def _spec() -> SpawnSpec:
    return SpawnSpec("/bin/sh", ["sh"], {}, "/tmp", timeout_s=30, stdout_cap=4096, stderr_cap=4096)


@contextlib.asynccontextmanager
async def _zygote() -> AsyncIterator[tuple[Spawner, int]]:
    """A started zygote (or the fake one, where a test put it in), and a pipe's write
    end for the spawns that need an fd."""
    spawner = Spawner()
    spawner.start()
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        yield spawner, w
    finally:
        os.close(r)
        os.close(w)
        spawner.close()


@needs_root
def test_plans_in_flight_together_each_get_their_own_sandbox() -> None:
    async def go() -> None:
        async with _zygote() as (spawner, _w):
            words = [f"w{n}" for n in range(12)]
            results = await asyncio.gather(
                *(spawn(_spec(), sandbox=Sandbox(spawner, _plan(w))) for w in words)
            )
            for word, result in zip(words, results, strict=True):
                assert result.exit_code == 0, (result.spawn_error, result.stderr.data)
                assert bytes(result.stdout.data) == f"{word}\n".encode()

    asyncio.run(go())


@needs_root
def test_a_plan_the_zygote_cannot_read_is_refused_and_the_next_one_runs() -> None:
    async def go() -> None:
        async with _zygote() as (spawner, out_w):
            # It says one extra fd and sends none: the zygote answers "bad plan" (by its
            # number), while the good one beside it runs.
            broken = msgspec.structs.replace(_plan("never"), extra_fds=1)
            good = asyncio.ensure_future(spawn(_spec(), sandbox=Sandbox(spawner, _plan("after"))))
            with pytest.raises(SandboxError, match="bad plan"):
                await spawner.spawn(broken, out_w, out_w, [])
            result = await good
            assert result.exit_code == 0, (result.spawn_error, result.stderr.data)
            assert bytes(result.stdout.data) == b"after\n"

    asyncio.run(go())


@needs_root
def test_a_zygote_that_dies_fails_the_plans_waiting_on_it_and_another_takes_the_next() -> None:
    async def go() -> None:
        async with _zygote() as (spawner, _w):
            first = await spawn(_spec(), sandbox=Sandbox(spawner, _plan("one")))
            assert first.exit_code == 0, first.spawn_error
            proc = spawner._proc
            assert proc is not None
            # Stopped, it cannot answer: the plan is surely waiting when it dies.
            os.kill(proc.pid, signal.SIGSTOP)
            waiting = asyncio.ensure_future(spawn(_spec(), sandbox=Sandbox(spawner, _plan("lost"))))
            while not spawner._waiting:
                await asyncio.sleep(0)
            os.kill(proc.pid, signal.SIGKILL)
            lost = await waiting
            assert lost.exit_code is None
            assert lost.spawn_error is not None and "zygote is gone" in lost.spawn_error
            again = await spawn(_spec(), sandbox=Sandbox(spawner, _plan("two")))
            assert again.exit_code == 0, again.spawn_error
            assert bytes(again.stdout.data) == b"two\n"
            assert spawner._proc is not None and spawner._proc.pid != proc.pid

    asyncio.run(go())


def test_a_capture_keeps_its_cap_counts_the_rest_and_closes_at_eof() -> None:
    async def go() -> None:
        capture = Capture(cap=10)
        wfd, reader = open_capture(capture)
        os.write(wfd, b"0123456789abcdef")
        os.close(wfd)
        await asyncio.wait_for(reader.closed, 30)
        assert bytes(capture.data) == b"0123456789"
        assert capture.total == 16 and capture.truncated
        assert reader.fd == -1
        reader.close()  # twice is harmless

    asyncio.run(go())


def test_closing_a_reader_under_a_writer_gives_the_writer_epipe_and_calls_on_eof_once() -> None:
    async def go() -> None:
        rfd, wfd = os.pipe2(os.O_CLOEXEC)
        ends: list[str] = []
        chunks: list[bytes] = []
        reader = PipeReader(rfd, chunks.append, lambda: ends.append("eof"))
        os.write(wfd, b"x")
        while not chunks:
            await asyncio.sleep(0)
        reader.close()
        reader.close()
        assert ends == ["eof"] and reader.closed.done()
        with pytest.raises(BrokenPipeError):
            os.write(wfd, b"y")
        os.close(wfd)

    asyncio.run(go())


@needs_root
def test_a_signal_to_the_connectors_process_group_reaches_no_sandbox() -> None:
    """A supervisor stops the connector with a signal to its group; the actions are the
    connector's to end, with their grace, and the outcome says so."""

    async def go() -> None:
        async with _zygote() as (spawner, out_w):
            assert spawner._proc is not None
            ours = os.getpgid(0)
            assert os.getpgid(spawner._proc.pid) != ours
            sleeper = msgspec.structs.replace(_plan("x"), argv=["sh", "-c", "exec sleep 60"])
            sb = await spawner.spawn(sleeper, out_w, out_w, [])
            try:
                assert sb.pid is not None and os.getpgid(sb.pid) != ours
            finally:
                sb.signal(signal.SIGKILL)
                assert await sb.wait() == -signal.SIGKILL
                sb.close()

    asyncio.run(go())


@needs_root
def test_plans_beyond_what_the_socket_holds_wait_for_room_instead_of_failing() -> None:
    """Plans queued for a zygote that is not reading fill the socket's send buffer:
    the ones past it wait for room instead of failing the spawn."""
    # Big environments (each value under the kernel's 128 KiB per string), so that a
    # few plans fill the buffer.
    env = {"PATH": "/usr/bin:/bin", **{f"PAD{i}": "x" * 100_000 for i in range(3)}}

    async def go() -> None:
        async with _zygote() as (spawner, _w):
            warm = await spawn(_spec(), sandbox=Sandbox(spawner, _plan("warm")))
            assert warm.exit_code == 0, warm.spawn_error
            proc, sock = spawner._proc, spawner._sock
            assert proc is not None and sock is not None
            room = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            os.kill(proc.pid, signal.SIGSTOP)
            words = [f"q{n}" for n in range(room // 300_000 + 3)]
            plans = [msgspec.structs.replace(_plan(w), env=env) for w in words]
            runs = [
                asyncio.ensure_future(spawn(_spec(), sandbox=Sandbox(spawner, p))) for p in plans
            ]
            # Every plan sent or waiting for room (or, refused for want of it, ended).
            while len(spawner._waiting) + sum(r.done() for r in runs) < len(words):
                await asyncio.sleep(0)
            os.kill(proc.pid, signal.SIGCONT)
            for word, result in zip(words, await asyncio.gather(*runs), strict=True):
                assert result.exit_code == 0, (result.spawn_error, result.stderr.data)
                assert bytes(result.stdout.data) == f"{word}\n".encode()

    asyncio.run(go())


class _FakeZygote:
    """The zygote's end of the socket, played by the test: what it reads and what it
    answers, when. The sandboxes it hands over are ``sleep`` processes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sock: socket.socket | None = None
        self.sleepers: list[subprocess.Popen[bytes]] = []

        def start(spawner: Spawner) -> None:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            ours.setblocking(False)
            spawner._sock, spawner._proc, self.sock = ours, None, theirs

        monkeypatch.setattr(Spawner, "start", start)

    def read_plan(self) -> int:
        assert self.sock is not None
        msg, fds, _flags, _addr = socket.recv_fds(self.sock, 1 << 20, 8)
        for fd in fds:
            os.close(fd)
        return int(msgspec.json.decode(msg)["request"])

    def sandbox(self) -> tuple[int, int]:
        proc = subprocess.Popen(["sleep", "60"])
        self.sleepers.append(proc)
        return proc.pid, os.pidfd_open(proc.pid)

    def close(self) -> None:
        for proc in self.sleepers:
            proc.kill()
            proc.wait()
        if self.sock is not None:
            self.sock.close()


def _plain(word: str) -> Plan:
    return msgspec.structs.replace(_plan(word), namespaces=0, mounts=[])


async def _sent(spawner: Spawner, w: int, word: str) -> asyncio.Future[Sandboxed]:
    """A spawn of ``_plain(word)``, once its plan is on its way to the zygote."""
    spawn = asyncio.ensure_future(spawner.spawn(_plain(word), w, w, []))
    while not spawner._waiting:
        await asyncio.sleep(0)
    return spawn


def test_a_reply_without_a_number_is_never_given_to_the_wrong_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Plan A is abandoned after it was sent; the zygote's numberless "bad plan" answers
    A, not B, which gets its own sandbox."""
    zygote = _FakeZygote(monkeypatch)

    async def go() -> None:
        try:
            async with _zygote() as (spawner, w):
                a = await _sent(spawner, w, "a")
                zygote.read_plan()
                a.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await a
                b = await _sent(spawner, w, "b")
                number = zygote.read_plan()
                assert zygote.sock is not None
                zygote.sock.send(b"0 ? bad plan: this was a")
                pid, pidfd = zygote.sandbox()
                socket.send_fds(zygote.sock, [f"{pid} {number}".encode()], [pidfd])
                os.close(pidfd)
                sb = await b
                assert sb.pid == pid and zygote.sleepers[0].poll() is None  # B's, alive
                sb.close()
        finally:
            zygote.close()

    asyncio.run(go())


def test_a_sandbox_whose_reply_came_as_its_spawn_was_cancelled_is_killed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    zygote = _FakeZygote(monkeypatch)

    async def go() -> None:
        try:
            async with _zygote() as (spawner, w):
                a = await _sent(spawner, w, "a")
                number = zygote.read_plan()
                pid, pidfd = zygote.sandbox()
                # The reply is taken, and the spawn cancelled before it could resume.
                spawner._answer(f"{pid} {number}", [pidfd])
                a.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await a
                assert zygote.sleepers[0].wait(30) == -signal.SIGKILL
        finally:
            zygote.close()

    asyncio.run(go())
