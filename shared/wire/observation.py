"""``sensorium-observation.v1``: a fact core admitted after an action ran (proposal 045).

The published schema is open at the root and in every object, so a document it allows
decodes here, fields this node does not know included. Optional fields are omitted when
absent (``omit_defaults``), never sent as ``null``.

An observation points at evidence instead of carrying it: the outcome it came from
(``outcome/id``), produced files by content id (``evidence/refs``), the declared result
pointers (``result/pointers``, a project field) and coded diagnostics. It never carries
stdout, stderr, argv or directive parameters — observations are published to
subscribers that must not see private payloads.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from sensorium.shared.wire.base import OpenMessage, Timestamp
from sensorium.shared.wire.declaration import (
    SIGNAL_FAMILY_PATTERN,
    SIGNAL_KIND_PATTERN,
    SensitivityClass,
    SignalKindText,
)
from sensorium.shared.wire.directive import ArtifactRef
from sensorium.shared.wire.outcome import Diagnostic

SCHEMA_NAME = "sensorium-observation.v1"
# Proposal 046's local topic: a subscriber's ZeroMQ prefix picks a kind or a subtree.
TOPIC_PREFIX = "local/sensorium/observations/"
TOPIC_PATTERN = "^local/sensorium/observations/" + SIGNAL_KIND_PATTERN.removeprefix("^")
SignalKind = SignalKindText
SignalFamily = Annotated[str, msgspec.Meta(pattern=SIGNAL_FAMILY_PATTERN, max_length=256)]
Topic = Annotated[str, msgspec.Meta(pattern=TOPIC_PATTERN)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
ConfidenceClass = Literal["unknown", "low", "medium", "high"]


def topic(kind: str) -> str:
    """The local topic an observation of ``kind`` is published on."""
    return TOPIC_PREFIX + kind


class Summary(OpenMessage, frozen=True, kw_only=True):
    lang: str
    text: str


class Confidence(OpenMessage, frozen=True, kw_only=True, omit_defaults=True):
    class_: ConfidenceClass = msgspec.field(name="class")
    rationale: str | None = None


class Freshness(OpenMessage, frozen=True, kw_only=True, omit_defaults=True):
    ttl_sec: PositiveInt
    expires_at: Timestamp | None = None


class ObservedSensitivity(OpenMessage, frozen=True, kw_only=True, omit_defaults=True):
    class_: SensitivityClass = msgspec.field(name="class")
    redaction: str | None = None


class SourceRef(OpenMessage, frozen=True, kw_only=True):
    kind: Annotated[str, msgspec.Meta(pattern=SIGNAL_KIND_PATTERN)]
    value: Annotated[str, msgspec.Meta(min_length=1)]


class StoreRef(OpenMessage, frozen=True, kw_only=True, omit_defaults=True):
    """Where the node keeps the record, and for how long."""

    record_id: Annotated[str, msgspec.Meta(min_length=1)] = msgspec.field(name="record/id")
    ttl_sec: PositiveInt
    expires_at: Timestamp | None = None


class Admission(OpenMessage, frozen=True, kw_only=True):
    """Core's authoritative admission decision (observations are admitted-only)."""

    status: Literal["admitted"]
    redaction_status: str
    memarium_admit: bool
    consumer_scopes: list[str]
    store: StoreRef
    publish_topics: Annotated[list[Topic], msgspec.Meta(min_length=1)]


class PolicyHints(OpenMessage, frozen=True, kw_only=True, omit_defaults=True):
    shareable: bool | None = None
    memarium_admit_hint: bool | None = None
    requested_consumer_scopes: list[str] | None = None


class Observation(OpenMessage, frozen=True, kw_only=True, omit_defaults=True):
    schema: Literal["sensorium-observation.v1"]
    schema_v: Literal[1] = msgspec.field(name="schema/v")
    observation_id: str = msgspec.field(name="observation/id")
    connector_id: str = msgspec.field(name="connector/id")
    connector_kind: str = msgspec.field(name="connector/kind")
    observed_at: Timestamp = msgspec.field(name="observed/at")
    ingested_at: Timestamp = msgspec.field(name="ingested/at")
    signal_kind: SignalKind = msgspec.field(name="signal/kind")
    confidence: Confidence
    freshness: Freshness
    sensitivity: ObservedSensitivity
    source_ref: SourceRef = msgspec.field(name="source/ref")
    admission: Admission
    invocation_id: str | None = msgspec.field(name="invocation/id", default=None)
    directive_id: str | None = msgspec.field(name="directive/id", default=None)
    outcome_id: str | None = msgspec.field(name="outcome/id", default=None)
    correlation_id: str | None = msgspec.field(name="correlation/id", default=None)
    signal_family: SignalFamily | None = msgspec.field(name="signal/family", default=None)
    subject_kind: str | None = msgspec.field(name="subject/kind", default=None)
    subject_id: str | None = msgspec.field(name="subject/id", default=None)
    summary: Summary | None = None
    evidence_refs: list[ArtifactRef] = msgspec.field(name="evidence/refs", default_factory=list)
    policy_hints: PolicyHints | None = msgspec.field(name="policy/hints", default=None)
    connector_submitted_at: Timestamp | None = msgspec.field(
        name="connector/submitted_at", default=None
    )
    # Project fields (the published root is open): the declared action that ran, how
    # it ended, the result pointers its declaration names, its incidental effects, and
    # coded diagnostics.
    action_id: str | None = msgspec.field(name="action/id", default=None)
    outcome_status: str | None = msgspec.field(name="outcome/status", default=None)
    result_pointers: dict[str, Any] = msgspec.field(name="result/pointers", default_factory=dict)
    # The outcome's incidental effects: the class's baselines and what the declaration
    # adds (seed 048: declared "in outcomes and observations").
    incidental_effects: list[str] = msgspec.field(name="incidental/effects", default_factory=list)
    diagnostics: list[Diagnostic] = msgspec.field(default_factory=list)

    @property
    def topic(self) -> str:
        return topic(self.signal_kind)
