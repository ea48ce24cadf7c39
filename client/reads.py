"""The read requests of proposal 045 §7, built once for ``Client`` and ``AsyncClient``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from sensorium.shared.ids import new_id
from sensorium.shared.wire.client_api import (
    AuditQuery,
    DirectiveList,
    DirectiveListRequest,
    ObservationGet,
    ObservationPage,
    ObserveQuery,
    SensoriumHealth,
    TopicSummary,
    TopicSummaryRequest,
)
from sensorium.shared.wire.declaration import SensitivityClass
from sensorium.shared.wire.observation import Observation

__all__ = [
    "DirectiveList",
    "Observation",
    "ObservationPage",
    "TopicSummary",
    "audit_query",
    "directive_list",
    "health",
    "observation_get",
    "observe_query",
    "topic_summary",
]


def directive_list() -> DirectiveListRequest:
    return DirectiveListRequest(request_id=new_id())


def health() -> SensoriumHealth:
    return SensoriumHealth(request_id=new_id())


def observation_get(observation_id: str) -> ObservationGet:
    return ObservationGet(request_id=new_id(), observation_id=observation_id)


def observe_query(
    *,
    since: str | None = None,
    until: str | None = None,
    signal_kind: str | None = None,
    kind_prefix: str | None = None,
    subject_kind: str | None = None,
    subject_id: str | None = None,
    connector_id: str | None = None,
    directive_id: str | None = None,
    sensitivity: Sequence[SensitivityClass] | None = None,
    limit: int = 100,
    order: Literal["desc", "asc"] = "desc",
    cursor: str | None = None,
) -> ObserveQuery:
    return ObserveQuery(
        request_id=new_id(),
        since=since,
        until=until,
        signal_kind=signal_kind,
        kind_prefix=kind_prefix,
        subject_kind=subject_kind,
        subject_id=subject_id,
        connector_id=connector_id,
        directive_id=directive_id,
        sensitivity=list(sensitivity) if sensitivity else None,
        limit=limit,
        order=order,
        cursor=cursor,
    )


def topic_summary(
    *,
    kind_prefix: str | None = None,
    subject_kind: str | None = None,
    since: str | None = None,
    until: str | None = None,
) -> TopicSummaryRequest:
    return TopicSummaryRequest(
        request_id=new_id(),
        kind_prefix=kind_prefix,
        subject_kind=subject_kind,
        since=since,
        until=until,
    )


def audit_query(
    *,
    action_id: str | None,
    status: str | None,
    issuer: str | None,
    since: str | None,
    until: str | None,
    limit: int,
    cursor: str | None,
) -> AuditQuery:
    """``sensorium.audit.query``; the values are checked as the node checks them."""
    return msgspec.convert(
        {
            "method": "sensorium.audit.query",
            "request/id": new_id(),
            "action_id": action_id,
            "status": status,
            "issuer": issuer,
            "since": since,
            "until": until,
            "limit": limit,
            "cursor": cursor,
        },
        AuditQuery,
    )
