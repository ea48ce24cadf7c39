"""``sensorium-observation.v1``: a typed signal core emits after an action ran.

An observation points at evidence instead of carrying it: the outcome it came from
(``outcome/ref``, ``evidence/refs``), the declared result pointers (``summary``) and
coded diagnostics. It never carries stdout, stderr, argv or directive parameters —
observations are published to subscribers that must not see private payloads.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from sensorium.shared.wire.base import OpenMessage, Timestamp
from sensorium.shared.wire.declaration import SIGNAL_KIND_PATTERN
from sensorium.shared.wire.outcome import Diagnostic, EvidenceRef, OutcomeStatus, Sensitivity

SCHEMA_NAME = "sensorium-observation.v1"
SignalKind = Annotated[str, msgspec.Meta(pattern=SIGNAL_KIND_PATTERN, max_length=256)]


class ObservationSource(OpenMessage, frozen=True, kw_only=True):
    """Which connector and which declared action produced the observed outcome."""

    connector_id: str
    action_id: str


class Observation(OpenMessage, frozen=True, kw_only=True):
    schema: Literal["sensorium-observation.v1"] = "sensorium-observation.v1"
    schema_v: Literal[1] = msgspec.field(name="schema/v", default=1)
    observation_id: str = msgspec.field(name="observation/id")
    signal_kind: SignalKind = msgspec.field(name="signal/kind")
    signal_family: str | None = msgspec.field(name="signal/family", default=None)
    sensitivity: Sensitivity = msgspec.field(default_factory=Sensitivity)
    source: ObservationSource
    directive_id: str = msgspec.field(name="directive/id")
    correlation_id: str | None = msgspec.field(name="correlation/id", default=None)
    outcome_ref: str = msgspec.field(name="outcome/ref")
    observed_at: Timestamp
    status: OutcomeStatus
    summary: dict[str, Any] = msgspec.field(default_factory=dict)
    evidence_refs: list[EvidenceRef] = msgspec.field(name="evidence/refs", default_factory=list)
    diagnostics: list[Diagnostic] = msgspec.field(default_factory=list)
