"""The embedding client: ``Client`` (blocking) and ``AsyncClient`` (asyncio)."""

from sensorium.client.aio import AsyncClient
from sensorium.client.api import Client
from sensorium.client.deferred import Deadline, OperationRef
from sensorium.client.errors import (
    ActionNotAllowlisted,
    ActionNotEnabled,
    DeadlineExceeded,
    ExecutionModeUnsupported,
    FlowFailed,
    FlowInvalid,
    GrantDenied,
    IdempotencyConflict,
    InDoubt,
    NotAuthentic,
    NotCancelable,
    Overloaded,
    ParametersInvalid,
    ProtocolError,
    RecordingActive,
    Rejected,
    ReplyTimeout,
    Retryable,
    SensoriumError,
    StorageUnavailable,
    Unavailable,
    UnknownId,
)
from sensorium.shared.rpc.curve import ClientKeys
from sensorium.shared.wire.deferred import (
    TERMINAL_STATUSES,
    DeferredOperation,
    DeferredOperationStatus,
    OperationList,
    OperationSummary,
)
from sensorium.shared.wire.flow import FlowDefinition, FlowStatus, FlowStep
from sensorium.shared.wire.outcome import Outcome

__all__ = [
    "TERMINAL_STATUSES",
    "ActionNotAllowlisted",
    "ActionNotEnabled",
    "AsyncClient",
    "Client",
    "ClientKeys",
    "Deadline",
    "DeadlineExceeded",
    "DeferredOperation",
    "DeferredOperationStatus",
    "ExecutionModeUnsupported",
    "FlowDefinition",
    "FlowFailed",
    "FlowInvalid",
    "FlowStatus",
    "FlowStep",
    "GrantDenied",
    "IdempotencyConflict",
    "InDoubt",
    "NotAuthentic",
    "NotCancelable",
    "OperationList",
    "OperationRef",
    "OperationSummary",
    "Outcome",
    "Overloaded",
    "ParametersInvalid",
    "ProtocolError",
    "RecordingActive",
    "Rejected",
    "ReplyTimeout",
    "Retryable",
    "SensoriumError",
    "StorageUnavailable",
    "Unavailable",
    "UnknownId",
]
