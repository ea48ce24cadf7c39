"""The asyncio client: ``AsyncClient``, many directives in flight on one socket.

Example::

    import asyncio
    from sensorium.client.aio import AsyncClient

    async def main() -> None:
        async with AsyncClient() as client:
            outcomes = await asyncio.gather(*(
                client.invoke("demo.system.uptime") for _ in range(8)))
            print([o.status for o in outcomes])

            op = await client.invoke("demo.slow.report", mode="async")
            final = await client.wait(op, deadline=120)
            print(final.status)

            # An invoke cut off by a restart is sent again, under one idempotency/key.
            outcome = await client.invoke("demo.system.uptime", retries=3)

    asyncio.run(main())
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal, TypeVar, overload

import msgspec
import zmq.asyncio

from sensorium.client import reads
from sensorium.client.api import make_directive
from sensorium.client.deferred import (
    ASYNC_ACK_TIMEOUT_S,
    FLOW_ENDED,
    Deadline,
    OperationRef,
    Retrier,
    StatusReads,
    flow_deadline,
    flow_definition,
    flow_reply_wait_s,
    flow_retry_hint,
    operation_deadline,
    operation_id_of,
    pause_s,
    read_timeout_s,
    retry_plan,
    seconds_until,
)
from sensorium.client.endpoint import (
    CONTROL_TIMEOUT_S,
    MaxTimeouts,
    core_curve,
    core_endpoint,
    reply_wait_s,
)
from sensorium.client.endpoint import module_id as _module_id
from sensorium.client.errors import ReplyTimeout, Retryable, SensoriumError, from_coded
from sensorium.client.results import Answer, unwrap
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.rpc.client import RpcClient
from sensorium.shared.rpc.curve import ClientKeys
from sensorium.shared.wire.audit import AuditPage, OutcomeRecord
from sensorium.shared.wire.client_api import (
    AuditGet,
    CatalogDescribe,
    CatalogView,
    FlowRun,
    FlowStatusRequest,
    HealthReply,
    Invoke,
    OperationCancel,
    OperationListRequest,
    OperationStatusRequest,
)
from sensorium.shared.wire.declaration import SensitivityClass
from sensorium.shared.wire.deferred import DeferredOperation, DeferredOperationStatus, OperationList
from sensorium.shared.wire.directive import Issuer, TimingMode
from sensorium.shared.wire.flow import FlowDefinition, FlowStatus
from sensorium.shared.wire.outcome import Outcome

T = TypeVar("T")


class AsyncClient:
    """Asyncio twin of ``Client``; create and use it inside one running event loop.

    Every method of ``Client`` is here under the same name and signature, as a
    coroutine: ``invoke`` (sync or async mode), ``status``, ``cancel``,
    ``operations``, ``wait``, ``run_flow``, ``flow_status``, ``wait_flow``,
    ``describe``, ``health``, ``directives``, ``observe_query``, ``observation``,
    ``topic_summary``.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        state_dir: str | None = None,
        curve: ClientKeys | None = None,
        module_id: str | None = None,
    ) -> None:
        self.endpoint = core_endpoint(endpoint, state_dir)
        # Who the directives say issued them (claimed: over ipc nothing proves it).
        self.issuer = Issuer(module_id=_module_id(module_id, curve.name if curve else None))
        # A tcp endpoint needs CURVE keys (ClientKeys.load(path)); ipc needs none.
        self._curve = core_curve(self.endpoint, state_dir, curve)
        self._ctx = zmq.asyncio.Context()
        self._rpc: RpcClient | None = None
        self._max_timeouts = MaxTimeouts()
        # The catalog fetch in flight for timeouts: callers that find them stale at the
        # same moment share it (16 first invokes are one fetch, not 16 that take the
        # node's in-flight slots their own invokes need).
        self._learning: asyncio.Task[CatalogView] | None = None
        self._reads = StatusReads()

    def __repr__(self) -> str:
        return f"<AsyncClient {self._rpc!r}>"

    def _client(self) -> RpcClient:
        if self._rpc is None:
            self._rpc = RpcClient(self._ctx, self.endpoint, name="core", curve=self._curve)
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

    @overload
    async def invoke(
        self,
        action_id: str,
        parameters: dict[str, Any] | None = None,
        *,
        mode: Literal["sync"] = "sync",
        timeout_ms: int | None = None,
        deadline_at: str | datetime | None = None,
        idempotency_key: str | None = None,
        correlation_id: str | None = None,
        consent: SensitivityClass | None = None,
        reply_timeout_s: float | None = None,
        retries: int | None = None,
    ) -> Outcome: ...

    @overload
    async def invoke(
        self,
        action_id: str,
        parameters: dict[str, Any] | None = None,
        *,
        mode: Literal["async"],
        timeout_ms: int | None = None,
        deadline_at: str | datetime | None = None,
        idempotency_key: str | None = None,
        correlation_id: str | None = None,
        consent: SensitivityClass | None = None,
        reply_timeout_s: float | None = None,
        retries: int | None = None,
    ) -> DeferredOperation: ...

    @overload
    async def invoke(
        self,
        action_id: str,
        parameters: dict[str, Any] | None = None,
        *,
        mode: TimingMode,
        timeout_ms: int | None = None,
        deadline_at: str | datetime | None = None,
        idempotency_key: str | None = None,
        correlation_id: str | None = None,
        consent: SensitivityClass | None = None,
        reply_timeout_s: float | None = None,
        retries: int | None = None,
    ) -> Outcome | DeferredOperation: ...

    async def invoke(
        self,
        action_id: str,
        parameters: dict[str, Any] | None = None,
        *,
        mode: TimingMode = "sync",
        timeout_ms: int | None = None,
        deadline_at: str | datetime | None = None,
        idempotency_key: str | None = None,
        correlation_id: str | None = None,
        consent: SensitivityClass | None = None,
        reply_timeout_s: float | None = None,
        retries: int | None = None,
    ) -> Outcome | DeferredOperation:
        """See ``Client.invoke``: an ``Outcome`` in sync mode, a handle in async mode;
        ``retries`` and ``idempotency_key`` work the same way. The socket is kept after a
        ``ReplyTimeout`` (other calls share it; a late reply is dropped by its id)."""
        retries, key = retry_plan(retries, idempotency_key)
        if timeout_ms is None:
            await self._max_timeout(action_id)  # learns the action's default too
        directive = make_directive(
            action_id,
            parameters,
            issuer=self.issuer,
            timeout_ms=timeout_ms
            if timeout_ms is not None
            else self._max_timeouts.default(action_id),
            idempotency_key=key,
            correlation_id=correlation_id,
            mode=mode,
            deadline_at=deadline_at,
            consent=consent,
        )
        retrier = Retrier(retries, key, directive.caller_deadline_at)
        while True:
            request = Invoke(request_id=new_id(), directive=directive)
            try:
                if mode == "async":
                    return unwrap(
                        await self._call(request, Answer, reply_timeout_s or ASYNC_ACK_TIMEOUT_S)
                    )
                wait = reply_timeout_s or reply_wait_s(
                    timeout_ms, await self._max_timeout(action_id)
                )
                return unwrap(await self._call(request, Answer, wait))
            except Retryable as exc:
                pause = retrier.pause_s(exc)
                if pause is None:
                    raise
                await asyncio.sleep(pause)

    async def _max_timeout(self, action_id: str) -> int | None:
        if self._max_timeouts.stale(action_id):
            try:
                await self._learn_timeouts()
            except SensoriumError:
                return None
        return self._max_timeouts.get(action_id)

    async def _flow_max_timeouts(self, flow: FlowDefinition) -> dict[str, int | None]:
        ids = {s.action_id for s in flow.steps}
        if any(self._max_timeouts.stale(a) for a in ids):
            with contextlib.suppress(SensoriumError):
                await self._learn_timeouts()
        return {a: self._max_timeouts.get(a) for a in ids}

    async def _learn_timeouts(self) -> None:
        """One catalog fetch for every caller waiting on it; a caller cancelled while it
        waits does not cancel the others' fetch."""
        if self._learning is None or self._learning.done():
            self._learning = asyncio.ensure_future(self.describe())
            self._learning.add_done_callback(_retrieved)
        self._max_timeouts.update(await asyncio.shield(self._learning))

    # -- deferred operations ----------------------------------------------

    async def status(
        self, op: OperationRef, *, refresh: bool = False, include_result: bool = False
    ) -> DeferredOperationStatus:
        """See ``Client.status``."""
        request = OperationStatusRequest(
            request_id=new_id(),
            operation_id=operation_id_of(op),
            refresh=refresh,
            include_result=include_result,
        )
        return await self._call(request, DeferredOperationStatus, CONTROL_TIMEOUT_S)

    async def cancel(self, op: OperationRef) -> DeferredOperationStatus:
        """See ``Client.cancel``."""
        request = OperationCancel(request_id=new_id(), operation_id=operation_id_of(op))
        return await self._call(request, DeferredOperationStatus, CONTROL_TIMEOUT_S)

    async def operations(self, limit: int = 100, open_only: bool = False) -> OperationList:
        request = OperationListRequest(request_id=new_id(), limit=limit, open_only=open_only)
        return await self._call(request, OperationList, CONTROL_TIMEOUT_S)

    async def wait(
        self, op: OperationRef, deadline: Deadline, *, include_result: bool = False
    ) -> DeferredOperationStatus:
        """See ``Client.wait``: the final status, or ``DeadlineExceeded`` with ``last``."""
        operation_id = operation_id_of(op)
        end = time.monotonic() + seconds_until(deadline)
        last: DeferredOperationStatus | None = None
        while True:
            request, reply_s = self._reads.request(
                operation_id, include_result, end - time.monotonic()
            )
            sent = time.monotonic()
            try:
                last = await self._call(request, DeferredOperationStatus, reply_s)
            except ReplyTimeout:
                if time.monotonic() >= end:
                    raise operation_deadline(operation_id, last) from None
                raise
            except SensoriumError as exc:
                if self._reads.refused(exc):
                    continue
                raise
            if last.terminal:
                return last
            left = end - time.monotonic()
            if left <= 0:
                raise operation_deadline(operation_id, last)
            await asyncio.sleep(self._reads.pause(last, time.monotonic() - sent, left))

    # -- flows ------------------------------------------------------------

    async def run_flow(
        self,
        definition: FlowDefinition | Mapping[str, Any],
        context: dict[str, Any] | None = None,
        *,
        correlation_id: str | None = None,
        reply_timeout_s: float | None = None,
    ) -> FlowStatus:
        """See ``Client.run_flow``."""
        flow = flow_definition(definition)
        if reply_timeout_s is None:
            reply_timeout_s = flow_reply_wait_s(flow, await self._flow_max_timeouts(flow))
        request = FlowRun(
            request_id=new_id(),
            flow=flow,
            context=dict(context or {}),
            correlation_id=correlation_id,
        )
        return await self._call(request, FlowStatus, reply_timeout_s)

    async def flow_status(self, flow_id: str) -> FlowStatus:
        request = FlowStatusRequest(request_id=new_id(), flow_id=flow_id)
        return await self._call(request, FlowStatus, CONTROL_TIMEOUT_S)

    async def wait_flow(self, flow_id: str, deadline: Deadline) -> FlowStatus:
        """See ``Client.wait_flow``."""
        end = time.monotonic() + seconds_until(deadline)
        last: FlowStatus | None = None
        while True:
            request = FlowStatusRequest(request_id=new_id(), flow_id=flow_id)
            try:
                last = await self._call(request, FlowStatus, read_timeout_s(end - time.monotonic()))
            except ReplyTimeout:
                if time.monotonic() >= end:
                    raise flow_deadline(flow_id, last) from None
                raise
            if last.state in FLOW_ENDED:
                return last
            left = end - time.monotonic()
            if left <= 0:
                raise flow_deadline(flow_id, last)
            await asyncio.sleep(pause_s(flow_retry_hint(last), left))

    # -- node -------------------------------------------------------------

    async def describe(self) -> CatalogView:
        return await self._call(
            CatalogDescribe(request_id=new_id()), CatalogView, CONTROL_TIMEOUT_S
        )

    async def audit_get(self, ident: str) -> OutcomeRecord:
        """A directive's ``sensorium-directive-outcome.v1`` by ``outcome/id`` (an invoke's
        receipt) or ``directive/id``. Restricted: ``GrantDenied`` for a CURVE key the
        operator has not granted ``audit``; ``UnknownId`` when there is none."""
        return await self._call(
            AuditGet(request_id=new_id(), id=ident), OutcomeRecord, CONTROL_TIMEOUT_S
        )

    async def audit_query(
        self,
        *,
        action_id: str | None = None,
        status: str | None = None,
        issuer: str | None = None,
        since: str | None = None,
        until: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> AuditPage:
        """A page of outcome records, newest first; the node caps ``limit``
        (``limits.audit_page_max``). Pass ``next_cursor`` back as ``cursor``."""
        request = reads.audit_query(
            action_id=action_id,
            status=status,
            issuer=issuer,
            since=since,
            until=until,
            limit=limit,
            cursor=cursor,
        )
        return await self._call(request, AuditPage, CONTROL_TIMEOUT_S)

    async def health(self) -> HealthReply:
        """``sensorium.health`` (the same answer as the earlier name ``health``)."""
        return await self._call(reads.health(), HealthReply, CONTROL_TIMEOUT_S)

    # -- the consumer read paths (proposal 045 §7) ------------------------------

    async def directives(self) -> reads.DirectiveList:
        """``sensorium.directive.list``: the actions this client may invoke, with their
        parameter schemas (over tcp, those its key is granted)."""
        return await self._call(reads.directive_list(), reads.DirectiveList, CONTROL_TIMEOUT_S)

    async def observe_query(self, **filters: Any) -> reads.ObservationPage:
        """``sensorium.observe.query``: one bounded page of stored observations; the
        filters are those of ``sensorium.client.reads.observe_query``. Pass the page's
        ``next_cursor`` as ``cursor`` for the next one."""
        return await self._call(
            reads.observe_query(**filters), reads.ObservationPage, CONTROL_TIMEOUT_S
        )

    async def observation(self, observation_id: str) -> reads.Observation:
        """``sensorium.observation.get``; ``UnknownId`` when it is not (or no longer) kept."""
        return await self._call(
            reads.observation_get(observation_id), reads.Observation, CONTROL_TIMEOUT_S
        )

    async def topic_summary(self, **filters: Any) -> reads.TopicSummary:
        """``sensorium.topic.summary``: per local topic, how many live records and when."""
        return await self._call(
            reads.topic_summary(**filters), reads.TopicSummary, CONTROL_TIMEOUT_S
        )

    async def close(self) -> None:
        if self._rpc is not None:
            await self._rpc.close()
        self._ctx.term()

    async def __aenter__(self) -> AsyncClient:
        await self.wait_connected()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _retrieved(task: asyncio.Task[CatalogView]) -> None:
    """Its error is every waiter's; with none left (all cancelled), it is dropped here."""
    if not task.cancelled():
        task.exception()
