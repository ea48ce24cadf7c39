"""Bounded deferred operations on the wire (seed 055, DESIGN §7).

* ``deferred-operation.v1`` — core's answer to an accepted async directive;
* ``deferred-operation-status.v1`` — a status poll's answer;
* ``sensorium-connector-deferred.v1`` — the OS connector's acknowledgement on the seam;
* the operator list of deferred operations.

Roots are closed; deployment-local metadata goes under ``extensions``. Every
document with a cancellation surface carries exactly one of ``cancel_href`` and
``cancel/unavailable-reason``: decoding one with both or neither fails, here and in
the JSON Schema (:data:`CANCEL_SURFACE`, added where schemagen defines the type).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from sensorium.shared.wire.base import Message, OpenMessage, Timestamp
from sensorium.shared.wire.outcome import Diagnostic

OperationStatus = Literal[
    "pending", "running", "completed", "failed", "timed-out", "cancelled", "expired", "unknown"
]
OPEN_STATUSES: frozenset[str] = frozenset({"pending", "running"})
TERMINAL_STATUSES: frozenset[str] = frozenset(
    {"completed", "failed", "timed-out", "cancelled", "expired", "unknown"}
)
DIRECTIVE_KIND = "sensorium.directive.invoke"

Extensions = dict[str, Any]
PositiveSeconds = Annotated[int, msgspec.Meta(ge=1)]
RetryAfterSeconds = Annotated[int, msgspec.Meta(ge=1, le=3600)]  # the published bounds
OperationId = Annotated[str, msgspec.Meta(pattern=r"^deferred:[a-z][a-z0-9.-]*:[A-Za-z0-9_-]+\Z")]
OperationKind = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9-]*(\.[a-z][a-z0-9-]*)*\Z")]

# Seed 002 recommends these; the published closed schemas have no such property, so
# they travel under ``extensions`` (the upstream contract's rule for seed fields).
EXT_OWNER_MODULE_ID = "owner_module_id"
EXT_CAPABILITY_ID = "capability_id"
EXT_ATTEMPT_NO = "attempt_no"

# Fields every handle and status carries although the Struct has a default for them
# (its constant): the published schemas require them, so the generated schemas do too.
ALWAYS_EMITTED: dict[str, list[str]] = {
    "DeferredOperation": ["schema", "schema/v", "status", "operation/kind"],
    "DeferredOperationStatus": ["schema", "schema/v", "operation/kind"],
}
# A completed status resumes its caller with ``result`` (published ``allOf``).
COMPLETED_HAS_RESULT: dict[str, Any] = {
    "allOf": [
        {
            "if": {"properties": {"status": {"const": "completed"}}, "required": ["status"]},
            "then": {"required": ["result"]},
        }
    ]
}

# The exactly-one invariant, for the JSON Schema of every document that carries it.
CANCEL_SURFACE: dict[str, Any] = {
    "oneOf": [
        {"required": ["cancel_href"], "not": {"required": ["cancel/unavailable-reason"]}},
        {"required": ["cancel/unavailable-reason"], "not": {"required": ["cancel_href"]}},
    ]
}


def cancel_surface_problem(href: object, reason: object) -> str | None:
    """Why a cancellation surface is invalid, or ``None`` when it has exactly one side."""
    has_href = href is not msgspec.UNSET and href is not None
    has_reason = reason is not msgspec.UNSET and reason is not None
    if has_href and has_reason:
        return "cancel_href and cancel/unavailable-reason are both present; exactly one may be"
    if not has_href and not has_reason:
        return "neither cancel_href nor cancel/unavailable-reason is present; exactly one must be"
    return None


class _CancelSurface(Message, frozen=True, kw_only=True):
    cancel_href: str | msgspec.UnsetType = msgspec.UNSET
    cancel_unavailable_reason: (
        Annotated[str, msgspec.Meta(min_length=1, max_length=500)] | msgspec.UnsetType
    ) = msgspec.field(name="cancel/unavailable-reason", default=msgspec.UNSET)

    def __post_init__(self) -> None:
        problem = cancel_surface_problem(self.cancel_href, self.cancel_unavailable_reason)
        if problem is not None:
            raise ValueError(problem)

    @property
    def cancelable(self) -> bool:
        return self.cancel_href is not msgspec.UNSET


class DeferredOperation(_CancelSurface, frozen=True, kw_only=True):
    """``deferred-operation.v1``: the durable handle of accepted long work.

    Only ids, hints, deadlines and links: never a parameter, a result or a piece of
    connector configuration.
    """

    schema: Literal["deferred-operation.v1"] = "deferred-operation.v1"
    schema_v: Literal[1] = msgspec.field(name="schema/v", default=1)
    status: Literal["deferred"] = "deferred"
    operation_id: OperationId = msgspec.field(name="operation/id")
    operation_kind: OperationKind = msgspec.field(name="operation/kind", default=DIRECTIVE_KIND)
    retry_after_seconds: RetryAfterSeconds
    created_at: Timestamp
    expires_at: Timestamp
    status_href: str | msgspec.UnsetType = msgspec.UNSET
    correlation_id: str | msgspec.UnsetType = msgspec.field(
        name="correlation/id", default=msgspec.UNSET
    )
    audit_outcome_ref: Annotated[str, msgspec.Meta(min_length=1)] | msgspec.UnsetType = (
        msgspec.field(name="audit/outcome-ref", default=msgspec.UNSET)
    )
    # An explicit serializable continuation context (upstream examples carry one).
    continuation: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    diagnostics: list[Diagnostic] = msgspec.field(default_factory=list)
    extensions: Extensions | msgspec.UnsetType = msgspec.UNSET

    @property
    def owner_module_id(self) -> str | None:
        return _text(_extension(self.extensions, EXT_OWNER_MODULE_ID))

    @property
    def capability_id(self) -> str | None:
        return _text(_extension(self.extensions, EXT_CAPABILITY_ID))


def _extension(extensions: Extensions | msgspec.UnsetType, key: str) -> Any:
    return None if isinstance(extensions, msgspec.UnsetType) else extensions.get(key)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


class ConnectorDeferred(_CancelSurface, frozen=True, kw_only=True):
    """``sensorium-connector-deferred.v1``: the connector has persisted and started a job.

    ``retry_after_seconds`` and ``fail_after_seconds`` are hints; the host clamps both.
    """

    schema: Literal["sensorium-connector-deferred.v1"] = "sensorium-connector-deferred.v1"
    schema_v: Literal[1] = msgspec.field(name="schema/v", default=1)
    operation_id: str = msgspec.field(name="operation/id")
    # A resubmitted id answers with its job's current status, which may be final.
    status: OperationStatus
    retry_after_seconds: PositiveSeconds | msgspec.UnsetType = msgspec.UNSET
    fail_after_seconds: PositiveSeconds | msgspec.UnsetType = msgspec.UNSET
    created_at: Timestamp
    diagnostics: list[Diagnostic] = msgspec.field(default_factory=list)
    extensions: Extensions | msgspec.UnsetType = msgspec.UNSET


class DeferredOperationStatus(Message, frozen=True, kw_only=True):
    """``deferred-operation-status.v1``; ``result`` once final (completed: required).

    What it lacks is absent, never ``null``; ``attempt_no`` (seed 002) sits under
    ``extensions``."""

    schema: Literal["deferred-operation-status.v1"] = "deferred-operation-status.v1"
    schema_v: Literal[1] = msgspec.field(name="schema/v", default=1)
    operation_id: OperationId = msgspec.field(name="operation/id")
    operation_kind: OperationKind = msgspec.field(name="operation/kind", default=DIRECTIVE_KIND)
    status: OperationStatus
    updated_at: Timestamp
    retry_after_seconds: RetryAfterSeconds | msgspec.UnsetType = msgspec.UNSET
    expires_at: Timestamp | msgspec.UnsetType = msgspec.UNSET
    result: Any = msgspec.UNSET
    diagnostics: list[Diagnostic] = msgspec.field(default_factory=list)
    extensions: Extensions | msgspec.UnsetType = msgspec.UNSET

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def attempt_no(self) -> int | None:
        value = _extension(self.extensions, EXT_ATTEMPT_NO)
        return value if isinstance(value, int) else None

    @property
    def result_or_none(self) -> Any:
        """``result``, or ``None`` when the status carries none."""
        return None if self.result is msgspec.UNSET else self.result


class OperationSummary(OpenMessage, frozen=True, kw_only=True):
    """One row of the operator view: read from the host registry alone."""

    operation_id: str = msgspec.field(name="operation/id")
    owner_module_id: str
    capability_id: str
    action_id: str | None = None
    status: OperationStatus
    created_at: Timestamp
    expires_at: Timestamp
    next_poll_at: Timestamp | None = None
    attempts: int = 0
    last_diagnostic: str | None = None
    cancel_unavailable_reason: str | None = msgspec.field(
        name="cancel/unavailable-reason", default=None
    )


class OperationList(OpenMessage, frozen=True, kw_only=True):
    operations: list[OperationSummary] = msgspec.field(default_factory=list)


class StatusEntry(OpenMessage, frozen=True, kw_only=True):
    """One operation's answer in a batch: its status, or the coded error that reading
    it alone would have raised (``code``, ``message``)."""

    operation_id: str = msgspec.field(name="operation/id")
    status: DeferredOperationStatus | None = None
    code: str | None = None
    message: str | None = None
    retry_after_ms: int | None = None


class OperationStatuses(OpenMessage, frozen=True, kw_only=True):
    """The answer to ``sensorium.operation.status-batch``: one entry per id asked, in
    the order asked."""

    entries: list[StatusEntry] = msgspec.field(default_factory=list)
