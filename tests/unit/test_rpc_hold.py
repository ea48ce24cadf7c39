"""Replies held for a restarting peer, over real ZeroMQ sockets: a reply produced while
the held-for caller was gone reaches its next incarnation (as an unmatched reply, the
orphan desk's intake); any other caller's missed reply is simply undeliverable."""

from __future__ import annotations

import asyncio
import tempfile

import zmq
import zmq.asyncio

from sensorium.shared.ids import new_id
from sensorium.shared.rpc.client import RpcClient
from sensorium.shared.rpc.server import RpcServer
from sensorium.shared.wire.envelope import Reply
from sensorium.shared.wire.supervisor_api import (
    Ack,
    ControlRequestUnion,
    SupervisorResume,
    SupervisorStatus,
)

IDENTITY = b"held-caller"


async def _slow(req: SupervisorResume) -> Ack:
    await asyncio.sleep(float(req.process))
    return Ack(message=req.process)


async def _fast(req: SupervisorStatus) -> Ack:
    return Ack(message=req.request_id)


async def _connected(client: RpcClient) -> None:
    for _ in range(300):
        if client.connected:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never connected")


def _scenario(routing_id: bytes | None) -> list[Reply]:
    async def main() -> list[Reply]:
        ctx = zmq.asyncio.Context()
        endpoint = f"ipc://{tempfile.mkdtemp(prefix='hold-', dir='/tmp')}/s.sock"
        server = RpcServer(
            ctx,
            endpoint,
            ControlRequestUnion,
            {SupervisorResume: _slow, SupervisorStatus: _fast},
            name="test",
            hold_for=IDENTITY,
        )
        server.bind()
        serving = asyncio.create_task(server.serve())
        first = RpcClient(ctx, endpoint, name="first", routing_id=routing_id)
        await _connected(first)
        slow = asyncio.create_task(
            first.call(SupervisorResume(request_id="slow-1", process="0.3"), Ack, 5)
        )
        await asyncio.sleep(0.1)
        await first.close()  # the caller dies while its request runs
        slow.cancel()
        await asyncio.sleep(0.4)  # the reply is produced with nobody there
        heard: list[Reply] = []
        second = RpcClient(
            ctx, endpoint, name="second", routing_id=routing_id, on_unmatched=heard.append
        )
        await _connected(second)
        # Any request from the returning caller releases what was held for it.
        await second.call(SupervisorStatus(request_id=new_id()), Ack, 2)
        await asyncio.sleep(0.2)
        await second.close()
        serving.cancel()
        server.close()
        ctx.term()
        return heard

    return asyncio.run(main())


def test_a_reply_missed_by_the_held_for_peer_reaches_its_next_incarnation() -> None:
    heard = _scenario(IDENTITY)
    assert [r.request_id for r in heard] == ["slow-1"]
    assert heard[0].ok


def test_another_callers_missed_reply_is_not_held() -> None:
    assert _scenario(None) == []
