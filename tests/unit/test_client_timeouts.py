"""How long a client waits for an invoke's reply, and how rarely it asks the catalog."""

from __future__ import annotations

import asyncio
import tempfile

import zmq.asyncio

from sensorium.client import AsyncClient
from sensorium.client.endpoint import MaxTimeouts, reply_wait_s
from sensorium.shared.config import Limits
from sensorium.shared.rpc.server import RpcServer
from sensorium.shared.wire.client_api import ActionView, CatalogDescribe, CatalogView, ClientRequest


def _view(**max_ms: int) -> CatalogView:
    return CatalogView(
        actions=[
            ActionView(
                action_id=a,
                parameters_schema={},
                default_timeout_ms=1,
                max_timeout_ms=m,
                execution_mode_support="sync-only",
                state="degraded",
            )
            for a, m in max_ms.items()
        ]
    )


def test_an_unknown_action_does_not_refetch_the_catalog_on_every_call() -> None:
    cache = MaxTimeouts(refresh_s=60)
    assert cache.stale("a.b")
    cache.update(_view(**{"a.b": 5000}))
    assert not cache.stale("a.b") and cache.get("a.b") == 5000
    assert not cache.stale("no.such") and cache.get("no.such") is None


def test_the_wait_is_the_actions_own_maximum_plus_the_margin() -> None:
    margin = Limits().reply_margin_ms / 1000
    assert reply_wait_s(None, 10_000) == 10 + margin
    assert reply_wait_s(2_000, 10_000) == 2 + margin
    assert reply_wait_s(60_000, 10_000) == 10 + margin  # core clamps to the maximum too
    assert reply_wait_s(None, None) == Limits().max_action_timeout_ms / 1000 + margin


def test_concurrent_first_invokes_share_one_catalog_fetch() -> None:
    """16 tasks that all find the timeouts stale send one CatalogDescribe, not 16 (each
    would take one of the node's in-flight slots their invokes need); one of them
    cancelled while it waits does not cancel the others' fetch."""
    asked: list[str] = []

    async def describe(req: CatalogDescribe) -> CatalogView:
        asked.append(req.request_id)
        await asyncio.sleep(0.2)
        return _view(**{"a.b": 7000})

    async def main() -> None:
        ctx = zmq.asyncio.Context()
        endpoint = f"ipc://{tempfile.mkdtemp(prefix='aio-', dir='/tmp')}/core.sock"
        server = RpcServer(ctx, endpoint, ClientRequest, {CatalogDescribe: describe}, name="core")
        server.bind()
        serving = asyncio.create_task(server.serve())
        try:
            async with AsyncClient(endpoint) as client:
                waiters = [asyncio.create_task(client._max_timeout("a.b")) for _ in range(16)]
                await asyncio.sleep(0.05)
                waiters[0].cancel()
                got = await asyncio.gather(*waiters[1:])
                assert got == [7000] * 15 and len(asked) == 1
                assert await client._max_timeout("a.b") == 7000 and len(asked) == 1
        finally:
            serving.cancel()
            server.close()
            ctx.term()

    asyncio.run(main())
