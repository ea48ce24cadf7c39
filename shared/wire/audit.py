"""``sensorium-directive-outcome.v1``: the audit record of one directive (045 §results).

Exactly one per directive, rejected ones included. Core keeps it in the audit store
(``core/audit.py``, table ``outcomes``, keyed by ``directive/id``) and never publishes
it; it is read through the restricted ``sensorium.audit.get`` and
``sensorium.audit.query``. An async directive's record is written ``admitted`` and
updated in place, same ``outcome/id``, when its deferred operation ends.

Fields this node adds are under the ``sensorium/`` prefix (the schema is open).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from sensorium.shared.wire.base import OpenMessage, Timestamp
from sensorium.shared.wire.directive import (
    ACTION_ID_PATTERN,
    ArtifactRef,
    DelegationProof,
    Issuer,
)
from sensorium.shared.wire.outcome import Accounting, SignatureGiven
from sensorium.shared.wire.result import ResultDiagnostic, ResultStatus

T = TypeVar("T")
SCHEMA_NAME = "sensorium-directive-outcome.v1"
Decision = Literal["admit", "reject", "timeout", "fail"]
AUDIT_CAPABILITY = "sensorium.audit.get"
CONNECTOR_KIND = "OS"


class AllowlistRef(OpenMessage, frozen=True, kw_only=True, omit_defaults=True):
    """The signed catalog entry that admitted the directive: ``hash`` is the catalog's
    config hash (``sha-256:HEX``), ``signer`` who signed it, ``record/id`` the action."""

    record_id: str | None = msgspec.field(name="record/id", default=None)
    hash: str | None = None
    version: str | None = None
    signer: dict[str, str] | None = None


class PolicyDecision(OpenMessage, frozen=True, kw_only=True):
    decision: Decision
    reason: str | UnsetType = UNSET
    retryable: bool = False


class AuditStoreRef(OpenMessage, frozen=True, kw_only=True):
    record_id: Annotated[str, msgspec.Meta(min_length=1)] = msgspec.field(name="record/id")
    capability: Annotated[str, msgspec.Meta(pattern=r"^sensorium\.audit\.[a-z][a-z0-9-]*\Z")] = (
        AUDIT_CAPABILITY
    )


class OutcomeRecord(OpenMessage, frozen=True, kw_only=True):
    """Optional fields are absent (``UNSET``) rather than ``null``; the ones this node
    always writes (``policy/decision``, ``retry/attempts``, ``observation/ids``,
    ``artifacts``) are optional to a reader, as published."""

    schema: Literal["sensorium-directive-outcome.v1"]
    schema_v: Literal[1] = msgspec.field(name="schema/v")
    outcome_id: str = msgspec.field(name="outcome/id")
    directive_id: str = msgspec.field(name="directive/id")
    correlation_id: str | UnsetType = msgspec.field(name="correlation/id", default=UNSET)
    status: ResultStatus = msgspec.field(name="outcome/status")
    recorded_at: Timestamp = msgspec.field(name="outcome/recorded_at")
    directive_issued_at: Timestamp | UnsetType = msgspec.field(
        name="directive/issued_at", default=UNSET
    )
    started_at: Timestamp | UnsetType = UNSET
    completed_at: Timestamp | UnsetType = UNSET
    duration_ms: Annotated[int, msgspec.Meta(ge=0)] | UnsetType = UNSET
    issuer: Issuer
    action_id: Annotated[str, msgspec.Meta(pattern=ACTION_ID_PATTERN)]
    connector_id: str | UnsetType = msgspec.field(name="connector/id", default=UNSET)
    connector_kind: str | UnsetType = msgspec.field(name="connector/kind", default=UNSET)
    allowlist_ref: AllowlistRef | UnsetType = msgspec.field(name="allowlist/ref", default=UNSET)
    policy_decision: PolicyDecision | UnsetType = msgspec.field(
        name="policy/decision", default=UNSET
    )
    retry_attempts: Annotated[int, msgspec.Meta(ge=0)] = msgspec.field(
        name="retry/attempts", default=0
    )
    result_summary: dict[str, Any] | UnsetType = msgspec.field(name="result/summary", default=UNSET)
    observation_ids: list[str] = msgspec.field(name="observation/ids", default_factory=list)
    artifacts: list[ArtifactRef] = msgspec.field(default_factory=list)
    diagnostics: list[ResultDiagnostic] = msgspec.field(default_factory=list)
    issuer_delegation: DelegationProof | UnsetType = UNSET
    audit_store: AuditStoreRef | UnsetType = msgspec.field(name="audit/store", default=UNSET)
    connector_dispatched_at: Timestamp | UnsetType = msgspec.field(
        name="connector/dispatched_at", default=UNSET
    )
    connector_responded_at: Timestamp | UnsetType = msgspec.field(
        name="connector/responded_at", default=UNSET
    )
    signature_digest: (
        Annotated[str, msgspec.Meta(pattern=r"^sha256:[A-Za-z0-9_-]+\Z")] | UnsetType
    ) = msgspec.field(name="directive/signature_digest", default=UNSET)
    # This node's: the signatures its scoped signer grant gave (domain, payload digest,
    # key id, signature; never a payload).
    signatures: list[SignatureGiven] | UnsetType = msgspec.field(
        name="sensorium/signatures", default=UNSET
    )
    # This node's: the deferred operation an admitted directive became.
    operation_id: str | UnsetType = msgspec.field(name="sensorium/operation-id", default=UNSET)
    # This node's: the earlier directive's record a keyed retry was answered from.
    deduplicated_from: str | UnsetType = msgspec.field(
        name="sensorium/deduplicated-from", default=UNSET
    )
    # This node's: what the action used (its execution report's ``accounting``).
    accounting: Accounting | UnsetType = msgspec.field(name="sensorium/accounting", default=UNSET)

    @property
    def operation(self) -> str | None:
        return None if isinstance(self.operation_id, UnsetType) else self.operation_id


def present(value: T | None) -> T | UnsetType:
    """``value``, or absent (``UNSET``) for ``None``: optional fields are never null."""
    return UNSET if value is None else value


class AuditPage(OpenMessage, frozen=True, kw_only=True, omit_defaults=True):
    """One page of ``sensorium.audit.query``, newest first; pass ``next_cursor`` back as
    ``cursor`` for the next (absent on the last page)."""

    records: list[OutcomeRecord]
    next_cursor: str | None = None
    limit: int
