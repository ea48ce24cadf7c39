"""Deferred admission: an async directive becomes a registered ``deferred-operation.v1``.

The order makes a crash at any point harmless:

1. reserve the operation in the host registry (one transaction; with a flow's
   continuation when a flow step is deferring);
2. hand the directive to the connector, which persists its job and acknowledges;
3. confirm the reservation with the acknowledgement's hints (one transaction);
4. record the admission in the audit store, then answer.

If core dies between 1 and 3 the poller finds the unconfirmed reservation and asks
the connector, which either has the job or does not: no operation is lost and no
job runs unregistered. A connector that refuses outright leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgspec
import structlog

from sensorium.core.audit import AuditRecord, AuditStore
from sensorium.core.keyspace import check_binding, params_digest
from sensorium.core.outcomes import Dispatched, admitted, row
from sensorium.shared.clock import parse_rfc3339, rfc3339
from sensorium.shared.deferred.policy import whole_seconds
from sensorium.shared.deferred.registry import Operation, Registry, Reservation, status_href
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.rpc.client import RpcClient, new_request_id
from sensorium.shared.wire.audit import OutcomeRecord
from sensorium.shared.wire.continuation import Continuation
from sensorium.shared.wire.deferred import (
    DIRECTIVE_KIND,
    EXT_CAPABILITY_ID,
    EXT_OWNER_MODULE_ID,
    ConnectorDeferred,
    DeferredOperation,
)
from sensorium.shared.wire.directive import Directive
from sensorium.shared.wire.report import ConnectorAction
from sensorium.shared.wire.seam import ConnectorInvoke

log = structlog.get_logger("sensorium.core")
_encoder = msgspec.msgpack.Encoder()
CAPABILITY_ID = DIRECTIVE_KIND
# How long core waits for the connector to acknowledge (it persists, then answers).
ACK_TIMEOUT_S = 10.0
# Errors after which the connector may have created the job: keep the reservation.
IN_DOUBT = frozenset(
    {
        RuntimeErrorCode.REPLY_TIMEOUT,
        RuntimeErrorCode.INTERNAL,
        RuntimeErrorCode.SHUTTING_DOWN,
    }
)

ContinuationFor = Callable[[str], Continuation]


def new_operation_id() -> str:
    return f"deferred:{DIRECTIVE_KIND}:{new_id()}"


def handle(op: Operation) -> DeferredOperation:
    """The caller's handle: ids, hints, deadlines and links, nothing private."""
    return DeferredOperation(
        operation_id=op.operation_id,
        operation_kind=op.operation_kind,
        retry_after_seconds=whole_seconds(op.retry_after_s),
        created_at=rfc3339(op.created_at),
        expires_at=rfc3339(op.expires_at),
        status_href=status_href(op.operation_id),
        cancel_href=op.cancel_href if op.cancel_href is not None else msgspec.UNSET,
        cancel_unavailable_reason=(
            op.cancel_unavailable_reason
            if op.cancel_unavailable_reason is not None
            else msgspec.UNSET
        ),
        correlation_id=op.correlation_id if op.correlation_id is not None else msgspec.UNSET,
        audit_outcome_ref=(
            op.audit_outcome_ref if op.audit_outcome_ref is not None else msgspec.UNSET
        ),
        extensions={
            EXT_OWNER_MODULE_ID: op.owner_module_id,
            EXT_CAPABILITY_ID: op.capability_id,
        },
    )


class Deferrals:
    def __init__(
        self,
        registry: Registry,
        audit: AuditStore,
        connector: RpcClient,
        recorded: Callable[[OutcomeRecord], None] | None = None,
    ) -> None:
        self.registry = registry
        self.audit = audit
        self.connector = connector
        # Told each ``admitted`` outcome record once it is on disk (Answers.written).
        self._recorded = recorded

    def __repr__(self) -> str:
        return f"<Deferrals {self.registry!r}>"

    async def defer(
        self,
        d: Directive,
        request_id: str,
        decl: ConnectorAction,
        module_id: str,
        config_hash: str,
        timeout_ms: int,
        continuation: ContinuationFor | None = None,
        caller_key: str | None = None,
        at: Dispatched | None = None,
    ) -> DeferredOperation:
        """``at``: where it goes, for its ``admitted`` outcome record."""
        at = at or Dispatched(connector_id=module_id)
        if d.idempotency_key is not None:
            first = await asyncio.to_thread(self.registry.by_idempotency_key, d.idempotency_key)
            if first is not None:
                return await self._again(first, d, request_id, config_hash, timeout_ms, at)
        profile = decl.deferred_profile
        operation_id = new_operation_id()
        record_id = new_id()
        reservation = Reservation(
            operation_id=operation_id,
            operation_kind=DIRECTIVE_KIND,
            owner_module_id=module_id,
            capability_id=CAPABILITY_ID,
            directive_id=d.directive_id,
            action_id=d.action_id,
            correlation_id=d.correlation_id,
            idempotency_key=d.idempotency_key,
            deadline_at=(
                parse_rfc3339(deadline) if (deadline := d.caller_deadline_at) is not None else None
            ),
            preferred_ttl_s=_float(profile.preferred_max_ttl_seconds if profile else None),
            preferred_retry_s=_float(profile.preferred_retry_after_seconds if profile else None),
            cancel_unavailable_reason=profile.cancel_unavailable_reason if profile else None,
            audit_outcome_ref=f"outcome:{record_id}",
            confirm_within_s=ACK_TIMEOUT_S + 5,
            caller_key=caller_key,
            params_digest=params_digest(d),
        )
        op, new = await self.registry.grouped(
            self.registry.reserve,
            reservation,
            time.time(),
            continuation(operation_id) if continuation is not None else None,
        )
        if not new:
            return await self._again(op, d, request_id, config_hash, timeout_ms, at)
        return await self._submit(op, d, request_id, config_hash, timeout_ms, at, withdraw=True)

    async def _again(
        self,
        first: Operation,
        d: Directive,
        request_id: str,
        config_hash: str,
        timeout_ms: int,
        at: Dispatched,
    ) -> DeferredOperation:
        """A retry with a known ``idempotency/key``: the first attempt's handle. If that
        attempt never reached the connector (core died between reserving and sending),
        send it now, as the first directive: the connector answers per operation id, so
        a retry racing the first attempt still makes one job."""
        check_binding(d, first.action_id, first.params_digest)
        if not first.open or first.admitted:
            log.info(
                "directive.deduplicated",
                key=d.idempotency_key,
                **{"directive/id": d.directive_id, "operation/id": first.operation_id},
            )
            return handle(first)
        same = msgspec.structs.replace(d, directive_id=first.directive_id)
        return await self._submit(
            first, same, request_id, config_hash, timeout_ms, at, withdraw=False
        )

    async def _submit(
        self,
        op: Operation,
        d: Directive,
        request_id: str,
        config_hash: str,
        timeout_ms: int,
        at: Dispatched,
        *,
        withdraw: bool,
    ) -> DeferredOperation:
        operation_id = op.operation_id
        record_id = (op.audit_outcome_ref or "").removeprefix("outcome:") or new_id()
        call = ConnectorInvoke(
            request_id=new_request_id(),
            directive=d,
            timeout_ms=timeout_ms,
            config_hash=config_hash,
            operation_id=operation_id,
        )
        try:
            ack = await self.connector.call(call, ConnectorDeferred, ACK_TIMEOUT_S)
        except CodedError as exc:
            if exc.code in IN_DOUBT or exc.detail.get("in_flight") == "true":
                log.warning(
                    "directive.deferral.in_doubt",
                    code=exc.code,
                    note="reservation kept; the poller will ask the connector",
                    **{"operation/id": operation_id},
                )
                raise CodedError(
                    exc.code,
                    f"{exc.message}; the operation may have started: "
                    f"`sensorium ops show {operation_id}` will say",
                    detail={**exc.detail, "operation/id": operation_id},
                    retry_after_ms=exc.retry_after_ms,
                ) from None
            if withdraw:
                await asyncio.to_thread(self.registry.withdraw, operation_id)
            raise
        except asyncio.CancelledError:
            raise  # in doubt: the reservation stays for the poller
        early, durable = self.registry.grouped_early(
            self.registry.confirm, operation_id, ack, time.time()
        )
        # Its failure is the early future's too, or raised by the gather below.
        durable.add_done_callback(_retrieved)
        try:
            # The audit record is written while the confirmation's commit runs; the
            # caller hears once both are on disk (two fsyncs side by side, not in turn).
            deferred = handle(await early)
            published = admitted(d, deferred, record_id, at)
            record = self._deferral_record(record_id, d, request_id, deferred, published)
            await asyncio.gather(durable, self.audit.record(record))
            if self._recorded is not None:
                self._recorded(published)
        except CodedError as exc:
            # The connector has the job: this is no "nothing was done". The reservation
            # stays, so the poller learns the job's fate; a keyed retry finds it.
            raise CodedError(
                exc.code,
                f"{exc.message} — but the connector had already accepted the job: it runs "
                f"as operation {operation_id} (`sensorium ops show {operation_id}`)",
                detail={**exc.detail, "operation/id": operation_id, "in_flight": "true"},
                retry_after_ms=exc.retry_after_ms,
            ) from None
        log.info(
            "directive.deferred",
            action_id=d.action_id,
            expires_at=deferred.expires_at,
            retry_after_s=deferred.retry_after_seconds,
            receipt=deferred.audit_outcome_ref,
            **{"directive/id": d.directive_id, "operation/id": operation_id},
        )
        return deferred

    @staticmethod
    def _deferral_record(
        record_id: str,
        d: Directive,
        request_id: str,
        deferred: DeferredOperation,
        published: OutcomeRecord,
    ) -> AuditRecord:
        """The journal's deferral, with the directive's ``admitted`` outcome record
        ``published`` (the same id as the handle's ``audit/outcome-ref``)."""
        return AuditRecord(
            outcome=row(published),
            record_id=record_id,
            kind="deferral",
            directive_id=d.directive_id,
            action_id=d.action_id,
            status="deferred",
            code=None,
            request_id=request_id,
            idempotency_key=d.idempotency_key,
            recorded_at=rfc3339(),
            body=_encoder.encode(deferred),
        )


def _float(value: int | None) -> float | None:
    return None if value is None else float(value)


def _retrieved(fut: asyncio.Future[Operation]) -> None:
    if not fut.cancelled():
        fut.exception()
