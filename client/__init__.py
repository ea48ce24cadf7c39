"""The embedding client: ``Client`` (blocking) and ``AsyncClient`` (asyncio)."""

from sensorium.client.aio import AsyncClient
from sensorium.client.api import Client
from sensorium.client.errors import (
    ActionNotAllowlisted,
    ActionNotEnabled,
    ExecutionModeUnsupported,
    Overloaded,
    ParametersInvalid,
    ProtocolError,
    Rejected,
    ReplyTimeout,
    Retryable,
    SensoriumError,
    Unavailable,
)
from sensorium.shared.wire.outcome import Outcome

__all__ = [
    "ActionNotAllowlisted",
    "ActionNotEnabled",
    "AsyncClient",
    "Client",
    "ExecutionModeUnsupported",
    "Outcome",
    "Overloaded",
    "ParametersInvalid",
    "ProtocolError",
    "Rejected",
    "ReplyTimeout",
    "Retryable",
    "SensoriumError",
    "Unavailable",
]
