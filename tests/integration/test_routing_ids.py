"""Two live connections with one routing id: the first keeps it, the second is refused
with a coded reply, and the node logs the id (docs/wire-protocol.md, "Identities")."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio
from harness import Stack
from zmq.utils.monitor import recv_monitor_message

from sensorium.client.endpoint import core_endpoint
from sensorium.shared.ids import new_id
from sensorium.shared.rpc.judging import JUDGE_QUEUE
from sensorium.shared.rpc.server import RpcServer
from sensorium.shared.wire.supervisor_api import Ack, ControlRequestUnion, SupervisorStatus

REPLY_S = 10.0  # an upper bound only: every wait below ends as soon as its event comes


def _dealer(
    ctx: zmq.Context[Any], stack: Stack, ident: bytes, watch: int = 0
) -> tuple[zmq.Socket[Any], zmq.Socket[Any] | None]:
    """A DEALER with a fixed id and, when ``watch`` names events, its monitor: attached
    before the connect, so that no event of this connection can come before it."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTING_ID, ident)
    events = sock.get_monitor_socket(watch) if watch else None
    sock.connect(core_endpoint(state_dir=str(stack.paths.root)))
    return sock, events


def _event(events: zmq.Socket[Any] | None) -> int:
    """The next monitor event (bounded: a missed one fails, it never hangs)."""
    assert events is not None
    assert events.poll(int(REPLY_S * 1000)), "no monitor event"
    return int(recv_monitor_message(events)["event"])


def _health(sock: zmq.Socket[Any]) -> dict[str, Any]:
    rid = new_id()
    sock.send(msgspec.msgpack.encode({"method": "sensorium.health", "request/id": rid}))
    for _ in range(10):  # a client drops replies that are not its own, as any would
        assert sock.poll(int(REPLY_S * 1000)), "no reply"
        reply: dict[str, Any] = msgspec.msgpack.decode(sock.recv())
        if reply["request/id"] == rid:
            return reply
    raise AssertionError("no reply to this request")


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    c: zmq.Context[Any] = zmq.Context()
    try:
        yield c
    finally:
        c.destroy(linger=0)


def test_a_second_connection_with_a_routing_id_in_use_is_refused_and_logged(
    stack: Stack, ctx: zmq.Context[Any]
) -> None:
    first, events = _dealer(
        ctx, stack, b"twin", zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
    )
    assert _health(first)["ok"] is True
    assert _event(events) == zmq.EVENT_HANDSHAKE_SUCCEEDED

    second, _ = _dealer(ctx, stack, b"twin")
    refused = _health(second)
    assert refused["ok"] is False
    assert refused["error"]["code"] == "routing-id-in-use"
    assert "twin" in refused["error"]["message"]

    # ZeroMQ had handed the id to the newcomer; the node dropped the first connection
    # once, so that it reconnects and takes its id back. It then works as before.
    assert _event(events) == zmq.EVENT_DISCONNECTED
    assert _event(events) == zmq.EVENT_HANDSHAKE_SUCCEEDED
    for _ in range(3):
        assert _health(first)["ok"] is True

    deadline = time.monotonic() + REPLY_S
    logged: list[dict[str, Any]] = []
    while not logged and time.monotonic() < deadline:
        lines = (stack.paths.logs / "core.jsonl").read_text().splitlines()
        logged = [json.loads(x) for x in lines if "rpc.routing_id.duplicate" in x]
        time.sleep(0.05)
    assert logged, "no rpc.routing_id.duplicate in logs/core.jsonl"
    assert logged[0]["routing_id"] == "twin"
    assert logged[0]["level"] == "warning"


def test_a_routing_id_reused_after_its_connection_closed_is_not_a_duplicate(
    stack: Stack, ctx: zmq.Context[Any]
) -> None:
    # A restarted client with a fixed id: the old connection is gone, the new one is
    # served at once (what the poller and a reconnecting client rely on).
    for _ in range(20):
        sock, events = _dealer(ctx, stack, b"phoenix", zmq.EVENT_HANDSHAKE_SUCCEEDED)
        assert _health(sock)["ok"] is True
        assert _event(events) == zmq.EVENT_HANDSHAKE_SUCCEEDED
        sock.disable_monitor()
        assert events is not None
        events.close(linger=0)
        sock.close(linger=0)


def test_a_duplicate_flooding_requests_is_judged_once_and_each_is_answered_once() -> None:
    """One RpcServer in this process, so that what it holds can be looked at: a duplicate
    connection that sends 200 requests while it is judged makes one judgement, holds at
    most ``JUDGE_QUEUE`` of them (counted in flight), and every request gets one answer
    (``routing-id-in-use`` or ``overloaded``; the ones sent once the holder has its id
    back reach the holder, as documented)."""
    count = 200

    async def status(req: SupervisorStatus) -> Ack:
        return Ack(message=req.request_id)

    def request(rid: str) -> bytes:
        return msgspec.msgpack.encode({"method": "supervisor.status", "request/id": rid})

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        endpoint = f"ipc://{tempfile.mkdtemp(prefix='rpc-ids-', dir='/tmp')}/s.sock"
        server = RpcServer(
            ctx, endpoint, ControlRequestUnion, {SupervisorStatus: status}, name="test"
        )
        server.bind()
        serving = asyncio.create_task(server.serve())
        socks: list[zmq.asyncio.Socket] = []

        def dealer() -> zmq.asyncio.Socket:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTING_ID, b"twin")
            sock.connect(endpoint)
            socks.append(sock)
            return sock

        try:
            first = dealer()
            rid = new_id()
            await first.send(request(rid))
            reply = msgspec.msgpack.decode(await asyncio.wait_for(first.recv(), REPLY_S))
            assert reply["ok"] is True and reply["request/id"] == rid

            second = dealer()
            sent = [new_id() for _ in range(count)]
            for r in sent:
                await second.send(request(r))
            answers: Counter[str] = Counter()
            codes: Counter[str] = Counter()
            judging: list[int] = []
            inflight: list[int] = []
            poller = zmq.asyncio.Poller()
            poller.register(first, zmq.POLLIN)
            poller.register(second, zmq.POLLIN)
            while sum(answers.values()) < count:
                judging.append(server.judging)
                inflight.append(server.inflight)
                ready = dict(await poller.poll(int(REPLY_S * 1000)))
                assert ready, f"no answer for {count - sum(answers.values())} requests"
                for sock in ready:
                    got = msgspec.msgpack.decode(await sock.recv())
                    answers[got["request/id"]] += 1
                    codes[got["error"]["code"]] += 1
            assert set(answers) == set(sent) and set(answers.values()) == {1}
            assert set(codes) <= {"routing-id-in-use", "overloaded"}, codes
            assert max(judging) <= 1 and max(inflight) <= JUDGE_QUEUE
            assert server.judging == 0 and server.inflight == 0
        finally:
            for sock in socks:
                sock.close(linger=0)
            serving.cancel()
            server.close()
            ctx.term()

    asyncio.run(main())
