"""What ``Client`` and ``AsyncClient`` share for deferred work: naming operations,
deadlines, the pacing of a waiter, and flow documents."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import msgspec

from sensorium.client.endpoint import CONTROL_TIMEOUT_S, reply_wait_s
from sensorium.client.errors import DeadlineExceeded, FlowInvalid
from sensorium.shared.clock import rfc3339
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.wire.deferred import DeferredOperation, DeferredOperationStatus
from sensorium.shared.wire.flow import FlowDefinition, FlowStatus

# An async invoke's reply: core waits up to 10 s for the connector to persist the job
# and acknowledge it, then registers the operation.
ASYNC_ACK_TIMEOUT_S = 15.0
# How a waiter paces its status reads: the host's retry hint, clamped to this range.
MIN_PAUSE_S = 0.2
MAX_PAUSE_S = 2.0
FLOW_ENDED = frozenset({"completed", "failed"})

# What names an operation: its handle, a status of it, or its bare id.
OperationRef = DeferredOperation | DeferredOperationStatus | str
# A wait's end: seconds from now, or an aware datetime.
Deadline = float | datetime


def timestamp(value: str | datetime | None) -> str | None:
    """An RFC 3339 timestamp for the wire; a datetime must be aware."""
    if value is None or isinstance(value, str):
        return value
    if value.tzinfo is None:
        raise ValueError(
            "deadline_at needs an aware datetime (with tzinfo), e.g. datetime.now(UTC)"
        )
    return rfc3339(value.timestamp())


def operation_id_of(op: OperationRef) -> str:
    """The ``operation/id`` of a handle, a status, or an id given as is."""
    if isinstance(op, str):
        if not op:
            raise ValueError("an operation id cannot be empty; `sensorium ops list` shows them")
        return op
    return op.operation_id


def seconds_until(deadline: Deadline) -> float:
    """Seconds from now to ``deadline`` (never negative)."""
    if isinstance(deadline, datetime):
        if deadline.tzinfo is None:
            raise ValueError(
                "deadline needs an aware datetime (with tzinfo) or seconds from now as a number"
            )
        return max(0.0, deadline.timestamp() - time.time())
    if isinstance(deadline, bool) or not isinstance(deadline, int | float):
        raise TypeError(f"deadline is seconds from now or an aware datetime, not {deadline!r}")
    return max(0.0, float(deadline))


def pause_s(retry_after_seconds: int | None, left_s: float) -> float:
    """How long a waiter sleeps before its next status read: the host's hint clamped to
    [0.2, 2] s, never past the deadline."""
    hint = float(retry_after_seconds) if retry_after_seconds else 1.0
    return max(0.0, min(max(MIN_PAUSE_S, min(hint, MAX_PAUSE_S)), left_s))


def read_timeout_s(left_s: float) -> float:
    """One status read's reply wait: the time left, within [0.2, CONTROL_TIMEOUT_S]."""
    return max(MIN_PAUSE_S, min(left_s, CONTROL_TIMEOUT_S))


def flow_definition(definition: FlowDefinition | Mapping[str, Any]) -> FlowDefinition:
    """A ``sensorium-flow.v1`` document as a ``FlowDefinition``; a dict that is not one
    raises ``FlowInvalid`` with the path of the first problem (as core would name it)."""
    if isinstance(definition, FlowDefinition):
        return definition
    if not isinstance(definition, Mapping):
        raise FlowInvalid(
            RuntimeErrorCode.FLOW_INVALID,
            f"a flow is a sensorium-flow.v1 object, not {type(definition).__name__}",
            path="$.flow",
        )
    try:
        return msgspec.convert(dict(definition), FlowDefinition)
    except msgspec.ValidationError as exc:
        message, _, where = str(exc).rpartition(" - at `")
        path = "$.flow" + where.rstrip("`")[1:] if where.startswith("$") else "$.flow"
        raise FlowInvalid(
            RuntimeErrorCode.FLOW_INVALID,
            f"not a sensorium-flow.v1 document: {message or exc}",
            path=path,
        ) from None


def flow_reply_wait_s(definition: FlowDefinition, max_timeouts: Mapping[str, int | None]) -> float:
    """How long ``run_flow`` waits for its reply: core runs the steps up to the first
    one that defers, so each step's own budget, added up."""
    total = 0.0
    for step in definition.steps:
        if step.mode == "async":
            total += ASYNC_ACK_TIMEOUT_S
        else:
            total += reply_wait_s(step.timeout_ms, max_timeouts.get(step.action_id))
    return total


def operation_deadline(operation_id: str, last: DeferredOperationStatus | None) -> DeadlineExceeded:
    where = (
        f"still {last.status} (expires {last.expires_at})" if last is not None else "not yet read"
    )
    return DeadlineExceeded(
        RuntimeErrorCode.DEADLINE_EXCEEDED,
        f"{operation_id} is {where} at the caller's deadline; it goes on under the host's "
        f"policy: wait again, or `sensorium ops cancel {operation_id}`",
        last=last,
    )


def flow_deadline(flow_id: str, last: FlowStatus | None) -> DeadlineExceeded:
    where = (
        f"still {last.state} at step {last.step_index + 1}/{last.steps}"
        if last is not None
        else "not yet read"
    )
    return DeadlineExceeded(
        RuntimeErrorCode.DEADLINE_EXCEEDED,
        f"flow {flow_id} is {where} at the caller's deadline; it goes on: wait again, or "
        f"`sensorium flow status {flow_id}`",
        last=last,
    )


def flow_retry_hint(status: FlowStatus) -> int | None:
    return status.deferred.retry_after_seconds if status.deferred is not None else None
