"""The audit records a sync directive leaves: its dispatch intent, its outcome, or the
refusal or in-doubt end that took the outcome's place (``core/audit.py`` stores them)."""

from __future__ import annotations

import msgspec
import structlog

from sensorium.core import observations
from sensorium.core.admission import shorten
from sensorium.core.audit import AuditRecord, Dispatch
from sensorium.core.keyspace import params_digest
from sensorium.core.outcomes import Dispatched, executed, refused, row
from sensorium.shared.clock import rfc3339
from sensorium.shared.diagnostics import RuntimeErrorCode
from sensorium.shared.errors import CodedError
from sensorium.shared.ids import new_id
from sensorium.shared.wire.audit import OutcomeRecord
from sensorium.shared.wire.client_api import Invoke
from sensorium.shared.wire.directive import Directive
from sensorium.shared.wire.observation import Observation
from sensorium.shared.wire.outcome import Accounting, Outcome

log = structlog.get_logger("sensorium.core")
_encoder = msgspec.msgpack.Encoder()


def dispatch_intent(
    d: Directive, seam_request_id: str, core_instance: str, connector_instance: str | None = None
) -> Dispatch:
    return Dispatch(
        directive_id=d.directive_id,
        idempotency_key=d.idempotency_key,
        action_id=d.action_id,
        correlation_id=d.correlation_id,
        seam_request_id=seam_request_id,
        core_instance=core_instance,
        dispatched_at=rfc3339(),
        connector_instance=connector_instance,
        params_digest=params_digest(d),
    )


def outcome_record(
    req: Invoke, outcome: Outcome, found: list[Observation], at: Dispatched
) -> tuple[AuditRecord, OutcomeRecord]:
    """The journal's outcome row, with the directive's published outcome record; and
    that record as built (what the caller's answer is read off)."""
    d = req.directive
    ids = [o.observation_id for o in found]
    published = executed(d, outcome, ids, at)
    return AuditRecord(
        outcome=row(published),
        observations=tuple(observations.rows(found)),
        record_id=outcome.outcome_id,
        kind="outcome",
        directive_id=d.directive_id,
        action_id=d.action_id,
        status=outcome.status,
        code=outcome.diagnostics[0].code if outcome.diagnostics else None,
        request_id=req.request_id,
        idempotency_key=d.idempotency_key,
        recorded_at=rfc3339(),
        body=_encoder.encode(outcome),
        accounting=outcome.accounting if isinstance(outcome.accounting, Accounting) else None,
    ), published


def refusal(
    req: Invoke,
    kind: str,
    exc: CodedError,
    *,
    settles: bool = False,
    at: Dispatched | None = None,
    record_id: str | None = None,
) -> AuditRecord:
    """A refusal (``rejection``: nothing ran) or an in-doubt end (``unknown``), logged,
    with the directive's published outcome record (same id: the receipt; ``record_id``
    when the receipt was given out already).

    ``settles``: it ends this attempt's dispatch. A refusal before dispatch must not: a
    retry that reuses the directive would otherwise close an earlier attempt's intent
    as "nothing ran".
    """
    d = req.directive
    body = {
        "code": exc.code,
        "message": exc.message,
        "path": exc.path,
        "directive/id": d.directive_id,
        "action_id": d.action_id,
    }
    rid = record_id if record_id is not None else new_id()
    log.info(
        "directive.rejected" if kind == "rejection" else "directive.in_doubt",
        action_id=shorten(d.action_id, 128),
        code=exc.code,
        path=exc.path,
        receipt=f"outcome:{rid}",
        **{"directive/id": d.directive_id},
    )
    return AuditRecord(
        record_id=rid,
        kind=kind,
        directive_id=d.directive_id,
        action_id=shorten(d.action_id, 128),
        status="rejected" if kind == "rejection" else "unknown",
        code=exc.code,
        request_id=req.request_id,
        idempotency_key=d.idempotency_key,
        recorded_at=rfc3339(),
        body=_encoder.encode(body),
        settles=settles,
        outcome=row(refused(d, exc, rid, in_doubt=kind != "rejection", at=at)),
    )


def in_doubt(exc: CodedError) -> bool:
    """Did the directive reach the connector before this went wrong?"""
    return (
        exc.code
        in (
            RuntimeErrorCode.REPLY_TIMEOUT,
            RuntimeErrorCode.REPLY_MALFORMED,
            RuntimeErrorCode.INTERNAL,
            RuntimeErrorCode.OUTCOME_IN_DOUBT,
        )
        or exc.detail.get("in_flight") == "true"
    )
