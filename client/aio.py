"""The asyncio client: ``AsyncClient``, many directives in flight on one socket.

Example::

    import asyncio
    from sensorium.client.aio import AsyncClient

    async def main() -> None:
        async with AsyncClient() as client:
            outcomes = await asyncio.gather(*(
                client.invoke("demo.system.uptime") for _ in range(8)))
            print([o.status for o in outcomes])

    asyncio.run(main())
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

import msgspec
import zmq.asyncio

from sensorium.client.api import CONTROL_TIMEOUT_S, make_directive
from sensorium.client.endpoint import MaxTimeouts, core_endpoint, reply_wait_s
from sensorium.client.errors import SensoriumError, from_coded
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.rpc.client import RpcClient
from sensorium.shared.wire.client_api import (
    CatalogDescribe,
    CatalogView,
    Health,
    HealthReply,
    Invoke,
)
from sensorium.shared.wire.outcome import Outcome

T = TypeVar("T")


class AsyncClient:
    """Asyncio twin of ``Client``; create and use it inside one running event loop."""

    def __init__(self, endpoint: str | None = None, *, state_dir: str | None = None) -> None:
        self.endpoint = core_endpoint(endpoint, state_dir)
        self._ctx = zmq.asyncio.Context()
        self._rpc: RpcClient | None = None
        self._max_timeouts = MaxTimeouts()

    def __repr__(self) -> str:
        return f"<AsyncClient {self._rpc!r}>"

    def _client(self) -> RpcClient:
        if self._rpc is None:
            self._rpc = RpcClient(self._ctx, self.endpoint, name="core")
        return self._rpc

    async def _call(self, request: msgspec.Struct, result_type: type[T], timeout_s: float) -> T:
        try:
            return await self._client().call(request, result_type, timeout_s)
        except CodedError as exc:
            raise from_coded(exc) from None

    async def wait_connected(self, timeout_s: float = 2.0) -> None:
        """Wait until core has accepted the connection (calls fail fast before that)."""
        rpc = self._client()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not rpc.connected and loop.time() < deadline:
            await asyncio.sleep(0.01)

    async def invoke(
        self,
        action_id: str,
        parameters: dict[str, Any] | None = None,
        *,
        timeout_ms: int | None = None,
        idempotency_key: str | None = None,
        correlation_id: str | None = None,
        reply_timeout_s: float | None = None,
    ) -> Outcome:
        directive = make_directive(
            action_id,
            parameters,
            timeout_ms=timeout_ms,
            idempotency_key=idempotency_key,
            correlation_id=correlation_id,
        )
        wait = reply_timeout_s or reply_wait_s(timeout_ms, await self._max_timeout(action_id))
        return await self._call(Invoke(request_id=new_id(), directive=directive), Outcome, wait)

    async def _max_timeout(self, action_id: str) -> int | None:
        if self._max_timeouts.stale(action_id):
            try:
                self._max_timeouts.update(await self.describe())
            except SensoriumError:
                return None
        return self._max_timeouts.get(action_id)

    async def describe(self) -> CatalogView:
        return await self._call(
            CatalogDescribe(request_id=new_id()), CatalogView, CONTROL_TIMEOUT_S
        )

    async def health(self) -> HealthReply:
        return await self._call(Health(request_id=new_id()), HealthReply, CONTROL_TIMEOUT_S)

    async def close(self) -> None:
        if self._rpc is not None:
            await self._rpc.close()
        self._ctx.term()

    async def __aenter__(self) -> AsyncClient:
        await self.wait_connected()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
