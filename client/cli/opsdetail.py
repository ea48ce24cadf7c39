"""What ``sensorium ops show`` may print of an operation: every registry field, with
the private parts (its result, a flow's continuation) reduced to digests and shapes."""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from sensorium.shared.canonical import canonical_json
from sensorium.shared.clock import rfc3339
from sensorium.shared.deferred.registry import Operation, Registry
from sensorium.shared.wire.continuation import Continuation


def status_text(op: Operation, now: float) -> str:
    """The status as an operator should read it: the registry's word, qualified."""
    text = op.status
    if op.open and now >= op.expires_at:
        text += " (expired, not yet recorded)"
    elif op.open and not op.admitted:
        text += " (not yet confirmed by the connector)"
    if op.connector_cancel == "owed":
        text += " (connector cancel owed)"
    return text


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _ts(value: float | None) -> str | None:
    return None if value is None else rfc3339(value)


def result_summary(result: bytes | None) -> dict[str, Any] | None:
    """What an operator may see of a result: its top-level status, exit code, outcome id,
    size and digest (of its canonical JSON) — never the payload."""
    if result is None:
        return None
    try:
        value = msgspec.msgpack.decode(result)
    except msgspec.DecodeError:
        return {"bytes": len(result), "digest": digest(result)}
    try:
        canonical = canonical_json(value)
    except Exception:  # not JSON-representable (rfc8785 refuses it): digest what is stored
        canonical = result
    summary: dict[str, Any] = {"bytes": len(canonical), "digest": digest(canonical)}
    if isinstance(value, dict):
        for key in ("status", "exit_code", "outcome/id"):
            if key in value:
                summary[key] = value[key]
    return summary


def continuation_summary(registry: Registry, operation_id: str) -> dict[str, Any] | None:
    """The redacted read model of a flow's continuation: ids, resume point, caller, the
    context's keys (never its values) and the digest of the whole private value."""
    found = registry.flows.continuation_of(operation_id)
    if found is None:
        return None
    body, body_digest, resumed_at = found
    view: dict[str, Any] = {"digest": body_digest, "resumed_at": _ts(resumed_at)}
    try:
        c = msgspec.json.decode(body, type=Continuation)
    except msgspec.DecodeError as exc:
        view["unreadable"] = f"not an orbiplex-continuation.v1 this CLI knows: {exc!s:.200}"
        return view
    view.update(
        {
            "continuation_id": c.continuation_id,
            "workflow_run_id": c.workflow_run_id,
            "step_id": c.step_id,
            "resume_kind": c.resume_kind,
            "resume_point": msgspec.to_builtins(c.resume_point),
            "caller": msgspec.to_builtins(c.caller),
            "capability_id": c.capability_id,
            "context_keys": sorted(c.context),
            "deadline_at": c.deadline_at,
            "attempts": c.attempts,
        }
    )
    return view


def detail(registry: Registry, op: Operation, now: float) -> dict[str, Any]:
    """Every registry field of an operation, private parts redacted."""
    last = None
    if op.last_code is not None or op.last_diagnostic is not None:
        message = op.last_diagnostic or ""
        last = {"code": op.last_code, "message": message, "digest": digest(message.encode())}
    return {
        "operation/id": op.operation_id,
        "operation/kind": op.operation_kind,
        "status": op.status,
        "status_note": status_text(op, now),
        "owner_module_id": op.owner_module_id,
        "capability_id": op.capability_id,
        "action_id": op.action_id,
        "directive/id": op.directive_id,
        "correlation/id": op.correlation_id,
        "idempotency/key": op.idempotency_key,
        "admitted": op.admitted,
        "created_at": _ts(op.created_at),
        "updated_at": _ts(op.updated_at),
        "expires_at": _ts(op.expires_at),
        "deadline_at": _ts(op.deadline_at),
        "retry_after_seconds": op.retry_after_s,
        "next_poll_at": _ts(op.next_poll_at),
        "attempts": op.attempts,
        "max_attempts": op.max_attempts,
        "lease_owner": op.lease_owner,
        "lease_until": _ts(op.lease_until),
        "cancel_href": op.cancel_href,
        "cancel/unavailable-reason": op.cancel_unavailable_reason,
        "connector_cancel": op.connector_cancel,
        "audit/outcome-ref": op.audit_outcome_ref,
        "last_diagnostic": last,
        # Polls that got no answer: the operation's history, never its final status.
        "attempt_notes": [
            {"at": _ts(n.at), "after_attempt": n.attempt, "code": n.code, "message": n.message}
            for n in registry.notes(op.operation_id)
        ],
        "result": result_summary(op.result),
        "continuation": continuation_summary(registry, op.operation_id),
    }
