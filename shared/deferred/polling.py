"""What one poll's answer does to the registry: shared by the poller and ``ops poll``.

* ``pending``/``running`` → an attempt, the next poll scheduled by the host policy
  (or ``timed-out`` when the attempts are spent);
* a final status → recorded once, resuming a waiting flow;
* ``unknown`` → terminal (seed 055: the connector no longer knows the id);
* no answer (busy, unreachable, timed out) → not an attempt, retried later;
* past its expiry: ``expired`` only once a final poll of the connector answered
  that the job is still open (or the connector stayed silent through
  ``deferred.final_poll_grace_s`` past expiry). A job that holds a terminal result ends
  with that result, however late the poll that fetched it.
"""

from __future__ import annotations

import msgspec

from sensorium.shared.deferred.registry import Operation, Registry, Settled
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.wire.deferred import OPEN_STATUSES, DeferredOperationStatus

_encoder = msgspec.msgpack.Encoder()


def apply(
    registry: Registry,
    op: Operation,
    owner: str | None,
    answer: DeferredOperationStatus | CodedError,
    now: float,
    grace_s: float,
) -> Settled:
    """Record one poll's answer. ``grace_s`` (``deferred.final_poll_grace_s``): how long
    past its expiry an operation waits for a final poll to be answered (core or the
    connector down meanwhile) before it is declared expired unheard."""
    final = isinstance(answer, DeferredOperationStatus) and answer.status not in OPEN_STATUSES
    if now >= op.expires_at and not final:
        if isinstance(answer, DeferredOperationStatus):  # the final poll: still open
            return registry.expire(op.operation_id, now)
        if now >= op.expires_at + grace_s:
            return registry.expire(
                op.operation_id,
                now,
                "no terminal result before the operation's expiry; the final poll got no "
                f"answer ({answer.code}) within {grace_s:g} s after it",
            )
    if isinstance(answer, CodedError):
        retry = answer.retry_after_ms / 1000 if answer.retry_after_ms else None
        return registry.record_busy(
            op.operation_id, owner, answer.code, answer.message[:500], retry, now
        )
    if answer.status in OPEN_STATUSES:
        return registry.record_open(
            op.operation_id, owner, answer.status, _present(answer.retry_after_seconds), now
        )
    code, message = _first_diagnostic(answer)
    if answer.status == "unknown":
        code = code or RuntimeErrorCode.OPERATION_UNKNOWN
        message = message or (
            "the connector does not know this operation"
            + ("" if op.admitted else " (core stopped before the connector accepted it)")
        )
    raw = answer.result_or_none
    result = None if raw is None else _encoder.encode(raw)
    return registry.settle(op.operation_id, answer.status, result, code, message, now)


def _first_diagnostic(answer: DeferredOperationStatus) -> tuple[str | None, str | None]:
    if answer.diagnostics:
        return answer.diagnostics[0].code, answer.diagnostics[0].message[:500]
    outcome = answer.result_or_none
    if isinstance(outcome, dict):
        diags = outcome.get("diagnostics")
        if isinstance(diags, list) and diags and isinstance(diags[0], dict):
            return str(diags[0].get("code")), str(diags[0].get("message", ""))[:500]
    return None, None


def _present(value: int | msgspec.UnsetType) -> int | None:
    return None if isinstance(value, msgspec.UnsetType) else value
