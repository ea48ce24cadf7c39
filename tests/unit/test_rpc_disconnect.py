"""What a client does when its server goes away, over real ZeroMQ sockets: the replies
the server sent just before it went are delivered, and a request sent into the gap
(after the server went, before the client saw it) never reaches the next server.

The client's event loop is held still while the server goes, as a busy core's would be:
the replies and the disconnect are then both queued before the client reads either.
Every wait is for an event (a thread's end, a socket's readiness), bounded only to
catch a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator

import msgspec
import pytest
import zmq
import zmq.asyncio

from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.rpc.client import RpcClient
from sensorium.shared.wire.envelope import Reply
from sensorium.shared.wire.supervisor_api import Ack, SupervisorStatus

HANG_MS = 30_000
_enc = msgspec.msgpack.Encoder()


def _endpoint() -> str:
    return f"ipc://{tempfile.mkdtemp(prefix='rpc-', dir='/tmp')}/s.sock"


def _ack(rid: str) -> bytes:
    return _enc.encode(
        Reply(request_id=rid, ok=True, result=msgspec.Raw(_enc.encode(Ack(message=rid))))
    )


# A ROUTER in its own process (so this process's sockets are the client's alone) that
# answers COUNT requests, then, once a line arrives on stdin, closes at once with its
# replies flushed.
_ANSWER_THEN_GO = """
import sys, msgspec, zmq
from sensorium.shared.wire.envelope import Reply
from sensorium.shared.wire.supervisor_api import Ack
enc = msgspec.msgpack.Encoder()
ctx = zmq.Context()
sock = ctx.socket(zmq.ROUTER)
sock.bind(sys.argv[1])
print("bound", flush=True)
for _ in range(int(sys.argv[2])):
    ident, body = sock.recv_multipart()
    rid = msgspec.msgpack.decode(body)["request/id"]
    ack = msgspec.Raw(enc.encode(Ack(message=rid)))
    sock.send_multipart([ident, enc.encode(Reply(request_id=rid, ok=True, result=ack))])
sys.stdin.readline()
sock.close(linger=30_000)
ctx.term()
"""


class AnswerThenGo:
    def __init__(self, endpoint: str, count: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _ANSWER_THEN_GO, endpoint, str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "bound\n"

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.close()
        assert self.proc.wait(HANG_MS / 1000) == 0

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(HANG_MS / 1000)


def _sockets() -> set[str]:
    """The sockets this process holds open, by inode."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:"):
                found.add(target)
    return found


def _hold_until_closed(connection: set[str]) -> None:
    """Block the event loop until libzmq has closed the client's connection: it reports
    the disconnect (and, with IMMEDIATE, drops the unread replies) before it closes it."""
    for _ in range(HANG_MS // 10):
        if not connection & _sockets():
            return
        time.sleep(0.01)
    raise AssertionError("the client's connection never closed")


class Recorder(threading.Thread):
    """A ROUTER that answers every request and remembers each ``request/id`` it saw."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(daemon=True)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.bind(endpoint)
        self.seen: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            if not self.sock.poll(50):
                continue
            ident, body = self.sock.recv_multipart()
            rid = msgspec.msgpack.decode(body)["request/id"]
            self.seen.append(rid)
            self.sock.send_multipart([ident, _ack(rid)])
        self.sock.close(linger=0)
        self.ctx.term()


@contextlib.asynccontextmanager
async def connected_to(
    answers: int,
) -> AsyncIterator[tuple[RpcClient, AnswerThenGo, set[str], str]]:
    """A client connected to an ``AnswerThenGo``; the client's connection (its socket
    inodes) and the endpoint."""
    ctx = zmq.asyncio.Context()
    endpoint = _endpoint()
    server = AnswerThenGo(endpoint, answers)
    before = _sockets()
    client = RpcClient(ctx, endpoint, name="connector", unavailable_code="connector-unavailable")
    try:
        for _ in range(HANG_MS // 10):
            if client.connected:
                break
            await asyncio.sleep(0.01)
        assert client.connected, "never connected"
        yield client, server, _sockets() - before, endpoint
    finally:
        await client.close()
        ctx.term()
        server.end()


def test_replies_sent_just_before_the_server_went_are_delivered() -> None:
    async def main() -> None:
        async with connected_to(3) as (client, server, connection, _endpoint):
            rids = [new_id() for _ in range(3)]
            calls = [
                asyncio.create_task(client.call(SupervisorStatus(request_id=rid), Ack, 30))
                for rid in rids
            ]
            await asyncio.sleep(0)  # each call sends, then waits for its reply
            # The loop is busy while the server answers all three and goes.
            server.go()
            _hold_until_closed(connection)
            answers = await asyncio.gather(*calls)
            assert [a.message for a in answers] == rids

    asyncio.run(main())


def test_a_request_sent_into_the_gap_never_reaches_the_next_server() -> None:
    async def main() -> None:
        async with connected_to(1) as (client, first, connection, endpoint):
            await client.call(SupervisorStatus(request_id=new_id()), Ack, 30)
            first.go()
            _hold_until_closed(connection)
            # The client has not seen the disconnect yet: this request is sent into
            # the gap, and its caller is told it may not have run.
            gap = new_id()
            with pytest.raises(CodedError) as err:
                await client.call(SupervisorStatus(request_id=gap), Ack, 30)
            assert err.value.code == "connector-unavailable"
            assert err.value.detail.get("in_flight") == "true"
            second = Recorder(endpoint)
            second.start()
            try:
                after = new_id()
                for _ in range(HANG_MS // 10):
                    try:
                        await client.call(SupervisorStatus(request_id=after), Ack, 30)
                        break
                    except CodedError as exc:  # not reconnected yet
                        assert exc.code == "connector-unavailable", (exc, second.seen, gap)
                        after = new_id()
                # Messages on one connection arrive in order: had the gap request
                # survived, the next server would have seen it first.
                assert gap not in second.seen
                assert second.seen[-1] == after
            finally:
                second.stop.set()
                second.join(HANG_MS / 1000)

    asyncio.run(main())
