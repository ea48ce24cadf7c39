"""The client API on core's ROUTER: one tagged union, one decoder (DESIGN §2)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from sensorium.shared.wire.base import Message, OpenMessage, RequestId, Timestamp
from sensorium.shared.wire.declaration import (
    DeferredProfile,
    ExecutionModeSupport,
    SensitivityClass,
)
from sensorium.shared.wire.directive import Directive
from sensorium.shared.wire.flow import FlowDefinition
from sensorium.shared.wire.observation import Observation, SignalKind
from sensorium.shared.wire.report import LedgerState


class Request(Message, frozen=True, kw_only=True, tag_field="method"):
    request_id: RequestId = msgspec.field(name="request/id")


class Invoke(Request, frozen=True, kw_only=True, tag="sensorium.directive.invoke"):
    directive: Directive


class OperationStatusRequest(Request, frozen=True, kw_only=True, tag="sensorium.operation.status"):
    """The registry's view; ``refresh`` asks the connector now instead (poller, operator).

    A final status carries a summary with references; ``include_result`` asks for the
    raw outcome instead (argv, stdout, stderr), which only the key that created the
    operation (while granted its action) and the operator may read."""

    operation_id: str = msgspec.field(name="operation/id")
    refresh: bool = False
    include_result: bool = False


class OperationStatusBatch(
    Request, frozen=True, kw_only=True, tag="sensorium.operation.status-batch"
):
    """Many ``sensorium.operation.status`` reads in one message: the poller sends one per
    round of due operations, and core asks the connector for them in one message too.
    Each id is answered on its own (``OperationStatuses``). A node older than this
    method refuses it (``request-malformed``); the poller then reads one at a time."""

    operation_ids: Annotated[list[str], msgspec.Meta(min_length=1, max_length=256)] = msgspec.field(
        name="operation/ids"
    )
    refresh: bool = False
    include_result: bool = False


class OperationWait(Request, frozen=True, kw_only=True, tag="sensorium.operation.wait"):
    """``sensorium.operation.status``, answered once the operation is final or
    ``wait_ms`` has passed, whichever comes first: a caller's ``wait`` is woken by the
    node when the job ends instead of sleeping between reads. A node older than this
    method refuses it (``request-malformed``); clients then read and sleep as before."""

    operation_id: str = msgspec.field(name="operation/id")
    include_result: bool = False
    wait_ms: Annotated[int, msgspec.Meta(ge=0, le=60_000)] = 10_000


class OperationCancel(Request, frozen=True, kw_only=True, tag="sensorium.operation.cancel"):
    operation_id: str = msgspec.field(name="operation/id")


class OperationListRequest(Request, frozen=True, kw_only=True, tag="sensorium.operation.list"):
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100
    open_only: bool = False


class FlowRun(Request, frozen=True, kw_only=True, tag="sensorium.flow.run"):
    flow: FlowDefinition
    context: dict[str, Any] = msgspec.field(default_factory=dict)
    correlation_id: Annotated[str, msgspec.Meta(max_length=128)] | None = msgspec.field(
        name="correlation/id", default=None
    )


class FlowStatusRequest(Request, frozen=True, kw_only=True, tag="sensorium.flow.status"):
    flow_id: str = msgspec.field(name="flow/id")


class CatalogDescribe(Request, frozen=True, kw_only=True, tag="sensorium.catalog.describe"):
    pass


class LedgerQuery(Request, frozen=True, kw_only=True, tag="sensorium.ledger.query"):
    action_id: str | None = None


class Health(Request, frozen=True, kw_only=True, tag="health"):
    """The earlier name of ``sensorium.health``, still served."""


class SensoriumHealth(Request, frozen=True, kw_only=True, tag="sensorium.health"):
    """Proposal 045 §7's name for :class:`Health`; the same answer."""


# -- the consumer read paths of proposal 045 §7 --------------------------------------------

Text = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
PageLimit = Annotated[int, msgspec.Meta(ge=1)]


class DirectiveListRequest(Request, frozen=True, kw_only=True, tag="sensorium.directive.list"):
    """The actions this caller may invoke, each with its parameter schema."""


class ObserveQuery(Request, frozen=True, kw_only=True, tag="sensorium.observe.query"):
    """Observations by time (``observed/at`` in ``[since, until)``), subject, signal kind
    (exact, or a ``signal/kind-prefix``), connector, directive and sensitivity class.

    A page holds at most ``limit`` records and never more than the node's
    ``observations.max_page``; ``next/cursor`` continues it. Newest first unless
    ``order`` is ``asc``."""

    since: Timestamp | None = None
    until: Timestamp | None = None
    signal_kind: SignalKind | None = msgspec.field(name="signal/kind", default=None)
    kind_prefix: Text | None = msgspec.field(name="signal/kind-prefix", default=None)
    subject_kind: Text | None = msgspec.field(name="subject/kind", default=None)
    subject_id: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)] | None = msgspec.field(
        name="subject/id", default=None
    )
    connector_id: Text | None = msgspec.field(name="connector/id", default=None)
    directive_id: Text | None = msgspec.field(name="directive/id", default=None)
    sensitivity: Annotated[list[SensitivityClass], msgspec.Meta(min_length=1)] | None = None
    limit: PageLimit = 100
    order: Literal["desc", "asc"] = "desc"
    cursor: Annotated[str, msgspec.Meta(min_length=1, max_length=512)] | None = None


class ObservationGet(Request, frozen=True, kw_only=True, tag="sensorium.observation.get"):
    observation_id: Text = msgspec.field(name="observation/id")


class TopicSummaryRequest(Request, frozen=True, kw_only=True, tag="sensorium.topic.summary"):
    """Per local topic (one per signal kind): how many live records, first and last."""

    kind_prefix: Text | None = msgspec.field(name="signal/kind-prefix", default=None)
    subject_kind: Text | None = msgspec.field(name="subject/kind", default=None)
    since: Timestamp | None = None
    until: Timestamp | None = None


class AuditGet(Request, frozen=True, kw_only=True, tag="sensorium.audit.get"):
    """One directive's outcome record, by ``outcome/id`` (the receipt ``invoke`` prints,
    ``outcome:`` prefix allowed) or by ``directive/id``. Restricted: the local operator,
    or a CURVE key the operator granted ``audit``."""

    id: Annotated[str, msgspec.Meta(min_length=1, max_length=160)]


class AuditQuery(Request, frozen=True, kw_only=True, tag="sensorium.audit.query"):
    """Outcome records, newest first, filtered; ``limit`` is clamped to the node's
    ``limits.audit_page_max``, and ``cursor`` (a page's ``next_cursor``) continues.
    ``since``/``until`` bound ``outcome/recorded_at`` (RFC 3339; since inclusive)."""

    action_id: Annotated[str, msgspec.Meta(max_length=128)] | None = None
    status: Literal["admitted", "completed", "failed", "timed_out", "rejected"] | None = None
    issuer: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    since: Timestamp | None = None
    until: Timestamp | None = None
    limit: Annotated[int, msgspec.Meta(ge=1)] = 50
    cursor: Annotated[str, msgspec.Meta(max_length=256)] | None = None


RecordingName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")]


class RecordStart(Request, frozen=True, kw_only=True, tag="sensorium.record.start"):
    """Start recording client requests into ``<state>/recordings/NAME.srec``.

    The bounds may only tighten the node's ``record`` config; the file name is core's
    choice within the recordings directory, never a path a caller picks.
    """

    name: RecordingName | None = None
    max_requests: Annotated[int, msgspec.Meta(ge=1)] | None = None
    max_bytes: Annotated[int, msgspec.Meta(ge=1)] | None = None
    max_duration_s: Annotated[float, msgspec.Meta(gt=0, le=86_400)] | None = None


class RecordStop(Request, frozen=True, kw_only=True, tag="sensorium.record.stop"):
    pass


class RecordStatusRequest(Request, frozen=True, kw_only=True, tag="sensorium.record.status"):
    pass


ClientRequest = (
    Invoke
    | OperationStatusRequest
    | OperationStatusBatch
    | OperationWait
    | OperationCancel
    | OperationListRequest
    | FlowRun
    | FlowStatusRequest
    | CatalogDescribe
    | LedgerQuery
    | Health
    | SensoriumHealth
    | DirectiveListRequest
    | ObserveQuery
    | ObservationGet
    | TopicSummaryRequest
    | AuditGet
    | AuditQuery
    | RecordStart
    | RecordStop
    | RecordStatusRequest
)

# Requests about recording itself are never written into a recording.
RECORD_CONTROL = (RecordStart, RecordStop, RecordStatusRequest)


class ActionView(OpenMessage, frozen=True, kw_only=True):
    """What a caller may know of an action: its id, its contract and whether it runs."""

    action_id: str
    description: str | None = None
    group: str | None = None
    parameters_schema: dict[str, Any]
    default_timeout_ms: int
    max_timeout_ms: int
    execution_mode_support: ExecutionModeSupport
    deferred_profile: DeferredProfile | None = None
    state: LedgerState
    gaps: list[str] = msgspec.field(default_factory=list)


class CatalogView(OpenMessage, frozen=True, kw_only=True):
    module_id: str | None = None
    connector_instance_id: str | None = msgspec.field(name="connector/instance-id", default=None)
    config_hash: str | None = msgspec.field(name="config/hash", default=None)
    config_authorized: bool = msgspec.field(name="config/authorized", default=False)
    actions: list[ActionView] = msgspec.field(default_factory=list)


class LedgerEntry(OpenMessage, frozen=True, kw_only=True):
    """A capability-ledger row (seed 003), as core sees it after negotiation."""

    id: str
    type: str = "CapabilityLedger"
    specVersion: str = "0.1.0"  # noqa: N815 - field name from the seed
    capabilityRef: str  # noqa: N815
    declaredBy: list[str]  # noqa: N815
    negotiatedBy: list[str]  # noqa: N815
    effectiveState: LedgerState  # noqa: N815
    policyDecisionRef: str  # noqa: N815
    evidenceRefs: list[str] = msgspec.field(default_factory=list)  # noqa: N815
    capturedAt: Timestamp  # noqa: N815


class Ledger(OpenMessage, frozen=True, kw_only=True):
    entries: list[LedgerEntry] = msgspec.field(default_factory=list)


class ConnectorHealth(OpenMessage, frozen=True, kw_only=True):
    connected: bool
    instance_id: str | None = msgspec.field(name="instance/id", default=None)
    actions: int = 0
    catalog_exposed: bool = msgspec.field(name="catalog/exposed", default=False)


class HealthReply(OpenMessage, frozen=True, kw_only=True):
    process: str
    instance_id: str = msgspec.field(name="instance/id")
    started_at: Timestamp
    version: str
    inflight: int = 0
    connector: ConnectorHealth | None = None


RecordingStopReason = Literal[
    "operator", "max-requests", "max-bytes", "max-duration", "core-stopped", "write-failed"
]


class RecordingStatus(OpenMessage, frozen=True, kw_only=True):
    """The current recording, or the last one since core started (``active`` false)."""

    active: bool
    path: str | None = None
    started_at: Timestamp | None = None
    requests: int = 0
    bytes: int = 0
    max_requests: int = 0
    max_bytes: int = 0
    max_duration_s: float | None = None
    stopped_reason: RecordingStopReason | None = None


class DirectiveList(OpenMessage, frozen=True, kw_only=True):
    """``sensorium.directive.list``: what ``sensorium.directive.invoke`` may ask for."""

    module_id: str | None = None
    actions: list[ActionView] = msgspec.field(default_factory=list)


class ObservationPage(OpenMessage, frozen=True, kw_only=True):
    observations: list[Observation] = msgspec.field(default_factory=list)
    # Present while more records match: pass it as ``cursor`` for the next page.
    next_cursor: str | None = msgspec.field(name="next/cursor", default=None)
    limit: int


class TopicEntry(OpenMessage, frozen=True, kw_only=True):
    topic: str
    signal_kind: str = msgspec.field(name="signal/kind")
    count: int
    first_observed_at: Timestamp = msgspec.field(name="first/observed_at")
    last_observed_at: Timestamp = msgspec.field(name="last/observed_at")
    last_observation_id: str = msgspec.field(name="last/observation_id")


class TopicSummary(OpenMessage, frozen=True, kw_only=True):
    topics: list[TopicEntry] = msgspec.field(default_factory=list)
    # More topics matched than one answer carries (``observations.max_page``).
    truncated: bool = False
