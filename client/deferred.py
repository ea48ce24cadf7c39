"""What ``Client`` and ``AsyncClient`` share: naming operations, deadlines, the pacing
of a waiter, flow documents, and the retry rules of an invoke."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import msgspec

from sensorium.client.endpoint import CONTROL_TIMEOUT_S, reply_wait_s
from sensorium.client.errors import DeadlineExceeded, FlowInvalid, Retryable, SensoriumError
from sensorium.shared.clock import parse_rfc3339, rfc3339
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.ids import new_id
from sensorium.shared.wire.client_api import OperationStatusRequest, OperationWait
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


def pause_s(retry_after_seconds: int | msgspec.UnsetType | None, left_s: float) -> float:
    """How long a waiter sleeps before its next status read: the host's hint clamped to
    [0.2, 2] s, never past the deadline."""
    hint = float(retry_after_seconds) if retry_after_seconds else 1.0
    return max(0.0, min(max(MIN_PAUSE_S, min(hint, MAX_PAUSE_S)), left_s))


# How long one held read (``sensorium.operation.wait``) may wait at the node.
HELD_READ_S = 10.0


class StatusReads:
    """How a ``wait`` reads: held at the node (``OperationWait``: answered when the job
    ends) where the node knows the method, else a plain status read and a sleep paced
    by the host's hint, as nodes before it required. One per client."""

    def __init__(self) -> None:
        self.held = True

    def request(
        self, operation_id: str, include_result: bool, left_s: float
    ) -> tuple[OperationWait | OperationStatusRequest, float]:
        """The next read and its reply wait."""
        if self.held:
            hold_s = max(0.0, min(left_s, HELD_READ_S))
            req = OperationWait(
                request_id=new_id(),
                operation_id=operation_id,
                include_result=include_result,
                wait_ms=int(hold_s * 1000),
            )
            return req, hold_s + CONTROL_TIMEOUT_S
        plain = OperationStatusRequest(
            request_id=new_id(), operation_id=operation_id, include_result=include_result
        )
        return plain, read_timeout_s(left_s)

    def refused(self, exc: SensoriumError) -> bool:
        """True when ``exc`` says the node predates held reads (then read plainly)."""
        if self.held and exc.code == RuntimeErrorCode.REQUEST_MALFORMED:
            self.held = False
            return True
        return False

    def pause(self, status: DeferredOperationStatus, took_s: float, left_s: float) -> float:
        """Seconds to sleep before the next read: none after a read the node held (it
        answered because the wait ran out), the hint's pacing otherwise (and after a
        held read answered early, say by a node that is stopping)."""
        if self.held and took_s >= HELD_READ_S / 2:
            return 0.0
        return pause_s(status.retry_after_seconds, left_s)


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


# -- retries of an invoke (Lazy Pirate) -----------------------------------------

# Retries when the caller gives an idempotency/key and no count.
DEFAULT_RETRIES = 3
# The pause before a retry: the error's retry_after_ms, doubled for each retry already
# made (a restart takes longer than one hint), clamped to this range, with ±20 % jitter
# so clients cut off together do not come back together.
MIN_RETRY_PAUSE_S = 0.05
MAX_RETRY_PAUSE_S = 2.0
RETRY_JITTER = 0.2
# When an error carries no hint.
DEFAULT_RETRY_AFTER_S = 0.5


def retry_plan(retries: int | None, idempotency_key: str | None) -> tuple[int, str | None]:
    """How often an invoke may be sent again, and the key that makes that safe.

    ``None`` means 3 when the caller gave an ``idempotency_key``, else 0: a directive
    without a key is never re-sent behind the caller's back. Retries asked for without
    a key get a fresh ULID as key, so core sees every attempt as the same directive
    (joins the one in flight, answers the recorded outcome, or says it is in doubt)
    and never runs it twice.
    """
    if retries is None:
        retries = DEFAULT_RETRIES if idempotency_key is not None else 0
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries is a count >= 0 (or None for the default), not {retries!r}")
    if retries > 0 and idempotency_key is None:
        idempotency_key = new_id()
    return retries, idempotency_key


def retry_pause_s(exc: SensoriumError, retried: int = 0) -> float:
    """The error's ``retry_after_ms`` × 2^``retried``, clamped to [0.05, 2] s, jittered."""
    hint = exc.retry_after_ms / 1000 if exc.retry_after_ms else DEFAULT_RETRY_AFTER_S
    jittered = hint * 2.0**retried * random.uniform(1 - RETRY_JITTER, 1 + RETRY_JITTER)
    return min(max(jittered, MIN_RETRY_PAUSE_S), MAX_RETRY_PAUSE_S)


class Retrier:
    """After a failed attempt, whether to send the same directive again, and when.

    Only ``Retryable`` errors are retried (``InDoubt``, refusals and protocol errors
    are final), at most ``retries`` times, and never past the directive's
    ``deadline_at``: a pause that would end after it ends the invoke instead. The
    final error carries ``detail["attempts"]`` and ``detail["idempotency/key"]`` (the
    key to retry with later, also when the client made it up).
    """

    def __init__(self, retries: int, idempotency_key: str | None, deadline_at: str | None) -> None:
        self.retries = retries
        self.attempts = 1
        self._key = idempotency_key
        self._deadline: float | None = None
        if deadline_at is not None:
            try:
                self._deadline = parse_rfc3339(deadline_at)
            except ValueError:
                pass  # core refuses a malformed deadline itself, with the path

    def __repr__(self) -> str:
        return f"<Retrier attempts={self.attempts}/{self.retries + 1}>"

    def pause_s(self, exc: SensoriumError) -> float | None:
        """Seconds to wait before the next attempt, or None: raise ``exc`` as final."""
        pause = retry_pause_s(exc, self.attempts - 1)
        if (
            not isinstance(exc, Retryable)
            or self.attempts > self.retries
            or (self._deadline is not None and time.time() + pause >= self._deadline)
        ):
            if self.retries > 0:
                exc.detail = {**exc.detail, "attempts": str(self.attempts)}
                if self._key is not None:
                    exc.detail["idempotency/key"] = self._key
            return None
        self.attempts += 1
        return pause
