"""The deferred surface as a caller sees it: ``sensorium.operation.status|wait|cancel|list``
and ``sensorium.flow.run|status``, each scoped by ``core/access.py`` to who asks."""

from __future__ import annotations

import asyncio
import time

from sensorium.core.access import Access, summarize
from sensorium.core.completions import Completions
from sensorium.core.flows import FlowRunner
from sensorium.core.operations import OperationsView
from sensorium.shared.deferred.records import unknown
from sensorium.shared.deferred.registry import Registry
from sensorium.shared.errors import CodedError
from sensorium.shared.wire.client_api import (
    FlowRun,
    FlowStatusRequest,
    OperationCancel,
    OperationListRequest,
    OperationStatusBatch,
    OperationStatusRequest,
    OperationWait,
)
from sensorium.shared.wire.deferred import (
    DeferredOperationStatus,
    OperationList,
    OperationStatuses,
    StatusEntry,
)
from sensorium.shared.wire.flow import FlowStatus


class ScopedDeferred:
    def __init__(
        self,
        registry: Registry,
        operations: OperationsView,
        flows: FlowRunner,
        access: Access,
        completions: Completions,
    ) -> None:
        self.registry = registry
        self.operations = operations
        self.flows = flows
        self.access = access
        self.completions = completions

    def __repr__(self) -> str:
        return f"<ScopedDeferred {self.access!r}>"

    async def status(self, req: OperationStatusRequest) -> DeferredOperationStatus:
        op = await asyncio.to_thread(self.registry.require, req.operation_id)
        caller = self.access.caller()
        self.access.operation(caller, op, "read", req.request_id, req.include_result)
        status = await self.operations.status(req.operation_id, req.refresh)
        return status if req.include_result else summarize(status)

    async def status_batch(self, req: OperationStatusBatch) -> OperationStatuses:
        """``status`` of each id, each answered on its own (a status or its error)."""
        ids = list(dict.fromkeys(req.operation_ids))
        ops = await asyncio.to_thread(self.registry.get_many, ids)
        caller = self.access.caller()
        failed: dict[str, CodedError] = {}
        readable = []
        for oid in ids:
            try:
                op = ops.get(oid)
                if op is None:
                    raise unknown(oid)
                self.access.operation(caller, op, "read", req.request_id, req.include_result)
            except CodedError as exc:
                failed[oid] = exc
                continue
            readable.append(op)
        answers: dict[str, DeferredOperationStatus | CodedError] = {
            **failed,
            **await self.operations.statuses(readable, req.refresh),
        }
        return OperationStatuses(
            entries=[_entry(oid, answers[oid], req.include_result) for oid in req.operation_ids]
        )

    async def wait(self, req: OperationWait) -> DeferredOperationStatus:
        """The status once final, or when ``wait_ms`` runs out: woken by the job's end
        (``core/completions.py``), re-reading the registry meanwhile."""
        op = await asyncio.to_thread(self.registry.require, req.operation_id)
        caller = self.access.caller()
        self.access.operation(caller, op, "read", req.request_id, req.include_result)
        end = time.monotonic() + req.wait_ms / 1000
        while op.open and not self.completions.closed and (left := end - time.monotonic()) > 0:
            await self.completions.changed(op.operation_id, left)
            op = await asyncio.to_thread(self.registry.require, req.operation_id)
        status = await self.operations.status(req.operation_id, False)
        return status if req.include_result else summarize(status)

    async def cancel(self, req: OperationCancel) -> DeferredOperationStatus:
        op = await asyncio.to_thread(self.registry.require, req.operation_id)
        self.access.operation(self.access.caller(), op, "cancel", req.request_id, False)
        return await self.operations.cancel(req.operation_id)

    async def list(self, req: OperationListRequest) -> OperationList:
        visible = self.access.visible(self.access.caller())
        return await self.operations.list(req.limit, req.open_only, visible)

    async def flow_run(self, req: FlowRun) -> FlowStatus:
        return await self.flows.start(req, self.access.caller().owner_key)

    async def flow_status(self, req: FlowStatusRequest) -> FlowStatus:
        caller = self.access.caller()
        return await self.flows.status(
            req.flow_id, lambda flow, steps: self.access.flow(caller, flow, steps, req.request_id)
        )


def _entry(
    operation_id: str, answer: DeferredOperationStatus | CodedError, include_result: bool
) -> StatusEntry:
    if isinstance(answer, CodedError):
        return StatusEntry(
            operation_id=operation_id,
            code=answer.code,
            message=answer.message,
            retry_after_ms=answer.retry_after_ms,
        )
    return StatusEntry(
        operation_id=operation_id, status=answer if include_result else summarize(answer)
    )
