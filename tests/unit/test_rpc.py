"""The RPC layer over real ZeroMQ sockets: correlation, timeouts, malformed input, overload."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.rpc.client import RpcClient
from sensorium.shared.rpc.server import AnswerThen, RpcServer
from sensorium.shared.rpc.sync_client import SyncRpcClient
from sensorium.shared.wire.envelope import Reply
from sensorium.shared.wire.supervisor_api import (
    Ack,
    ControlRequestUnion,
    SupervisorResume,
    SupervisorStatus,
    SupervisorStop,
)


def _endpoint() -> str:
    return f"ipc://{tempfile.mkdtemp(prefix='rpc-', dir='/tmp')}/s.sock"


class Behaviour:
    """Handlers: ``process`` of a resume request is how long to sleep before answering."""

    async def slow(self, req: SupervisorResume) -> Ack:
        await asyncio.sleep(float(req.process))
        return Ack(message=req.process)

    async def fast(self, req: SupervisorStatus) -> Ack:
        return Ack(message=req.request_id)

    async def crash(self, _req: SupervisorStop) -> Ack:
        raise ValueError("secret internal detail")


Quick = Callable[[SupervisorStatus], Any]


async def _server(
    endpoint: str,
    ctx: zmq.asyncio.Context,
    behaviour: Behaviour,
    max_inflight: int = 16,
    quick: Quick | None = None,
    before: Callable[[RpcServer], None] = lambda _server: None,
) -> tuple[RpcServer, asyncio.Task[None]]:
    """``quick``: the ``at_once`` of ``SupervisorStatus``; ``before``: run on the bound
    server before it serves."""
    server = RpcServer(
        ctx,
        endpoint,
        ControlRequestUnion,
        {
            SupervisorResume: behaviour.slow,
            SupervisorStatus: behaviour.fast,
            SupervisorStop: behaviour.crash,
        },
        name="test",
        max_inflight=max_inflight,
        at_once={SupervisorStatus: quick} if quick is not None else None,
    )
    server.bind()
    before(server)
    return server, asyncio.create_task(server.serve())


@contextlib.asynccontextmanager
async def serving(
    max_inflight: int = 16,
    quick: Quick | None = None,
    before: Callable[[RpcServer], None] = lambda _server: None,
) -> AsyncIterator[tuple[RpcClient, RpcServer]]:
    """A server and a connected client on a fresh ipc endpoint, torn down afterwards."""
    ctx = zmq.asyncio.Context()
    endpoint = _endpoint()
    server, task = await _server(endpoint, ctx, Behaviour(), max_inflight, quick, before)
    client = RpcClient(ctx, endpoint, name="test", unavailable_code="core-unavailable")
    for _ in range(200):
        if client.connected:
            break
        await asyncio.sleep(0.01)
    try:
        yield client, server
    finally:
        task.cancel()
        await client.close()
        server.close()
        ctx.term()


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


def test_a_late_reply_never_reaches_the_next_caller() -> None:
    async def main() -> None:
        async with serving() as (client, _server):
            with pytest.raises(CodedError) as err:
                await client.call(SupervisorResume(request_id=new_id(), process="0.3"), Ack, 0.05)
            assert err.value.code == "reply-timeout"
            # The late reply to the first call arrives while the second waits: it is dropped.
            second = await client.call(SupervisorResume(request_id=new_id(), process="0.5"), Ack, 2)
            assert second.message == "0.5"

    run(main())


def test_concurrent_calls_are_matched_by_request_id() -> None:
    async def main() -> None:
        async with serving(max_inflight=64) as (client, _server):
            delays = [0.2, 0.0, 0.1, 0.05, 0.15]
            replies = await asyncio.gather(
                *(
                    client.call(SupervisorResume(request_id=new_id(), process=str(d)), Ack, 2)
                    for d in delays
                )
            )
            assert [r.message for r in replies] == [str(d) for d in delays]

    run(main())


def test_overload_is_answered_at_once_not_queued() -> None:
    async def main() -> None:
        async with serving(max_inflight=1) as (client, server):
            slow = asyncio.create_task(
                client.call(SupervisorResume(request_id=new_id(), process="3"), Ack, 30)
            )
            while server.inflight == 0:  # the slow call holds the one slot
                await asyncio.sleep(0.01)
            with pytest.raises(CodedError) as err:
                await client.call(SupervisorResume(request_id=new_id(), process="0"), Ack, 30)
            assert err.value.code == "overloaded" and err.value.retry_after_ms
            # Answered while the slot is still taken, not queued behind it.
            assert not slow.done()
            assert (await slow).message == "3"

    run(main())


def test_a_crashing_handler_gives_internal_without_its_traceback() -> None:
    async def main() -> None:
        async with serving() as (client, _server):
            rid = new_id()
            with pytest.raises(CodedError) as err:
                await client.call(SupervisorStop(request_id=rid), Ack, 2)
            assert err.value.code == "internal"
            assert "secret" not in err.value.message and rid in err.value.message
            # The server keeps serving.
            assert (await client.call(SupervisorStatus(request_id=new_id()), Ack, 2)).ok

    run(main())


def test_a_peer_that_disappears_fails_in_flight_calls_at_once() -> None:
    async def main() -> None:
        async with serving() as (client, server):
            call = asyncio.create_task(
                client.call(SupervisorResume(request_id=new_id(), process="30"), Ack, 30)
            )
            while server.inflight == 0:
                await asyncio.sleep(0.01)
            server.close()
            with pytest.raises(CodedError) as err:
                await call
            # Its 30 s reply timeout would say reply-timeout: the disconnect ended it.
            assert err.value.code == "core-unavailable"
            # With nobody there, a new call fails at once instead of queueing.
            with pytest.raises(CodedError) as err2:
                await client.call(SupervisorStatus(request_id=new_id()), Ack, 5)
            assert err2.value.code == "core-unavailable"

    run(main())


def test_malformed_frames_get_a_coded_reply_and_never_kill_the_server() -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        endpoint = _endpoint()
        server, task = await _server(endpoint, ctx, Behaviour())
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(endpoint)
        enc = msgspec.msgpack.Encoder()
        cases = [
            b"\xff\x00garbage",
            enc.encode({"request/id": "r1", "method": "no.such.method"}),
            enc.encode({"request/id": "r2", "method": "supervisor.resume"}),
            enc.encode({"request/id": "r3", "method": "supervisor.status", "extra": 1}),
            enc.encode([1, 2, 3]),
        ]
        for payload in cases:
            await raw.send(payload)
            reply = msgspec.msgpack.decode(await asyncio.wait_for(raw.recv(), 2), type=Reply)
            assert not reply.ok and reply.error is not None
            assert reply.error.code == "request-malformed"
        await raw.send(enc.encode({"request/id": "ok", "method": "supervisor.status"}))
        reply = msgspec.msgpack.decode(await asyncio.wait_for(raw.recv(), 2), type=Reply)
        assert reply.ok and reply.request_id == "ok"
        raw.close()
        task.cancel()
        server.close()
        ctx.term()

    run(main())


def test_sync_client_timeout_does_not_wedge_the_socket() -> None:
    import threading

    endpoint = _endpoint()
    ready = threading.Event()
    stop = threading.Event()

    def serve() -> None:
        async def main() -> None:
            ctx = zmq.asyncio.Context()
            server, task = await _server(endpoint, ctx, Behaviour())
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
            task.cancel()
            server.close()
            ctx.term()

        asyncio.run(main())

    thread = threading.Thread(target=serve)
    thread.start()
    ready.wait(5)
    try:
        with SyncRpcClient(endpoint, name="test") as client:
            with pytest.raises(CodedError) as err:
                client.call(SupervisorResume(request_id=new_id(), process="0.3"), Ack, 0.05)
            assert err.value.code == "reply-timeout"
            got = client.call(SupervisorResume(request_id=new_id(), process="0.4"), Ack, 2)
            assert got.message == "0.4"
    finally:
        stop.set()
        thread.join(5)


def test_sync_client_without_a_server_fails_fast_with_a_hint() -> None:
    with SyncRpcClient(_endpoint(), name="core", connect_timeout_s=0.2) as client:
        with pytest.raises(CodedError) as err:
            client.call(SupervisorStatus(request_id=new_id()), Ack, 60)
        # Its connect timeout ended it (a 60 s wait for a reply would say reply-timeout).
        assert err.value.code == "core-unavailable" and "sensorium status" in err.value.message


def test_a_server_answers_its_own_probe_until_its_socket_is_gone_or_taken() -> None:
    """The watchdog's health check: a probe on the bound path comes back from this very
    server; an unlinked path, or another socket bound there, fails it."""
    from sensorium.shared.rpc.server import bound_servers

    async def main() -> None:
        async with serving() as (_client, server):
            assert server in bound_servers()
            assert await server.check(2.0) is None
            path = server.endpoint[len("ipc://") :]
            os.unlink(path)
            problem = await server.check(0.5)
            assert problem is not None and "is gone" in problem
            # Someone else binds the path: the probe reaches them, not us.
            ctx = zmq.asyncio.Context()
            thief = RpcServer(ctx, server.endpoint, ControlRequestUnion, {}, name="thief")
            thief.bind()
            thief_task = asyncio.create_task(thief.serve())
            try:
                problem = await server.check(0.5)
                assert problem is not None and "another socket" in problem
                assert await thief.check(2.0) is None
            finally:
                thief_task.cancel()
                thief.close()
                ctx.term()
        assert server not in bound_servers()

    run(main())


def test_an_answer_given_at_once_skips_the_handler_and_none_or_a_crash_falls_through() -> None:
    """``at_once`` answers in the receive loop; None, or a bug in it, leaves the request
    to its handler, and the server serves on."""
    asked: list[str] = []

    def quick(req: SupervisorStatus) -> Ack | None:
        asked.append(req.request_id)
        if req.request_id.startswith("crash"):
            raise ValueError("a bug in the quick answer")
        return Ack(message="at once") if req.request_id.startswith("quick") else None

    async def main() -> None:
        async with serving(quick=quick) as (client, server):
            for rid, expected in (
                ("quick-1", "at once"),
                ("slow-1", "slow-1"),  # None: the handler answers
                ("crash-1", "crash-1"),  # its bug: the handler answers, the server serves on
                ("quick-2", "at once"),
            ):
                reply = await client.call(SupervisorStatus(request_id=rid), Ack, 5)
                assert reply.message == expected, rid
            # Only the type it was given for is asked; the rest go to their handlers.
            resumed = await client.call(SupervisorResume(request_id="r", process="0"), Ack, 5)
            assert resumed.message == "0"
            assert asked == ["quick-1", "slow-1", "crash-1", "quick-2"]
            assert server.inflight == 0  # no task was left behind by an answer at once

    run(main())


def test_what_follows_an_answer_at_once_runs_after_it_left_and_its_bug_stops_nothing() -> None:
    """``AnswerThen``: the reply leaves first, then its follow-up runs, in the same turn
    (before the next request is read); a follow-up that raises is logged, and the
    server serves on."""
    events: list[str] = []
    sent: list[str] = []

    def quick(req: SupervisorStatus) -> AnswerThen:
        def then() -> None:
            # The reply is on its way already (the Replies sent it), the next request
            # not read yet.
            events.append(f"then {req.request_id} after {sent[-1]}")
            if req.request_id == "crash":
                raise ValueError("a bug after the answer")

        return AnswerThen(Ack(message=req.request_id), then)

    def watch_sends(server: RpcServer) -> None:
        send = server._replies.result

        def recorded(route: list[bytes], rid: str, result: msgspec.Struct) -> None:
            sent.append(rid)
            send(route, rid, result)

        server._replies.result = recorded  # type: ignore[method-assign]

    async def main() -> None:
        async with serving(quick=quick, before=watch_sends) as (client, server):
            for rid in ("a", "crash", "b"):
                reply = await client.call(SupervisorStatus(request_id=rid), Ack, 5)
                assert reply.message == rid
            assert events == ["then a after a", "then crash after crash", "then b after b"]
            assert server.inflight == 0

    run(main())
