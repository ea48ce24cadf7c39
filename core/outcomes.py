"""The published documents a directive leaves: its ``sensorium-directive-outcome.v1``
audit record and the ``sensorium-directive-result.v1`` its caller is answered.

Both are built from what core knows at that moment — the connector's execution report
(``Outcome``), a refusal, a deferral, or the registry's end of a deferred operation —
and the result is always read off the record, so the two cannot disagree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import UnsetType

from sensorium.core.authenticity import signature_digest
from sensorium.core.outcomes_sql import OutcomeRow
from sensorium.shared.clock import parse_rfc3339, rfc3339
from sensorium.shared.deferred.registry import Operation
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.wire.audit import (
    CONNECTOR_KIND,
    AllowlistRef,
    AuditStoreRef,
    Decision,
    OutcomeRecord,
    PolicyDecision,
    present,
)
from sensorium.shared.wire.deferred import DeferredOperation
from sensorium.shared.wire.directive import ARTIFACT_ID_PATTERN, ArtifactRef, Directive
from sensorium.shared.wire.outcome import Diagnostic, Outcome
from sensorium.shared.wire.result import (
    DirectiveResult,
    ResultDiagnostic,
    ResultStatus,
    published_status,
)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(OutcomeRecord)
_execution = msgspec.msgpack.Decoder(Outcome)
_ARTIFACT_ID = re.compile(ARTIFACT_ID_PATTERN)
_ROLES = frozenset({"stdout", "stderr", "produced-file", "raw-capture"})
# A structured result larger than this (encoded) is not repeated beside the report.
RESULT_INLINE_MAX = 32 * 1024

# Refusals that are about the node's availability, or that leave the directive in
# doubt, are not admission decisions: the caller gets the error envelope (with the
# outcome/id) and may retry. Every other refusal is a ``rejected`` result.
NOT_REJECTIONS = frozenset(
    {
        RuntimeErrorCode.CONNECTOR_UNAVAILABLE,
        RuntimeErrorCode.CORE_UNAVAILABLE,
        RuntimeErrorCode.OVERLOADED,
        RuntimeErrorCode.SHUTTING_DOWN,
        RuntimeErrorCode.STORAGE_UNAVAILABLE,
        RuntimeErrorCode.CATALOG_STALE,
        RuntimeErrorCode.REPLY_TIMEOUT,
        RuntimeErrorCode.REPLY_MALFORMED,
        RuntimeErrorCode.INTERNAL,
        RuntimeErrorCode.OUTCOME_IN_DOUBT,
    }
)
# A deferred operation's end, in the published vocabulary, and the policy's word for it.
_ENDS: dict[str, tuple[ResultStatus, Decision]] = {
    "completed": ("completed", "admit"),
    "failed": ("failed", "fail"),
    "timed-out": ("timed_out", "timeout"),
    "expired": ("timed_out", "timeout"),
    "cancelled": ("failed", "fail"),
    "unknown": ("failed", "fail"),
}
_DECISIONS: dict[str, Decision] = {
    "completed": "admit",
    "failed": "fail",
    "timed_out": "timeout",
    "rejected": "reject",
    "admitted": "admit",
}


def is_rejection(exc: CodedError) -> bool:
    """Is this refusal the directive's ``rejected`` answer (rather than an error)?"""
    return exc.code not in NOT_REJECTIONS and exc.detail.get("in_flight") != "true"


def receipted(exc: CodedError, outcome_id: str) -> CodedError:
    """``exc`` naming the outcome record it left (``detail["outcome/id"]``)."""
    if exc.detail.get("outcome/id") == outcome_id:
        return exc
    return CodedError(
        exc.code,
        exc.message,
        path=exc.path,
        retry_after_ms=exc.retry_after_ms,
        detail={**exc.detail, "outcome/id": outcome_id},
    )


@dataclass(frozen=True)
class Dispatched:
    """Where and when an admitted directive went (absent for one refused before)."""

    connector_id: str
    allowlist: AllowlistRef | None = None
    dispatched_at: str | None = None
    responded_at: str | None = None


def _diagnostic(
    code: str,
    message: str,
    path: str | None,
    *,
    retryable: bool = False,
    level: str = "error",
    detail: dict[str, str] | None = None,
) -> ResultDiagnostic:
    return ResultDiagnostic(
        detail=present({k: v for k, v in (detail or {}).items() if k != "outcome/id"} or None),
        level="warn" if level == "warn" else "info" if level == "info" else "error",
        kind=code,
        code=code,
        message=message,
        retryable=retryable,
        path=present(path),
    )


def _from_diagnostics(found: list[Diagnostic], status: str) -> list[ResultDiagnostic]:
    level = "warn" if status == "completed" else "error"
    return [_diagnostic(d.code, d.message, d.path, level=level) for d in found]


def artifacts(outcome: Outcome) -> list[ArtifactRef]:
    """The execution's artifact references in the artifact-lane shape (ids it cannot
    name as ``sha256:``/``memarium-blob:`` are left to the execution report)."""
    return [
        ArtifactRef(
            artifact_id=ref.id,
            role=ref.role if ref.role in _ROLES else "produced-file",  # type: ignore[arg-type]
            media_type=ref.media_type,
            size_bytes=ref.size,
        )
        for ref in outcome.artifact_refs
        if _ARTIFACT_ID.match(ref.id)
    ]


def _base(d: Directive, outcome_id: str, status: ResultStatus) -> dict[str, Any]:
    return {
        "schema": "sensorium-directive-outcome.v1",
        "schema_v": 1,
        "outcome_id": outcome_id,
        "directive_id": d.directive_id,
        "correlation_id": present(d.correlation_id),
        "status": status,
        "recorded_at": rfc3339(),
        "directive_issued_at": d.directive_issued_at,
        "issuer": d.issuer,
        "action_id": d.action_id,
        "issuer_delegation": present(d.issuer_delegation),
        "signature_digest": present(signature_digest(d)),
        "audit_store": AuditStoreRef(record_id=outcome_id),
    }


def _connector(at: Dispatched | None) -> dict[str, Any]:
    if at is None:
        return {}
    return {
        "connector_id": at.connector_id,
        "connector_kind": CONNECTOR_KIND,
        "allowlist_ref": present(at.allowlist),
        "connector_dispatched_at": present(at.dispatched_at),
        "connector_responded_at": present(at.responded_at),
    }


def executed(
    d: Directive, outcome: Outcome, observation_ids: list[str], at: Dispatched
) -> OutcomeRecord:
    """The record of a sync directive the connector ran (or reported on)."""
    status = published_status(outcome.status)
    first = outcome.diagnostics[0] if outcome.diagnostics else None
    started = _time(outcome.started_at)
    return OutcomeRecord(
        **_base(d, outcome.outcome_id, status),
        **_connector(at),
        started_at=outcome.started_at,
        completed_at=present(rfc3339(started + outcome.duration_ms / 1000) if started else None),
        duration_ms=max(0, round(outcome.duration_ms)),
        policy_decision=PolicyDecision(
            decision=_DECISIONS[status],
            reason=present(f"{first.code}: {first.message}"[:500] if first else None),
        ),
        retry_attempts=1,
        result_summary=summary(outcome),
        observation_ids=observation_ids,
        artifacts=artifacts(outcome),
        diagnostics=_from_diagnostics(outcome.diagnostics, status),
        signatures=outcome.signatures,
        accounting=outcome.accounting,
    )


def refused(
    d: Directive,
    exc: CodedError,
    outcome_id: str,
    *,
    in_doubt: bool = False,
    at: Dispatched | None = None,
) -> OutcomeRecord:
    """A refusal's record: ``rejected`` when nothing ran; an attempt that may have run
    but whose outcome was lost is ``failed`` (``outcome-in-doubt``'s kind of code) —
    unless it became a deferred operation, which is ``admitted`` until that ends."""
    operation_id = exc.detail.get("operation/id")
    retryable = exc.retry_after_ms is not None or exc.code in NOT_REJECTIONS
    if in_doubt and operation_id:
        status: ResultStatus = "admitted"
    else:
        status = "failed" if in_doubt else "rejected"
    return OutcomeRecord(
        **_base(d, outcome_id, status),
        **_connector(at if in_doubt else None),
        policy_decision=PolicyDecision(
            decision=_DECISIONS[status], reason=exc.message[:500], retryable=retryable
        ),
        retry_attempts=1 if in_doubt else 0,
        observation_ids=[],
        artifacts=[],
        diagnostics=[
            _diagnostic(exc.code, exc.message, exc.path, retryable=retryable, detail=exc.detail)
        ],
        operation_id=present(operation_id),
    )


def admitted(
    d: Directive, handle: DeferredOperation, outcome_id: str, at: Dispatched
) -> OutcomeRecord:
    """An async directive the connector accepted: ``admitted`` until its operation ends."""
    return OutcomeRecord(
        **_base(d, outcome_id, "admitted"),
        **_connector(at),
        policy_decision=PolicyDecision(decision="admit"),
        retry_attempts=0,
        observation_ids=[],
        artifacts=[],
        operation_id=handle.operation_id,
    )


def finished(rec: OutcomeRecord, op: Operation) -> OutcomeRecord | None:
    """``rec`` (admitted) brought to its operation's end; None while it is still open."""
    end = _ENDS.get(op.status)
    if end is None:
        return None
    status, decision = end
    outcome = _execution.decode(op.result) if op.result else None
    base = msgspec.structs.replace(
        rec,
        status=status,
        recorded_at=rfc3339(),
        connector_responded_at=rfc3339(op.updated_at),
        retry_attempts=max(1, op.attempts) if outcome is not None else op.attempts,
        policy_decision=PolicyDecision(
            decision=decision,
            reason=present(
                f"{op.last_code}: {op.last_diagnostic or ''}"[:500] if op.last_code else None
            ),
        ),
    )
    if outcome is None:
        diagnostics = (
            [_diagnostic(op.last_code, op.last_diagnostic or op.status, None)]
            if op.last_code
            else []
        )
        return msgspec.structs.replace(base, diagnostics=diagnostics)
    started = _time(outcome.started_at)
    return msgspec.structs.replace(
        base,
        started_at=outcome.started_at,
        completed_at=present(rfc3339(started + outcome.duration_ms / 1000) if started else None),
        duration_ms=max(0, round(outcome.duration_ms)),
        result_summary=summary(outcome),
        artifacts=artifacts(outcome),
        diagnostics=_from_diagnostics(outcome.diagnostics, status),
    )


def summary(outcome: Outcome) -> dict[str, Any]:
    """What the audit keeps of an execution beside its references: exit, signal and
    sizes — never argv, parameters, stdout or stderr (those stay in the journal)."""
    return {
        "exit_code": outcome.exit_code,
        "signal": outcome.signal,
        "stdout_bytes": outcome.stdout.bytes_total,
        "stderr_bytes": outcome.stderr.bytes_total,
        "files_touched": len(outcome.files_touched),
        "execution/outcome-id": outcome.outcome_id,
    }


def row(rec: OutcomeRecord) -> OutcomeRow:
    return OutcomeRow(
        directive_id=rec.directive_id,
        outcome_id=rec.outcome_id,
        action_id=rec.action_id,
        status=rec.status,
        issuer=rec.issuer.name,
        operation_id=rec.operation,
        recorded_at=rec.recorded_at,
        body=_encoder.encode(rec),
    )


def decode(body: bytes) -> OutcomeRecord:
    return _decoder.decode(body)


def result(
    rec: OutcomeRecord, outcome: Outcome | None = None, deferred: DeferredOperation | None = None
) -> DirectiveResult:
    """The caller's answer, read off the directive's record (``outcome``: the execution
    report, carried whole as ``sensorium/outcome``).

    The structured result is in the report too; past ``RESULT_INLINE_MAX`` encoded bytes
    it is not repeated at the top (the reply must still fit the message the connector
    sized the report for), and an ``info`` diagnostic says where it is."""
    body = structured(outcome) if rec.status not in ("rejected", "admitted") else None
    diagnostics = list(rec.diagnostics)
    if body is not None and len(_encoder.encode(body)) > RESULT_INLINE_MAX:
        body = None
        diagnostics.append(
            _diagnostic(
                RuntimeErrorCode.RESULT_NOT_INLINED,
                f"the result is over {RESULT_INLINE_MAX} bytes: read it from "
                "sensorium/outcome.result.json",
                None,
                level="info",
            )
        )
    return DirectiveResult(
        schema="sensorium-directive-result.v1",
        schema_v=1,
        directive_id=rec.directive_id,
        correlation_id=None if isinstance(rec.correlation_id, UnsetType) else rec.correlation_id,
        status=rec.status,
        result=body,
        outcome_id=rec.outcome_id,
        observation_ids=list(rec.observation_ids),
        artifacts=list(rec.artifacts),
        diagnostics=diagnostics,
        outcome=outcome,
        deferred=deferred,
        signature_digest=rec.signature_digest,
    )


def structured(outcome: Outcome | None) -> dict[str, Any] | None:
    """The action's result per its result contract: the JSON object it printed (a
    non-object wrapped as ``{"value": …}``); None when it declares none."""
    if outcome is None or outcome.result is None:
        return None
    body = outcome.result.json
    if isinstance(body, dict):
        return body
    return None if body is None else {"value": body}


def _time(text: str) -> float | None:
    try:
        return parse_rfc3339(text)
    except ValueError:
        return None


def deduplicated(rec: OutcomeRecord, d: Directive) -> OutcomeRecord:
    """The record of ``d``, a keyed directive answered ``rec``'s outcome or handle (an
    earlier directive under the same ``idempotency/key``): nothing ran for it."""
    outcome_id = new_id()
    return msgspec.structs.replace(
        rec,
        outcome_id=outcome_id,
        directive_id=d.directive_id,
        correlation_id=present(d.correlation_id),
        directive_issued_at=d.directive_issued_at,
        issuer=d.issuer,
        issuer_delegation=present(d.issuer_delegation),
        recorded_at=rfc3339(),
        retry_attempts=0,
        audit_store=AuditStoreRef(record_id=outcome_id),
        deduplicated_from=rec.outcome_id,
    )


def rejected_result(d: Directive, exc: CodedError, outcome_id: str) -> DirectiveResult:
    """The ``rejected`` answer to a refusal recorded as ``outcome_id``."""
    return DirectiveResult(
        schema="sensorium-directive-result.v1",
        schema_v=1,
        directive_id=d.directive_id,
        correlation_id=d.correlation_id,
        status="rejected",
        outcome_id=outcome_id,
        observation_ids=[],
        diagnostics=[
            _diagnostic(
                exc.code,
                exc.message,
                exc.path,
                retryable=exc.retry_after_ms is not None,
                detail=exc.detail,
            )
        ],
    )
