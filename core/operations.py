"""``sensorium.operation.*``: status, cancel and list over the host registry.

Status answers from the registry, which the poller keeps current under host
policy; ``refresh`` asks the connector instead (the poller and ``ops poll`` do).
An open operation past its expiry is first polled one final time: a job that holds
a terminal result ends with it, one still open ends ``expired``.
Cancel is host-side first — the operation is cancelled the moment the registry
says so — and the connector's job is then told; if it cannot be reached, the
cancel stays owed and the poller delivers it later.
"""

from __future__ import annotations

import asyncio
import time

import msgspec
import structlog

from sensorium.core.access import result_summary
from sensorium.shared.clock import rfc3339
from sensorium.shared.deferred import polling
from sensorium.shared.deferred.policy import whole_seconds
from sensorium.shared.deferred.registry import Operation, Registry
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.rpc.client import RpcClient, new_request_id
from sensorium.shared.wire.deferred import (
    EXT_ATTEMPT_NO,
    DeferredOperationStatus,
    OperationList,
    OperationSummary,
)
from sensorium.shared.wire.outcome import Diagnostic
from sensorium.shared.wire.seam import (
    ConnectorCancel,
    ConnectorStatus,
    ConnectorStatusBatch,
    ConnectorStatuses,
)

log = structlog.get_logger("sensorium.core")
STATUS_TIMEOUT_S = 5.0


def status_of(op: Operation, *, with_result: bool = True) -> DeferredOperationStatus:
    """The registry's view of an operation, in ``deferred-operation-status.v1``; a
    control answer (cancel) leaves the result out: it is no private-payload channel."""
    raw = msgspec.UNSET if op.result is None else msgspec.msgpack.decode(op.result)
    if not with_result and raw is not msgspec.UNSET:
        # A completed status must carry a result: the summary, references only.
        raw = result_summary(raw) if op.status == "completed" else msgspec.UNSET
    return DeferredOperationStatus(
        operation_id=op.operation_id,
        operation_kind=op.operation_kind,
        status=op.status,  # type: ignore[arg-type]  # the registry's CHECK keeps it valid
        retry_after_seconds=whole_seconds(op.retry_after_s) if op.open else msgspec.UNSET,
        expires_at=rfc3339(op.expires_at),
        updated_at=rfc3339(op.updated_at),
        result=raw,
        extensions={EXT_ATTEMPT_NO: op.attempts},
        diagnostics=(
            [Diagnostic(code=op.last_code, message=op.last_diagnostic or "")]
            if op.last_code is not None
            else []
        ),
    )


def summary_of(op: Operation) -> OperationSummary:
    return OperationSummary(
        operation_id=op.operation_id,
        owner_module_id=op.owner_module_id,
        capability_id=op.capability_id,
        action_id=op.action_id,
        status=op.status,  # type: ignore[arg-type]
        created_at=rfc3339(op.created_at),
        expires_at=rfc3339(op.expires_at),
        next_poll_at=rfc3339(op.next_poll_at) if op.next_poll_at is not None else None,
        attempts=op.attempts,
        last_diagnostic=(
            f"{op.last_code}: {op.last_diagnostic}" if op.last_code else op.last_diagnostic
        ),
        cancel_unavailable_reason=op.cancel_unavailable_reason,
    )


class OperationsView:
    def __init__(
        self,
        registry: Registry,
        connector: RpcClient,
        sigterm_grace_s: float,
        final_poll_grace_s: float,
    ) -> None:
        self.registry = registry
        self.final_poll_grace_s = final_poll_grace_s
        self.connector = connector
        # A running job's cancel waits out its SIGTERM grace before the SIGKILL.
        self.cancel_timeout_s = sigterm_grace_s + 5
        self._delivering: set[asyncio.Task[bool]] = set()
        # False once the connector refused ConnectorStatusBatch (an older one).
        self.batch_seam = True

    def __repr__(self) -> str:
        return f"<OperationsView {self.registry!r}>"

    async def status(self, operation_id: str, refresh: bool) -> DeferredOperationStatus:
        op = await asyncio.to_thread(self.registry.require, operation_id)
        if op.open and time.time() >= op.expires_at:
            # The poller may be down: a status read still never shows a live operation
            # long past its expiry, nor ends one whose job holds its result.
            return await self._final_poll(op, refresh)
        if not op.open or not refresh:
            return status_of(op)
        return await self._ask_connector(op)

    async def statuses(
        self, ops: list[Operation], refresh: bool
    ) -> dict[str, DeferredOperationStatus | CodedError]:
        """``status`` of each; the open ones a refresh asks about go to the connector in
        one message (one at a time to a connector that predates the batch)."""
        answers: dict[str, DeferredOperationStatus | CodedError] = {}
        ask: list[Operation] = []
        now = time.time()
        for op in ops:
            if op.open and now >= op.expires_at:
                try:
                    answers[op.operation_id] = await self._final_poll(op, refresh)
                except CodedError as exc:
                    answers[op.operation_id] = exc
            elif not op.open or not refresh:
                answers[op.operation_id] = status_of(op)
            else:
                ask.append(op)
        if not ask:
            return answers
        if self.batch_seam:
            try:
                got = await self.connector.call(
                    ConnectorStatusBatch(
                        request_id=new_request_id(), operation_ids=[op.operation_id for op in ask]
                    ),
                    ConnectorStatuses,
                    STATUS_TIMEOUT_S,
                )
            except CodedError as exc:
                if exc.code != RuntimeErrorCode.REQUEST_MALFORMED:
                    answers.update((op.operation_id, exc) for op in ask)
                    return answers
                self.batch_seam = False
            else:
                if len(got.statuses) == len(ask):
                    for op, answer in zip(ask, got.statuses, strict=True):
                        answers[op.operation_id] = self._host_view(op, answer)
                    return answers
        for op in ask:
            try:
                answers[op.operation_id] = await self._ask_connector(op)
            except CodedError as exc:
                answers[op.operation_id] = exc
        return answers

    async def _ask_connector(self, op: Operation) -> DeferredOperationStatus:
        answer = await self.connector.call(
            ConnectorStatus(request_id=new_request_id(), operation_id=op.operation_id),
            DeferredOperationStatus,
            STATUS_TIMEOUT_S,
        )
        return self._host_view(op, answer)

    @staticmethod
    def _host_view(op: Operation, answer: DeferredOperationStatus) -> DeferredOperationStatus:
        # The connector's view, under the host's id, kind and expiry.
        return msgspec.structs.replace(
            answer,
            operation_id=op.operation_id,
            operation_kind=op.operation_kind,
            expires_at=rfc3339(op.expires_at),
            extensions={
                **(answer.extensions if isinstance(answer.extensions, dict) else {}),
                EXT_ATTEMPT_NO: op.attempts,
            },
        )

    async def _final_poll(self, op: Operation, refresh: bool) -> DeferredOperationStatus:
        """Past expiry: ask the connector once more and record what it says (its
        terminal result, or ``expired`` if the job is still open). Unanswered, the
        operation stays open until ``deferred.final_poll_grace_s`` has passed too."""
        answer: DeferredOperationStatus | CodedError
        try:
            answer = await self._ask_connector(op)
        except CodedError as exc:
            answer = exc
        if isinstance(answer, CodedError) and time.time() < op.expires_at + self.final_poll_grace_s:
            if refresh:
                raise answer  # the poller notes it and tries again
            return status_of(op)
        settled = await asyncio.to_thread(
            polling.apply,
            self.registry,
            op,
            None,
            answer,
            time.time(),
            self.final_poll_grace_s,
        )
        if settled.changed:
            log.info(
                "operation.settled",
                status=settled.operation.status,
                by="final-poll",
                **{"operation/id": op.operation_id},
            )
        return status_of(settled.operation)

    async def cancel(self, operation_id: str) -> DeferredOperationStatus:
        settled = await asyncio.to_thread(self.registry.cancel, operation_id, time.time())
        op = settled.operation
        if settled.changed:
            log.info("operation.cancelled", **{"operation/id": operation_id})
        if op.connector_cancel == "owed":
            # The host's cancel is final now; the job hears of it in the background (a
            # job ignoring SIGTERM takes its whole grace), and the poller retries it.
            task = asyncio.create_task(self.deliver_cancel(op))
            self._delivering.add(task)
            task.add_done_callback(self._delivering.discard)
        return status_of(op, with_result=False)

    async def deliver_cancel(self, op: Operation) -> bool:
        """Tell the connector's job; False (and still owed) when it cannot be reached."""
        try:
            answer = await self.connector.call(
                ConnectorCancel(request_id=new_request_id(), operation_id=op.operation_id),
                DeferredOperationStatus,
                self.cancel_timeout_s,
            )
        except CodedError as exc:
            log.warning(
                "operation.cancel.owed",
                code=exc.code,
                note="the poller delivers it when the connector answers",
                **{"operation/id": op.operation_id},
            )
            return False
        note = None
        if answer.status not in ("cancelled", "unknown"):
            note = f"the connector's job had already ended {answer.status} when the cancel came"
        await asyncio.to_thread(self.registry.cancel_delivered, op.operation_id, note)
        return True

    async def list(
        self, limit: int, open_only: bool, visible_to: tuple[str, frozenset[str]] | None = None
    ) -> OperationList:
        """The newest operations (``visible_to``: only those a client may see)."""
        ops = await asyncio.to_thread(
            self.registry.recent, limit, open_only=open_only, visible_to=visible_to
        )
        return OperationList(operations=[summary_of(op) for op in ops])
